"""`solver="auto"` (`sciad.solve`'s default): a solver chosen from what is known at trace time.

- A mass matrix (M u' = f) → Rodas5P, the solver that takes one.
- Otherwise stiff or not, from a stiffness estimate on concrete values: the dominant eigenvalue
  (or complex pair) of ∂f/∂u, by `sciad._stability.ITERATIONS` power iterations of Jacobian-vector products
  (nothing n × n formed) and the Ritz values on the span of the last two iterates, at (u0, p, t0)
  and where an explicit method's first step would take u0 (Hairer's starting step
  h0 = 0.01 ‖u0‖/‖f(u0)‖ in the error norm: f's Jacobian at u0 itself can hide the stiffness, as
  Robertson's does, its stiff couplings zero while two concentrations are).
- A mode λ = −a + ib (a > 0) decays below the tolerance after τ = ln(1/rtol)/a; from then on it is
  dormant, and an explicit method's steps are bounded by stability alone to |hλ| ≲ 3 (Tsit5's and
  Dopri5's stability regions reach about 3.5 along the real axis, 3.3 along the imaginary one):
  about S = |λ| (|t1 − t0| − τ) / 3 steps that accuracy does not ask for. A mode that does not
  decay (an oscillation, a growing mode) is active throughout: resolving it is the accuracy's own
  work, which an implicit method must do as well, so it adds nothing to S. The problem is stiff
  when S, the larger over the Ritz values, exceeds `stiff_steps`: `STIFF_STEPS` on few states,
  whatever the tolerance (Rodas5P's step costs a fixed overhead there); on n > `SMALL_STATES`
  states its step costs more in proportion to n (a Jacobian of n JVPs, or of its colours, and an
  LU), more so at tight tolerances (its accuracy steps grow faster than Tsit5's stability-bound
  ones): the bar is `STIFF_STEPS` × n/`SMALL_STATES` × (1e-6/rtol)^0.15 where that is larger, the
  factor n/`SMALL_STATES` at most `SPARSE_GROWTH` for sparse or matrix-free stage solves (their
  cost per state does not grow with n; not measured beyond 288 states).
  Stiff → "rodas5p" (one Jacobian and one LU of W per step, its stage solves dense or sparse as
  `jacobian` says); not stiff → "tsit5".
- The estimate reads concrete values: the solve's u0, p and time span where they are concrete,
  else the problem's own (`prob.u0`, `prob.p`, `prob.tspan`: concrete under the caller's
  `jax.jit` unless the problem itself is traced). With none concrete, or an f that closes over
  traced values, there is nothing to measure: "tsit5", and the reason says so.
- It runs as one compiled program per f's content (its jaxpr's text and constants, never f
  itself), held by JAX's own cache of `jax.jit`: a solve called again, or a new f with the same
  program, compiles nothing for it.

Calibration against measured times (Tsit5 and Rodas5P, interleaved): experiments/solver_choice.py,
its results in experiments/solver_choice.md.
"""

import functools
import hashlib
import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.core
import jax.flatten_util as jfu
import jax.numpy as jnp
import numpy as np

from sciad._rosenbrock import Rodas5P
from sciad._stability import STABILITY_STEPS_MIN, power_iterates, ritz_values
from sciad._stiff import auto_jacobian

STABILITY_INTERVAL = 3.0  # |hλ| an explicit Runge–Kutta method's error control keeps to on a dormant mode
STIFF_STEPS = 400  # stiff on few states: more steps than this for stability alone
SMALL_STATES = 32  # beyond this many states Rodas5P's step costs more than Tsit5's in proportion to n
SPARSE_GROWTH = 8  # the most that n raises the bar by with sparse or matrix-free stage solves


class Stiffness(NamedTuple):
    """From the Ritz values of ∂f/∂u at u0 and after an explicit first step: `rho`, the largest
    modulus (the spectral radius's estimate), and `steps`, the most an explicit method would take
    for stability alone on a decayed mode (the module docstring's S)."""

    rho: float
    steps: float


class SolverPick(NamedTuple):
    """`solver="auto"`'s answer: a name in `sciad._solve.SOLVERS`, why, and the `Stiffness` it
    estimated (None where it made none)."""

    name: str
    reason: str
    stiffness: Stiffness | None = None


def stiff_steps(rtol: float, states: int, stages: str) -> float:
    """The steps for stability alone beyond which a problem is stiff at `rtol`, on `states` states
    whose implicit stages would be solved as `stages` ("dense", "sparse", "matrix-free")."""
    size = states / SMALL_STATES if stages == "dense" else min(states / SMALL_STATES, SPARSE_GROWTH)
    return STIFF_STEPS * max(1.0, size * (1e-6 / rtol) ** 0.15)


