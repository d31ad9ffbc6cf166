"""A Hamiltonian neural ODE over a long horizon: hundreds of parameters, two states, two save points."""

import dataclasses

import numpy as np
from jaxtyping import Float

from sciad._ode import ODEProblem
from sciad.ad import namespace
from sciad.problems._benchmark import Benchmark
from sciad.problems._spiral import SquaredError


@dataclasses.dataclass(frozen=True)
class HamiltonianRHS:
    """u = (q, v)' = J ∇H(u) with the learned energy H(u) = |u|²/2 + wᵀ tanh(W u + b) and
    J = [[0, 1], [−1, 0]]; p = [W (hidden×2), b, w] flattened (4·hidden). ∇H is written out,
    u + Wᵀ(w ⊙ (1 − tanh²(W u + b))), so f needs no AD of its own."""

    hidden: int

    def __call__(self, u, p, t):
        xp, h = namespace(u, p), self.hidden
        w1 = xp.reshape(p[: 2 * h], (h, 2))
        b = p[2 * h : 3 * h]
        w2 = p[3 * h :]
        grad = u + (w2 * (1 - xp.tanh(w1 @ u + b) ** 2)) @ w1
        return xp.stack([grad[1], -grad[0]])

    def initial_parameters(self, seed: int) -> np.ndarray:
        """W, b ~ N(0, 1) and w ~ N(0, 0.1²/hidden) (a small correction to the harmonic
        oscillator), float64."""
        rng = np.random.default_rng(seed)
        w1 = rng.standard_normal((self.hidden, 2))
        b = rng.standard_normal(self.hidden)
        w2 = 0.1 / np.sqrt(self.hidden) * rng.standard_normal(self.hidden)
        return np.concatenate([w1.ravel(), b, w2])


def pendulum(u0: Float[np.ndarray, " 2"], ts: Float[np.ndarray, " T"]) -> Float[np.ndarray, "T 2"]:
    """The pendulum q'' = −sin q from u0 = (q, q') at `ts` (T, 2), from a tight SciPy solve."""
    from scipy.integrate import solve_ivp  # SciPy comes with JAX

    sol = solve_ivp(lambda t, u: [u[1], -np.sin(u[0])], (0.0, ts[-1]), u0, t_eval=ts, rtol=1e-11, atol=1e-11)
    return sol.y.T


def hamiltonian_node(hidden: int = 100, t1: float = 100.0, seed: int = 0) -> Benchmark:
    """A Hamiltonian neural network (Greydanus et al. 2019) fitted to a pendulum: u0 = (1, 0),
    t ∈ [0, t1] (default 100: about 16 periods), saved at t1/2 and t1, loss = squared error to
    the pendulum there, Tsit5 at rtol = atol = 1e-8, float64, 4·hidden parameters (default 400).

    In the suite as the long-horizon neural ODE: many steps, many parameters and only two save
    points, where the continuous adjoints' memory (one interval at a time) and cost (two
    intervals) shine and a recursively checkpointed reverse pass pays for every step. The
    flow conserves H, so the orbit stays bounded for any horizon and integrating it backwards
    (BacksolveAdjoint) is as stable as forwards."""
    if hidden < 1:
        raise ValueError(f"hamiltonian_node(hidden): hidden must be at least 1, got {hidden}")
    if not t1 > 0:
        raise ValueError(f"hamiltonian_node(t1): t1 must be positive, got {t1}")
    u0 = np.array([1.0, 0.0])
    ts = np.array([t1 / 2, t1])
    rhs = HamiltonianRHS(hidden)
    problem = ODEProblem(rhs, u0, (0.0, float(t1)), rhs.initial_parameters(seed))
    return Benchmark(
        f"hamiltonian-node-{4 * hidden}",
        problem,
        ts,
        SquaredError(pendulum(u0, ts)),
        rtol=1e-8,
        atol=1e-8,
        max_steps=max(4096, int(40 * t1)),
    )
