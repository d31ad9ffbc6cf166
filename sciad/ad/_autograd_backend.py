"""HIPS autograd: operator overloading on NumPy, a dynamic tape."""

import dataclasses
import re

import numpy as np

from sciad.ad._backend import AbstractHostBackend

_FIX = (
    "write f with functions autograd differentiates (`sciad.ad.namespace(x)` gives the array-API ones), "
    "or use another engine, e.g. 'jax-reverse' or 'torch'"
)


@dataclasses.dataclass(frozen=True)
class Autograd(AbstractHostBackend):
    """HIPS autograd reverse mode (`autograd.make_vjp`): a tape recorded on
    every call over `autograd.numpy`. Value-dependent branches are fine.
    Nests with itself for Hessians. A function autograd has no derivative
    rule for, or an output that lost the tape, raises an error naming it."""

    name = "autograd"
    mode = "reverse"
    primitives = frozenset({"pullback"})
    package = "autograd"
    extra = "autograd"

    def asarray(self, x, like=None):
        if like is not None:
            return np.asarray(x, dtype=like.dtype)
        return x if type(x).__module__.startswith("autograd") else np.asarray(x)

    def value_and_pullback(self, f, xs):
        from autograd import make_vjp

        try:
            vjp, y = make_vjp(lambda args: f(*args))(tuple(xs))  # pyright: ignore[reportGeneralTypeIssues]  # autograd's decorated make_vjp
        except NotImplementedError as e:
            rule = re.match(r"VJP of (\S+) wrt", str(e))
            if rule is None:
                raise
            raise NotImplementedError(
                f"autograd cannot differentiate `{rule[1]}` (it has no derivative rule): {_FIX}"
            ) from e
        if getattr(y, "dtype", None) == np.dtype(object):
            raise TypeError(
                "f returned a NumPy object array holding autograd values: a NumPy function (such as "
                "numpy.asarray of a list) dropped the tape, which would give a zero gradient; build "
                "arrays with `sciad.ad.namespace(x)` (its `asarray`, `stack`, `concat` keep the tape)"
            )
        return y, lambda w: tuple(vjp(w))
