"""The forward sensitivity equations."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp

import sciad.ad as ad
from sciad._dae import consistent_tangents, solver_mass, with_mass
from sciad.adjoints._base import AbstractSensitivity, Products, Setup, leading_seminorm, plain_forward, stats_vector
from sciad.adjoints._discrete import ForwardDiffSensitivity

SLOW_IMPLICIT_STATES = 16  # states from which ForwardSensitivity with an implicit solver gets a warning


class ForwardSensitivity(AbstractSensitivity):
    """Continuous forward sensitivities: u' = f, S' = (∂f/∂u) S + ∂f/∂p solved
    as one augmented system with error control on u and S. `jvp` is the
    engine for the Jacobian-vector products (a backend or registry name).

    The forward pass carries one sensitivity column per differentiated input
    (n for u0, m for p: cost grows with n + m, best for small problems); jvps
    and gradients are products with the sensitivities at the saveat times.

    `seminorm=True` leaves S out of the error control: the steps are the
    forward solve's, and S is the discrete derivative of the solution (equal
    to `DiscreteAdjoint`'s gradient to rounding with an explicit solver), and faster
    (paper/tables/scaling.md, suite.md).

    With a mass matrix (M u' = f, a DAE where M is singular) S solves the sensitivity DAE
    M S' = (∂f/∂u) S + ∂f/∂p with the same Rosenbrock solver (mass matrix M on each column), from
    consistent tangents: the derivative of the consistent initialisation (`sciad._dae`).

    For an SDE the sensitivity SDE dS = (∂a/∂u S + ∂a/∂p) dt + (∂σ/∂u S + ∂σ/∂p) ∘ dW is discretised by the
    forward solver on the same increments and steps: that is the forward-mode derivative of the steps, which
    it takes, with the products from `jvp`.
    """

    stores_interpolation = False
    # S rides on the forward steps: with `seminorm` outside the error control, and inside it the embedded
    # error estimate does not see a stiff mode's error at the stability limit either (measured 2% off)
    follows_steps = True
    initialises = True  # consistent tangents: of u0's differential part and p alone
    through_the_steps = True  # for a kind whose sensitivity equations are the derivative of its steps

    jvp: ad.AbstractBackend
    seminorm: bool

    def __init__(self, jvp: str | ad.AbstractBackend = "jax-forward", seminorm: bool = False):
        self.jvp = ad.get(jvp)
        self.seminorm = bool(seminorm)

    def slow_for(self, states: int, implicit: bool) -> str | None:
        if implicit and states >= SLOW_IMPLICIT_STATES:
            return (
                f"ForwardSensitivity with an implicit solver on {states} states: the sensitivity equations "
                "join every Newton solve (many times slower than an adjoint: paper/tables/suite.md); "
                "sensealg='auto' picks a faster one"
            )
        return None

    def forward(self, setup: Setup, u0, p, active):
        if active is None:
            return plain_forward(setup, u0, p)
        if getattr(setup.f, "sensitivities_through_steps", False):  # a kind whose sensitivity equations they are
            through = dataclasses.replace(setup, f=setup.f.with_products(self.jvp))
            ys, stats, jacs = ForwardDiffSensitivity().forward(through, u0, p, active)
            s_u0, s_p = (None if j is None else jnp.moveaxis(j, -1, 1) for j in (jacs.u0, jacs.p))  # pyright: ignore[reportOptionalMemberAccess]  # differentiated: Jacobians
            return ys, stats, Sensitivities(s_u0, s_p, ys.shape)
        n, m = u0.shape[0], p.shape[0]
        u0 = setup.initialised(u0, p)
        y0 = setup.state(u0)
        sizes = (n if active.u0 else 0, m if active.p else 0)
        # Column c starts at S(t0) = ∂y0/∂x_c and is driven by ∂F/∂p · ∂p/∂x_c.
        s0 = jnp.concatenate(
            [jnp.eye(sizes[0], y0.shape[0], dtype=u0.dtype), jnp.zeros((sizes[1], y0.shape[0]), u0.dtype)]
        )
        dps = jnp.concatenate([jnp.zeros((sizes[0], m), p.dtype), jnp.eye(sizes[1], m, dtype=p.dtype)])
        prods = Products(setup.f, self.jvp)
        mass = solver_mass(setup.solver, n)
        if mass is not None:  # the sensitivity DAE M S' = J S + ∂f/∂p dp, from consistent tangents
            s0 = s0.at[:, :n].set(
                consistent_tangents(setup.f, mass, u0, p, setup.t0, s0[:, :n], dps, setup.rtol, setup.atol)
            )
            setup = eqx.tree_at(
                lambda s: s.solver,
                setup,
                with_mass(setup.solver, [setup.solver.mass_matrix] * (1 + s0.shape[0])),  # pyright: ignore[reportAttributeAccessIssue]  # a mass-matrix solver
            )

        def rhs(t, y, p):
            y, s = y
            ds = jax.vmap(lambda s, dp: prods.jvp(y[:n], p, t, s[:n], dp)[1])(s, dps)
            return setup.rate(y, p, t), ds

        sol = setup.diffeqsolve(
            setup.term(rhs),
            (y0, s0),
            p,
            setup.t0,
            setup.t1,
            ts=jnp.asarray(setup.ts, u0.dtype),
            norm=leading_seminorm() if self.seminorm else None,
        )
        ys, sens = sol.ys  # sens: (T, columns, n + k)  # pyright: ignore[reportGeneralTypeIssues]  # saved: not None
        blocks = Sensitivities(
            sens[:, : sizes[0]] if active.u0 else None, sens[:, sizes[0] :] if active.p else None, ys.shape
        )
        return ys, stats_vector(sol), blocks

    def pullback(self, setup: Setup, sens: "Sensitivities", w):
        return tuple(None if s is None else jnp.einsum("tn,tkn->k", w, s) for s in (sens.u0, sens.p))

    def pushforward(self, setup: Setup, sens: "Sensitivities", du0, dp):
        return sum(
            (jnp.einsum("tkn,k->tn", s, v) for s, v in zip((sens.u0, sens.p), (du0, dp)) if s is not None),
            start=jnp.zeros(sens.shape, du0.dtype),
        )


class Sensitivities(eqx.Module):
    """∂y(tᵢ)/∂u0 (T, n, n + k) and ∂y(tᵢ)/∂p (T, m, n + k) at the save times (None where not
    differentiated), and the `shape` (T, n + k) of the saves."""

    u0: jax.Array | None
    p: jax.Array | None
    shape: tuple = eqx.field(static=True)
