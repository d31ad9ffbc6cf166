"""The backend concept: an engine and its settings, implementing one or two primitives.

A backend declares the primitives it implements, `primitives`: "pullback" (`value_and_pullback`,
reverse mode), "pushforward" (`value_and_pushforward`, forward mode), or both, and `mode` names
the native one. The Jacobian is derived here from the native primitive and the other primitive
from the Jacobian, generically (an engine with a faster gradient overrides `value_and_gradient`).
A backend that declares no primitive, or not what it implements, cannot be created. Functions
take a tuple of arrays `xs` and return one array `y`; Jacobians have shape `y.shape + x.shape`.
"""

import abc
import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import ClassVar

import numpy as np
from equinox import AbstractClassVar, AbstractVar

from sciad.ad._errors import require
from sciad.ad._namespace import namespace

PRIMITIVES = {"pullback": "value_and_pullback", "pushforward": "value_and_pushforward"}  # name: method
NATIVE = {"reverse": "pullback", "forward": "pushforward"}  # mode: its primitive


class AbstractBackend(abc.ABC):
    """An AD engine with its settings: a small immutable value (a frozen dataclass).

    A concrete backend declares, as class attributes: `name` (the registry name) and `primitives`
    (what it implements, above); and, as class attributes or, where they depend on its settings
    or parts, properties: `mode` ("reverse" when the native primitive is the pullback, "forward"
    when it is the pushforward) and the capabilities code asks, never the engine's type:

    - `traced`: its products are JAX programs, traced into the caller's.
    - `host`: its products run on the host (Python, NumPy, torch); called
      from JAX they go through host callbacks (`differentiate_with`).
    - `compiled`: a function is traced once into a compiled program, so
      value-dependent Python branches are refused (JAX engines with
      `jit=True`, Enzyme).
    - `higher_order`: JAX can differentiate its traced products again
      (second derivatives through code that uses them).
    - `vmappable`: `jax.vmap` can batch its products; otherwise batches run
      as a loop.

    `package`/`extra` name the engine's optional install. Creating a backend that misses a
    declaration raises a TypeError naming it.
    """

    name: AbstractClassVar[str]
    primitives: AbstractClassVar[frozenset[str]]
    mode: AbstractVar[str]
    traced: AbstractVar[bool]
    host: AbstractVar[bool]
    compiled: AbstractVar[bool]
    higher_order: AbstractVar[bool]
    vmappable: AbstractVar[bool]
    package: ClassVar[str | None] = None
    extra: ClassVar[str | None] = None

    def __new__(cls, *args, **kwargs):
        _check_declarations(cls)
        return super().__new__(cls)

    def __post_init__(self):
        if self.package is not None:
            require(self.package, self.extra, type(self).__name__)

    # -- the engine's arrays -------------------------------------------------
    def asarray(self, x, like=None):
        """`x` (NumPy or the engine's own array) as an engine array, with `like`'s dtype."""
        dtype = None if like is None else like.dtype
        return np.asarray(x, dtype=dtype)

    def numpy(self, y) -> np.ndarray:
        """An engine array as a NumPy array."""
        return np.asarray(y)

    def compile(self, fn: Callable) -> Callable:
        """Trace/compile `fn` once for repeated calls (identity for eager engines)."""
        return fn

    def map(self, fn: Callable, batch):
        """`fn` applied to each row of `batch`, results stacked (a tuple stacks per item)."""
        return _stacked([fn(b) for b in batch])

    def map_batch(self, product: Callable, args: tuple, batched: tuple[bool, ...]):
        """`product(engine, *member)` for every member of a batch, results stacked on a
        leading axis (a tuple stacks per item), in one call: what a host callback under
        `jax.vmap` runs. `args` are engine arrays, `args[i]` (B, ...) where `batched[i]`,
        otherwise shared by all members. `product` computes with `engine`'s primitives
        (`value_and_pullback`, `value_and_pushforward`). Here a loop with `engine = self`;
        an engine with its own batching overrides it (Torch: `torch.func.vmap`)."""
        size = next(len(a) for a, b in zip(args, batched) if b)
        return _stacked([product(self, *(a[i] if b else a for a, b in zip(args, batched))) for i in range(size)])

    def hessian_engines(self) -> tuple["AbstractBackend", "AbstractBackend"]:
        """`(outer, inner)` for Hessians: `outer` differentiates the `inner` gradient
        (by default this engine over itself)."""
        return self, self

    # -- a derived operator engines may make faster ---------------------------
    def value_and_gradient(self, f: Callable, xs: tuple):
        """`(y, grads)` for scalar `y = f(*xs)`: the pullback of 1."""
        y, pb = self.value_and_pullback(f, xs)
        check_scalar(y)
        return y, pb(self.asarray(np.ones(()), like=y))

    # -- primitives (implement those declared in `primitives`) --------------
    def value_and_pullback(self, f: Callable, xs: tuple):
        """`(y, pb)` with `y = f(*xs)` and `pb(w) = tuple(wᵀ ∂y/∂x_i)`; here, from the Jacobian."""
        y, jacs = self.value_and_jacobian(f, xs)
        m = _size(y)

        def pb(w):
            w = namespace(w).reshape(w, (m,))
            return tuple(
                namespace(J).reshape(w @ namespace(J).reshape(J, (m, _size(x))), x.shape) for J, x in zip(jacs, xs)
            )

        return y, pb

    def value_and_pushforward(self, f: Callable, xs: tuple):
        """`(y, pf)` with `y = f(*xs)` and `pf(vs) = Σ_i ∂y/∂x_i v_i` (same shape as y); here, from the
        Jacobian."""
        y, jacs = self.value_and_jacobian(f, xs)
        m = _size(y)

        def pf(vs):
            terms = [
                namespace(J).reshape(J, (m, _size(x))) @ namespace(v).reshape(v, (_size(x),))
                for J, x, v in zip(jacs, xs, vs)
            ]
            return namespace(*terms).reshape(sum(terms[1:], terms[0]), y.shape)

        return y, pf

    def value_and_jacobian(self, f: Callable, xs: tuple):
        """`(y, Js)` with `Js[i]` of shape `y.shape + xs[i].shape`, from the native primitive (`mode`):
        one pullback per entry of y, or one pushforward per entry of each x."""
        if NATIVE[self.mode] == "pullback":
            y, pb = self.value_and_pullback(f, xs)
            m = _size(y)
            basis = namespace(y).reshape(self.asarray(np.eye(m), like=y), (m, *y.shape))
            rows = self.map(pb, basis)
            return y, tuple(namespace(r).reshape(r, (*y.shape, *x.shape)) for r, x in zip(rows, xs))
        y, pf = self.value_and_pushforward(f, xs)
        jacs = []
        for i, x in enumerate(xs):
            n = _size(x)
            basis = namespace(x).reshape(self.asarray(np.eye(n), like=x), (n, *x.shape))
            zeros = [self.asarray(np.zeros(z.shape), like=z) for z in xs]
            cols = self.map(lambda e: pf(tuple(zeros[:i]) + (e,) + tuple(zeros[i + 1 :])), basis)
            cols = namespace(cols).reshape(cols, (n, _size(y))).T
            jacs.append(namespace(cols).reshape(cols, (*y.shape, *x.shape)))
        return y, tuple(jacs)


