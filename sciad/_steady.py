"""`steady_state`: u* with f(u*, p, t) = 0, by pseudo-transient continuation and Newton, differentiable."""

import functools
from typing import Any

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx
from jaxtyping import Array, ArrayLike, PyTree

from sciad._dae import dae_solver, default_solver, initialise
from sciad._errors import error_if, raising_solve_errors
from sciad._ode import ODEProblem, get_solver
from sciad._problem import check_inputs, check_tolerances
from sciad._vector_field import VectorField
from sciad.adjoints._base import solver_failure, step_controller
from sciad.adjoints._registry import refusal
from sciad.adjoints._steady import SteadyStateAdjoint, is_singular, jacobian_solve

NEWTON_STEPS = 10  # Newton iterations at most after the time stepping (from there it takes 1 to 3)

NO_STEADY_STATE = (
    "no steady state was found within max_steps={} time steps: the solution of u' = f(u, p, t) "
    "did not settle (RMS ‖f(u)‖ ≤ atol + rtol ‖u‖); it may oscillate (a limit cycle), diverge, or "
    "approach a steady state that is unstable (time stepping finds stable ones only) or very slowly: "
    "pass a larger max_steps or an initial guess u0 nearer the steady state"
)
SINGULAR = (
    "the Jacobian ∂f/∂u is singular at the steady state found, so it is not isolated and neither it nor "
    "its gradient is defined: a conserved quantity (e.g. a total Σu that f leaves unchanged) makes the "
    "steady states a family; eliminate one state with it, or replace one equation of f by the constraint "
    "(e.g. Σu = total). Where f does not change with u (u' = c, drift) there is no steady state at all"
)
NO_CONVERGENCE = (
    f"Newton's method did not converge in {NEWTON_STEPS} iterations from the time-stepped state: "
    "∂f/∂u is nearly singular there, or rtol and atol ask for more than the precision allows: pass "
    "larger ones"
)


class SteadyState(eqx.Module):
    """`u`: the steady state (u0's structure); `stats`: `steps` (time steps to settle),
    `newton_iterations` (integers) and `residual`, RMS ‖f(u)‖ at the steady state returned."""

    u: PyTree[Array]
    stats: dict[str, Any]


@raising_solve_errors
def steady_state(
    prob: ODEProblem,
    *,
    u0: PyTree[ArrayLike] | None = None,
    p: PyTree[Any] = None,
    sensealg: SteadyStateAdjoint | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-6,
    max_steps: int = 4096,
    solver: str | dfx.AbstractSolver | None = None,
) -> SteadyState:
    """The steady state u* of `prob`'s f: f(u*, p, t) = 0 with t = prob.tspan[1] held fixed (f is
    meant to be autonomous there; SciML's t = ∞ can turn t-dependent terms into NaN), the one
    that u settles into from the initial guess u0 (default prob.u0).

    Found by pseudo-transient continuation: u' = f(u, p, t) is stepped in pseudo-time from u0 by
    `solver` (a name in `sciad.SOLVERS` or a diffrax solver of one ODE term; default Kvaerno5,
    implicit: step sizes grow as u settles; with a mass matrix, M u' = f by Rodas5P from u0 with its
    algebraic states solved first, so f = 0 holds with the algebraic rows throughout) until
    RMS ‖f(u)‖ ≤ atol + rtol ‖u‖ (diffrax's
    steady-state event), then polished by Newton's method until its last step δ has
    RMS ‖δ‖ ≤ atol + rtol ‖u‖ (u is then within the tolerances of the root). Time stepping finds
    stable steady states only (those u settles into); that makes it robust from a poor guess where
    Newton alone diverges.

    Differentiable (jax.grad, jax.jvp, jax.hessian; under jax.jit and jax.vmap) in `p` (a PyTree
    like the problem's) and the values f closes over, by `sensealg` (default
    `SteadyStateAdjoint()`, the implicit function theorem; its `linear_solver` also solves the
    Newton steps); the derivative in u0 is zero.

    Checked at the call (errors naming the argument and the fix): `prob`, `u0` and `p` as in
    `sciad.solve` (`check_inputs`: structures, float leaves, concrete values finite), the
    tolerances and `max_steps`, and `sensealg` (a `SteadyStateAdjoint` instance; for one of
    diffrax's adjoints the error names sciad's equivalent). While it runs it raises
    `sciad.SolveError` when traced u0 or p hold NaN or inf (naming the leaf), when no steady state
    is reached within `max_steps` time steps, or when ∂f/∂u is singular there (dense solves: e.g. a
    conserved quantity; Krylov solves report failing to converge): as itself where this call runs
    eagerly (also in an eager `jax.grad`'s backward pass), inside JAX's runtime error under a
    user's `jax.jit` (`sciad.SolveError` says how to read it).
    """
    if not isinstance(prob, ODEProblem):
        raise TypeError(f"prob must be a sciad.ODEProblem, got {type(prob).__name__}")
    u0, p = check_inputs(prob, u0, p)
    check_tolerances(rtol, atol, max_steps)
    if sensealg is None:
        sensealg = SteadyStateAdjoint()
    if not isinstance(sensealg, SteadyStateAdjoint):
        raise ValueError(refusal(sensealg, steady=True))
    t = prob.tspan[1]
    field = VectorField.of(prob.f, u0, p, t, host=any(not e.traced for e in sensealg.engines()))
    u0_flat = jnp.asarray(field.u.ravel(u0), field.dtype)
    p_flat = jnp.asarray(field.p.ravel(eqx.filter(p, eqx.is_array)), field.dtype)
    mass = prob.mass_matrix
    solver = dae_solver(get_solver(default_solver(mass, "kvaerno5") if solver is None else solver), mass)
    find = functools.partial(
        _find, solver=solver, mass=mass, t=t, rtol=float(rtol), atol=float(atol), max_steps=int(max_steps)
    )
    u, stats = sensealg.solve(field, find, u0_flat, p_flat, t=t, rtol=float(rtol), atol=float(atol))
    counts = stats[:2].astype(jnp.int32)
    return SteadyState(field.u.unravel(u), {"steps": counts[0], "newton_iterations": counts[1], "residual": stats[2]})


