"""Sensitivity algorithms (sensealgs), named as in SciMLSensitivity.jl."""

from sciad.adjoints.base import AbstractSensitivity
from sciad.adjoints.continuous import BacksolveAdjoint, InterpolatingAdjoint, QuadratureAdjoint
from sciad.adjoints.discrete import DiscreteAdjoint, ForwardDiffSensitivity
from sciad.adjoints.forward import ForwardSensitivity

SENSEALGS = {
    cls.__name__: cls
    for cls in (ForwardDiffSensitivity, ForwardSensitivity, BacksolveAdjoint,
                InterpolatingAdjoint, QuadratureAdjoint, DiscreteAdjoint)
}
