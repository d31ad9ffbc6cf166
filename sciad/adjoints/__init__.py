"""Sensitivity algorithms (sensealgs), named as in SciMLSensitivity.jl; `SENSEALGS`,
`describe` and `parse` map them to and from names with every option (`ODE_SENSEALGS`: those
that serve ODE solves; every one serves SDE solves, pathwise). `STORED_STEPS` and
`STORED_BYTES` bound what the stored continuous adjoints keep; `step_controller` is the step-size
controller a solve uses (for running diffrax alike)."""

from sciad.adjoints._base import STORED_BYTES, STORED_STEPS, AbstractSensitivity, step_controller
from sciad.adjoints._continuous import BacksolveAdjoint, GaussAdjoint, InterpolatingAdjoint, QuadratureAdjoint
from sciad.adjoints._discrete import DiscreteAdjoint, ForwardDiffSensitivity
from sciad.adjoints._forward import ForwardSensitivity
from sciad.adjoints._registry import ODE_SENSEALGS, SENSEALGS, describe, engine_option, parse
from sciad.adjoints._reversible import ReversibleAdjoint
from sciad.adjoints._steady import SteadyStateAdjoint

__all__ = [
    "ODE_SENSEALGS",
    "SENSEALGS",
    "STORED_BYTES",
    "STORED_STEPS",
    "AbstractSensitivity",
    "BacksolveAdjoint",
    "DiscreteAdjoint",
    "ForwardDiffSensitivity",
    "ForwardSensitivity",
    "GaussAdjoint",
    "InterpolatingAdjoint",
    "QuadratureAdjoint",
    "ReversibleAdjoint",
    "SteadyStateAdjoint",
    "describe",
    "engine_option",
    "parse",
    "step_controller",
]
