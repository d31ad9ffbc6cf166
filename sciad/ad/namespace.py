"""One function definition for every engine: the array module of an array."""

import functools
import types

import numpy as np


def namespace(*xs) -> types.ModuleType:
    """The array module to use on `xs` (arrays of one engine).

    jax arrays and tracers -> `jax.numpy`; torch tensors -> torch's array-API
    namespace (`array_api_compat.torch`); autograd's boxes -> `autograd.numpy`;
    NumPy arrays and Python numbers -> `numpy`. A function written as
    `xp = namespace(u); xp.stack([...])` runs on every engine.
    """
    for x in xs:
        module = type(x).__module__
        if module.startswith("jax"):
            import jax.numpy as jnp

            return jnp
        if module.startswith("torch"):
            from array_api_compat import torch as xp

            return xp
        if module.startswith("autograd"):
            return _autograd_namespace()
    return np


@functools.cache
def _autograd_namespace() -> types.ModuleType:
    """`autograd.numpy` with array-API names it lacks a rule for: its `concat`
    is NumPy's, which silently drops the tape for boxes inside the list."""
    import autograd.numpy as anp

    xp = types.ModuleType("autograd.numpy (sciad)")
    xp.__dict__.update({k: v for k, v in vars(anp).items() if not k.startswith("__")})
    xp.concat = anp.concatenate
    return xp
