"""Caches belong to the objects that use them, are keyed on content and safe between threads: the
autotune disk cache (`sciad.select`), remembered sparsity patterns (`sciad._sparsity.PatternCache`),
the host LU's factorisations and its tally (`sciad._host_lu`)."""

import concurrent.futures

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

import sciad
from sciad import _host_lu as host_lu
from sciad import _sparsity as sparsity
from sciad._auto import Choice

TS = np.array([0.5, 1.0])


def decay(f):
    return sciad.ODEProblem(f, np.ones(2), (0.0, 1.0), np.array([1.0]))


def test_autotune_cache_tells_two_lambdas_apart(monkeypatch, tmp_path):
    """Two lambdas (one `__qualname__`) with other programs or other captured values get their own
    choices; a lambda written again, or the same function, is answered from disk."""
    measured = []

    def autotune(prob, ts, loss, feat, *rest):  # a choice naming the problem it was measured on
        measured.append(prob)
        sensealg = sciad.DiscreteAdjoint() if len(measured) % 2 else sciad.ForwardDiffSensitivity()
        return Choice(sensealg, feat, [{"name": sciad.adjoints.describe(sensealg)}], autotuned=True)

    monkeypatch.setattr(sciad._select, "_autotune", autotune)

    def choose(prob):
        return sciad.select_sensealg(prob, saveat=TS, autotune=True, cache_dir=tmp_path).name

    weights = jnp.array([1.0, 2.0])
    problems = [
        decay(lambda u, p, t: -p * u),
        decay(lambda u, p, t: -2 * p * u),
        decay(lambda u, p, t: -p * u * weights),
        decay(lambda u, p, t: -p * u * jnp.array([1.0, 3.0])),
    ]
    first = [choose(prob) for prob in problems]
    assert measured == problems and first == ["DiscreteAdjoint", "ForwardDiffSensitivity"] * 2
    assert len(list(tmp_path.glob("*.json"))) == 4
    again = [choose(prob) for prob in (problems[0], decay(lambda u, p, t: -p * u), decay(problems[1].f))]
    assert again == first[:1] * 2 + first[1:2] and len(measured) == 4  # all three from disk


def test_pattern_cache_is_bounded_shared_between_threads_and_its_own():
    stencil = lambda x: jnp.roll(x, 1) - 2 * x + jnp.roll(x, -1)  # noqa: E731
    square = lambda x: x**2  # noqa: E731
    cache = sparsity.PatternCache(size=1)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        found = list(pool.map(lambda _: cache.pattern(stencil, jnp.ones(8)), range(8)))
    assert all(p is found[0] for p in found) and found[0].matrix.nnz == 24
    assert cache.pattern(lambda x: jnp.roll(x, 1) - 2 * x + jnp.roll(x, -1), jnp.ones(8)) is found[0]  # content
    assert cache.pattern(square, jnp.ones(8)) is not found[0]
    assert cache.pattern(stencil, jnp.ones(8)) is not found[0]  # pushed out by `square`
    assert sparsity.PatternCache().pattern(square, jnp.ones(8)) is not cache.pattern(square, jnp.ones(8))


def test_equal_given_patterns_share_one_pattern_and_its_colourings():
    ring = sp.eye(6, format="csr") + sp.eye(6, k=1, format="csr")
    given = sparsity.PATTERNS.given(sparsity.GivenPattern(ring))
    assert sparsity.PATTERNS.given(sparsity.GivenPattern(ring.toarray())) is given
    assert given.colouring() is sparsity.PATTERNS.given(sparsity.GivenPattern(ring)).colouring()


def lu_of(seed, n=20, kept=2):
    matrix = (sp.random(n, n, density=0.1, random_state=seed, format="coo") + 4 * sp.identity(n)).tocoo()
    matrix.sum_duplicates()
    return host_lu.HostLU(matrix.row, matrix.col, (n, n), kept), matrix.data


def test_host_lu_is_an_immutable_static_value_whose_equals_share_factorisations():
    lu, values = lu_of(10)
    twin, _ = lu_of(10)
    assert not lu.rows.flags.writeable and not lu.cols.flags.writeable
    (eqn,) = jax.make_jaxpr(lambda v, b: host_lu.lu_solve(lu, v, b))(values, np.ones(20)).eqns
    assert eqn.params["lu"] == twin and "nnz=" in str(eqn)  # a short repr in printed programs
    host_lu.COUNTS.clear()
    lu.solve(values, np.ones(20))
    twin.solve(values, np.ones(20))
    assert host_lu.COUNTS.snapshot()["factorisations"] == 1


def test_host_lu_counts_every_solve_of_threads_at_once():
    lu, values = lu_of(11, kept=1)
    host_lu.COUNTS.clear()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: [lu.solve(values * (1 + k % 3), np.ones(20)) for _ in range(50)], range(8)))
    counts = host_lu.COUNTS.snapshot()
    assert counts["solves"] == 400 and 3 <= counts["factorisations"] <= 400 and counts["factor_bytes"] > 0
