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

ITERATIONS = 12  # power iterations: ρ's size to within a factor of about 2


def stability_boundary(solver) -> float | None:
    """β: the largest x with |R(−y)| ≤ 1 for every y in [0, x], R the stability polynomial of the
    explicit Runge–Kutta `solver` (from its Butcher tableau); None for a solver without a single
    explicit tableau (implicit, IMEX, Euler)."""
    tableau = getattr(solver, "tableau", None)
    if getattr(tableau, "a_diagonal", 0) is not None or not hasattr(tableau, "a_lower"):
        return None
    return _boundary(tuple(tuple(map(float, row)) for row in tableau.a_lower), tuple(map(float, tableau.b_sol)))


@functools.lru_cache(maxsize=None)
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


def spectral_radius(rate, x, t, iterations: int = ITERATIONS):
    """ρ(∂rate/∂x) at (x (n,), t) (traced) by power iterations of JVPs from a fixed random start: the
    geometric mean of the growth over the latter half (a complex or clustered dominant pair does not
    converge to one vector; its growth does)."""
    v = np.random.default_rng(0).standard_normal(x.shape)
    v = jnp.asarray(v / np.linalg.norm(v), x.dtype)

    def power(i, carry):
        v, logs = carry
        w = jax.jvp(lambda y: rate(y, t), (x,), (v,))[1]
        norm = jnp.linalg.norm(w)
        return jnp.where(norm > 0, w / jnp.where(norm > 0, norm, 1), v), logs.at[i].set(jnp.log(norm))

    logs = jax.lax.fori_loop(0, iterations, power, (v, jnp.zeros(iterations, x.dtype)))[1]
    return jnp.exp(jnp.mean(logs[iterations // 2:]))


SAMPLES = 8  # states along the solve at which ρ is estimated: u0 and up to this many saved ones


def stability_steps(rate, t0, t1, u0, ts, us, beta: float):
    """S = ∫ ρ(∂rate/∂u) dt / β over [t0, t1]: the steps an explicit method of real stability
    boundary β needs for stability alone. ρ is estimated at u0 (n,) and at up to `SAMPLES` of the
    saved states us (T, n) at their times ts (T,) (increasing, inside [t0, t1]), and integrated by the
    trapezoidal rule, held constant after the last save. `rate(u, t)` (n,). No derivative."""
    T = us.shape[0]
    picked = np.unique(np.linspace(0, T - 1, min(T, SAMPLES)).round().astype(int)) if T else np.zeros(0, int)
    times = jnp.concatenate([jnp.reshape(t0, (1,)), jnp.asarray(ts)[picked]]).astype(u0.dtype)
    states = jnp.concatenate([u0[None], us[picked]])
    times, states = jax.lax.stop_gradient((times, states))
    rho = jax.vmap(lambda x, t: spectral_radius(rate, x, t))(states, times)
    rho = jnp.where(jnp.isfinite(rho), rho, 0.0)
    inside = jnp.sum(jnp.diff(times) * (rho[1:] + rho[:-1]) / 2)
    return (inside + (jax.lax.stop_gradient(t1) - times[-1]) * rho[-1]) / beta
