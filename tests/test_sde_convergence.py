"""Strong convergence in dt, per solver: the mean error at T over 64 paths against the closed form on
each path, at dt = 2⁻⁴, 2⁻⁶, 2⁻⁸, and its slope in log-log (the strong order). Measured (float64):

| solver | GBM Itô (scalar, multiplicative) | GBM Stratonovich | Ornstein–Uhlenbeck (additive) |
|---|---|---|---|
| euler | 0.46 | 0.48 | 1.00 |
| milstein | 0.99 | 0.99 | 1.00 |
| heun | 0.99 | 1.00 | ≥ 1 (3.1: below the reference's own error) |
| reversible_heun | 0.99 | 1.01 | ≥ 1 (3.1: idem) |

Scalar noise is commutative, so Heun and reversible Heun reach 1 on GBM; with non-commutative noise
they are 1/2 (Kidger et al. 2021). With additive noise and linear drift the Heun methods are exact in
the noise and second order in the drift: their error falls below the OU reference's (the midpoint
rule on the finest path), so only "at least 1" is checked. `ORDERS` holds the expected values; the
test accepts a measured slope within 0.2 of them (at least them, for `AT_LEAST`)."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad

MU, SIGMA, THETA, T = 0.5, 0.5, 1.0, 1.0
DTS = (2.0**-4, 2.0**-6, 2.0**-8)
KEYS = jax.random.split(jax.random.key(7), 64)
ORDERS = {
    ("euler", "ito"): 0.5,
    ("euler", "stratonovich"): 0.5,
    ("euler", "additive"): 1.0,
    ("milstein", "ito"): 1.0,
    ("milstein", "stratonovich"): 1.0,
    ("milstein", "additive"): 1.0,
    ("heun", "ito"): 1.0,
    ("heun", "stratonovich"): 1.0,
    ("heun", "additive"): 1.0,
    ("reversible_heun", "ito"): 1.0,
    ("reversible_heun", "stratonovich"): 1.0,
    ("reversible_heun", "additive"): 1.0,
}
AT_LEAST = {("heun", "additive"), ("reversible_heun", "additive")}


def problem(kind: str):
    if kind == "additive":  # du = -θ u dt + σ dW: Itô = Stratonovich
        return sciad.SDEProblem(lambda u, p, t: -THETA * u, lambda u, p, t: SIGMA + 0 * u, np.array([1.0]), (0.0, T))
    return sciad.SDEProblem(lambda u, p, t: MU * u, lambda u, p, t: SIGMA * u, np.array([1.0]), (0.0, T), calculus=kind)


def exact(kind: str, path, dt_fine: float):
    """u(T) on the path: GBM's closed form in W_T; OU's stochastic integral by the midpoint rule on the path's
    own grid, refined by its bridge (exact to O(dt_fine))."""
    W = path.evaluate(0.0, T)[0]
    if kind == "ito":
        return jnp.exp((MU - SIGMA**2 / 2) * T + SIGMA * W)
    if kind == "stratonovich":
        return jnp.exp(MU * T + SIGMA * W)
    increments = path.increments()[:, 0]
    s = (jnp.arange(increments.shape[0]) + 0.5) * dt_fine
    return jnp.exp(-THETA * T) + SIGMA * jnp.exp(-THETA * (T - s)) @ increments


def errors(solver: str, kind: str):
    """Mean |u_N - u(T)| over the paths at each dt; the reference is on the path of the finest dt, whose
    increments summed give the coarser paths' (the same Brownian motion)."""
    prob = problem(kind)
    fine = DTS[-1]

    def on_key(key):
        sol_fine = sciad.solve(prob, key=key, dt0=fine, solver=solver, sensealg="DiscreteAdjoint")
        path = sol_fine.brownian
        out = []
        for dt in DTS:
            steps, ratio = int(round(T / dt)), int(round(dt / fine))
            summed = _Summed(path.increments().reshape(steps, ratio, 1).sum(1), dt)  # the same motion, coarser
            u = sciad.solve(prob, brownian=summed, dt0=dt, solver=solver, sensealg="DiscreteAdjoint").us[-1, 0]
            out.append(jnp.abs(u - exact(kind, path, fine)))
        return jnp.stack(out)

    return np.asarray(jnp.mean(jax.jit(jax.vmap(on_key))(KEYS), axis=0))


class _Summed(diffrax.AbstractBrownianPath):
    """A Brownian path on a coarse grid whose increments are sums of a finer path's (grid steps only)."""

    increments: jax.Array
    dt: float
    t0: float = 0.0
    t1: float = T
    levy_area: type = diffrax.BrownianIncrement

    @property
    def shape(self):
        return jax.ShapeDtypeStruct((1,), self.increments.dtype)

    def evaluate(self, t0, t1=None, left=True, use_levy=False):
        return self.increments[jnp.round(t0 / self.dt).astype(jnp.int32)]


def strong_order(solver: str, kind: str) -> float:
    e = errors(solver, kind)
    return float(np.polyfit(np.log(DTS), np.log(e), 1)[0])


@pytest.mark.parametrize("solver", ["euler", "milstein", "heun", "reversible_heun"])
@pytest.mark.parametrize("kind", ["ito", "stratonovich", "additive"])
def test_strong_order(solver, kind):
    order = strong_order(solver, kind)
    print(f"{solver} {kind}: strong order {order:.2f}")
    expected = ORDERS[solver, kind]
    assert order > expected - 0.2 if (solver, kind) in AT_LEAST else abs(order - expected) < 0.2, order
