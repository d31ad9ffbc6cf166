"""`solver="auto"`: a solver chosen from what is known at trace time.

- A mass matrix (M u' = f) → Rodas5P, the default solver that takes one.
- Otherwise stiff or not, from a stiffness estimate on concrete values: the spectral radius ρ of
  ∂f/∂u by `ITERATIONS` power iterations of Jacobian-vector products (nothing n × n formed), at
  (u0, p, t0) and where an explicit solver's first step would take u0 (Hairer's starting step
  h0 = 0.01 ‖u0‖/‖f(u0)‖ in the error norm: f's Jacobian at u0 itself can hide the stiffness, as
  Robertson's does, its stiff couplings zero while two concentrations are). An explicit method's
  steps are bounded by stability alone to |hρ| ≲ 3 (Tsit5's and Dopri5's real stability interval
  is about [−3.5, 0]), so it needs about S = ρ |t1 − t0| / 3 steps whatever the tolerance; the
  problem is stiff when S exceeds `stiff_steps`: `STIFF_STEPS` at rtol = 1e-6, twice that per
  1,000× tighter rtol (both methods' accuracy steps grow), and by (n/`DENSE_STATES`)² more for
  dense stage solves on n > `DENSE_STATES` states (a Jacobian of n JVPs and an n³ LU per step).
  Stiff → "rodas5p" (one Jacobian and one LU of W per step, its stage solves dense or sparse as
  `jacobian` says; measured fastest of sciad's stiff solvers on the 2-D Brusselator, 512-8,192
  states: Kvaerno5 about 2x slower, SUNDIALS CVODES 1.4-7x slower on the forward solve). Not
  stiff → "tsit5".
- The estimate reads concrete values: the solve's u0, p and time span where they are concrete,
  else the problem's own (`prob.u0`, `prob.p`, `prob.tspan`: concrete under the caller's
  `jax.jit` unless the problem itself is traced). With none concrete, or an f that closes over
  traced values, there is nothing to measure: "tsit5", and the reason says so.

Calibration (forward solves, Tsit5 against Rodas5P, jit-compiled, median of 5; a 2-core machine
loaded by other processes, load average 5-7, so ratios within 2x are noise): Van der Pol
(μ = 3-300, t ≤ 10) and `sciad.problems.brusselator_pde(4-12)` (32-288 states). Rodas5P wins from
S ≈ 300 at rtol = 1e-6 (Van der Pol S = 300: 1.1x; S = 1,000: 4.5x; Brusselator 72 states,
S = 590: 1.6x; 32 states, S = 239: 0.9x), from S ≈ 150-300 at rtol = 1e-3 (S = 100: 0.2x; S = 239-300:
1.7-1.8x) and S ≈ 600-1,200 at 1e-9 (Van der Pol S = 300: 0.3x, S = 1,000: 1.7x; Brusselator
128 states, S = 1,240: 0.5x). Dense stage solves on 200 states lose at S = 2,020 (Tsit5 26 ms,
Rodas5P 73 ms at 1e-6; its sparse stage solves 19-42 ms).
"""

from typing import NamedTuple

import jax
import jax.flatten_util as jfu
import jax.numpy as jnp
import numpy as np

from sciad._stiff import auto_jacobian
from sciad._rosenbrock import Rodas5P

ITERATIONS = 12  # power iterations per point: ρ's size to within a factor of about 2 (a threshold's precision)
STABILITY_INTERVAL = 3.0  # |hλ| an explicit Runge–Kutta method's error control keeps to on a stiff mode
STIFF_STEPS = 300  # stiff at rtol = 1e-6: more steps than this for stability alone (ρ |t1 − t0| / 3)
DENSE_STATES = 64  # dense stage solves beyond this many states raise the bar by (n / DENSE_STATES)²


class Stiffness(NamedTuple):
    """ρ, the estimated spectral radius of ∂f/∂u, and `steps` = ρ |t1 − t0| / `STABILITY_INTERVAL`:
    an explicit method's steps for stability alone."""

    rho: float
    steps: float


class SolverPick(NamedTuple):
    """`solver="auto"`'s answer: a name in `sciad._solve.SOLVERS` and why."""

    name: str
    reason: str


def stiff_steps(rtol: float, states: int, stages: str) -> float:
    """The steps for stability alone beyond which a problem is stiff at `rtol`, on `states` states
    whose implicit stages would be solved as `stages` ("dense", "sparse", "matrix-free")."""
    dense = max(1.0, states / DENSE_STATES) ** 2 if stages == "dense" else 1.0
    return STIFF_STEPS * (1e-6 / rtol) ** 0.1 * dense


