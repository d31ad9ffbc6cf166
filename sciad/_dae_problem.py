"""`DAEProblem`: a fully implicit DAE F(u', u, p, t) = 0 (index 1), u(t0) = u0, u'(t0) = du0 on tspan = (t0, t1),
and what it adds to the solve: which states are algebraic (from ∂F/∂u' at (du0, u0)), the consistent
initialisation, the BDF's residual term (`sciad._bdf.ResidualTerm`), the consistent u' at save and event times."""

import dataclasses
import typing
from collections.abc import Callable
from typing import Any, ClassVar

import diffrax as dfx
import equinox as eqx
import jax
import jax.flatten_util as jfu
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, PyTree

from sciad import _events as events
from sciad._bdf import BDF, ResidualTerm
from sciad._custom_types import RealScalarLike
from sciad._dae import (
    MassMatrix,
    _concrete,
    algebraic_block,
    check_initialization,
    implicit_derivative,
    initialise_implicit,
)
from sciad._dense import DenseOutput
from sciad._ode import _in_reverse
from sciad._problem import (
    AbstractProblem,
    Request,
    Staged,
    _describe,
    _traced,
    check_leaves,
    check_params,
    check_state,
    check_steps,
    check_tolerances,
    check_tspan,
    forward_times,
)
from sciad._pytrees import Layout, leaf_names
from sciad._vector_field import AroundVectorField, VectorField
from sciad.adjoints._base import AbstractSensitivity, Setup

RESIDUAL = "F(du, u, p, t)"


class DAEProblem(AbstractProblem):
    """A fully implicit differential-algebraic problem F(u', u, p, t) = 0 on tspan = (t0, t1), u(t0) = u0,
    u'(t0) = du0, of index 1 (IDAS's and SciMLSensitivity's `DAEProblem` form).

    `F(du, u, p, t)` returns the residual with u0's structure; `du0` is like u0 (a guess: the solve makes it
    consistent). u0, p and tspan are as for `ODEProblem`. Which states are algebraic is read off
    ∂F/∂u' (n, n) over the flattened state at (du0, u0, p, t0) (its rank and null spaces, held for the solve as
    IDAS holds its `id`): zero columns, or in general the directions ∂F/∂u' does not see, and the equations
    it does not (its left null space) are the algebraic ones. Solved by `sciad.BDF` (its W = ∂F/∂u' +
    (h/α) ∂F/∂u), and differentiated through its steps (`ForwardDiffSensitivity`, `ForwardSensitivity`,
    `DiscreteAdjoint`). The solution depends on u0's differential part and p alone: du0 and u0's
    algebraic part are solved for, so their derivatives are zero.

    Checked here, each error naming the argument and the fix: F callable; u0's, du0's and p's leaves (float,
    finite); du0 like u0; tspan; F(du0, u0, p, t0) returns u0's structure and shapes (by tracing); and the
    index: the algebraic block U₀ᵀ (∂F/∂u) V₀ of ∂F/∂u' at (du0, u0, p, t0) invertible (else the Newton matrix is
    singular for small steps: index 2 or more). These read the problem's own values, which must be concrete
    (make the problem outside `jax.jit`; pass traced u0 and p to `sciad.solve`)."""

    F: Callable[..., PyTree[Array]]
    u0: PyTree[Array]
    du0: PyTree[Array]
    tspan: tuple[float, float] = eqx.field(static=True)
    p: PyTree[Any] = None
    derivative_jacobian: MassMatrix = eqx.field(static=True, default=None)  # ∂F/∂u' at (du0, u0, p, t0)
    options: ClassVar[dict[str, Any]] = {
        "stepsize_controller": None,
        "dense": False,
        "jacobian": "auto",
        "initialization": None,
    }

    def __init__(
        self,
        F: Callable[..., PyTree[Array]],
        u0: PyTree[ArrayLike],
        du0: PyTree[ArrayLike],
        tspan: tuple[RealScalarLike, RealScalarLike],
        p: PyTree[Any] = None,
    ):
        if not callable(F):
            raise TypeError(f"DAEProblem(F=...): F must be callable F(du, u, p, t) returning the residual, got {F!r}")
        self.F = F
        self.u0 = check_state("u0", u0)
        self.du0 = check_state("du0", du0)
        _check_du0(self.du0, self.u0)
        self.p = check_params("p", np.zeros((0,), jnp.result_type(*jax.tree.leaves(self.u0))) if p is None else p)
        self.tspan = check_tspan(tspan)
        _check_residual(F, self.u0, self.du0, self.p, self.tspan[0])
        self.derivative_jacobian = _derivative_jacobian(F, self.u0, self.du0, self.p, self.tspan[0])

    def staged(self, request: Request) -> Staged:
        return _staged(self, request)

    def sensealg_choice(self, ts, *, rtol: float, atol: float):
        """ "auto"'s `sciad._auto.Choice` for a solve saved at `ts` (T,) (`sciad.select_sensealg`)."""
        from sciad._auto import auto_dae_sensealg

        return auto_dae_sensealg(self.u0, self.p, ts, solver=BDF(), rtol=rtol, atol=atol)


