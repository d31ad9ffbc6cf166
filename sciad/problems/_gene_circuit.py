"""A gene regulatory circuit (Mjolsness, Sharp & Reinitz 1991): n genes, n² + 3n parameters, dense data."""

import dataclasses

import numpy as np

from sciad._ode import ODEProblem
from sciad.ad import namespace
from sciad.problems._benchmark import Benchmark
from sciad.problems._spiral import SquaredError


@dataclasses.dataclass(frozen=True)
class GeneCircuitRHS:
    """x_i' = R_i g(Σ_j W_ij x_j + h_i) − λ_i x_i with g(s) = (1 + s/√(1 + s²))/2: gene i's
    product x_i is made at most at rate R_i as its regulators (W_ij > 0 activates, < 0
    represses) switch it on, and decays at rate λ_i. p = [W (n×n), h, R, λ] flattened (n² + 3n)."""

    n: int

    def __call__(self, x, p, t):
        xp, n = namespace(x, p), self.n
        w = xp.reshape(p[: n * n], (n, n))
        h, r, decay = p[n * n : n * n + n], p[n * n + n : n * n + 2 * n], p[n * n + 2 * n :]
        s = w @ x + h
        return r * (1 + s / xp.sqrt(1 + s * s)) / 2 - decay * x

    def true_parameters(self, seed: int) -> np.ndarray:
        """A repressilator (Elowitz & Leibler 2000) in genes 0–2 (W_i,i−1 = −10, h = 5, R = 2,
        λ = 1: it oscillates) driving the others: each regulated by one repressilator gene and
        two random genes (W ~ N(0, 1.5²)), h ~ N(−0.5, 0.5²), R ~ U(1, 3), λ ~ U(0.5, 1.5), float64."""
        n, rng = self.n, np.random.default_rng(seed)
        w = np.zeros((n, n))
        for i in range(3):
            w[i, (i - 1) % 3] = -10.0
        for i in range(3, n):
            others = rng.choice([j for j in range(n) if j != i % 3], size=2, replace=False)
            w[i, [i % 3, *others]] = 1.5 * rng.standard_normal(3)
        h, r, decay = -0.5 + 0.5 * rng.standard_normal(n), rng.uniform(1.0, 3.0, n), rng.uniform(0.5, 1.5, n)
        h[:3], r[:3], decay[:3] = 5.0, 2.0, 1.0
        return np.concatenate([w.ravel(), h, r, decay])


def gene_circuit(n: int = 10, saves: int = 50, seed: int = 0) -> Benchmark:
    """n genes (a repressilator driving n − 3 others: an oscillating, mildly nonlinear
    network) from x0 ~ U(0, 1) on t ∈ [0, 20], `saves` save points (default 50: dense
    time-course data), loss = squared error to the circuit's own trajectory at the true
    parameters; solved at those parameters perturbed by 10% (so the gradient is that of a
    fit in progress), Tsit5 at rtol = atol = 1e-8 (the oscillation's phase makes the gradient
    sensitive: at 1e-6 it is off by 2e-4), float64, n² + 3n parameters (default 130).

    In the suite as the many-parameter model with dense data: m ≫ n and many save points,
    where a continuous adjoint restarts once per save point and a discrete adjoint does not."""
    if n < 3:
        raise ValueError(f"gene_circuit(n): n must be at least 3 (the repressilator), got {n}")
    if saves < 2:
        raise ValueError(f"gene_circuit(saves): saves must be at least 2, got {saves}")
    from scipy.integrate import solve_ivp  # SciPy comes with JAX

    rhs = GeneCircuitRHS(n)
    rng = np.random.default_rng(seed + 1)
    truth = rhs.true_parameters(seed)
    x0 = rng.uniform(0.0, 1.0, n)
    ts = np.linspace(0.0, 20.0, saves)
    data = solve_ivp(lambda t, x: rhs(x, truth, t), (0.0, 20.0), x0, t_eval=ts, rtol=1e-11, atol=1e-11).y.T
    p = truth * (1 + 0.1 * rng.standard_normal(truth.shape))
    problem = ODEProblem(rhs, x0, (0.0, 20.0), p)
    return Benchmark(f"gene-circuit-{n}", problem, ts, SquaredError(data), rtol=1e-8, atol=1e-8)
