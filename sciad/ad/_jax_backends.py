"""Backends traced by JAX: reverse, forward, jvp + transpose, and EnzymeJAX."""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from sciad._errors import error_if
from sciad.ad._backend import AbstractBackend


@dataclasses.dataclass(frozen=True)
class _JaxTraced(AbstractBackend):
    """Shared by the JAX engines: JAX arrays, `jax.jit`, `jax.vmap`; compiled with `jit`."""

    traced = True
    host = False
    higher_order = True
    vmappable = True
    jit: bool = True

    def asarray(self, x, like=None):
        return jnp.asarray(x, dtype=None if like is None else like.dtype)

    def compile(self, fn: Callable) -> Callable:
        return jax.jit(fn) if self.jit else fn

    def map(self, fn: Callable, batch):
        return jax.vmap(fn)(batch)

    @property
    def compiled(self) -> bool:
        return self.jit

    def hessian_engines(self) -> tuple[AbstractBackend, AbstractBackend]:
        """Forward over this engine."""
        return JaxForward(jit=self.jit), self


@dataclasses.dataclass(frozen=True)
class JaxReverse(_JaxTraced):
    """JAX reverse mode (`jax.vjp`). With `jit=True` the paper's compiled tape
    (ReverseDiff, compiled); with `jit=False` eager source-to-source (Zygote).
    `jit=True` cannot trace value-dependent Python branches."""

    name = "jax-reverse"
    mode = "reverse"
    primitives = frozenset({"pullback"})

    def value_and_pullback(self, f, xs):
        return jax.vjp(f, *xs)


@dataclasses.dataclass(frozen=True)
class JaxForward(_JaxTraced):
    """JAX forward mode (`jax.jvp`): the paper's ForwardDiff (dual numbers)."""

    name = "jax-forward"
    mode = "forward"
    primitives = frozenset({"pushforward"})

    def value_and_pushforward(self, f, xs):
        y = f(*xs)
        return y, lambda vs: jax.jvp(f, xs, tuple(vs))[1]


@dataclasses.dataclass(frozen=True)
class JaxTranspose(_JaxTraced):
    """Reverse mode as JAX models it (seed 000): linearize, then transpose the
    linear map (`jax.linearize` + `jax.linear_transpose`). Both primitives."""

    name = "jax-transpose"
    mode = "reverse"
    primitives = frozenset({"pullback", "pushforward"})

    def value_and_pullback(self, f, xs):
        y, lin = jax.linearize(f, *xs)
        transpose = jax.linear_transpose(lin, *xs)
        return y, transpose

    def value_and_pushforward(self, f, xs):
        y, lin = jax.linearize(f, *xs)
        return y, lambda vs: lin(*vs)


@dataclasses.dataclass(frozen=True)
class Enzyme(AbstractBackend):
    """EnzymeJAX (`enzyme-ad`): compiler-level AD of the lowered program; always
    jitted. Reverse mode only (its forward mode fails on common programs in
    enzyme-ad 0.0.16); no `jax.vmap` (enzyme-ad has no batching rule), so
    Jacobians loop over pullbacks, and batches of the products of a function
    made with `differentiate_with(f, "enzyme")` run as a `jax.lax.map` loop;
    no second derivatives (enzyme-ad cannot differentiate its own
    derivatives). enzyme-ad 0.0.16 differentiates a product of neighbouring
    elements of one array (`u[0] * u[1]`) as the product over each element:
    NaN where an element is 0; a pullback that is not finite where f and the
    cotangent are raises at run time, naming the fix. Needs Python 3.11 on
    Linux x86_64."""

    name = "enzyme"
    mode = "reverse"
    primitives = frozenset({"pullback"})
    traced = True
    host = False
    compiled = True
    higher_order = False
    vmappable = False
    package = "enzyme_ad"
    extra = "enzyme"

    def asarray(self, x, like=None):
        return jnp.asarray(x, dtype=None if like is None else like.dtype)

    def compile(self, fn: Callable) -> Callable:
        return jax.jit(fn)

    @staticmethod
    def _lower(f):
        from enzyme_ad.jax import enzyme_jax_ir

        return enzyme_jax_ir()(f)

    def value_and_pullback(self, f, xs):
        for primitive in _primitives(jax.make_jaxpr(f)(*xs)):
            if primitive in ENZYME_REFUSES:
                raise NotImplementedError(
                    f"enzyme-ad 0.0.16 cannot differentiate `{primitive}` (jax.numpy.{primitive}): "
                    f"{ENZYME_REFUSES[primitive]}; use another engine for this function, e.g. 'jax-reverse'"
                )
        y, pullback = jax.vjp(self._lower(f), *xs)
        return y, lambda w: _finite(pullback(w), (y, w))


# JAX primitives enzyme-ad 0.0.16 mis-differentiates, refused before lowering (tests/test_namespace.py).
ENZYME_REFUSES = {
    "atanh": "its derivative has the wrong sign",
    "acosh": "its derivative is wrong",
    "tan": "it has no adjoint rule for stablehlo.tan",
    "sort": "it crashes the process",
}


def _finite(cotangents, given):
    """`cotangents`, raising a `SolveError` when the program runs where they are not finite but f's
    value and the cotangent pulled back (`given`) are."""
    finite = lambda tree: jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))
    return error_if(
        cotangents,
        finite(given) & ~finite(cotangents),
        "the 'enzyme' engine's derivative is NaN or infinite where f and the cotangent are finite: "
        "enzyme-ad 0.0.16 differentiates a product of neighbouring elements of one array "
        "(u[0] * u[1]) as the product over each element, NaN where one is 0; use another engine "
        "for this function, e.g. 'jax-reverse'",
    )


def _primitives(jaxpr):
    """Names of the primitives in `jaxpr` and the jaxprs nested in its equations."""
    for eqn in jaxpr.eqns:
        yield eqn.primitive.name
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if hasattr(sub, "eqns"):
                    yield from _primitives(sub)
