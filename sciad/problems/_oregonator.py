"""The Oregonator (OREGO, Hairer & Wanner II): stiff Belousov–Zhabotinsky kinetics."""

import numpy as np

from sciad._ode import ODEProblem
from sciad.ad import namespace
from sciad.problems._benchmark import Benchmark


def oregonator_rhs(y, p, t):
    """y1' = s (y2 + y1 (1 − q y1 − y2)),  y2' = (y3 − (1 + y1) y2) / s,  y3' = w (y1 − y3), p = (s, q, w)."""
    xp = namespace(y, p)
    s, q, w = p[0], p[1], p[2]
    return xp.stack([s * (y[1] + y[0] * (1 - q * y[0] - y[1])), (y[2] - (1 + y[0]) * y[1]) / s, w * (y[0] - y[2])])


def sum_of_squared_logs(us):
    """Σ over saved times and species of log(y)²: each species' relative change weighs alike."""
    xp = namespace(us)
    return xp.sum(xp.log(us) ** 2)


def oregonator(t1: float = 30.0) -> Benchmark:
    """OREGO's standard parameters (s, q, w) = (77.27, 8.375e−6, 0.161) and
    y0 = (1, 2, 3), on t ∈ [0, t1] (default 30: the first relaxation spike;
    the test set's horizon is 360), saved every time unit, Kvaerno5, float64.
    The species span five orders of magnitude; |λ_max| ≈ 1e5 at the spike."""
    if not t1 > 0:
        raise ValueError(f"oregonator(t1): t1 must be positive, got {t1}")
    problem = ODEProblem(
        oregonator_rhs, np.array([1.0, 2.0, 3.0]), (0.0, float(t1)), np.array([77.27, 8.375e-6, 0.161])
    )
    return Benchmark(
        "oregonator",
        problem,
        np.linspace(0.0, t1, int(round(t1)) + 1),
        sum_of_squared_logs,
        solver="kvaerno5",
        max_steps=100_000,
    )
