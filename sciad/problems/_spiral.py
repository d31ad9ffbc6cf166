"""The spiral neural ODE (paper, Appendix B, Example 2; Chen et al. 2018)."""

import dataclasses

import numpy as np
from jaxtyping import Float

from sciad._ode import ODEProblem
from sciad.ad import namespace
from sciad.problems._benchmark import Benchmark

TRUE_A = np.array([[-0.1, 2.0], [-2.0, -0.1]])


def spiral_rhs(u, p, t):
    """The true spiral u' = (u³)ᵀA."""
    return (u**3) @ namespace(u).asarray(TRUE_A, dtype=u.dtype)


@dataclasses.dataclass(frozen=True)
class NeuralRHS:
    """u' = W2 tanh(W1 u³ + b1) + b2 with p = [W1 (hidden×2), b1, W2 (2×hidden), b2] flattened."""

    hidden: int

    def __call__(self, u, p, t):
        xp, h = namespace(u, p), self.hidden
        w1 = xp.reshape(p[: 2 * h], (h, 2))
        b1 = p[2 * h : 3 * h]
        w2 = xp.reshape(p[3 * h : 5 * h], (2, h))
        b2 = p[5 * h :]
        return w2 @ xp.tanh(w1 @ u**3 + b1) + b2

    def initial_parameters(self, seed: int) -> np.ndarray:
        """Glorot-uniform weights, zero biases (as Flux's Dense), float32."""
        rng = np.random.default_rng(seed)
        limit = np.sqrt(6.0 / (self.hidden + 2))
        w1 = rng.uniform(-limit, limit, (self.hidden, 2))
        w2 = rng.uniform(-limit, limit, (2, self.hidden))
        return np.concatenate([w1.ravel(), np.zeros(self.hidden), w2.ravel(), np.zeros(2)]).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class SquaredError:
    """Σ (us − data)² over the saved times and both states."""

    data: np.ndarray

    def __call__(self, us):
        xp = namespace(us)
        return xp.sum((us - xp.asarray(self.data, dtype=us.dtype)) ** 2)


def spiral_data(u0: Float[np.ndarray, " 2"], ts: Float[np.ndarray, " T"]) -> Float[np.ndarray, "T 2"]:
    """The true spiral at `ts` (T, 2), float32, from a tight float64 RK45 solve (NumPy, no JAX precision needed)."""
    from scipy.integrate import solve_ivp  # SciPy comes with JAX

    sol = solve_ivp(
        lambda t, u: spiral_rhs(u, None, t), (ts[0], ts[-1]), u0.astype(np.float64), t_eval=ts, rtol=1e-10, atol=1e-10
    )
    return sol.y.T.astype(np.float32)


def spiral_node(hidden: int = 50, seed: int = 0) -> Benchmark:
    """u' = NN(u³), one hidden tanh layer of `hidden` units, u0 = (2, 0),
    t ∈ [0, 1.5], 30 saveat points, loss = squared error to the true spiral,
    float32, weights seeded by `seed` (5·hidden + 2 parameters)."""
    u0 = np.array([2.0, 0.0], np.float32)
    ts = np.linspace(0.0, 1.5, 30)
    rhs = NeuralRHS(hidden)
    problem = ODEProblem(rhs, u0, (0.0, 1.5), rhs.initial_parameters(seed))
    return Benchmark(
        "spiral-node" if hidden == 50 else f"spiral-node-{hidden}",
        problem,
        ts,
        SquaredError(spiral_data(u0, ts)),
        rtol=1e-5,
        atol=1e-5,
    )
