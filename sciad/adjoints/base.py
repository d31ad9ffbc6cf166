"""What every sensitivity algorithm shares: the solve setup, diffrax calls,
the products of f from a chosen engine, and the custom rules that make a
solve differentiable."""

import abc
import dataclasses
import typing
from typing import Callable

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import sciad.ad as ad
from sciad.ad.linear import REVERSE_OVER_REVERSE, forward_mode_only


@dataclasses.dataclass(frozen=True)
class Setup:
    """Everything about a solve except u0 and p (static, known at trace time).

    `ts` (T,) are the saveat times, strictly increasing inside [t0, t1].
    """

    f: Callable
    solver: dfx.AbstractSolver
    t0: float
    t1: float
    ts: np.ndarray
    rtol: float
    atol: float
    max_steps: int

    @property
    def implicit(self) -> bool:
        """Whether the solver is implicit (then the adjoint systems are solved implicitly too)."""
        return is_implicit(self.solver)

    def term(self, vector_field: Callable | None = None):
        """`vector_field(t, y, args)` (default: f) as the term the solver takes; IMEX solvers
        (KenCarp) get it as their implicit part, with a zero explicit part."""
        vector_field = vector_field or (lambda t, u, p: self.f(u, p, t))
        term = dfx.ODETerm(vector_field)
        if typing.get_origin(self.solver.term_structure) is dfx.MultiTerm:
            zero = dfx.ODETerm(lambda t, y, args: jax.tree.map(jnp.zeros_like, y))
            return dfx.MultiTerm(zero, term)
        return term

    def breakpoints(self, extra=()) -> np.ndarray:
        """Sorted unique times t0, ts, `extra`, t1: where the adjoint state jumps or restarts."""
        return np.unique(np.concatenate([[self.t0], self.ts, np.asarray(extra, float), [self.t1]]))

    def diffeqsolve(self, term, y0, args, t0, t1, *, ts=None, dense=False, steps=False,
                    adjoint=None, max_steps=None, norm=None, dt0=None, throw=True):
        """One diffrax solve with this setup's solver and tolerances (t1 < t0 runs backwards).
        `dt0` is the first step (None: diffrax selects it, at two extra f evaluations).
        Solves inside the rules run in diffrax's `ForwardMode` (JAX never reverse-differentiates
        them, and an outer `jax.jvp` can enter them: second derivatives)."""
        controller = step_controller(self.solver, self.rtol, self.atol, norm)
        saveat = dfx.SaveAt(ts=ts, t1=ts is None and not steps, steps=steps, dense=dense)
        return dfx.diffeqsolve(
            term, self.solver, t0, t1, dt0, y0, args=args, saveat=saveat,
            stepsize_controller=controller, max_steps=max_steps or self.max_steps,
            adjoint=adjoint or dfx.ForwardMode(), throw=throw,
        )

    def forward(self, u0, p, *, ts=None, dense=False, adjoint=None):
        """The forward solve from t0 to t1, saving at `ts` (default: the saveat times)."""
        ts = self.ts if ts is None else ts
        return self.diffeqsolve(self.term(), u0, p, self.t0, self.t1, ts=jnp.asarray(ts, u0.dtype),
                                dense=dense, adjoint=adjoint)


def step_controller(solver: dfx.AbstractSolver, rtol: float, atol: float, norm=None) -> dfx.PIDController:
    """Adaptive steps at rtol, atol: integral control, or for implicit solvers PI control
    (pcoeff 0.4, icoeff 0.3, as diffrax suggests for stiff problems: Kvaerno5 rejects about
    half its steps on the Oregonator under integral control, a fifth under PI)."""
    gains = {"pcoeff": 0.4, "icoeff": 0.3} if is_implicit(solver) else {}
    return dfx.PIDController(rtol=rtol, atol=atol, **gains, **({} if norm is None else {"norm": norm}))


def is_implicit(solver: dfx.AbstractSolver) -> bool:
    """Whether a diffrax solver is implicit (declares a root finder for its stages)."""
    return isinstance(solver, dfx.AbstractImplicitSolver)


def checked(result, x):
    """`x`, with a run-time error if the diffrax solve that gave `result` failed
    (e.g. hit max_steps). diffrax's own check rides on the solve's outputs and
    is dropped when only its derivatives are used (jax.jit removes it), so the
    rules that re-solve internally attach it to what they return."""
    return result.error_if(x, jnp.invert(dfx.is_okay(result)))


def stats_vector(sol: dfx.Solution, dtype) -> jax.Array:
    """(steps, accepted, rejected) as a float vector (so it can ride along a differentiable output)."""
    s = sol.stats
    return jnp.stack([s["num_steps"], s["num_accepted_steps"], s["num_rejected_steps"]]).astype(dtype)


class Products:
    """f's derivative products from JAX code, computed by one `sciad.ad` backend:
    `vjp(u, p, t, λ) -> (f, λᵀ∂f/∂u, λᵀ∂f/∂p)`, `jvp(u, p, t, du, dp) -> (f, ∂f/∂u du + ∂f/∂p dp)`.
    JAX engines are traced in; torch, autograd and finite differences run
    through `sciad.ad.differentiate_with` (a host callback per product)."""

    def __init__(self, f: Callable, backend):
        self.backend = ad.get(backend)
        self.g = ad.differentiate_with(f, self.backend)

    def vjp(self, u, p, t, lam):
        y, pb = jax.vjp(lambda u, p: self.g(u, p, t), u, p)
        return (y, *pb(lam))

    def jvp(self, u, p, t, du, dp):
        return jax.jvp(lambda u, p: self.g(u, p, t), (u, p), (du, dp))



class AbstractSensitivity(eqx.Module):
    """How a solve is differentiated. Subclasses give the forward pass and the
    pullback (and may override the pushforward, by default forward-mode AD
    through the solver)."""

    @abc.abstractmethod
    def forward(self, setup: Setup, u0, p, active):
        """-> (us (T, n), stats (3,), residuals for the rules). `active` = (u0 is
        differentiated, p is differentiated), or None when nothing is."""

    @abc.abstractmethod
    def pullback(self, setup: Setup, residuals, w):
        """w (T, n) cotangent of us -> (∂L/∂u0 (n,), ∂L/∂p (m,)); None where inactive."""

    def pushforward(self, setup: Setup, residuals, du0, dp):
        """Tangent of us (T, n) in direction (du0, dp); by default forward-mode AD
        through the solver. `residuals` start with (u0, p)."""
        u0, p = residuals[0], residuals[1]

        def solve(u0, p):
            sol = setup.forward(u0, p)
            return sol.ys, sol.result

        _, dus, result = jax.jvp(solve, (u0, p), (du0, dp), has_aux=True)
        return checked(result, dus)

    def solve(self, setup: Setup, u0, p):
        """-> (us, stats), differentiable in u0 and p by this algorithm's rules."""

        def forward(u0, p, active):
            us, stats, residuals = self.forward(setup, u0, p, active)
            if active is None:
                return (us, stats), residuals
            return forward_mode_only(((us, stats), residuals), REVERSE_OVER_REVERSE)

        def pushforward(residuals, vs):
            dus = self.pushforward(setup, residuals, *vs)
            return dus, jnp.zeros((3,), dus.dtype)

        def pullback(residuals, w):
            return self.pullback(setup, residuals, w[0])

        return ad.custom_linear_rules(forward, pushforward, pullback)(u0, p)


def plain_forward(setup: Setup, u0, p):
    """(us, stats, residuals) of an undifferentiated solve."""
    sol = setup.forward(u0, p)
    return sol.ys, stats_vector(sol, u0.dtype), (u0, p)
