"""A backend declares the primitives it implements and its capabilities; one that declares none, or
not what it implements, cannot be created; one primitive is enough for every operator."""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad.ad as ad
from sciad.ad._backend import AbstractBackend


@dataclasses.dataclass(frozen=True)
class _Jax(AbstractBackend):
    """JAX arrays, no compilation: what the backends below share."""

    traced = True
    host = False
    compiled = False
    higher_order = True
    vmappable = True

    def asarray(self, x, like=None):
        return jnp.asarray(x, dtype=None if like is None else like.dtype)


def backend_class(**body):
    """A frozen dataclass backend made of `_Jax`'s declarations and `body`."""
    return dataclasses.dataclass(frozen=True)(type("Engine", (_Jax,), {"name": "engine", **body}))


def pullback(self, f, xs):
    return jax.vjp(f, *xs)


def pushforward(self, f, xs):
    return f(*xs), lambda vs: jax.jvp(f, xs, tuple(vs))[1]


OnlyPullback = backend_class(
    name="only-pullback", mode="reverse", primitives=frozenset({"pullback"}), value_and_pullback=pullback
)
OnlyPushforward = backend_class(
    name="only-pushforward", mode="forward", primitives=frozenset({"pushforward"}), value_and_pushforward=pushforward
)


def f(x):
    return jnp.sum(jnp.sin(x) * x[::-1]) + x[0] ** 3


def g(x):
    return jnp.stack([x[0] * x[1], jnp.exp(x[2]) - x[0], x[1] ** 2])


X, V, W = np.array([0.3, -1.2, 0.7]), np.array([1.0, 0.5, -2.0]), np.array([0.2, -1.0, 3.0])


@pytest.mark.parametrize("backend", [OnlyPullback(), OnlyPushforward()], ids=lambda b: b.name)
def test_one_primitive_gives_every_operator(backend):
    hessian = jax.hessian(f)(X)
    close = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)  # noqa: E731
    close(ad.gradient(backend, f, X), jax.grad(f)(X))
    close(ad.jacobian(backend, g, X), jax.jacobian(g)(X))
    close(ad.jvp(backend, g, X, V), jax.jvp(g, (X,), (V,))[1])
    close(ad.vjp(backend, g, X, W), jax.vjp(g, X)[1](W)[0])
    close(ad.hessian(backend, f, X), hessian)
    close(ad.hvp(backend, f, X, V), hessian @ V)
    close(ad.derivative(backend, lambda t: jnp.sin(t) * t, 0.4), np.cos(0.4) * 0.4 + np.sin(0.4))
    close(ad.differentiate_with(g, backend)(X), g(X))
    close(
        jax.grad(lambda x: jnp.sum(ad.differentiate_with(g, backend)(x) ** 2))(X),
        jax.grad(lambda x: jnp.sum(g(x) ** 2))(X),
    )


@pytest.mark.parametrize(
    "body, message",
    [
        ({"mode": "reverse", "primitives": frozenset()}, "Engine cannot be created: it declares primitives=set()"),
        ({"mode": "reverse"}, "Engine cannot be created: declare primitives"),
        (
            {"mode": "reverse", "primitives": frozenset({"pullback"})},
            "Engine cannot be created: it declares the pullback but does not implement it: "
            "implement value_and_pullback",
        ),
        (
            {"mode": "forward", "primitives": frozenset({"pushforward"}), "value_and_pullback": pullback},
            "it implements the pullback but does not declare it: add 'pullback' to its primitives",
        ),
        (
            {"mode": "forward", "primitives": frozenset({"pullback"}), "value_and_pullback": pullback},
            "its mode 'forward' must name a primitive it implements",
        ),
        (
            {"primitives": frozenset({"pullback"}), "value_and_pullback": pullback},
            "Engine cannot be created: declare mode",
        ),
        (
            {"mode": "reverse", "primitives": frozenset({"jacobian"})},
            "'pullback' \\(value_and_pullback\\), 'pushforward'",
        ),
        (
            {
                "mode": "reverse",
                "primitives": property(lambda self: frozenset({"pullback"})),
                "value_and_pullback": pullback,
            },
            "Engine.primitives must be a class attribute, not a property",
        ),
    ],
)
def test_a_backend_missing_a_declaration_cannot_be_created(body, message):
    engine = backend_class(**body)
    with pytest.raises(TypeError, match=message):
        engine()


def test_a_backend_implementing_nothing_is_refused_before_any_derivation():
    """Before, the derived pullback asked the Jacobian, which asked the pullback: a RecursionError at first use."""

    @dataclasses.dataclass(frozen=True)
    class Nothing(_Jax):
        name = "nothing"
        mode = "reverse"
        primitives = frozenset()

    with pytest.raises(TypeError, match="Nothing cannot be created"):
        ad.gradient(Nothing(), f, X)


def test_registered_engines_declare_their_capabilities_as_class_attributes():
    """Every registered engine's capabilities are class attributes (readable on the class, as the benchmark
    reads them), save `compiled` where a setting (`jit`) decides it; HigherOrder's come from its engines."""
    for cls in ad.BACKENDS.values():
        for name in ("name", "primitives", "mode", "traced", "host", "higher_order", "vmappable"):
            assert not isinstance(inspect.getattr_static(cls, name), property), (cls.__name__, name)
        assert {"reverse": "pullback", "forward": "pushforward"}[cls.mode] in cls.primitives
    composed = ad.HigherOrder(ad.JaxForward(), ad.Torch())
    assert (composed.mode, composed.traced, composed.host, composed.compiled) == ("reverse", False, True, True)
