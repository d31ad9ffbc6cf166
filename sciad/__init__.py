"""sciad: differentiable programming for scientific machine learning.

    prob = sciad.ODEProblem(f, u0, tspan, p)
    sol = sciad.solve(prob, p=p, saveat=ts, sensealg=sciad.InterpolatingAdjoint(vjp="jax-reverse"))
"""

from sciad import ad
from sciad.adjoints import (
    AbstractSensitivity,
    BacksolveAdjoint,
    DiscreteAdjoint,
    ForwardDiffSensitivity,
    ForwardSensitivity,
    GaussAdjoint,
    InterpolatingAdjoint,
    QuadratureAdjoint,
    SteadyStateAdjoint,
)
from sciad.errors import SolveError
from sciad.events import ContinuousCallback, PresetTimeCallback
from sciad.problem import ODEProblem
from sciad.select import Choice, select_sensealg
from sciad.solve import SOLVERS, Solution, solve
from sciad.ensemble import ensemble
from sciad.steady import SteadyState, steady_state
from sciad import problems  # noqa: E402  (builds on solve)
