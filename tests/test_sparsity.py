"""Jacobian sparsity from jaxprs (`sciad.sparsity`): detected patterns hold every nonzero of the
Jacobian (checked against jax.jacfwd at random points) and are exact where the operations are
followed exactly; colourings give every entry from few products.
"""

import inspect

import jax
import jax.numpy as jnp
import jax.scipy.signal as jsig
import numpy as np
import pytest

import sciad
from sciad._sparsity import jacobian_pattern
from sciad.problems import brusselator_pde

RNG = np.random.default_rng(0)


def true_nonzeros(fn, x, *args, points=3, jacobian=jax.jacfwd):
    """The union of the Jacobian's nonzeros at a few random points near x (one compiled program)."""
    found = np.zeros((np.size(jax.eval_shape(fn, x, *args)), x.size), bool)
    compiled = jax.jit(jacobian(fn))
    for _ in range(points):
        found |= np.asarray(compiled(x * (1 + 0.3 * RNG.standard_normal(x.shape)), *args)) != 0
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
        lambda s: jax.jvp(lambda u: u**2 * jnp.roll(u, 1), (x[:4],), (s,))[1]
    )(x[4:].reshape(2, 4)).ravel(),
}
EXACT = {
    "stencil by roll",
    "constant sparse matrix",
    "fixed gather",
    "slices, pad, concatenate",
    "2-D reshape, transpose and reduce",
    "where and comparisons",
    "custom_jvp and jit",
    "vmap of jvp (size-1 broadcasting)",
    "cumsum",
}


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
    np.testing.assert_allclose(values, np.asarray(jax.jit(jax.jacfwd(f))(u, b.problem.p))[rows, cols], rtol=1e-12)


def test_dense_rows_go_by_reverse_mode():
    """A sum over every state (an adjoint's parameter row): one VJP, and the rest coloured alone."""

    def fn(x):
        return jnp.concatenate([jnp.roll(x, 1) * x, jnp.sum(x**2)[None]])

    x = jnp.asarray(RNG.uniform(0.5, 1.5, 40))
    colouring = jacobian_pattern(fn, x).colouring(dense_row=10)
    np.testing.assert_array_equal(colouring.dense, [40])
    assert colouring.count <= 3
    rows, cols = colouring.rows_cols
    reference = np.asarray(jax.jit(jax.jacfwd(fn))(x))  # compiled (eagerly, a small program per operation)
    np.testing.assert_allclose(colouring.jacobian_values(fn, x), reference[rows, cols], rtol=1e-12)


def test_an_unknown_operation_is_conservative_and_named():
    """Named with the line of the user's code that traced it (jnp.sort's own jit skipped)."""
    x = jnp.asarray(RNG.uniform(0.5, 1.5, 6))
    line = inspect.currentframe().f_lineno + 1
    pattern = jacobian_pattern(lambda x: jnp.sort(x) * x, x)
    assert pattern.conservative == (f"sort at test_sparsity.py:{line}",) and pattern.matrix.nnz == 36


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

    def scaled(weights):
        return lambda x: x * weights

    weights = np.arange(1.0, 6.0).view(Weights)
    f = scaled(weights)
    refs = weakref.ref(f), weakref.ref(weights)
    jacobian_pattern(f, jnp.ones(5)).colouring()
    del f, weights
    gc.collect()
    assert all(ref() is None for ref in refs)


# --- rules that follow ordinary JAX: each exact against jacfwd's nonzeros, nothing taken as dense


@jax.custom_vjp
def _twice(x):
    return 2 * x


_twice.defvjp(lambda x: (2 * x, None), lambda _, c: (2 * c,))
LAPLACE = jnp.array([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]])


def _conv(lhs, rhs, **kw):
    return jax.lax.conv_general_dilated(lhs, rhs, **kw)


