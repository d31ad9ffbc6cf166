"""`differentiate_with`: a function differentiated by any engine, called from
compiled JAX code, against JAX's own derivatives of the same function."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad.ad as ad
from sciad.ad import namespace

U = np.array([1.0, 0.5])
P = np.array([1.5, 1.0, 3.0, 1.0])
DU = np.array([0.3, -0.7])
DP = np.array([0.2, -0.1, 0.4, 0.5])
W = np.array([-0.6, 1.1])
ENZYME_NO_VMAP = "enzyme-ad 0.0.16 has no batching rule: its functions cannot be vmapped"


def lotka_volterra(u, p):
    """The right-hand side du/dt = f(u, p), written once for every engine."""
    xp = namespace(u, p)
    return xp.stack([p[0] * u[0] - p[1] * u[0] * u[1], -p[2] * u[1] + p[3] * u[0] * u[1]])


def _tolerance(engine_name):
    return 1e-6 if engine_name == "finite-differences" else 1e-10


def _loss(rhs):
    return lambda u, p: jnp.sum(jnp.sin(rhs(u, p)))


def _assert_close(actual, expected, rtol):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * max(1.0, float(jnp.max(jnp.abs(e)))))


@pytest.fixture
def rhs(engine_name):
    return ad.differentiate_with(lotka_volterra, engine_name)


def _vjp(rhs, u, p):
    y, pb = jax.vjp(rhs, u, p)
    return y, pb(W)


# JAX transformations of a right-hand side `rhs`, each run under jax.jit.
TRANSFORMS = {
    "value": lambda rhs, u, p: rhs(u, p),
    "jvp": lambda rhs, u, p: jax.jvp(rhs, (u, p), (DU, DP)),
    "jvp-u-only": lambda rhs, u, p: jax.jvp(lambda u: rhs(u, p), (u,), (DU,)),
    "vjp": _vjp,
    "grad-p-only": lambda rhs, u, p: jax.grad(_loss(rhs), argnums=1)(u, p),
    "grad-u-only": lambda rhs, u, p: jax.grad(_loss(rhs), argnums=0)(u, p),
    "jacrev": lambda rhs, u, p: jax.jacrev(rhs, argnums=(0, 1))(u, p),
    "jacfwd": lambda rhs, u, p: jax.jacfwd(rhs, argnums=(0, 1))(u, p),
}


@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
def test_transforms_under_jit(engine_name, rhs, transform):
    if engine_name == "enzyme" and transform == "jacrev":
        pytest.skip(ENZYME_NO_VMAP + " (jax.jacrev vmaps the pullback)")
    t = TRANSFORMS[transform]
    actual = jax.jit(lambda u, p: t(rhs, u, p))(U, P)
    expected = jax.jit(lambda u, p: t(lotka_volterra, u, p))(U, P)
    _assert_close(actual, expected, _tolerance(engine_name))


def test_vmap_of_gradient(engine_name, rhs):
    if engine_name == "enzyme":
        pytest.skip(ENZYME_NO_VMAP)
    us = U + np.linspace(-0.5, 0.5, 4)[:, None]
    batched = lambda rhs: jax.jit(jax.vmap(jax.grad(_loss(rhs), argnums=1), in_axes=(0, None)))  # noqa: E731
    _assert_close(batched(rhs)(us, P), batched(lotka_volterra)(us, P), _tolerance(engine_name))


def test_float32_stays_float32(engine_name, rhs):
    u, p = U.astype(np.float32), P.astype(np.float32)
    y, pb = jax.vjp(jax.jit(rhs), u, p)
    grads = jax.jit(jax.grad(_loss(rhs), argnums=(0, 1)))(u, p)
    for out in (y, *pb(W.astype(np.float32)), *grads):
        assert out.dtype == jnp.float32
    np.testing.assert_allclose(y, lotka_volterra(U, P), rtol=1e-6)


def _counted_lotka_volterra(calls):
    def f(u, p, t):
        if not isinstance(u, jax.core.Tracer):  # a host evaluation
            calls.append(t)
        return lotka_volterra(u, p) * namespace(u, p, t).cos(t)

    return f


def test_finite_differences_have_no_columns_for_inactive_arguments():
    """The pullback in (u, p) at fixed t: 1 + 2 (2 + 4) evaluations, none moving t."""
    calls = []
    g = ad.differentiate_with(_counted_lotka_volterra(calls), "finite-differences")
    t = np.array(0.3)
    _, pb = jax.vjp(lambda u, p: g(u, p, t), U, P)
    del calls[:]
    pb(W)
    assert len(calls) == 1 + 2 * (U.size + P.size)
    assert all(c == t for c in calls)
    _, tangent = jax.jvp(lambda u: g(u, P, t), (U,), (DU,))
    assert all(c == t for c in calls)
    _assert_close(tangent, jax.jvp(lambda u: lotka_volterra(u, P) * jnp.cos(t), (U,), (DU,))[1], 1e-6)


@pytest.mark.parametrize("engine", ["torch", "autograd"])
def test_tape_engines_hold_inactive_arguments_constant(engine):
    """`t` reaches the engine as a plain array (no requires_grad, no box), so code that
    needs a concrete t (here `float(t)`) works, and the gradient in p is right."""
    if engine not in ad.available():
        pytest.skip(f"{engine} is not installed")
    seen = []

    def f(u, p, t):
        seen.append(type(t).__module__.split(".")[0] + str(getattr(t, "requires_grad", "")))
        return lotka_volterra(u, p) * float(t)

    g = ad.differentiate_with(f, engine)
    t = np.array(0.3)
    grad = jax.grad(lambda p: jnp.sum(g(U, p, t) ** 2))(P)
    _assert_close(grad, jax.grad(lambda p: jnp.sum((lotka_volterra(U, p) * 0.3) ** 2))(P), 1e-10)
    assert set(seen) - {"jax"} == ({"torchFalse"} if engine == "torch" else {"numpy"})
