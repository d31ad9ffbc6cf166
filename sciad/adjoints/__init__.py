"""Sensitivity algorithms (sensealgs), named as in SciMLSensitivity.jl; `SENSEALGS`,
`describe` and `parse` map them to and from names with every option."""

from sciad.adjoints.base import AbstractSensitivity
from sciad.adjoints.continuous import BacksolveAdjoint, GaussAdjoint, InterpolatingAdjoint, QuadratureAdjoint
from sciad.adjoints.discrete import DiscreteAdjoint, ForwardDiffSensitivity
from sciad.adjoints.forward import ForwardSensitivity
from sciad.adjoints.steady import SteadyStateAdjoint
from sciad.adjoints.registry import SENSEALGS, describe, engine_option, parse
