"""Errors a solve raises: `SolveError` (eagerly, or as the last line of JAX's runtime error under
`jax.jit`) and `summary(error)`, the one line a user acts on."""

from sciad._errors import SolveError, summary

__all__ = ["SolveError", "summary"]