def _find(field: VectorField, u0, p, linear, *, solver, mass, t, rtol, atol, max_steps):
    """(u* (n,), stats (3,): time steps, Newton iterations, RMS ‖f(u*)‖) from u0 (n,) at p (m,):
    time stepping (of M u' = f from a consistent u0 with a mass matrix M), then Newton with the
    systems solved by `linear` ("dense" or a lineax solver)."""
    u0 = initialise("consistent", field, mass, u0, p, t, rtol, atol)  # u0 itself without a singular M
    term = dfx.ODETerm(lambda tau, u, p: field(u, p, t))
    sol = dfx.diffeqsolve(
        term,
        solver,
        0.0,
        jnp.inf,
        None,
        u0,
        args=p,
        event=dfx.Event(dfx.steady_state_event()),
        stepsize_controller=step_controller(solver, rtol, atol),
        max_steps=max_steps,
        throw=False,
    )
    settled = sol.result == dfx.RESULTS.event_occurred
    unsettled = sol.result == dfx.RESULTS.max_steps_reached
    u = error_if(sol.ys[-1], unsettled, NO_STEADY_STATE.format(max_steps))  # pyright: ignore[reportOptionalSubscript]  # saved: not None
    u = solver_failure(u, dfx.RESULTS.where(settled | unsettled, dfx.RESULTS.successful, sol.result), max_steps)
    residual = lambda u: field(u, p, t)  # noqa: E731
    basis = jnp.eye(u.shape[0], dtype=u.dtype)

    def newton(carry):
        u, k, _ = carry
        fu, jvp = jax.linearize(residual, u)
        jac = None
        if linear == "dense":
            jac = jax.vmap(jvp, out_axes=1)(basis)
            jac = error_if(jac, is_singular(jac), SINGULAR)
        delta = jacobian_solve(linear, -fu, matrix=jac, matvec=jvp)
        u = u + delta
        return u, k + 1, optx.rms_norm(delta) <= atol + rtol * optx.rms_norm(u)

    u, k, converged = jax.lax.while_loop(
        lambda c: ~c[2] & (c[1] < NEWTON_STEPS), newton, (u, jnp.zeros((), jnp.int32), jnp.zeros((), bool))
    )
    u = error_if(u, ~converged, NO_CONVERGENCE)
    return u, jnp.stack([sol.stats["num_steps"], k, optx.rms_norm(residual(u))]).astype(u.dtype)
