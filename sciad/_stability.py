"""Linear stability of explicit Runge–Kutta steps, and the spectral radius of a vector field.

An explicit method's step on u' = λu multiplies u by R(hλ), R the method's stability polynomial;
its steps are stable for hλ ∈ [−β, 0], β its real stability boundary. On a stiff problem the
step-size control keeps h near β/ρ, ρ the spectral radius of ∂f/∂u: the steps are then sized by
stability, not accuracy, and their linearisation, which differentiating through the steps applies
to tangents and cotangents, is not under the error control's feedback.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

ITERATIONS = 12  # power iterations: the dominant eigenvalue (pair) to within a few per cent

# An explicit solver's steps sit at its stability limit when it took fewer than this many times the
# steps stability alone needs (S, `stability_steps`): steps sized by accuracy on a problem with fast
# modes take many more (experiments/stiff_discrete.py: stiff problems 0.8-1.2 S, non-stiff ones 2.4 S and up).
STABILITY_LIMITED = 2.0
STABILITY_STEPS_MIN = 50  # fewer steps for stability alone than this: too few for the tangents to drift
# Fewer accepted steps than this cannot sit at the limit with S >= STABILITY_STEPS_MIN: a solve takes at
# least about S steps where its steps are stability-limited (0.79 S at the fewest, in the calibration).
STABILITY_CHECKED_STEPS = STABILITY_STEPS_MIN // 2


def stability_boundary(solver) -> float | None:
    """β: the largest x with |R(−y)| ≤ 1 for every y in [0, x], R the stability polynomial of the
    explicit Runge–Kutta `solver` (from its Butcher tableau); None for a solver without a single
    explicit tableau (implicit, IMEX, Euler)."""
    tableau = getattr(solver, "tableau", None)
    if getattr(tableau, "a_diagonal", 0) is not None or not hasattr(tableau, "a_lower"):
        return None
    return _boundary(tuple(tuple(map(float, row)) for row in tableau.a_lower), tuple(map(float, tableau.b_sol)))  # pyright: ignore[reportOptionalMemberAccess]  # an explicit RK's tableau


@functools.cache
def _boundary(a_lower: tuple, b: tuple) -> float:
    """β for the explicit tableau with strictly lower rows `a_lower` and weights `b` (hashable floats)."""
    s = len(b)
    a = np.zeros((s, s))
    for i, row in enumerate(a_lower):
        a[i + 1, : len(row)] = row
    # R(z) = 1 + Σ_k z^k bᵀ A^(k−1) 1 (A nilpotent: degree s)
    coefficients, power = [1.0], np.ones(s)
    for _ in range(s):
        coefficients.append(float(np.asarray(b) @ power))
        power = a @ power
    x = np.linspace(0.0, 4.0 * s, 40_000 * s)
    unstable = np.abs(np.polynomial.polynomial.polyval(-x, coefficients)) > 1 + 1e-12
    return float(x[np.argmax(unstable)]) if unstable.any() else float(x[-1])


def power_iterates(rate, x, t, iterations: int = ITERATIONS):
    """`iterations` power iterations of ∂rate/∂x at (x (n,), t) (traced) by Jacobian-vector products
    from a fixed random start: the last three unit iterates v (3, n) and the growths g (2,) with
    J v[i] = g[i] v[i + 1]."""
    jvp = jax.linearize(lambda y: rate(y, t), x)[1]
    start = np.random.default_rng(0).standard_normal(x.size)
    v = jnp.asarray(start / np.linalg.norm(start), x.dtype)

    def step(i, carry):
        a, b, v, g = carry
        w = jvp(v)
        norm = jnp.linalg.norm(w)
        return b, v, jnp.where(norm > 0, w / jnp.where(norm > 0, norm, 1.0), 0.0), jnp.stack([g[1], norm])

    a, b, v, g = jax.lax.fori_loop(0, iterations, step, (v, v, v, jnp.zeros(2, x.dtype)))
    return jnp.stack([a, b, v]), g


def ritz_values(v, g):
    """The Ritz values (2,) complex of J on span(v[0], v[1]) from `power_iterates`' iterates: the
    dominant eigenvalue or complex pair (v[0], v[1] nearly parallel, as a real dominant eigenvalue
    makes them: its Rayleigh quotient v[0]·J v[0] and 0). Closed form for the 2 × 2 projection (m with
    [v0 v1] m = [J v0, J v1], by Gram–Schmidt on the unit iterates), on any backend."""
    image = v[1:] * g[:, None]  # J v0, J v1
    r12 = v[0] @ v[1]
    w = v[1] - r12 * v[0]
    r22 = jnp.linalg.norm(w)
    spanned = r22 > 1e-6  # v0 and v1 span a plane (the iterates are unit vectors)
    q2 = w / jnp.where(spanned, r22, 1.0)
    row1 = (q2 @ image.T) / jnp.where(spanned, r22, 1.0)
    m = jnp.stack([v[0] @ image.T - r12 * row1, row1])
    rayleigh = v[0] @ image[0]
    m = jnp.where(spanned, m, jnp.array([[1.0, 0.0], [0.0, 0.0]], m.dtype) * rayleigh)
    half_trace, det = (m[0, 0] + m[1, 1]) / 2, m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0]
    root = jnp.sqrt((half_trace**2 - det).astype(jnp.result_type(m.dtype, jnp.complex64)))
    return jnp.stack([half_trace + root, half_trace - root])


SAMPLES = 8  # states along the solve at which ρ is estimated: u0 and up to this many saved ones


def stability_steps(rate, t0, t1, u0, ts, us, beta: float, rtol: float):
    """S = ∫ ρ dt / β over [t0, t1]: the steps an explicit method of real stability boundary β needs
    for stability alone on the modes that have decayed below `rtol`. At u0 (n,) and up to `SAMPLES`
    of the saved states us (T, n) at their times ts (T,) (increasing, inside [t0, t1]), ρ = |λ| of
    the dominant eigenvalue λ of ∂rate/∂u (`ritz_values`), counted for the part of the span after
    the mode decays (ln(1/rtol)/|Re λ|; an undamped oscillation counts nothing), integrated by the
    trapezoidal rule, held constant after the last save. `rate(u, t)` (n,). No derivative."""
    T = us.shape[0]
    picked = np.unique(np.linspace(0, T - 1, min(T, SAMPLES)).round().astype(int)) if T else np.zeros(0, int)
    times = jnp.concatenate([jnp.reshape(t0, (1,)), jnp.asarray(ts)[picked]]).astype(u0.dtype)
    states = jnp.concatenate([u0[None], us[picked]])
    times, states = jax.lax.stop_gradient((times, states))
    span = jax.lax.stop_gradient(t1 - t0)

    def dormant(x, t):
        values = ritz_values(*power_iterates(rate, x, t))
        decay = jnp.maximum(-values.real, 0.0)
        after = jnp.maximum(span - np.log(1 / rtol) / jnp.where(decay > 0, decay, 1.0), 0.0) * (decay > 0)
        return jnp.max(jnp.abs(values) * after / jnp.where(span > 0, span, 1.0))

    rho = jax.vmap(dormant)(states, times)
    rho = jnp.where(jnp.isfinite(rho), rho, 0.0)
    inside = jnp.sum(jnp.diff(times) * (rho[1:] + rho[:-1]) / 2)
    return (inside + (jax.lax.stop_gradient(t1) - times[-1]) * rho[-1]) / beta