def _check_du0(du0, u0) -> None:
    if jax.tree.structure(du0) != jax.tree.structure(u0):
        raise ValueError(
            f"du0 is {_describe(du0)} but u0 is {_describe(u0)}: du0 is u'(t0), a PyTree like u0 (a guess, made "
            "consistent by the solve: zeros will do)"
        )
    for (label, d), (_, u) in zip(leaf_names(du0, "du0"), leaf_names(u0, "u0")):
        if np.shape(d) != np.shape(u):
            raise ValueError(
                f"{label} has shape {tuple(np.shape(d))} but u0{label[3:]} has shape {tuple(np.shape(u))}: du0 is "
                "u'(t0), like u0"
            )


def _check_residual(F: Callable, u0, du0, p, t0) -> None:
    """F(du0, u0, p, t0) returns float arrays of u0's structure and shapes (traced, not run)."""
    out = _traced(RESIDUAL, lambda u, p, t: F(du0, u, p, t), u0, p, t0)
    if jax.tree.structure(out) != jax.tree.structure(u0):
        raise ValueError(
            f"{RESIDUAL} returns {_describe(out)} but u0 is {_describe(u0)}: the residual has u0's structure, one "
            "equation per state (return one array with xp.stack / xp.asarray for a vector state)"
        )
    check_leaves(RESIDUAL, out, u0, "the residual")


TRACED_PROBLEM = (
    "DAEProblem got traced values (made under jax.jit or jax.vmap): which states are algebraic is read from "
    "∂F/∂u' at the problem's own (du0, u0, p, t0), which must be concrete: make the problem with concrete values "
    "and pass the traced ones to the solve: sciad.solve(prob, u0=..., p=...)"
)


def _derivative_jacobian(F: Callable, u0, du0, p, t0) -> MassMatrix:
    """∂F/∂u' (n, n) at (du0, u0, p, t0) over the flattened state, as a `MassMatrix` (its split: the algebraic
    equations and states), checked finite and index 1 (the algebraic block of ∂F/∂u invertible)."""
    params, static = eqx.partition(p, eqx.is_array)
    values = _concrete((u0, du0, params))
    if values is None:
        raise ValueError(TRACED_PROBLEM)
    u0, du0, params = values
    u, unravel = jfu.ravel_pytree(u0)
    du = jfu.ravel_pytree(du0)[0].astype(u.dtype)
    t = jnp.asarray(t0, u.dtype)

    def residual(du, u):
        return jfu.ravel_pytree(F(unravel(du), unravel(u), eqx.combine(params, static), t))[0]

    A, B = (np.asarray(x, np.float64) for x in jax.jacfwd(residual, argnums=(0, 1))(du, u))
    if not (np.all(np.isfinite(A)) and np.all(np.isfinite(B))):
        raise ValueError(
            f"{RESIDUAL}'s Jacobians at (du0, u0, p, t0) have non-finite entries: pass du0, u0 and p where F is "
            "differentiable"
        )
    n = u.size
    mass = typing.cast(MassMatrix, MassMatrix.of(A, n))  # A is a matrix: a MassMatrix
    if mass.singular:
        k = mass.algebraic
        block = algebraic_block(mass, B)
        tol = n * np.finfo(np.asarray(u).dtype).eps * max(np.abs(B).max(), np.abs(A).max())
        if np.linalg.matrix_rank(block, tol=tol) < k:
            raise ValueError(
                f"DAEProblem: F is not index 1 at (du0, u0, p, t0): ∂F/∂du has rank {n - k} of {n} ({k} algebraic "
                f"state(s)), and ∂F/∂u on the algebraic equations and states ({k}×{k}) is singular, so the Newton "
                "matrix ∂F/∂du + (h/α) ∂F/∂u is singular as the step shrinks (index 2 or more, e.g. a constraint on "
                "differential states alone, as a pendulum's length). Reduce the index: differentiate the "
                "constraint until it involves the algebraic states (the pendulum's velocity- or "
                "acceleration-level constraint)"
            )
    return mass