RULES = {
    "stack": lambda x: jnp.stack([x[:6], x[6:] ** 2], axis=1).ravel(),
    "stack of 2-D, axis 0": lambda x: jnp.stack([x.reshape(3, 4), jnp.roll(x.reshape(3, 4), 1, axis=1)]).ravel(),
    "concatenate on axis 1": lambda x: jnp.concatenate([x.reshape(3, 4), x.reshape(3, 4)[:, :1] ** 2], axis=1).ravel(),
    "expand_dims, transpose, squeeze, broadcast": lambda x: (
        jnp.expand_dims(x.reshape(3, 4), 0).transpose(2, 0, 1).squeeze(1) * x[:4, None]
    ).ravel(),
    "tile": lambda x: jnp.tile(x[:3], 4) * x,
    ".at[i].set": lambda x: x.at[jnp.array([1, 3])].set(x[:2] ** 2),
    ".at[slice].set to a constant": lambda x: x.at[2:5].set(0.0) + jnp.roll(x, 1) ** 2,
    ".at[i].add with repeated indices": lambda x: x.at[jnp.array([1, 1, 3])].add(x[5:8] ** 2),
    ".at[i].multiply": lambda x: x.at[jnp.array([0, 4])].multiply(x[6:8], unique_indices=True),
    ".at[:, 0].set on 2-D": lambda x: x.reshape(3, 4).at[:, 0].set(x[8:11]).ravel(),
    ".at[i].set under vmap (batched scatter)": lambda x: jax.vmap(lambda r: r.at[1].set(r[0] ** 2))(
        x.reshape(3, 4)
    ).ravel(),
    "take, clip and fill modes": lambda x: jnp.concatenate(
        [jnp.take(x, jnp.array([2, 5, 40]), mode="clip"), jnp.take(x, jnp.array([7, 40]), mode="fill")]
    ),
    "dynamic_slice at a static start": lambda x: jax.lax.dynamic_slice(x, (3,), (4,)) * x[:4],
    "dynamic_update_slice at a static start": lambda x: jax.lax.dynamic_update_slice(x, x[:3] ** 2, (5,)),
    "select_n with a constant mask": lambda x: jnp.where(jnp.arange(12) < 5, x, jnp.roll(x, 1)),
    "mul by a constant with zeros (diagonal)": lambda x: jnp.diagonal(jnp.outer(x[:3], x[3:6])),
    "convolve, same": lambda x: jnp.convolve(x, jnp.array([1.0, -2.0, 1.0]), mode="same"),
    "convolve, full, kernel with zeros": lambda x: jnp.convolve(x, jnp.array([1.0, 0.0, 0.0, 2.0])),
    "correlate, valid": lambda x: jnp.correlate(x, jnp.array([1.0, 3.0, 2.0]), mode="valid"),
    "convolve of two parts of x": lambda x: jnp.convolve(x[:9], x[9:]),
    "convolve2d, five-point kernel": lambda x: jsig.convolve2d(x.reshape(3, 4), LAPLACE, mode="same").ravel(),
    "conv: strides, dilations, groups, NWC": lambda x: _conv(
        x.reshape(1, 6, 2),
        jnp.array([[[1.0, 0.0]], [[0.0, 2.0]], [[3.0, 0.0]]]),
        window_strides=(2,),
        padding=((2, 1),),
        lhs_dilation=(2,),
        rhs_dilation=(2,),
        dimension_numbers=("NWC", "WIO", "NWC"),
        feature_group_count=2,
    ).ravel(),
    "roll, pad and diff": lambda x: jnp.diff(jnp.pad(jnp.roll(x, 2), 1, mode="wrap")),
    "cumsum reversed on 2-D, cumprod": lambda x: jnp.concatenate(
        [jax.lax.cumsum(x.reshape(3, 4), axis=0, reverse=True).ravel(), jnp.cumprod(x[:5])]
    ),
    "dot_general with a sparse constant": lambda x: (x.reshape(3, 4) @ jnp.asarray(np.eye(4)[:, :2] * 3)).ravel(),
    "indices passed into jit": lambda x: jax.jit(lambda y, i: y[i] * y[i + 1])(x, jnp.array([1, 7])),
    "custom_vjp (reverse mode only)": lambda x: _twice(jnp.roll(x, 1)) * x,
    "switch at a constant index": lambda x: jax.lax.switch(jnp.array(1), [lambda y: y, lambda y: jnp.roll(y, 1)], x),
    "fori_loop (scan) with the counter as index": lambda x: jax.lax.fori_loop(
        0, 3, lambda i, y: y.at[i].set(y[i + 1] * y[i]), x
    ),
    "while with a steady carry": lambda x: jax.lax.while_loop(
        lambda c: c[1] < 3, lambda c: (c[0] * 2, c[1] + 1), (jnp.roll(x, 1) * x, 0)
    )[0],
}


