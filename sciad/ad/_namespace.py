"""One function definition for every engine: the array module of an array.

`namespace(u)` gives the array-API standard functions on `u`'s engine, with
derivatives. The engines' own modules are used as they are, except where
they would drop the tape or have no derivative rule; those functions are
written here from ones that do:

- torch (`array_api_compat.torch`): `asarray` of a list of tensors (torch
  copies their values and drops the tape), `linspace` between tensors.
- autograd (`autograd.numpy`): `asarray` and `concat` of lists of boxes (NumPy
  drops the tape), and `flip`, `positive`, `vecdot`, `matrix_transpose`,
  `broadcast_to`, `cumulative_sum`, `take`, `unstack`, which autograd wraps
  without a derivative rule.
"""

import functools
import types
import typing

import numpy as np


def namespace(*xs) -> types.ModuleType:
    """The array module to use on `xs` (arrays of one engine).

    jax arrays and tracers -> `jax.numpy`; torch tensors -> torch's array-API
    namespace (`array_api_compat.torch`); autograd's boxes -> `autograd.numpy`;
    NumPy arrays and Python numbers -> `numpy`. A function written as
    `xp = namespace(u); xp.stack([...])` runs, and is differentiated, on
    every engine.
    """
    for x in xs:
        module = type(x).__module__
        if module.startswith("jax"):
            import jax.numpy as jnp

            return jnp
        if module.startswith("torch"):
            return _torch_namespace()
        if module.startswith("autograd"):
            return _autograd_namespace()
    return np


def _extended(base: types.ModuleType, name: str, **functions) -> types.ModuleType:
    """A module with `base`'s names, and `functions` in place of some."""
    xp = types.ModuleType(name)
    xp.__dict__.update({k: v for k, v in vars(base).items() if not k.startswith("__")})
    xp.__dict__.update(functions)
    return xp


def _arrays_in(obj, is_array) -> list:
    """The arrays (`is_array` true) in `obj` and the lists and tuples nested in it."""
    if isinstance(obj, (list, tuple)):
        return [a for o in obj for a in _arrays_in(o, is_array)]
    return [obj] if is_array(obj) else []


@functools.cache
def _torch_namespace() -> types.ModuleType:
    import torch
    from array_api_compat import torch as xp

    def stacked(obj, dtype, device):
        if isinstance(obj, (list, tuple)):
            return torch.stack([stacked(o, dtype, device) for o in obj])
        return torch.as_tensor(obj, dtype=dtype, device=device)

    def asarray(obj, /, *, dtype=None, device=None, copy=None, **kwargs):
        """A list of tensors is stacked (keeping the tape); numbers in it take the tensors' dtype."""
        tensors = _arrays_in(obj, torch.is_tensor) if isinstance(obj, (list, tuple)) else []
        if not tensors:
            return xp.asarray(obj, dtype=dtype, device=device, copy=copy, **kwargs)
        if dtype is None:
            dtype = functools.reduce(torch.promote_types, [t.dtype for t in tensors])
        return stacked(obj, dtype, device or tensors[0].device)

    def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True):
        """Between tensors: `start + (stop - start) * s`, differentiable in both ends."""
        if not (torch.is_tensor(start) or torch.is_tensor(stop)):
            return xp.linspace(start, stop, num, dtype=dtype, device=device, endpoint=endpoint)
        start, stop = (torch.as_tensor(e, dtype=dtype, device=device) for e in (start, stop))
        s = xp.linspace(0.0, 1.0, num, dtype=start.dtype, device=start.device, endpoint=endpoint)
        return start + (stop - start) * s

    return _extended(xp, "array_api_compat.torch (sciad)", asarray=asarray, linspace=linspace)


@functools.cache
def _autograd_namespace() -> types.ModuleType:
    import autograd.numpy
    from autograd.tracer import isbox

    anp: typing.Any = autograd.numpy  # its names are NumPy's, wrapped at import: no static view of them

    def asarray(obj, /, *, dtype=None, device=None, copy=None):
        """Boxes, alone or in (nested) lists, through `autograd.numpy.array`, which keeps the tape."""
        if isbox(obj) and dtype is None:
            return obj
        if _arrays_in(obj, isbox):
            return anp.array(obj, dtype=dtype)
        return np.asarray(obj, dtype=dtype, copy=copy)

    def flip(x, /, *, axis=None):
        axes = range(anp.ndim(x)) if axis is None else np.atleast_1d(axis) % anp.ndim(x)
        return x[tuple(slice(None, None, -1) if i in axes else slice(None) for i in range(anp.ndim(x)))]

    def broadcast_to(x, /, shape):
        return x + anp.zeros(shape, dtype=anp.result_type(x))

    def cumulative_sum(x, /, *, axis=None, dtype=None, include_initial=False):
        if axis is None:
            if anp.ndim(x) != 1:
                raise ValueError(f"cumulative_sum needs axis= for a {anp.ndim(x)}-D array")
            axis = 0
        total = anp.cumsum(x if dtype is None else anp.array(x, dtype=dtype), axis=axis)
        if not include_initial:
            return total
        shape = list(anp.shape(total))
        shape[axis] = 1
        return anp.concatenate([anp.zeros(shape, dtype=anp.result_type(total)), total], axis=axis)

    def take(x, indices, /, *, axis=None):
        if axis is None:
            if anp.ndim(x) != 1:
                raise ValueError(f"take needs axis= for a {anp.ndim(x)}-D array")
            axis = 0
        return anp.moveaxis(anp.moveaxis(x, axis, 0)[indices], 0, axis)

    return _extended(
        anp,
        "autograd.numpy (sciad)",
        asarray=asarray,
        concat=anp.concatenate,
        flip=flip,
        positive=lambda x, /: anp.array(x),
        vecdot=lambda x1, x2, /, *, axis=-1: anp.sum(anp.conj(x1) * x2, axis=axis),
        matrix_transpose=lambda x, /: anp.swapaxes(x, -1, -2),
        broadcast_to=broadcast_to,
        cumulative_sum=cumulative_sum,
        take=take,
        unstack=lambda x, /, *, axis=0: tuple(anp.moveaxis(x, axis, 0)),
    )
