"""sciad: differentiable programming for scientific machine learning."""

from sciad import ad
