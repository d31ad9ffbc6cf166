"""PyTrees in and out, on every installed engine, against JAX's own transformations.

Arguments: a dict of lists, several arguments, an equinox module (JAX engines).
Outputs: a dict holding arrays and a tuple. Each operator's result must have
the structure `jax.jacobian`, `jax.jvp`, `jax.vjp`, `jax.grad` and
`jax.hessian` give, and their values.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad.ad as ad
from helpers import assert_close
from sciad.ad import namespace

TREE = {"a": np.array([0.3, 0.4]), "b": [np.array([1.0, 2.0]), np.array([0.5])]}
TREE_NEW = {"a": np.array([-0.6, 1.1]), "b": [np.array([0.2, -1.5]), np.array([0.9])]}
P, P_NEW = np.array([1.5, -0.7]), np.array([0.4, 2.0])
X, X_NEW = (TREE, P), (TREE_NEW, P_NEW)
SLOW_ENGINES = ("enzyme",)  # about 10 s of compiling each test; CI runs them with -m slow


def _tree_to_scalar(d):
    xp = namespace(d["a"])
    return xp.sum(d["a"] ** 2) * d["b"][0][1] + xp.sum(xp.sin(d["b"][1]))


def _tree_to_tree(d):
    """A dict of lists in, a dict holding a scalar, a vector and a tuple out."""
    xp = namespace(d["a"])
    return {"s": xp.sum(d["a"] ** 2) * d["b"][0][1], "v": d["a"] * d["b"][0], "t": (xp.sin(d["b"][1]),)}


def _several_to_tree(d, p):
    """A dict of lists and an array in, a dict holding a scalar, a vector and a tuple out."""
    xp = namespace(p)
    return {
        "s": xp.sum(d["a"] ** 2) * d["b"][0][1] * p[0],
        "v": d["a"] * d["b"][0] + p[1],
        "t": (xp.sin(d["b"][1]) * p,),
    }


def _several_to_scalar(d, p):
    xp = namespace(p)
    return xp.sum(xp.sin(d["a"]) * d["b"][0]) * p[0] + xp.sum(d["a"] ** 3) * p[1] ** 2 * d["b"][1][0]


def _rtol(engine_name, second_order=False):
    if engine_name != "finite-differences":
        return 1e-10
    return 1e-4 if second_order else 1e-6


def _check(backend, actual, expected, rtol):
    """`actual` (engine arrays) has `expected`'s structure and values."""
    actual = jax.tree.map(lambda a: np.asarray(backend.numpy(a)), actual)
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    jax.tree.map(lambda a, e: assert_close(a, np.asarray(e), rtol), actual, expected)


def _like(tree, seed):
    """A deterministic tree of random arrays structured as `tree`."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda a: rng.standard_normal(np.shape(a)), tree)


def _references(x, seed):
    """JAX's own results for `_several_to_tree` at `x`, with `v` and `w` drawn from `seed`."""
    v, w = _like(x, seed), _like(_several_to_tree(*x), seed)
    y, jv = jax.jvp(_several_to_tree, x, v)
    J = jax.jacobian(_several_to_tree, (0, 1))(*x)
    wJ = jax.vjp(_several_to_tree, *x)[1](w)
    return {"jacobian": ((), (y, J)), "jvp": ((v,), (y, jv)), "vjp": ((w,), (y, wJ))}


@pytest.fixture(scope="module")
def references():
    """At X for the direct calls and at X_NEW for the prepared ones."""
    return _references(X, 0), _references(X_NEW, 1)


def test_pytree_outputs(engine_name, references):
    """value_and_* of jacobian, jvp and vjp for a dict output and several arguments (one a dict
    of lists), then the prepared operators at a new point: jax.jacobian's, jax.jvp's and
    jax.vjp's structures and values."""
    b, rtol = ad.get(engine_name), _rtol(engine_name)
    at_x, at_new = references
    for op in ("jacobian", "jvp", "vjp"):
        vectors, expected = at_x[op]
        _check(b, getattr(ad, f"value_and_{op}")(b, _several_to_tree, X, *vectors), expected, rtol)
        vectors, (_, expected) = at_new[op]
        _check(b, ad.prepare(b, op, _several_to_tree, X, *vectors)(X_NEW, *vectors), expected, rtol)
    _check(b, ad.jacobian(b, _tree_to_tree, TREE), jax.jacobian(_tree_to_tree)(TREE), rtol)


def test_derivative_of_pytree_output(engine_name):
    """f'(s) of a dict output is a dict, as jax.jacfwd gives."""
    b = ad.get(engine_name)

    def f(s):
        xp = namespace(s)
        return {"sin": xp.sin(s), "pair": (s * xp.asarray([1.0, 2.0], dtype=s.dtype), s**2)}

    s = np.array(0.7)
    _check(b, ad.value_and_derivative(b, f, s), (f(s), jax.jacfwd(f)(s)), _rtol(engine_name))


def _hessian_references(x, v):
    """`(f, ∇f, ∇²f, ∇²f v)` of `_several_to_scalar` at `x` by JAX: blocks [i][j] as jax.hessian."""
    grad = jax.grad(_several_to_scalar, (0, 1))
    return (_several_to_scalar(*x), grad(*x), jax.hessian(_several_to_scalar, (0, 1))(*x), jax.jvp(grad, x, v)[1])


