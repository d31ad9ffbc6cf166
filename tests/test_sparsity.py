"""Jacobian sparsity from jaxprs (`sciad.sparsity`): detected patterns hold every nonzero of the
Jacobian (checked against jax.jacfwd at random points) and are exact where the operations are
followed exactly; colourings give every entry from few products.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sciad.problems import brusselator_pde
from sciad.sparsity import jacobian_pattern

RNG = np.random.default_rng(0)


def true_nonzeros(fn, x, *args, points=3):
    """The union of the Jacobian's nonzeros at a few random points near x."""
    found = np.zeros((np.size(fn(x, *args)), x.size), bool)
    for _ in range(points):
        found |= np.asarray(jax.jacfwd(fn)(x * (1 + 0.3 * RNG.standard_normal(x.shape)), *args)) != 0
    return found


def laplacian_1d(n):
    return np.diag(-2.0 * np.ones(n)) + np.diag(np.ones(n - 1), 1) + np.diag(np.ones(n - 1), -1)


CASES = {
    "stencil by roll": lambda x: jnp.roll(x, 1) - 2 * x + jnp.roll(x, -1),
    "constant sparse matrix": lambda x: jnp.asarray(laplacian_1d(x.size)) @ x + x**3,
    "fixed gather": lambda x: x[jnp.array([3, 0, 0, 5])] * x[:4],
    "slices, pad, concatenate": lambda x: jnp.concatenate([jnp.pad(x[1:] - x[:-1], (0, 1)), x[:2] ** 2]),
    "2-D reshape, transpose and reduce": lambda x: jnp.sum(x.reshape(3, 4).T ** 2, axis=1),
    "where and comparisons": lambda x: jnp.where(x > 0, jnp.sin(x), x**2) * jax.lax.stop_gradient(x[0]),
    "custom_jvp and jit": lambda x: jax.jit(jax.nn.softplus)(x) + jax.nn.relu(x[::-1]),
    "cumsum": lambda x: jnp.cumsum(x) * x,
    "cond": lambda x: jax.lax.cond(x[0] > 0, lambda y: y * 2, lambda y: jnp.roll(y, 2), x),
    "vmap of jvp (size-1 broadcasting)": lambda x: jax.vmap(
        lambda s: jax.jvp(lambda u: u**2 * jnp.roll(u, 1), (x[:4],), (s,))[1])(x[4:].reshape(2, 4)).ravel(),
}
EXACT = {"stencil by roll", "constant sparse matrix", "fixed gather", "slices, pad, concatenate",
         "2-D reshape, transpose and reduce", "where and comparisons", "custom_jvp and jit",
         "vmap of jvp (size-1 broadcasting)"}


@pytest.mark.parametrize("name", list(CASES))
def test_pattern_holds_every_nonzero(name):
    x = jnp.asarray(RNG.uniform(0.5, 1.5, 12))
    pattern = jacobian_pattern(CASES[name], x)
    detected = pattern.matrix.toarray()
    truth = true_nonzeros(CASES[name], x)
    assert not np.any(truth & ~detected), f"{name}: a nonzero entry the pattern misses"
    if name in EXACT:
        np.testing.assert_array_equal(detected, truth, err_msg=name)
        assert pattern.conservative == ()


def test_brusselator_pattern_is_exact_and_needs_few_colours():
    b = brusselator_pde(6)
    f = lambda u, p: b.problem.f(u, p, 0.0)  # noqa: E731
    u = jnp.asarray(b.problem.u0) + 0.1
    pattern = jacobian_pattern(f, u, b.problem.p)
    np.testing.assert_array_equal(pattern.matrix.toarray(), true_nonzeros(f, u, b.problem.p))
    colouring = pattern.colouring()
    assert colouring.count <= 12 and len(colouring.dense) == 0
    values = colouring.jacobian_values(lambda x: f(x, b.problem.p), u)
    rows, cols = colouring.rows_cols
    np.testing.assert_allclose(values, np.asarray(jax.jacfwd(f)(u, b.problem.p))[rows, cols], rtol=1e-12)


def test_dense_rows_go_by_reverse_mode():
    """A sum over every state (an adjoint's parameter row): one VJP, and the rest coloured alone."""
    def fn(x):
        return jnp.concatenate([jnp.roll(x, 1) * x, jnp.sum(x**2)[None]])

    x = jnp.asarray(RNG.uniform(0.5, 1.5, 40))
    colouring = jacobian_pattern(fn, x).colouring(dense_row=10)
    np.testing.assert_array_equal(colouring.dense, [40])
    assert colouring.count <= 3
    rows, cols = colouring.rows_cols
    np.testing.assert_allclose(colouring.jacobian_values(fn, x), np.asarray(jax.jacfwd(fn)(x))[rows, cols],
                               rtol=1e-12)


def test_an_unknown_operation_is_conservative_and_named():
    x = jnp.asarray(RNG.uniform(0.5, 1.5, 6))
    pattern = jacobian_pattern(lambda x: jnp.sort(x) * x, x)
    assert "sort" in pattern.conservative and pattern.matrix.nnz == 36


def test_arguments_other_than_x_carry_nothing_and_may_be_traced():
    def fn(x, p):
        return x * p[0] + jnp.sum(p)

    @jax.jit
    def nnz(p):
        return jacobian_pattern(fn, jnp.ones(5), p).matrix.nnz + 0 * p[0]

    assert int(nnz(jnp.ones(3))) == 5


def test_a_jaxpr_seen_before_is_found_not_propagated_and_its_constants_count():
    """Solvers trace one stage relation many times per program: its pattern is remembered by the
    jaxpr and its constants' values (a closed-over index array changes the pattern, not the jaxpr)."""
    x = jnp.ones(6)

    def gather(indices):
        return lambda x: x[jnp.asarray(indices)] * 2

    first = jacobian_pattern(gather(np.array([0, 1, 2])), x)
    assert jacobian_pattern(gather(np.array([0, 1, 2])), x) is first
    other = jacobian_pattern(gather(np.array([5, 4, 3])), x)
    assert other is not first and sorted(other.matrix.indices) == [3, 4, 5]
    assert first.colouring() is jacobian_pattern(gather(np.array([0, 1, 2])), x).colouring()


def test_remembered_patterns_keep_no_function_nor_what_it_captures():
    import gc
    import weakref

    class Weights(np.ndarray):  # a weak-referenceable array captured by f
        pass

    weights = np.arange(1.0, 6.0).view(Weights)

    def f(x):
        return x * weights

    refs = weakref.ref(f), weakref.ref(weights)
    jacobian_pattern(f, jnp.ones(5)).colouring()
    del f, weights
    gc.collect()
    assert all(ref() is None for ref in refs)