def _staged(prob: DAEProblem, r: Request) -> "_DAEStaged":
    """The DAE's solve: sciad's BDF on F's residual term in the solve's forward time s = sign t, under its own
    step control."""
    o = r.options
    rtol, atol, controller, dt0 = check_steps(o["stepsize_controller"], r.dt0, r.rtol, r.atol, r.sign)
    check_tolerances(rtol, atol, r.max_steps)
    mass = prob.derivative_jacobian
    initialization = check_initialization(o["initialization"], mass)
    default = r.solver is None or (isinstance(r.solver, str) and r.solver in ("auto", "bdf"))
    solver = BDF() if default else r.solver
    if (
        not isinstance(solver, dfx.AbstractSolver)
        or not getattr(solver, "takes_residual", False)
        or getattr(solver, "mass_matrix", None) is not None
    ):
        raise ValueError(
            f"solver={r.solver!r}: a DAEProblem (F(du, u, p, t) = 0) is solved by sciad's BDF without a mass matrix: "
            "pass solver='bdf' (the default) or sciad.BDF(); for a Rosenbrock solver, write it as "
            "ODEProblem(f, u0, tspan, p, mass_matrix=M) (M du = f)"
        )
    if o["jacobian"] not in ("auto", "dense"):
        raise ValueError(
            f"jacobian={o['jacobian']!r}: a DAEProblem's BDF solves its Newton steps densely: pass jacobian='dense' "
            "or 'auto'"
        )
    if any(not isinstance(c, events.PresetTimeCallback) for c in r.callbacks or ()):
        raise ValueError(
            "a DAEProblem's solve takes PresetTimeCallbacks (changes at given times) only, not yet "
            "ContinuousCallbacks: give the event's times, or write the problem as an ODEProblem with a mass_matrix"
        )
    if o["dense"] and r.callbacks:
        raise ValueError(
            "dense=True with callbacks is not supported: the state jumps at events; save at the times you need (saveat)"
        )
    sign = r.sign
    dtype = jnp.result_type(*jax.tree.leaves(r.u0), *jax.tree.leaves(eqx.filter(r.p, eqx.is_array)))
    example = jax.tree.map(lambda x: jnp.zeros(jnp.shape(x), dtype), r.u0)  # du, as F is traced with it
    g = r.integrand if sign > 0 or r.integrand is None else _in_reverse(r.integrand)
    F = VectorField.of(_in_time(prob.F, sign), r.u0, r.p, sign * r.t0, host=False, integrand=g, extra=(example,))
    field = DAEField(F, mass, float(rtol), float(atol))
    s0, s1, saves = forward_times(r, dtype)
    first = None if dt0 is None else jnp.asarray(dt0, dtype)
    steps = (float(rtol), float(atol), int(r.max_steps))
    setup = Setup(field, solver, s0, s1, saves, *steps, stepsize_controller=controller, dt0=first)
    u0 = jnp.asarray(F.u.ravel(r.u0), dtype)
    p = jnp.asarray(F.p.ravel(eqx.filter(r.p, eqx.is_array)), dtype)
    du0 = sign * jax.lax.stop_gradient(jnp.asarray(F.u.ravel(prob.du0), dtype))  # a guess: no derivative
    return _DAEStaged(setup, u0, p, F.u, F.q, prob, r, initialization, du0)


def _in_time(F: Callable, sign: int) -> Callable:
    """F as f(u, p, s, du) in the solve's forward time s = sign t: F(du, u, p, t), or F(-du, u, p, -s)."""
    if sign > 0:
        return lambda u, p, s, du: F(du, u, p, s)
    return lambda u, p, s, du: F(jax.tree.map(jnp.negative, du), u, p, -s)