@pytest.mark.parametrize("name", list(RULES))
def test_rule_is_exact(name):
    x = jnp.asarray(RNG.uniform(0.5, 1.5, 12))
    pattern = jacobian_pattern(RULES[name], x)
    assert pattern.conservative == (), name
    truth = true_nonzeros(RULES[name], x, jacobian=jax.jacrev if "reverse mode" in name else jax.jacfwd)
    np.testing.assert_array_equal(pattern.matrix.toarray(), truth, err_msg=name)


@pytest.mark.parametrize("name", [name for name in RULES if "while" not in name])
def test_rule_is_exact_through_its_transpose(name):
    """The adjoint stages' relations hold f's VJP: the rules' transposes (unstack, scatter-add, pads,
    reversed scans, ...) are followed exactly too, Jᵀ's pattern found with x unknown."""
    x = jnp.asarray(RNG.uniform(0.5, 1.5, 12))
    fn = RULES[name]
    cotangent = jnp.asarray(RNG.uniform(0.5, 1.5, np.size(fn(x))))

    def pullback(w, x):
        return jax.vjp(fn, x)[1](w)[0]

    pattern = jacobian_pattern(pullback, cotangent, x)
    assert pattern.conservative == (), name
    np.testing.assert_array_equal(pattern.matrix.toarray(), true_nonzeros(fn, x, jacobian=jax.jacrev).T, err_msg=name)


def test_a_while_loop_is_united_over_iterations_and_named():
    """Its trip count is not known here: the carry's dependence after any number of iterations."""
    x = jnp.asarray(RNG.uniform(0.5, 1.5, 12))

    def fn(x):
        return jax.lax.while_loop(lambda c: c[1] < 2, lambda c: (jnp.roll(c[0], 1) * c[0], c[1] + 1), (x, 0))[0]

    line = inspect.getsourcelines(fn)[1] + 1
    pattern = jacobian_pattern(fn, x)
    assert pattern.conservative == (f"while at test_sparsity.py:{line} (united over its iterations)",)
    assert not np.any(true_nonzeros(fn, x) & ~pattern.matrix.toarray())


def _gray_scott(how, n):
    """Gray–Scott on an n × n periodic grid (Laplacian by jnp.roll, reaction u v²), its state a dict,
    a stacked (2, n, n) array, or one flat concatenated vector."""

    def laplacian(w):
        return jnp.roll(w, 1, 0) + jnp.roll(w, -1, 0) + jnp.roll(w, 1, 1) + jnp.roll(w, -1, 1) - 4 * w

    def rates(u, v, p):
        uvv = u * v * v
        return p[2] * laplacian(u) - uvv + p[0] * (1 - u), p[3] * laplacian(v) + uvv - (p[0] + p[1]) * v

    rng = np.random.default_rng(1)
    u, v = 1 - 0.5 * (rng.uniform(size=(n, n)) > 0.9), 0.25 * (rng.uniform(size=(n, n)) > 0.9) + 0.01
    forms = {
        "dict": (lambda y, p, t: dict(zip("uv", rates(y["u"], y["v"], p))), {"u": u, "v": v}),
        "stack": (lambda y, p, t: jnp.stack(rates(y[0], y[1], p)), np.stack([u, v])),
        "concatenate": (
            lambda y, p, t: jnp.concatenate(
                [w.ravel() for w in rates(y[: n * n].reshape(n, n), y[n * n :].reshape(n, n), p)]
            ),
            np.concatenate([u.ravel(), v.ravel()]),
        ),
    }
    f, u0 = forms[how]
    return sciad.ODEProblem(f, u0, (0.0, 1.0), jnp.array([0.04, 0.06, 0.2, 0.1]))


def test_gray_scott_stacked_or_concatenated_gets_the_dict_states_pattern_and_choice():
    from jax.flatten_util import ravel_pytree

    patterns, choices = {}, {}
    for how in ("dict", "stack", "concatenate"):
        prob = _gray_scott(how, 12)
        flat, unravel = ravel_pytree(prob.u0)

        def rate(u, p, prob=prob, unravel=unravel):
            return ravel_pytree(prob.f(unravel(u), p, 0.0))[0]

        pattern = jacobian_pattern(rate, flat, prob.p)
        assert pattern.conservative == (), how
        patterns[how] = pattern.matrix.toarray()
        choice = sciad.select_sensealg(prob, saveat=jnp.array([0.5, 1.0]), solver="kvaerno5")
        choices[how] = (choice.name, choice.features.stage_jacobian, choice.report().splitlines()[0])
    np.testing.assert_array_equal(patterns["dict"], true_nonzeros(rate, flat, prob.p))
    assert patterns["dict"].sum() == 288 * 6  # the five-point stencil and the other species at the same point
    for how in ("stack", "concatenate"):
        np.testing.assert_array_equal(patterns[how], patterns["dict"], err_msg=how)
        assert choices[how] == choices["dict"], how
    assert choices["dict"][1] == "sparse"


