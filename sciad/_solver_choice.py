"""`solver="auto"` (`sciad.solve`'s default): a solver chosen from what is known at trace time.

- A mass matrix (M u' = f) → Rodas5P, the solver that takes one.
- Otherwise stiff or not, from a stiffness estimate on concrete values: the dominant eigenvalue
  (or complex pair) of ∂f/∂u, by `ITERATIONS` power iterations of Jacobian-vector products
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

import hashlib
import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.flatten_util as jfu
import jax.numpy as jnp
import numpy as np

from sciad._stiff import auto_jacobian
from sciad._rosenbrock import Rodas5P

ITERATIONS = 12  # power iterations per point: the dominant eigenvalue (pair) to within a few per cent
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
    """`solver="auto"`'s answer: a name in `sciad._solve.SOLVERS` and why."""

    name: str
    reason: str


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
    measured = (f"ρ(∂f/∂u) ≈ {est.rho:.3g}{source}: an explicit method needs about {est.steps:.3g} steps for "
                f"stability alone on decayed modes (|λ|(|t1 − t0| − ln(1/rtol)/|Re λ|)/3); stiff beyond "
                f"{bar:.3g} (rtol {rtol:g}, {n} states, {stages} stage solves" + (f": {why})" if n > SMALL_STATES else ")"))
    if est.steps <= bar:
        return SolverPick("tsit5", f"not stiff: {measured}: Tsit5, explicit")
    return SolverPick("rodas5p", f"stiff: {measured}: Rodas5P, linearly implicit")


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
        vs, gs = map(np.asarray, _iterates(_Rate(closed), flat, dynamic, *scalars))
    if not (np.all(np.isfinite(vs)) and np.all(np.isfinite(gs))):
        return Stiffness(math.nan, math.nan)
    values = np.concatenate([_ritz(v, g) for v, g in zip(vs, gs)])
    decay = np.maximum(-values.real, 0.0)
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


@eqx.filter_jit
def _iterates(rate: _Rate, x, dynamic, t0, t1, rtol, atol):
    """`_power`'s iterates and growths of ∂rate/∂x at (x, t0) and one explicit Euler step of Hairer's
    starting size h0 on (at tolerances `rtol`, `atol`), stacked: (2, 3, n) and (2, 2)."""
    dx = rate(x, dynamic, t0)
    scale = atol + rtol * jnp.abs(x)
    d0, d1 = (jnp.sqrt(jnp.mean(jnp.square(y / scale))) for y in (x, dx))
    h0 = jnp.where((d0 > 1e-5) & (d1 > 1e-5), 0.01 * d0 / jnp.where(d1 > 0, d1, 1.0), 1e-6 * jnp.abs(t1 - t0))
    step = jnp.sign(t1 - t0) * jnp.minimum(h0, jnp.abs(t1 - t0))
    return jax.tree.map(lambda *a: jnp.stack(a), _power(rate, x, dynamic, t0),
                        _power(rate, x + step * dx, dynamic, t0 + step))


def _power(rate, x, dynamic, t):
    """`ITERATIONS` power iterations of ∂rate/∂x at (x, t) from a fixed random start: the last three
    unit iterates v (3, n) and the growths g (2,) with J v[i] = g[i] v[i + 1]."""
    jvp = jax.linearize(lambda y: rate(y, dynamic, t), x)[1]
    start = np.random.default_rng(0).standard_normal(x.size)
    v = jnp.asarray(start / np.linalg.norm(start), x.dtype)

    def step(i, carry):
        a, b, v, g = carry
        w = jvp(v)
        norm = jnp.linalg.norm(w)
        return b, v, jnp.where(norm > 0, w / jnp.where(norm > 0, norm, 1.0), 0.0), jnp.stack([g[1], norm])

    a, b, v, g = jax.lax.fori_loop(0, ITERATIONS, step, (v, v, v, jnp.zeros(2, x.dtype)))
    return jnp.stack([a, b, v]), g


def _ritz(v, g) -> np.ndarray:
    """The Ritz values (2,) of J on span(v[0], v[1]) from `_power`'s iterates (v[0], v[1] nearly
    parallel, as a real dominant eigenvalue makes them: one value and 0)."""
    basis, image = v[:2].T, v[1:].T * g
    return np.linalg.eigvals(np.linalg.lstsq(basis, image, rcond=1e-6)[0])


def _concrete(tree) -> bool:
    """Whether every leaf of `tree` is a concrete value (no JAX tracer)."""
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))