@pytest.fixture(scope="module")
def hessian_references():
    """`_hessian_references` at X and at X_NEW (v = _like(X, 0)), compiled (eagerly, a small program per operation)
    once for the module: the same for every engine."""
    v = _like(X, 0)
    return v, jax.jit(_hessian_references)(X, v), jax.jit(_hessian_references)(X_NEW, v)


def test_hessian_of_pytrees(engine_name, hessian_references):
    """value_gradient_and_hessian of several arguments, one a dict of lists, then a prepared
    Hessian-vector product at a new point: jax.hessian's blocks [i][j] and jax.grad's structure."""
    b, rtol = ad.get(engine_name), _rtol(engine_name, second_order=True)
    v, (y, g, H, _), at_new = hessian_references
    _check(b, ad.value_gradient_and_hessian(b, _several_to_scalar, X), (y, g, H), rtol)
    _check(b, ad.prepare(b, ad.hvp, _several_to_scalar, X, v)(X_NEW, v), at_new[3], rtol)


@pytest.mark.parametrize(
    "backend",
    [
        ad.HigherOrder(ad.JaxReverse(), ad.JaxReverse()),
        ad.HigherOrder(ad.FiniteDifferences(), ad.JaxReverse(jit=False)),
    ],
    ids=["reverse-over-reverse", "finite-differences-over-reverse"],
)
def test_hessian_of_pytrees_by_composed_engines(backend, hessian_references):
    """The outer engine's pullback (H is symmetric) and a numerical outer engine, on blocks."""
    rtol = 1e-10 if backend.outer.traced else 1e-4
    v, (_, _, H, Hv), _ = hessian_references
    _check(backend, ad.hessian(backend, _several_to_scalar, X), H, rtol)
    _check(backend, ad.hvp(backend, _several_to_scalar, X, v), Hv, rtol)


# -- PyTree inputs -----------------------------------------------------------------

TREE_GRAD = {"a": 2 * TREE["a"] * 2.0, "b": [np.array([0.0, np.sum(TREE["a"] ** 2)]), np.cos(TREE["b"][1])]}


def test_pytree_inputs(engine_name):
    """Gradients and prepared gradients of a dict of lists, alone and with a second argument: x's structure."""
    b, rtol = ad.get(engine_name), _rtol(engine_name)
    y, g = ad.value_and_gradient(b, _tree_to_scalar, TREE)
    _check(b, (y, g), (_tree_to_scalar(TREE), TREE_GRAD), rtol)
    _check(b, ad.prepare(b, ad.gradient, _tree_to_scalar, TREE)(TREE), TREE_GRAD, rtol)
    scaled = ad.gradient(b, lambda d, s: _tree_to_scalar(d) * s, (TREE, np.array(2.0)))
    _check(b, scaled, (jax.tree.map(lambda a: 2 * a, TREE_GRAD), _tree_to_scalar(TREE)), rtol)


def test_equinox_module_input():
    """A JAX engine takes any PyTree: an equinox MLP's gradient matches equinox's (None at static leaves)."""
    eqx = pytest.importorskip("equinox")
    mlp = eqx.nn.MLP(2, 1, 4, 1, key=jax.random.PRNGKey(0))
    loss = lambda m: m(np.array([0.3, -0.2]))[0]  # noqa: E731
    mine, theirs = ad.gradient(ad.JaxReverse(), loss, mlp), eqx.filter_grad(loss)(mlp)
    assert mine.activation is None
    jax.tree.map(lambda a, e: assert_close(a, e, 1e-12), eqx.filter(mine, eqx.is_array), theirs)
    hessian = ad.hessian(ad.JaxReverse(), lambda m: jnp.sum(m(np.array([0.3, -0.2])) ** 2), mlp)
    assert hessian.activation is None and hessian.layers[0].weight.activation is None
    assert hessian.layers[0].weight.layers[1].bias.shape == (4, 2, 1)  # x_i.shape + x_j.shape
    assert_close(hessian.layers[1].bias.layers[1].bias, np.array([[2.0]]), 1e-12)  # of (W h + b)² in b


def test_pytree_errors():
    pytest.importorskip("torch")
    eqx = pytest.importorskip("equinox")
    linear = eqx.nn.Linear(2, 1, key=jax.random.PRNGKey(0))
    with pytest.raises(TypeError, match=r"^x is a Linear, which a host engine cannot hold.*'jax-reverse'"):
        ad.gradient(ad.Torch(), lambda m: m(np.ones(2))[0], linear)
    with pytest.raises(TypeError, match=r"x\['b'\]\[1\] has dtype int"):
        ad.gradient(ad.JaxReverse(), _tree_to_scalar, {"a": TREE["a"], "b": [TREE["b"][0], np.array([1])]})
    with pytest.raises(ValueError, match=r"v must have the structure of x, but v\['b'\]\[1\] is missing"):
        ad.jvp(ad.JaxForward(), _tree_to_tree, TREE, {"a": TREE["a"], "b": [TREE["b"][0]]})
    with pytest.raises(ValueError, match=r"v\['a'\] has shape \(3,\) but x\['a'\] has shape \(2,\)"):
        ad.jvp(ad.JaxForward(), _tree_to_tree, TREE, {"a": np.ones(3), "b": TREE["b"]})
