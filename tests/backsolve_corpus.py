"""Problems where BacksolveAdjoint's gradient is right and where it is wrong (unstable backwards in
time), for the test of its self-check (tests/test_backsolve_check.py). Each case:
(name, problem, saveat, solver, rtol, atol, wrong)."""

import jax.numpy as jnp
import numpy as np

import sciad
from sciad.problems import hamiltonian_node


def _mlp(hidden: int, seed: int, damping: float, dtype):
    """u' = W2 tanh(W1 u + b1) + b2 − damping·u, 2 states, 5·hidden + 2 parameters."""
    rng = np.random.default_rng(seed)
    w1, w2 = rng.normal(size=(hidden, 2)), rng.normal(size=(2, hidden)) / np.sqrt(hidden)
    p = np.concatenate([w1.ravel(), 0.1 * rng.normal(size=hidden), w2.ravel(), np.zeros(2)]).astype(dtype)

    def f(u, p, t):
        h = hidden
        return (p[3 * h: 5 * h].reshape(2, h) @ jnp.tanh(p[: 2 * h].reshape(h, 2) @ u + p[2 * h: 3 * h])
                + p[5 * h:] - damping * u)

    return f, p


def _pendulum(u, p, t):
    return jnp.stack([u[1], -p[0] * jnp.sin(u[0]) - p[1] * u[1]])


def _lotka_volterra(u, p, t):
    return jnp.stack([p[0] * u[0] - p[1] * u[0] * u[1], -p[2] * u[1] + p[3] * u[0] * u[1]])


def _two_rates(u, p, t):
    """u' = A u, A = R diag(−p0, −p1) Rᵀ with R a 45° rotation: the fast mode's error grows like
    exp((p1 − p0) t) against the slow mode's solution when solved backwards."""
    rotation = jnp.array([[1.0, -1.0], [1.0, 1.0]]) / np.sqrt(2.0)
    return rotation @ (-p * (rotation.T @ u))


def _fisher_kpp(points: int):
    """u_t = D u_xx + r u (1 − u) on a periodic grid of `points` cells (stiff: diffusion)."""
    dx = 1.0 / points

    def f(u, p, t):
        return p[0] * (jnp.roll(u, 1) - 2 * u + jnp.roll(u, -1)) / dx**2 + p[1] * u * (1 - u)

    x = np.linspace(0.0, 1.0, points, endpoint=False)
    return f, 0.5 + 0.4 * np.sin(2 * np.pi * x)


def cases():
    f, p = _mlp(128, 0, 0.05, np.float64)
    f32, p32 = _mlp(50, 1, 0.05, np.float32)
    kpp, kpp0 = _fisher_kpp(100)
    pend = sciad.ODEProblem(_pendulum, np.array([1.0, 0.0]), (0.0, 100.0), np.array([1.0, 0.2]))
    ham = hamiltonian_node()
    lv = sciad.ODEProblem(_lotka_volterra, np.ones(2), (0.0, 10.0), np.array([1.5, 1.0, 3.0, 1.0]))
    return [
        # right: dissipative or conservative, long horizons, neural ODEs, f32 and f64, several tolerances
        ("neural ODE, 642 params, t ≤ 30", sciad.ODEProblem(f, np.array([1.0, -0.5]), (0.0, 30.0), p),
         [15.0, 30.0], "tsit5", 1e-7, 1e-7, False),
        ("neural ODE, 642 params, t ≤ 30, rtol 1e-10", sciad.ODEProblem(f, np.array([1.0, -0.5]), (0.0, 30.0), p),
         [15.0, 30.0], "tsit5", 1e-10, 1e-10, False),
        ("neural ODE, f32, t ≤ 10", sciad.ODEProblem(f32, np.array([1.0, -0.5], np.float32), (0.0, 10.0), p32),
         [10.0], "tsit5", 1e-5, 1e-5, False),
        ("pendulum, light damping, t ≤ 30", sciad.ODEProblem(_pendulum, np.array([1.0, 0.0]), (0.0, 30.0),
                                                              np.array([1.0, 0.02])), [30.0], "dopri5", 1e-8, 1e-8, False),
        ("pendulum, light damping, t ≤ 300", sciad.ODEProblem(_pendulum, np.array([1.0, 0.0]), (0.0, 300.0),
                                                               np.array([1.0, 0.005])), [300.0], "tsit5", 1e-7, 1e-7, False),
        ("Hamiltonian neural ODE, 400 params, t ≤ 100", ham.problem, ham.saveat, "tsit5", 1e-8, 1e-8, False),
        ("Lotka–Volterra, t ≤ 10", lv, np.linspace(0, 10, 11), "tsit5", 1e-6, 1e-6, False),
        ("Lotka–Volterra, t ≤ 10, rtol 1e-10", lv, [10.0], "tsit5", 1e-10, 1e-10, False),
        ("pendulum, damped, saved every 1", pend, np.linspace(0, 100, 101), "tsit5", 1e-8, 1e-8, False),
        # wrong: unstable backwards
        ("pendulum, damped, t ≤ 100", pend, [100.0], "tsit5", 1e-8, 1e-8, True),
        ("linear, rates 1 and 20, t ≤ 5", sciad.ODEProblem(_two_rates, np.array([1.0, 0.0]), (0.0, 5.0),
                                                           np.array([1.0, 20.0])), [5.0], "tsit5", 1e-6, 1e-6, True),
        ("Fisher–KPP, 100 states, Kvaerno5", sciad.ODEProblem(kpp, kpp0, (0.0, 1.0), np.array([0.01, 1.0])),
         [1.0], "kvaerno5", 1e-6, 1e-6, True),
    ]
