"""Sparsity of a Jacobian read off a function's jaxpr: `jacobian_pattern(f, x, *args)` gives a
`Pattern` (its matrix, density, and the operations taken as dense in `.conservative`)."""

from sciad._sparsity import Pattern, jacobian_pattern

__all__ = ["Pattern", "jacobian_pattern"]
