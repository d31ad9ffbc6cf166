"""Lotka–Volterra (paper, Appendix B, Example 1), in SciML's standard form."""

import numpy as np

from sciad._ode import ODEProblem
from sciad.ad import namespace
from sciad.problems._benchmark import Benchmark


def lotka_volterra_rhs(u, p, t):
    """[p0·x − p1·x·y, −p2·y + p3·x·y]: scalar indexing, as in many biochemical models."""
    xp = namespace(u, p)
    x, y = u[0], u[1]
    return xp.stack([p[0] * x - p[1] * x * y, -p[2] * y + p[3] * x * y])


def sum_of_states(us):
    """Σ_i (x(t_i) + y(t_i))."""
    return namespace(us).sum(us)


def lotka_volterra() -> Benchmark:
    """p = (1.5, 1, 3, 1), u0 = (1, 1), t ∈ [0, 10], saved at 0, 0.1, …, 10,
    loss Σ_i (x(t_i) + y(t_i)), float64 (enable `jax_enable_x64`)."""
    problem = ODEProblem(lotka_volterra_rhs, np.array([1.0, 1.0]), (0.0, 10.0), np.array([1.5, 1.0, 3.0, 1.0]))
    return Benchmark("lotka-volterra", problem, np.linspace(0.0, 10.0, 101), sum_of_states)
