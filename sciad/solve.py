"""`solve`: integrate an `ODEProblem` with diffrax, differentiably by a chosen sensealg."""

import warnings
from typing import Any

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sciad.adjoints import SENSEALGS, AbstractSensitivity, InterpolatingAdjoint, parse
from sciad.adjoints.base import Setup, is_implicit
from sciad.problem import ODEProblem, check_finite, check_inputs, check_saveat, check_tolerances
from sciad.vector_field import VectorField

SOLVERS = {
    "tsit5": dfx.Tsit5,
    "dopri5": dfx.Dopri5,
    "dopri8": dfx.Dopri8,
    "bosh3": dfx.Bosh3,
    "kvaerno3": dfx.Kvaerno3,
    "kvaerno5": dfx.Kvaerno5,
}


class Solution(eqx.Module):
    """`ts` (T,); `us`: u0's structure with a leading time axis (T, ...), like diffrax's `ys`;
    `stats` (integers) with `steps`, `accepted_steps`, `rejected_steps`, `function_evaluations`
    of the forward solve; with `dense=True`, `interpolation(t)` evaluates u (u0's structure) at any t in tspan."""

    ts: jax.Array
    us: Any
    stats: dict[str, Any]
    interpolation: Any = None


def get_solver(solver) -> dfx.AbstractSolver:
    """A diffrax solver: `solver` itself, or a new one by its name in `SOLVERS`."""
    if isinstance(solver, dfx.AbstractSolver):
        return solver
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {sorted(SOLVERS)} or pass a diffrax solver")
    return SOLVERS[solver]()


def _sensealg(sensealg) -> AbstractSensitivity:
    if sensealg is None:
        return InterpolatingAdjoint()
    if isinstance(sensealg, AbstractSensitivity):
        return sensealg
    if isinstance(sensealg, str) and sensealg.partition("(")[0].strip() in SENSEALGS:
        return parse(sensealg)  # a name, or any string `sciad.adjoints.describe` prints
    raise ValueError(f"unknown sensealg {sensealg!r}; pass one of {sorted(SENSEALGS)} (an instance or its name)")


def solve(prob: ODEProblem, *, u0=None, p=None, saveat=None, solver="tsit5", rtol=1e-6, atol=1e-6,
          sensealg=None, max_steps=4096, dense=False) -> Solution:
    """Solve `prob` and save u at `saveat` (default: t0 and t1; concrete or traced times (T,)).

    Differentiable (jax.grad, jax.vjp, jax.jvp, jax.jacfwd, jax.hessian; under jax.jit and
    jax.vmap) with respect to `u0` and `p` passed here (PyTrees like the problem's) and to
    values f closes over, by the rules of `sensealg` (default `InterpolatingAdjoint()`;
    `"auto"` picks one with `sciad.select_sensealg`; or any of `sciad.adjoints.SENSEALGS`, as an
    instance or its name). `solver` is a
    name in `SOLVERS` or a diffrax solver; steps are adaptive (PID control
    at `rtol`, `atol`). A solve that needs more than `max_steps` steps (default
    4096, as diffrax; it also sizes the stored interpolation) raises
    an error. With `dense=True` the solution carries an interpolant
    (differentiated by discretise-then-optimise).
    """
    if not isinstance(prob, ODEProblem):
        raise TypeError(f"prob must be a sciad.ODEProblem, got {type(prob).__name__}")
    u0, p = check_inputs(prob, u0, p)
    check_tolerances(rtol, atol, max_steps)
    t0, t1 = prob.tspan
    ts = check_saveat(saveat, t0, t1)
    if isinstance(sensealg, str) and sensealg == "auto":  # decided from shapes and settings: works under jit
        from sciad.auto import auto_sensealg

        sensealg = auto_sensealg(u0, p, ts, solver=get_solver(solver), rtol=rtol, atol=atol,
                                 max_steps=int(max_steps)).sensealg
    sensealg = _sensealg(sensealg)
    advice = sensealg.slow_for(int(sum(np.size(x) for x in jax.tree.leaves(u0))), is_implicit(get_solver(solver)))
    if advice:
        warnings.warn(advice, UserWarning, stacklevel=2)
    field = VectorField.of(prob.f, u0, p, t0, host=any(not e.traced for e in sensealg.engines()))
    dtype = field.dtype
    ts = jnp.asarray(ts, dtype)
    setup = Setup(field, get_solver(solver), t0, t1, ts, float(rtol), float(atol), int(max_steps))
    u0_flat = check_finite("u0", jnp.asarray(field.u.ravel(u0), dtype))
    p_flat = check_finite("p", jnp.asarray(field.p.ravel(eqx.filter(p, eqx.is_array)), dtype))
    us, stats = sensealg.solve(setup, u0_flat, p_flat)
    evals = _evaluations_per_step(setup.solver)
    steps = stats.astype(jnp.int32)
    solution_stats = {
        "steps": steps[0], "accepted_steps": steps[1], "rejected_steps": steps[2],
        "function_evaluations": steps[0] * evals if evals else None,
    }
    interpolation = None
    if dense:
        dense_sol = setup.forward(u0_flat, p_flat, dense=True, adjoint=dfx.RecursiveCheckpointAdjoint())
        interpolation = lambda t: field.u.unravel(dense_sol.interpolation.evaluate(t))  # noqa: E731
    return Solution(ts, jax.vmap(field.u.unravel)(us), solution_stats, interpolation)


def _evaluations_per_step(solver) -> int | None:
    """f evaluations per step of an explicit Runge–Kutta solver (FSAL-aware); None otherwise."""
    tableau = getattr(solver, "tableau", None)
    if tableau is None or is_implicit(solver):
        return None
    return tableau.num_stages - (1 if tableau.fsal else 0)