def auto_solver(prob, u0, p, tspan, *, rtol: float, atol: float, jacobian="auto") -> SolverPick:
    """The solver for `prob` (an `ODEProblem`) solved from `u0` with `p` over `tspan` = (t0, t1)
    (each concrete or traced), at tolerances `rtol`, `atol`, its implicit stages solved as
    `jacobian` says (as in `sciad.solve`)."""
    n = sum(int(np.size(x)) for x in jax.tree.leaves(prob.u0))
    if prob.mass_matrix is not None:
        return SolverPick("rodas5p", f"a mass matrix (M u' = f, {n} states): Rodas5P, a Rosenbrock solver that takes M")
    given = (u0, p, tspan)
    values = [x if _concrete(x) else own for x, own in zip(given, (prob.u0, prob.p, prob.tspan))]
    if not all(map(_concrete, values)):
        return SolverPick("tsit5", "nothing concrete to estimate stiffness from (u0, p or the time span traced, the "
                          "problem's own too): Tsit5; pass solver=\"rodas5p\" for a stiff problem")
    est = stiffness(prob.f, *values, rtol=rtol, atol=atol)
    if est is None or np.isnan(est.rho):
        why = ("f closes over traced values, so its Jacobian cannot be estimated while tracing" if est is None else
               "f or its Jacobian-vector products give NaN at u0, so its stiffness cannot be estimated")
        return SolverPick("tsit5", f"{why}: Tsit5; pass solver=\"rodas5p\" for a stiff problem")
    if isinstance(jacobian, str) and jacobian == "auto":
        stages, why = auto_jacobian(Rodas5P(), prob.f, values[0], values[1], values[2][0])
    else:
        stages, why = (jacobian if isinstance(jacobian, str) else jacobian.kind), "given"
    bar = stiff_steps(rtol, n, stages)
    source = "" if all(v is x for v, x in zip(values, given)) else " (the problem's own u0, p, tspan where traced)"
    measured = (f"ρ(∂f/∂u) ≈ {est.rho:.3g}{source}: an explicit method needs about ρ|t1 − t0|/3 ≈ {est.steps:.3g} "
                f"steps for stability alone; stiff beyond {bar:.3g} (rtol {rtol:g}, {n} states, {stages} stage solves"
                + (f": {why})" if n > DENSE_STATES else ")"))
    if est.steps <= bar:
        return SolverPick("tsit5", f"not stiff: {measured}: Tsit5, explicit")
    return SolverPick("rodas5p", f"stiff: {measured}: Rodas5P, linearly implicit")


def stiffness(f, u0, p, tspan, *, rtol: float, atol: float) -> Stiffness | None:
    """The `Stiffness` of u' = f(u, p, t) from concrete u0, p and tspan = (t0, t1): ρ the larger of
    the estimates at (u0, t0) and one explicit Euler step of Hairer's starting size h0 on (at
    tolerances `rtol`, `atol`), computed by one compiled program (about as costly to compile as
    f's JVP); None where f closes over traced values."""
    t0, t1 = (float(t) for t in tspan)
    with jax.ensure_compile_time_eval():  # concrete values: computed now, also inside a caller's trace
        flat, unravel = jfu.ravel_pytree(u0)

    def rate(x, t):
        return jfu.ravel_pytree(f(unravel(x), p, t))[0]

    def estimate(x):
        dx = rate(x, t0)
        scale = atol + rtol * jnp.abs(x)
        d0, d1 = (jnp.sqrt(jnp.mean(jnp.square(y / scale))) for y in (x, dx))
        h0 = jnp.where((d0 > 1e-5) & (d1 > 1e-5), 0.01 * d0 / jnp.where(d1 > 0, d1, 1.0), 1e-6 * abs(t1 - t0))
        step = np.sign(t1 - t0) * jnp.minimum(h0, abs(t1 - t0))
        return jnp.maximum(_spectral_radius(rate, x, t0), _spectral_radius(rate, x + step * dx, t0 + step))

    with jax.ensure_compile_time_eval():
        rho = jax.jit(estimate)(flat) if flat.size else jnp.zeros(())
    if not _concrete(rho):
        return None
    rho = float(rho)
    return Stiffness(rho, rho * abs(t1 - t0) / STABILITY_INTERVAL)


def _spectral_radius(rate, x, t):
    """ρ(∂rate/∂x) at (x, t) (traced) by `ITERATIONS` power iterations of JVPs from a fixed random
    start: the geometric mean of the growth over the latter half (a complex or clustered dominant
    pair does not converge to one vector; its growth does)."""
    v = np.random.default_rng(0).standard_normal(x.shape)
    v = jnp.asarray(v / np.linalg.norm(v), x.dtype)

    def power(i, carry):
        v, logs = carry
        w = jax.jvp(lambda y: rate(y, t), (x,), (v,))[1]
        norm = jnp.linalg.norm(w)
        return jnp.where(norm > 0, w / jnp.where(norm > 0, norm, 1), v), logs.at[i].set(jnp.log(norm))

    logs = jax.lax.fori_loop(0, ITERATIONS, power, (v, jnp.zeros(ITERATIONS, x.dtype)))[1]
    return jnp.exp(jnp.mean(logs[ITERATIONS // 2:]))


def _concrete(tree) -> bool:
    """Whether every leaf of `tree` is a concrete value (no JAX tracer)."""
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))
