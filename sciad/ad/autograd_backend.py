"""HIPS autograd: operator overloading on NumPy, a dynamic tape."""

import dataclasses

import numpy as np

from sciad.ad.backend import AbstractBackend


@dataclasses.dataclass(frozen=True)
class Autograd(AbstractBackend):
    """HIPS autograd reverse mode (`autograd.make_vjp`): a tape recorded on
    every call over `autograd.numpy`. Value-dependent branches are fine.
    Nests with itself for Hessians."""

    name = "autograd"
    mode = "reverse"
    package = "autograd"
    extra = "autograd"

    def asarray(self, x, like=None):
        if like is not None:
            return np.asarray(x, dtype=like.dtype)
        return x if type(x).__module__.startswith("autograd") else np.asarray(x)

    def value_and_pullback(self, f, xs):
        from autograd import make_vjp

        vjp, y = make_vjp(lambda args: f(*args))(tuple(xs))
        return y, lambda w: tuple(vjp(w))