class DAEField(AroundVectorField):
    """A fully implicit DAE as a kind of sciad's solve: `F` its residual F(u, p, t, du) on flat vectors (with an
    integrand g beside it: [F; g]), `mass` the split of ∂F/∂u' (`sciad._dae.MassMatrix`), and the tolerances
    its consistent u' is solved to. What the solve's `Setup` asks of its field: the consistent rate (`__call__`),
    the BDF's `terms`, and the sensealgs that serve (through the steps)."""

    F: VectorField
    mass: MassMatrix = eqx.field(static=True)
    rtol: float = eqx.field(static=True)
    atol: float = eqx.field(static=True)
    # the sensitivity DAE discretised on the same BDF steps is their derivative: ForwardSensitivity takes it
    sensitivities_through_steps: ClassVar[bool] = True
    steps_reversed: ClassVar[bool] = True  # reverse mode through the steps (DiscreteAdjoint) serves too
    host_engines_refused: ClassVar[str] = "a fully implicit DAE's solve takes JAX engines for its products"
    through_steps_only: ClassVar[str] = (
        "a fully implicit DAE (DAEProblem) is differentiated through its BDF steps: pass "
        "sensealg=sciad.ForwardDiffSensitivity(), sciad.DiscreteAdjoint(), sciad.ForwardSensitivity() or 'auto' "
        "(the continuous adjoints' adjoint DAE is not there yet for this form; an ODEProblem with a mass_matrix "
        "takes them)"
    )

    @property
    def integrand_size(self) -> int:
        return self.F.integrand_size

    @property
    def static_p(self):
        return self.F.static_p

    def with_closure(self, c, merged: bool) -> "DAEField":
        return dataclasses.replace(self, F=self.F.with_closure(c, merged))

    def with_products(self, backend) -> "DAEField":
        return dataclasses.replace(self, F=self.F.with_products(backend))

    def driving(self) -> tuple:
        return ()

    def driven(self, arrays, like) -> "DAEField":
        return self

    def open(self) -> Callable:
        return self.F.open()

    def _values(self, du, u, p, t):
        """[F(du, u); g(u)] (n + k,) in the field's dtype (an F that computes in a wider one is cast back)."""
        return self.F(u, p, t, self.u.unravel(du)).astype(self.dtype)

    def residual(self, dy, y, p, t):
        """The residual (n + k,) at the state y = (u, q) and its derivative dy: [F(du, u); dq − g(u)]."""
        n = self.u.size
        out = self._values(dy[:n], y[:n], p, t)
        return out if not self.integrand_size else jnp.concatenate([out[:n], dy[n:] - out[n:]])

    def __call__(self, u, p, t):
        """The consistent rate [u'; g(u)] (n + k,) at a consistent u (n,) (`sciad._dae.implicit_derivative`)."""
        n = self.u.size
        du = implicit_derivative(self.mass, self._equations(p), u, t, self.rtol, self.atol)
        if not self.integrand_size:
            return du
        return jnp.concatenate([du, self._values(du, u, p, t)[n:]])

    def _equations(self, p) -> Callable:
        """F(du, u, t) (n,) at the flat parameters p."""
        return lambda du, u, t: self._values(du, u, p, t)[: self.u.size]

    def terms(self, solver, vector_field, noise):
        """The residual as the BDF's term (`ResidualTerm`), its args the flat p."""
        if vector_field is not None or noise is not None:
            raise ValueError(self.through_steps_only)
        n = self.u.size
        return ResidualTerm(lambda t, y, dy, p: self.residual(dy, y, p, t), lambda t, y, p: self(y[:n], p, t))

    def initialised(self, mode: str, u0, du0, p, t0, what: str = "u0"):
        """u0 (n,) initialised from (u0, du0) at t0 in `mode` (`sciad._dae.initialise_implicit`)."""
        return initialise_implicit(mode, self.mass, self._equations(p), u0, du0, t0, self.rtol, self.atol, what)


@dataclasses.dataclass(frozen=True)
class _DAEStaged(Staged):
    setup: Setup
    u0: jax.Array
    p: jax.Array
    u: Layout
    q: Layout | None
    prob: DAEProblem
    request: Request
    initialization: str
    du0: jax.Array  # the problem's du0 (n,) in the solve's forward time

    def auto_sensealg(self) -> AbstractSensitivity:
        return self.choice().sensealg

    def choice(self):
        """ "auto"'s `sciad._auto.Choice` for this solve (its rule and why: `Choice.report()`)."""
        from sciad._auto import auto_dae_sensealg

        r, setup = self.request, self.setup
        return auto_dae_sensealg(r.u0, (r.p, setup.f.held), r.ts, solver=setup.solver, rtol=setup.rtol, atol=setup.atol)

    def prepared(self, sensealg: AbstractSensitivity) -> tuple[Setup, jax.Array]:
        setup = self.setup
        return setup, setup.f.initialised(self.initialization, self.u0, self.du0, self.p, setup.t0)

    def plan(self):
        r, mode, field = self.request, self.initialization, typing.cast(DAEField, self.setup.f)
        callbacks = [dataclasses.replace(c, affect=_reinitialising(c.affect, field, mode, r.sign)) for c in r.callbacks]
        return events.Plan.of(callbacks, field, r.u0, r.p, (r.t0, r.t1), r.sign, r.max_events)

    def extras(self, setup: Setup, sensealg: AbstractSensitivity, u0: jax.Array) -> dict[str, Any]:
        if not self.request.options["dense"]:
            return {}
        return {"interpolation": DenseOutput.of(setup, sensealg, u0, self.p, self.request.sign)}


def _reinitialising(affect: Callable, field: DAEField, mode: str, sign: int) -> Callable:
    """`affect(u, p, t)` followed by the initialisation in `mode` at the event time (its algebraic states
    re-solved from the differential ones, or checked), `field` in the solve's forward time s = sign t."""
    F = field.F

    def after(u, p, t):
        v = F.u.ravel(affect(u, p, t)).astype(F.dtype)
        params = F.p.ravel(eqx.filter(p, eqx.is_array)).astype(F.dtype)
        s = sign * jnp.asarray(t, F.dtype)
        return F.u.unravel(field.initialised(mode, v, jnp.zeros_like(v), params, s, events.AFFECTED))

    return after