class AbstractHostBackend(AbstractBackend):
    """An engine whose products run on the host: not traced nor compiled by JAX, not differentiable
    again inside it; batches of host callbacks run through `map_batch`."""

    traced = False
    host = True
    compiled = False
    higher_order = False
    vmappable = True


# what a concrete backend declares: name -> AbstractClassVar (a class attribute) or AbstractVar (any attribute)
_DECLARED = {
    n: typing.get_origin(hint)
    for n, hint in typing.get_type_hints(AbstractBackend).items()
    if typing.get_origin(hint) in (AbstractClassVar, AbstractVar)
}


def _check_declarations(cls: type["AbstractBackend"]) -> None:
    """Raise a TypeError naming what `cls` must declare or implement to be created."""
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    missing = [n for n in _DECLARED if not (hasattr(cls, n) or n in fields)]
    if missing:
        raise TypeError(
            f"{cls.__name__} cannot be created: declare {', '.join(missing)} (see sciad.ad.AbstractBackend)"
        )
    for n, kind in _DECLARED.items():
        if kind is AbstractClassVar and isinstance(inspect.getattr_static(cls, n), property):
            raise TypeError(f"{cls.__name__}.{n} must be a class attribute, not a property")
    if not cls.primitives or not set(cls.primitives) <= PRIMITIVES.keys():
        raise TypeError(
            f"{cls.__name__} cannot be created: it declares primitives={set(cls.primitives)}; declare "
            "those it implements, 'pullback' (value_and_pullback), 'pushforward' "
            "(value_and_pushforward) or both, and implement them"
        )
    for primitive, method in PRIMITIVES.items():
        implemented = getattr(cls, method) is not getattr(AbstractBackend, method)
        if primitive in cls.primitives and not implemented:
            raise TypeError(
                f"{cls.__name__} cannot be created: it declares the {primitive} but does not implement "
                f"it: implement {method}"
            )
        if implemented and primitive not in cls.primitives:
            raise TypeError(
                f"{cls.__name__} cannot be created: it implements the {primitive} but does not declare "
                f"it: add '{primitive}' to its primitives"
            )
    mode = inspect.getattr_static(cls, "mode")
    if not isinstance(mode, property) and NATIVE.get(mode) not in cls.primitives:
        raise TypeError(
            f"{cls.__name__} cannot be created: its mode {mode!r} must name a primitive it implements, "
            f"'reverse' (the pullback) or 'forward' (the pushforward); its primitives: "
            f"{sorted(cls.primitives)}"
        )


def check_scalar(y, op: str = "gradient") -> None:
    """Raise the `op` error unless `y` is a scalar (an array of shape ())."""
    shape = getattr(y, "shape", None)
    if shape is None or tuple(shape) != ():
        got = f"a {type(y).__name__}" if shape is None else f"shape {tuple(shape)}"
        raise ValueError(
            f"{op} needs f to return a scalar, but f returned {got}: use jacobian or vjp for non-scalar outputs"
        )


def _stacked(outs: list):
    """Results of a map stacked on a leading axis (tuples per item)."""
    if isinstance(outs[0], tuple):
        return tuple(namespace(*o).stack(list(o)) for o in zip(*outs))
    return namespace(*outs).stack(outs)


def _size(x) -> int:
    return int(np.prod(x.shape, dtype=int))
