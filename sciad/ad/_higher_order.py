"""Composition of two backends for second-order operators."""

import dataclasses

from sciad.ad._backend import AbstractBackend


@dataclasses.dataclass(frozen=True)
class HigherOrder(AbstractBackend):
    """`outer` differentiates what `inner` computes: Hessians are the `outer`
    Jacobian of the `inner` gradient (forward-over-reverse is
    `HigherOrder(JaxForward(), JaxReverse())`). First-order operators use
    `inner`. The two engines must compose: `outer` must be able to trace
    through `inner` (JAX over JAX, torch over torch, autograd over autograd,
    finite differences over anything). Its capabilities are its engines':
    first-order products and batches run on `inner`, compilation on
    `outer`."""

    outer: AbstractBackend
    inner: AbstractBackend

    name = "higher-order"
    primitives = frozenset({"pullback", "pushforward"})  # inner's, its other one derived there

    def __post_init__(self):
        for arg, backend in (("outer", self.outer), ("inner", self.inner)):
            if not isinstance(backend, AbstractBackend):
                raise TypeError(f"HigherOrder({arg}=...) must be a sciad.ad backend, got {backend!r}")

    @property
    def mode(self):
        return self.inner.mode

    @property
    def traced(self):
        return self.outer.traced and self.inner.traced

    @property
    def host(self):
        return self.outer.host or self.inner.host

    @property
    def compiled(self):
        return self.outer.compiled

    @property
    def higher_order(self):
        return self.outer.higher_order and self.inner.higher_order

    @property
    def vmappable(self):
        return self.inner.vmappable

    def asarray(self, x, like=None):
        return self.inner.asarray(x, like)

    def compile(self, fn):
        return self.outer.compile(fn)

    def map(self, fn, batch):
        return self.inner.map(fn, batch)

    def hessian_engines(self):
        return self.outer, self.inner

    def value_and_pullback(self, f, xs):
        return self.inner.value_and_pullback(f, xs)

    def value_and_pushforward(self, f, xs):
        return self.inner.value_and_pushforward(f, xs)

    def value_and_jacobian(self, f, xs):
        return self.inner.value_and_jacobian(f, xs)
