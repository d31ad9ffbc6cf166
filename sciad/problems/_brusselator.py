"""The 2-D Brusselator reaction–diffusion system on an n×n periodic grid: the size sweep."""

import dataclasses

import numpy as np

from sciad._ode import ODEProblem
from sciad.ad import namespace
from sciad.problems._benchmark import Benchmark


@dataclasses.dataclass(frozen=True)
class BrusselatorRHS:
    """u' = B + u²v − (A+1)u + α/Δx² Δu,  v' = Au − u²v + α/Δx² Δv with
    p = (A, B, α) and Δ the 5-point lattice Laplacian with periodic
    boundaries (Δx = 1: α in grid units); the state is [u.ravel(), v.ravel()] (2n²,)."""

    n: int
    dx: float = 1.0

    def __call__(self, state, p, t):
        xp, n = namespace(state, p), self.n
        u = xp.reshape(state[: n * n], (n, n))
        v = xp.reshape(state[n * n :], (n, n))
        a, b, alpha = p[0], p[1], p[2] / self.dx**2

        def laplacian(w):
            return (
                xp.roll(w, 1, axis=0) + xp.roll(w, -1, axis=0) + xp.roll(w, 1, axis=1) + xp.roll(w, -1, axis=1) - 4 * w
            )

        u2v = u * u * v
        du = b + u2v - (a + 1) * u + alpha * laplacian(u)
        dv = a * u - u2v + alpha * laplacian(v)
        return xp.concat([xp.reshape(du, (-1,)), xp.reshape(dv, (-1,))])


def mean_square(us):
    """Σ over saved times of the mean of u², v² over the grid."""
    xp = namespace(us)
    return xp.sum(us**2) / us.shape[1]


def brusselator(n: int = 8) -> Benchmark:
    """2n² states and p = (A, B, α) = (3.4, 1, 0.1), u0 = 22(y(1−y))^1.5 + 1,
    v0 = 27(x(1−x))^1.5 + 1 on the grid x, y = i/n, t ∈ [0, 1], saved at 5
    times, float64.

    α multiplies the lattice Laplacian in grid units (no 1/Δx² factor), so the
    stiffness does not grow with n and the explicit Tsit5 serves every size:
    the sweep measures how gradient cost grows with size, not with stiffness.
    """
    if n < 2:
        raise ValueError(f"brusselator(n): n must be at least 2, got {n}")
    x = np.arange(n) / n
    xx, yy = np.meshgrid(x, x, indexing="ij")
    u0 = 22.0 * (yy * (1 - yy)) ** 1.5 + 1.0
    v0 = 27.0 * (xx * (1 - xx)) ** 1.5 + 1.0
    problem = ODEProblem(
        BrusselatorRHS(n), np.concatenate([u0.ravel(), v0.ravel()]), (0.0, 1.0), np.array([3.4, 1.0, 0.1])
    )
    return Benchmark(f"brusselator-{n}", problem, np.linspace(0.0, 1.0, 5), mean_square)


def brusselator_pde(n: int = 8) -> Benchmark:
    """The stiff 2-D Brusselator PDE of the SciML stiff benchmarks (BRUSS-2D; Ma
    et al. 2021): 2n² states on the periodic grid x, y = 0, 1/(n−1), …, 1, real
    diffusion α/Δx² with p = (A, B, α) = (3.4, 1, 10), u0 = 22(y(1−y))^1.5,
    v0 = 27(x(1−x))^1.5, t ∈ [0, 1] saved at 11 times, Kvaerno5, float64.
    Stiffness grows as n² (|λ_max| ≈ 8α(n−1)²); the benchmark's forcing pulse
    switches on at t = 1.1, after this horizon, and is left out."""
    if n < 3:
        raise ValueError(f"brusselator_pde(n): n must be at least 3, got {n}")
    x = np.linspace(0.0, 1.0, n)
    xx, yy = np.meshgrid(x, x, indexing="ij")
    u0 = 22.0 * (yy * (1 - yy)) ** 1.5
    v0 = 27.0 * (xx * (1 - xx)) ** 1.5
    problem = ODEProblem(
        BrusselatorRHS(n, dx=1.0 / (n - 1)),
        np.concatenate([u0.ravel(), v0.ravel()]),
        (0.0, 1.0),
        np.array([3.4, 1.0, 10.0]),
    )
    return Benchmark(f"brusselator-pde-{n}", problem, np.linspace(0.0, 1.0, 11), mean_square, solver="kvaerno5")