def test_the_report_names_what_was_taken_as_dense_and_where():
    n = 256  # enough states for "auto" to look at the pattern

    def f(u, p, t):
        return -p * u + 0.1 * jnp.sort(u)

    line = inspect.getsourcelines(f)[1] + 1
    prob = sciad.ODEProblem(f, np.linspace(0.0, 1.0, n), (0.0, 1.0), jnp.asarray(1.0))
    report = sciad.select_sensealg(prob, saveat=jnp.array([1.0]), solver="kvaerno5").report()
    assert f"(100.00% of {n}²); taken as dense by: sort at test_sparsity.py:{line}" in report


MOVES = [
    lambda x: x.reshape(6, 4),
    lambda x: jax.lax.reshape(x, (24,), dimensions=(1, 0)),
    lambda x: jax.lax.broadcast_in_dim(x[:2, 0], (2, 3, 5), (0,)),
    lambda x: jax.lax.broadcast_in_dim(x[:1], (3, 4, 6), (1, 2)),
    lambda x: jax.lax.squeeze(x[:1, None], (0, 1)),
    lambda x: jax.lax.transpose(x.reshape(2, 2, 6), (2, 0, 1)),
    lambda x: jax.lax.rev(x, (0, 1)),
    lambda x: jax.lax.slice(x, (1, 0), (4, 6), (2, 3)),
    lambda x: jax.lax.concatenate([x, x[:1]], 0),
    lambda x: jnp.stack([x, x], axis=2),
    lambda x: jnp.unstack(x, axis=1),
    lambda x: jnp.split(x, [1, 4], axis=1),
    lambda x: jnp.tile(x, (2, 1, 3)),
    lambda x: jax.lax.pad(x, x[0, 0], [(1, -2, 1), (-1, 3, 2)]),
    lambda x: jax.lax.pad(x, x[0, 0], [(-3, 0, 0), (0, -2, 0)]),
    lambda x: jax.lax.dynamic_slice(x, (3, -1), (2, 2)),
    lambda x: jax.lax.dynamic_update_slice(x, x[:2, :2], (5, 1)),
]


@pytest.mark.parametrize("k", range(len(MOVES)))
def test_data_movement_in_numpy_is_jaxs(k):
    """`sparsity` runs common moves in NumPy (not one XLA compilation each): the same result as
    the primitive itself, on positions, for each parameter form (negative and interior pads,
    clamped dynamic starts, a reshape with dimensions)."""
    from jax.extend import core as jex_core

    from sciad._sparsity import _NUMPY_MOVES, _numpy_moved

    def equations(jaxpr):
        for eqn in jaxpr.eqns:
            if "jaxpr" in eqn.params:  # jnp's own jitted functions
                yield from equations(getattr(eqn.params["jaxpr"], "jaxpr", eqn.params["jaxpr"]))
            yield eqn

    checked = 0
    for eqn in equations(jax.make_jaxpr(MOVES[k])(jnp.ones((4, 6))).jaxpr):
        if eqn.primitive.name not in _NUMPY_MOVES:
            continue
        operands = [
            np.asarray(v.val)
            if isinstance(v, jex_core.Literal)
            else np.arange(1, 1 + np.prod(v.aval.shape, dtype=int), dtype=np.int32).reshape(v.aval.shape)
            for v in eqn.invars
        ]
        ours = _numpy_moved(eqn.primitive.name, operands, eqn.params)
        with jax.ensure_compile_time_eval():
            theirs = eqn.primitive.bind(*operands, **eqn.params)
        ours, theirs = (ours, theirs) if eqn.primitive.multiple_results else ([ours], [theirs])
        assert len(ours) == len(theirs), eqn
        for a, b in zip(ours, theirs):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(eqn))
        checked += 1
    assert checked
