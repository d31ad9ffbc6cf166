"""sciad: differentiable programming for scientific machine learning.

    prob = sciad.ODEProblem(f, u0, tspan, p)
    sol = sciad.solve(prob, p=p, saveat=ts, sensealg=sciad.InterpolatingAdjoint(vjp="jax-reverse"))

The public API is what `__all__` lists here, in `sciad.ad`, `sciad.adjoints`, `sciad.problems`,
`sciad.errors`, `sciad.select`, `sciad.sparsity`, `sciad.stiff` and `sciad.timing`; modules named
`_name` are private.
"""

from typing import TYPE_CHECKING

from sciad import (
    ad,
    adjoints,
    errors,
    problems,  # noqa: E402  (builds on solve)
    select,
    stiff,
    timing,
)
from sciad._bdf import BDF
from sciad._brownian import BrownianPath
from sciad._dae_problem import DAEProblem
from sciad._dde import DDEProblem
from sciad._diffrax_adjoint import DiffraxAdjoint, diffrax_adjoint
from sciad._ensemble import ensemble
from sciad._events import ContinuousCallback, PresetTimeCallback
from sciad._ode import SOLVERS, ODEProblem, get_solver
from sciad._rosenbrock import Rodas4, Rodas5P
from sciad._sde import SDEProblem
from sciad._sde_solvers import SDE_SOLVERS
from sciad._solve import SDESolution, Solution, solve
from sciad._steady import SteadyState, steady_state
from sciad.adjoints import (
    AbstractSensitivity,
    BacksolveAdjoint,
    DiscreteAdjoint,
    ForwardDiffSensitivity,
    ForwardSensitivity,
    GaussAdjoint,
    InterpolatingAdjoint,
    QuadratureAdjoint,
    ReversibleAdjoint,
    SteadyStateAdjoint,
    step_controller,
)
from sciad.errors import SolveError
from sciad.select import Choice, select_sensealg

__all__ = [
    "BDF",
    "SDE_SOLVERS",
    "SOLVERS",
    "AbstractSensitivity",
    "BacksolveAdjoint",
    "BrownianPath",
    "Choice",
    "ContinuousCallback",
    "DiffraxAdjoint",
    "DiscreteAdjoint",
    "ForwardDiffSensitivity",
    "ForwardSensitivity",
    "GaussAdjoint",
    "InterpolatingAdjoint",
    "DAEProblem",
    "DDEProblem",
    "ODEProblem",
    "PresetTimeCallback",
    "QuadratureAdjoint",
    "ReversibleAdjoint",
    "Rodas4",
    "Rodas5P",
    "SDEProblem",
    "SDESolution",
    "Solution",
    "SolveError",
    "SteadyState",
    "SteadyStateAdjoint",
    "ad",
    "adjoints",
    "diffrax_adjoint",
    "ensemble",
    "errors",
    "get_solver",
    "problems",
    "select",
    "select_sensealg",
    "solve",
    "sparsity",
    "steady_state",
    "step_controller",
    "stiff",
    "timing",
]

if TYPE_CHECKING:  # imported on first use (SciPy): the module __getattr__ below
    from sciad import sparsity


def __getattr__(name: str):
    if name == "sparsity":  # on first use: sparsity detection pulls SciPy, which importing sciad does not
        import sciad.sparsity

        return sciad.sparsity
    raise AttributeError(f"module 'sciad' has no attribute {name!r}")
