"""sciad._host_lu: sparse LU solves on the host as a JAX primitive, against dense NumPy solves."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

from sciad._host_lu import COUNTS, HostLU, lu_solve


def random_sparse(n, seed, density=0.1, dtype=np.float64):
    """(HostLU, entries): a diagonally dominant sparse n × n matrix, entries in pattern order."""
    matrix = sp.random(n, n, density=density, random_state=seed, format="coo") + 4 * sp.identity(n, format="coo")
    matrix = matrix.tocoo()
    matrix.sum_duplicates()
    return HostLU(matrix.row, matrix.col, (n, n), kept=2), matrix.data.astype(dtype)


def dense(lu, values):
    out = np.zeros(lu.shape, values.dtype)
    out[lu.rows, lu.cols] = values
    return out


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_solves_under_jit_as_numpy_does(dtype):
    lu, values = random_sparse(40, 0, dtype=dtype)
    b = np.random.default_rng(1).standard_normal(40).astype(dtype)
    x = jax.jit(lambda v, b: lu_solve(lu, v, b))(jnp.asarray(values), jnp.asarray(b))
    assert x.dtype == dtype
    np.testing.assert_allclose(x, np.linalg.solve(dense(lu, values), b), rtol=1e-4 if dtype == np.float32 else 1e-10)


def test_vmap_over_entries_right_hand_sides_or_both():
    lu, values = random_sparse(30, 2)
    rng = np.random.default_rng(3)
    batch_values = values * (1 + 0.1 * rng.random((3, 1)))
    bs = rng.standard_normal((3, 30))
    expected = np.stack([np.linalg.solve(dense(lu, v), b) for v, b in zip(batch_values, bs)])
    np.testing.assert_allclose(jax.vmap(lambda v, b: lu_solve(lu, v, b))(batch_values, bs), expected, rtol=1e-10)
    np.testing.assert_allclose(
        jax.vmap(lambda b: lu_solve(lu, values, b), in_axes=1)(bs.T),
        np.linalg.solve(dense(lu, values), bs.T).T,
        rtol=1e-10,
    )
    np.testing.assert_allclose(
        jax.vmap(lambda v: lu_solve(lu, v, bs[0]))(batch_values),
        [np.linalg.solve(dense(lu, v), bs[0]) for v in batch_values],
        rtol=1e-10,
    )


def test_a_held_factorisation_is_reused_for_equal_entries_only():
    lu, values = random_sparse(25, 4)
    b = np.ones(25)
    COUNTS.clear()
    for entries in (values, values, values * 2, values, values * 3, values * 2 + 1e-12):
        lu(entries[None], b[None])
    assert (COUNTS["solves"], COUNTS["factorisations"]) == (6, 4)  # kept=2: values*3 pushed `values` out first
    assert COUNTS["factor_bytes"] > 0


def test_a_singular_matrix_gives_nan():
    lu = HostLU(np.array([0, 1]), np.array([0, 0]), (2, 2), kept=1)  # column 1 empty
    assert np.isnan(lu_solve(lu, jnp.ones(2), jnp.ones(2))).all()


def test_equal_patterns_are_one_static_value():
    a, _ = random_sparse(10, 5)
    b, _ = random_sparse(10, 5)
    c, _ = random_sparse(10, 6)
    assert a == b and hash(a) == hash(b) and a != c


def test_threads_solving_at_once_each_get_their_own_matrix():
    """JAX calls the host from several threads: with one factorisation held, each thread's next
    factorisation pushes out another's, and every solve still uses its own matrix."""
    import concurrent.futures

    two, values = random_sparse(30, 7)
    lu = HostLU(two.rows, two.cols, two.shape, kept=1)
    b = np.arange(30.0)
    scales = np.linspace(1, 2, 8)

    def solve(scale):
        return [lu.solve(values * scale, b) for _ in range(5)]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(solve, scales))
    for scale, xs in zip(scales, results):
        np.testing.assert_allclose(xs, [np.linalg.solve(dense(lu, values * scale), b)] * 5, rtol=1e-10)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_narrow_pattern_is_factorised_in_band_storage(dtype):
    """A 1-D grid's pattern, its states shuffled: reverse Cuthill–McKee makes it banded, and LAPACK's band
    LU (`_Band`, on the calling thread) solves A x = b and Aᵀ x = b as NumPy does; a singular one gives NaN."""
    n = 300
    perm = np.random.default_rng(2).permutation(n)
    band = sp.diags([np.full(n - 1, -1.0), np.full(n, 2.5), np.full(n - 1, -1.2), np.full(n - 3, 0.3)], [-1, 0, 1, 3])
    band = band.tocoo()
    lu = HostLU(perm[band.row], perm[band.col], (n, n), kept=2)
    values = band.data.astype(dtype)
    b = np.random.default_rng(3).standard_normal(n).astype(dtype)
    A = dense(lu, values)
    for transpose in (False, True):
        x = np.asarray(jax.jit(lambda v, b: lu_solve(lu, v, b, transpose))(values, b))
        assert x.dtype == dtype
        np.testing.assert_allclose((A.T if transpose else A) @ x, b, atol=100 * np.finfo(dtype).eps)
    assert lu._factorisations.band is not None and (lu._factorisations.band.kl, lu._factorisations.band.ku) <= (4, 4)
    singular = values.copy()
    singular[band.row == 0] = 0.0  # a zero row
    assert np.all(np.isnan(np.asarray(lu_solve(lu, singular, b))))