def auto_solver(prob, u0, p, tspan, *, rtol: float, atol: float, jacobian="auto") -> SolverPick:
    """The solver for `prob` (an `ODEProblem`) solved from `u0` with `p` over `tspan` = (t0, t1)
    (each concrete or traced), at tolerances `rtol`, `atol`, its implicit stages solved as
    `jacobian` says (as in `sciad.solve`)."""
    n = sum(int(np.size(x)) for x in jax.tree.leaves(prob.u0))
    if prob.mass_matrix is not None:
        return SolverPick("rodas5p", f"a mass matrix (M u' = f, {n} states): Rodas5P, a Rosenbrock solver that takes M")
    est, values = estimate(prob, u0, p, tspan, rtol=rtol, atol=atol)
    if isinstance(est, str):
        return SolverPick("tsit5", f'{est}: Tsit5; pass solver="rodas5p" for a stiff problem')
    if isinstance(jacobian, str) and jacobian == "auto":
        stages, why = auto_jacobian(Rodas5P(), prob.f, values[0], values[1], values[2][0])
    else:
        stages, why = (jacobian if isinstance(jacobian, str) else jacobian.kind), "given"
    bar = stiff_steps(rtol, n, stages)
    source = (
        "" if all(v is x for v, x in zip(values, (u0, p, tspan))) else " (the problem's own u0, p, tspan where traced)"
    )
    measured = (
        f"ρ(∂f/∂u) ≈ {est.rho:.3g}{source}: an explicit method needs about {est.steps:.3g} steps for "
        f"stability alone on decayed modes (|λ|(|t1 − t0| − ln(1/rtol)/|Re λ|)/3); stiff beyond "
        f"{bar:.3g} (rtol {rtol:g}, {n} states, {stages} stage solves" + (f": {why})" if n > SMALL_STATES else ")")
    )
    if est.steps <= bar:
        return SolverPick("tsit5", f"not stiff: {measured}: Tsit5, explicit", est)
    return SolverPick("rodas5p", f"stiff: {measured}: Rodas5P, linearly implicit", est)


def choose(
    prob, solver, u0, p, tspan, *, rtol: float, atol: float, jacobian, implicit, stiffness: bool = True
) -> tuple:
    """(the solver: `solver`, or for "auto" (or None) `auto_solver`'s name; why; for an explicit solver
    whether the problem is stiff for it, `stiff_for_explicit`, None where not estimated or where
    `stiffness` is not asked for). `implicit(solver) -> bool` says whether the chosen solver is implicit."""
    if solver is None or (isinstance(solver, str) and solver == "auto"):
        solver, why, est = auto_solver(prob, u0, p, tspan, rtol=rtol, atol=atol, jacobian=jacobian)
    else:
        why, est = "given", None
    if stiffness and est is None and prob.mass_matrix is None and not implicit(solver):
        est = estimate(prob, u0, p, tspan, rtol=rtol, atol=atol)[0]
    return solver, why, stiff_for_explicit(est)


def stiff_for_explicit(est) -> bool | None:
    """Whether an explicit solver's steps would be held at its stability limit long enough that
    derivatives through them lose their accuracy (`STABILITY_STEPS_MIN` steps for stability alone),
    from `estimate`'s answer (None where it made none)."""
    return est.steps >= STABILITY_STEPS_MIN if isinstance(est, Stiffness) else None


def estimate(prob, u0, p, tspan, *, rtol: float, atol: float) -> tuple:
    """(the `Stiffness` of `prob` from u0, p and tspan = (t0, t1) where concrete, else the problem's
    own, or why none can be made (a str); the values (u0, p, tspan) it was made from)."""
    values = [x if _concrete(x) else own for x, own in zip((u0, p, tspan), (prob.u0, prob.p, prob.tspan))]
    if not all(map(_concrete, values)):
        return (
            "nothing concrete to estimate stiffness from (u0, p or the time span traced, the problem's own too)"
        ), values
    est = stiffness(prob.f, *values, rtol=rtol, atol=atol)
    if est is None:
        return "f closes over traced values, so its Jacobian cannot be estimated while tracing", values
    if np.isnan(est.rho):
        return "f or its Jacobian-vector products give NaN at u0, so its stiffness cannot be estimated", values
    return est, values


