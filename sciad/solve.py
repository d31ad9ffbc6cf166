"""`solve`: integrate an `ODEProblem` with diffrax, differentiably by a chosen sensealg."""

from typing import Any

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sciad.adjoints import SENSEALGS, AbstractSensitivity, InterpolatingAdjoint
from sciad.adjoints.base import Setup, is_implicit
from sciad.problem import ODEProblem, check_saveat, check_vector

SOLVERS = {
    "tsit5": dfx.Tsit5,
    "dopri5": dfx.Dopri5,
    "dopri8": dfx.Dopri8,
    "bosh3": dfx.Bosh3,
    "kvaerno3": dfx.Kvaerno3,
    "kvaerno5": dfx.Kvaerno5,
}


class Solution(eqx.Module):
    """`ts` (T,), `us` (T, n); `stats` with `steps`, `accepted_steps`,
    `rejected_steps`, `function_evaluations` of the forward solve; with
    `dense=True`, `interpolation(t)` evaluates u at any t in tspan."""

    ts: jax.Array
    us: jax.Array
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
    if isinstance(sensealg, str) and sensealg in SENSEALGS:
        return SENSEALGS[sensealg]()
    raise ValueError(f"unknown sensealg {sensealg!r}; pass one of {sorted(SENSEALGS)} (an instance or its name)")


def _like(name: str, x, ref):
    x = check_vector(name, x)
    if x.shape != ref.shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)} but the problem's {name} has shape {tuple(ref.shape)}")
    return x


def _finite(name: str, x):
    """Non-finite values under jit: a runtime error instead of NaN gradients."""
    return eqx.error_if(x, ~jnp.all(jnp.isfinite(x)), f"{name} contains non-finite values (NaN or inf)")


def solve(prob: ODEProblem, *, u0=None, p=None, saveat=None, solver="tsit5", rtol=1e-6, atol=1e-6,
          sensealg=None, max_steps=4096, dense=False) -> Solution:
    """Solve `prob` and save u at `saveat` (default: t0 and t1).

    Differentiable (jax.grad, jax.vjp, jax.jvp, jax.jacfwd; under jax.jit and
    jax.vmap) with respect to `u0` (n,) and `p` (m,) passed here, by the rules
    of `sensealg` (default `InterpolatingAdjoint()`; `"auto"` picks one with
    `sciad.select_sensealg`; or any of `sciad.adjoints.SENSEALGS`, as an
    instance or its name). `solver` is a
    name in `SOLVERS` or a diffrax solver; steps are adaptive (PID control
    at `rtol`, `atol`). A solve that needs more than `max_steps` steps (default
    4096, as diffrax; it also sizes the stored interpolation) raises
    an error. With `dense=True` the solution carries an interpolant
    (differentiated by discretise-then-optimise).
    """
    if not isinstance(prob, ODEProblem):
        raise TypeError(f"prob must be a sciad.ODEProblem, got {type(prob).__name__}")
    u0 = prob.u0 if u0 is None else _like("u0", u0, prob.u0)
    p = prob.p if p is None else _like("p", p, prob.p)
    dtype = jnp.result_type(u0, p)
    u0, p = _finite("u0", jnp.asarray(u0, dtype)), _finite("p", jnp.asarray(p, dtype))
    for name, tol in (("rtol", rtol), ("atol", atol)):
        if not (np.isfinite(tol) and tol > 0):
            raise ValueError(f"{name} must be a positive number, got {tol}")
    if int(max_steps) < 1:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps}")
    t0, t1 = prob.tspan
    setup = Setup(prob.f, get_solver(solver), t0, t1, check_saveat(saveat, t0, t1), float(rtol), float(atol), int(max_steps))
    if isinstance(sensealg, str) and sensealg == "auto":  # decided from shapes and settings: works under jit
        from sciad.auto import auto_sensealg

        sensealg = auto_sensealg(u0, p, setup.ts, solver=setup.solver, rtol=rtol, atol=atol,
                                 max_steps=setup.max_steps).sensealg
    us, stats = _sensealg(sensealg).solve(setup, u0, p)
    evals = _evaluations_per_step(setup.solver)
    solution_stats = {
        "steps": stats[0], "accepted_steps": stats[1], "rejected_steps": stats[2],
        "function_evaluations": stats[0] * evals if evals else None,
    }
    interpolation = None
    if dense:
        interpolation = setup.forward(u0, p, dense=True, adjoint=dfx.RecursiveCheckpointAdjoint()).interpolation.evaluate
    return Solution(jnp.asarray(setup.ts, dtype), us, solution_stats, interpolation)


def _evaluations_per_step(solver) -> int | None:
    """f evaluations per step of an explicit Runge–Kutta solver (FSAL-aware); None otherwise."""
    tableau = getattr(solver, "tableau", None)
    if tableau is None or is_implicit(solver):
        return None
    return tableau.num_stages - (1 if tableau.fsal else 0)
