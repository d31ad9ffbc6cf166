"""`linear_map` and the rules built on it are differentiable again.

`differentiate_with(f, engine)` for the JAX engines agrees with plain JAX to
third order, in forward-over-reverse, reverse-over-reverse and
forward-over-forward, under `jax.jit` and `jax.vmap`; engines that cannot
differentiate their own derivatives say so; Enzyme, which cannot be vmapped,
is batched by a loop.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad.ad as ad
from sciad.ad._linear import HigherOrderError, accumulate_pullback, linear_map

X = jnp.array([0.3, -0.5, 0.7])
Y = jnp.array([1.1, 0.9, 1.3])


def f(x, y):
    xp = ad.namespace(x, y)
    return xp.sin(x) * y**2 + x**3 * y[0]


def loss(g):
    return lambda x: jnp.sum(g(x, Y) ** 2) + jnp.prod(g(x, Y))


JAX_ENGINES = ["jax-reverse", "jax-forward", "jax-transpose"]
ORDERS = {
    "grad": jax.grad,
    "hessian": jax.hessian,
    "forward-over-forward": lambda h: jax.jacfwd(jax.jacfwd(h)),
    "reverse-over-reverse": lambda h: jax.jacrev(jax.grad(h)),
    "third": lambda h: jax.jacfwd(jax.hessian(h)),
    "vmap-of-grad": lambda h: jax.vmap(jax.grad(h)),
}


def _point(order):
    return jnp.stack([X, 2 * X]) if order == "vmap-of-grad" else X


@functools.cache
def _plain_jax(order):
    """Plain JAX's derivative of `order` at its point: compiled (eagerly, a small program per operation), once per
    order for the module (the same for every engine)."""
    return np.asarray(jax.jit(ORDERS[order](loss(f)))(_point(order)))


@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("engine", JAX_ENGINES)
def test_jax_engines_agree_with_jax_to_third_order(engine, order):
    mine = jax.jit(ORDERS[order](loss(ad.differentiate_with(f, engine))))(_point(order))
    np.testing.assert_allclose(mine, _plain_jax(order), rtol=1e-12, atol=1e-12)


def test_enzyme_is_batched_by_a_loop():
    if "enzyme" not in ad.available():
        pytest.skip("enzyme-ad is not installed")
    g = ad.differentiate_with(f, "enzyme")
    np.testing.assert_allclose(jax.jit(jax.jacrev(lambda x: g(x, Y)))(X), jax.jacrev(lambda x: f(x, Y))(X), rtol=1e-12)
    xs = jnp.stack([X, 2 * X])
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(loss(g))))(xs), jax.vmap(jax.grad(loss(f)))(xs), rtol=1e-12)


@pytest.mark.parametrize("engine,match", [("enzyme", "'enzyme' engine"), ("torch", "host engine 'torch'")])
def test_engines_without_second_derivatives_say_so(engine, match):
    if engine not in ad.available():
        pytest.skip(f"{engine} is not installed")

    def numpy_f(x, y):  # torch runs f on its own arrays
        xp = ad.namespace(x, y)
        return xp.sin(x) * y**2

    g = ad.differentiate_with(numpy_f, engine)
    with pytest.raises(HigherOrderError, match=match):
        jax.hessian(lambda x: jnp.sum(g(x, Y) ** 2))(X)


def test_linear_map_with_a_declared_transpose():
    """A map nonlinear in its residual r, A(r) v with A(r) = diag(sin r) + outer(r, r): first
    and second derivatives through the declared transpose match plain JAX."""

    def A(r):
        return jnp.diag(jnp.sin(r)) + jnp.outer(r, r)

    def apply(r, v):
        return linear_map(lambda r, v: A(r) @ v, lambda r, w: A(r).T @ w, r, v)

    def through_map(x):
        return jnp.sum(apply(x**2, jnp.cos(x)) ** 2)

    def plain(x):
        return jnp.sum((A(x**2) @ jnp.cos(x)) ** 2)

    for op in (jax.grad, jax.hessian, lambda h: jax.jacrev(jax.grad(h))):
        # plain JAX's compiled too (eagerly, a small program per operation)
        np.testing.assert_allclose(jax.jit(op(through_map))(X), jax.jit(op(plain))(X), rtol=1e-12, atol=1e-12)


def test_linear_map_closing_over_a_traced_value():
    """A traced value the map closes over is hoisted into its residuals and differentiated."""

    def h(k):
        return jnp.sum(linear_map(lambda _, v: k * jnp.sin(k) * v, lambda _, w: k * jnp.sin(k) * w, (), X))

    np.testing.assert_allclose(jax.grad(h)(0.7), jnp.sum(X) * (jnp.sin(0.7) + 0.7 * jnp.cos(0.7)), rtol=1e-12)
    np.testing.assert_allclose(jax.hessian(h)(0.7), jax.hessian(lambda k: jnp.sum(k * jnp.sin(k) * X))(0.7), rtol=1e-12)


def test_each_direction_is_traced_only_when_used():
    """A rule's pushforward is traced by jax.jvp and its pullback by jax.grad, never the other: a reverse-mode
    gradient of a solve once traced (and threw away) a forward-mode solve too."""
    import sciad

    calls = {"pushforward": 0, "pullback": 0}

    class Counted(sciad.InterpolatingAdjoint):
        def pushforward(self, setup, rec, du0, dp):
            calls["pushforward"] += 1
            return super().pushforward(setup, rec, du0, dp)

        def pullback(self, setup, rec, w):
            calls["pullback"] += 1
            return super().pullback(setup, rec, w)

    prob = sciad.ODEProblem(lambda u, p, t: -p * u, np.ones(2), (0.0, 1.0), np.array([0.5, 1.5]))

    def loss(p):
        return jnp.sum(sciad.solve(prob, p=p, sensealg=Counted()).us ** 2)

    gradient = jax.jit(jax.grad(loss))(prob.p)
    assert calls == {"pushforward": 0, "pullback": 1}
    tangent = jax.jit(lambda p, v: jax.jvp(loss, (p,), (v,))[1])(prob.p, jnp.ones(2))
    assert calls == {"pushforward": 1, "pullback": 1}
    np.testing.assert_allclose(tangent, jnp.sum(gradient), rtol=1e-6)
    with pytest.raises(TypeError, match="closes over a traced value"):  # a deferred fun must not close over tracers
        jax.jit(lambda x: linear_map(lambda r, v: v * x, lambda r, w: w * x, (), jnp.ones(2), out=jnp.ones(2)))(2.0)


def _accumulated(x, p, w, acc):
    return accumulate_pullback(lambda x, p: jnp.tanh(p[:3] * x) * p[3], x, p, w, acc, (1,))


def _plain(x, p, w, acc):
    x_bar, p_bar = jax.vjp(lambda x, p: jnp.tanh(p[:3] * x) * p[3], x, p)[1](w)
    return x_bar, acc + p_bar


def test_accumulate_pullback_batched_and_differentiated():
    """`accumulate_pullback` is the plain pullback plus the accumulator, member by member under vmap
    (p batched or not), and in its derivatives; under a transpose whose batch shares p (slot 1), the
    batch's p cotangent is its members' sum."""
    p, acc = jnp.array([0.4, -0.2, 0.9, 1.5]), jnp.array([0.1, 0.2, 0.3, 0.4])
    xs, ws, ps = X + jnp.arange(4.0)[:, None], Y * jnp.arange(1.0, 5.0)[:, None], p + 0.1 * jnp.arange(4.0)[:, None]
    for in_axes, args in [((0, None, 0, None), (xs, p, ws, acc)), ((0, 0, 0, 0), (xs, ps, ws, ps))]:
        for a, b in zip(jax.vmap(_accumulated, in_axes)(*args), jax.vmap(_plain, in_axes)(*args)):
            np.testing.assert_allclose(a, b, rtol=1e-12)
    tangents = (Y, p[::-1], X, acc * 2)
    for a, b in zip(jax.jvp(_accumulated, (X, p, Y, acc), tangents), jax.jvp(_plain, (X, p, Y, acc), tangents)):
        for u, v in zip(a, b):
            np.testing.assert_allclose(u, v, rtol=1e-12)

    rules = ad.custom_linear_rules(
        lambda x, p, active: (jnp.tanh(p[:3] * x) * p[3], (x, p)),
        lambda res, vs: jax.jvp(lambda x, p: jnp.tanh(p[:3] * x) * p[3], res, vs)[1],
        lambda res, w: _accumulated(*res, w, jnp.zeros_like(res[1])),
    )
    got = jax.grad(lambda p: jnp.sum(jax.vmap(rules, (0, None))(xs, p) * ws))(p)
    want = sum(_plain(x, p, w, jnp.zeros_like(p))[1] for x, w in zip(xs, ws))
    np.testing.assert_allclose(got, want, rtol=1e-12)