def stiffness(f, u0, p, tspan, *, rtol: float, atol: float) -> Stiffness | None:
    """The `Stiffness` of u' = f(u, p, t) from concrete u0, p and tspan = (t0, t1) at tolerances
    `rtol`, `atol` (the module docstring); None where f closes over traced values."""
    t0, t1 = (float(t) for t in tspan)
    with jax.ensure_compile_time_eval():  # concrete values: computed now, also inside a caller's trace
        flat, unravel = jfu.ravel_pytree(u0)
        if not flat.size:
            return Stiffness(0.0, 0.0)
        dynamic, static = eqx.partition(p, eqx.is_array)

        def rate(x, dynamic, t):
            return jfu.ravel_pytree(f(unravel(x), eqx.combine(dynamic, static), t))[0]

        closed = jax.make_jaxpr(rate)(flat, dynamic, jnp.asarray(t0, flat.dtype))
        if not _concrete(closed.consts):
            return None
        scalars = (np.asarray(x, flat.dtype) for x in (t0, t1, rtol, atol))
        args = (flat, dynamic, *scalars)
        values = np.asarray(_dominant_program(_Rate(closed), _shapes(args))(*args)).ravel()
    if not np.all(np.isfinite(values)):
        return Stiffness(math.nan, math.nan)
    decay = np.maximum(-values.real, 0.0)  # pyright: ignore[reportAttributeAccessIssue]  # NumPy's stubs
    dormant = np.maximum(abs(t1 - t0) - np.log(1 / rtol) / np.where(decay > 0, decay, 1.0), 0.0) * (decay > 0)
    return Stiffness(float(np.abs(values).max()), float(np.max(np.abs(values) * dormant) / STABILITY_INTERVAL))


class _Rate:
    """f on flat vectors as a static part of a JAX program: its closed jaxpr, equal (and hashing
    equal) for equal text and constants, so JAX's cache of a program compiled for it is keyed on
    f's content and holds no user's function."""

    def __init__(self, closed):
        self.closed = closed
        self.key = (str(closed.jaxpr), *map(_const_key, closed.consts))

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, _Rate) and self.key == other.key

    def __call__(self, x, dynamic, t):
        out = jax.core.eval_jaxpr(self.closed.jaxpr, self.closed.consts, x, *jax.tree.leaves(dynamic), t)[0]
        return out.astype(x.dtype)  # in u0's dtype, whatever p's


def _const_key(value) -> tuple:
    concrete = np.asarray(value)
    return concrete.dtype.str, concrete.shape, hashlib.blake2b(concrete.tobytes(), digest_size=16).digest()


# XLA's options for a program whose compile time is its cost (it runs once per problem, in microseconds): its
# optimisations off and the older, faster-compiling fusion code generator (a third of the default compile time).
FAST_COMPILE = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
    "xla_cpu_use_fusion_emitters": False,
}


def _shapes(args) -> tuple:
    """`args`' structure and leaves' shapes and dtypes: a hashable key."""
    leaves, treedef = jax.tree.flatten(args)
    return treedef, tuple(jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)) for x in leaves)


@functools.lru_cache(maxsize=64)
def _dominant_program(rate: "_Rate", shapes: tuple):
    """`_dominant` for `rate` (keyed on f's content) at arguments of `shapes` (`_shapes`), compiled for compile
    time (`FAST_COMPILE`)."""
    treedef, leaves = shapes
    args = jax.tree.unflatten(treedef, leaves)
    return jax.jit(functools.partial(_dominant, rate)).trace(*args).lower().compile(compiler_options=FAST_COMPILE)


def _dominant(rate: _Rate, x, dynamic, t0, t1, rtol, atol):
    """The dominant eigenvalue (or complex pair) of ∂rate/∂x, `ritz_values` (2, 2) complex, at (x, t0)
    and one explicit Euler step of Hairer's starting size h0 on (at tolerances `rtol`, `atol`)."""
    dx = rate(x, dynamic, t0)
    scale = atol + rtol * jnp.abs(x)
    d0, d1 = (jnp.sqrt(jnp.mean(jnp.square(y / scale))) for y in (x, dx))
    h0 = jnp.where((d0 > 1e-5) & (d1 > 1e-5), 0.01 * d0 / jnp.where(d1 > 0, d1, 1.0), 1e-6 * jnp.abs(t1 - t0))
    step = jnp.sign(t1 - t0) * jnp.minimum(h0, jnp.abs(t1 - t0))

    def rate_at(y, t):
        return rate(y, dynamic, t)

    return jnp.stack(
        [ritz_values(*power_iterates(rate_at, x, t0)), ritz_values(*power_iterates(rate_at, x + step * dx, t0 + step))]
    )


def _concrete(tree) -> bool:
    """Whether every leaf of `tree` is a concrete value (no JAX tracer)."""
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))
