"""`sciad.ad.namespace`: the array-API standard functions, differentiated by every engine.

Each case is a small function written once with `namespace(...)`; every
installed engine's Jacobian must match jax-reverse's to 1e-10 relative
(finite differences to 1e-6). Constructs an engine cannot differentiate
raise an error naming the function and the fix, never a zero gradient.
"""

import jax
import numpy as np
import pytest

import sciad.ad as ad
from sciad.ad import namespace

X = np.array([0.3, 0.55, 0.7, 0.2])  # in (0, 1): every function below is defined and smooth here
U, P, T = np.array([1.0, 0.5]), np.array([1.5, 1.0, 3.0, 1.0]), np.array(0.4)


def _unary(name, shift=0.0):
    return lambda x: getattr(namespace(x), name)(x + shift)


def _binary(name):
    return lambda x: getattr(namespace(x), name)(x, 0.6 - 0.5 * x)


UNARY = [
    "abs",
    "acos",
    "asin",
    "asinh",
    "atan",
    "atanh",
    "cos",
    "cosh",
    "exp",
    "expm1",
    "log",
    "log1p",
    "log2",
    "log10",
    "negative",
    "positive",
    "sin",
    "sinh",
    "sqrt",
    "square",
    "tan",
    "tanh",
]
BINARY = ["add", "subtract", "multiply", "divide", "pow", "atan2", "maximum", "minimum", "hypot", "logaddexp"]


def _asarray_list(x):
    xp = namespace(x)
    return xp.asarray([x[0] * x[1], -x[2], 2.0])


def _asarray_nested(x):
    xp = namespace(x)
    return xp.asarray([[x[0], 1.0], [x[1] * x[3], x[2]]])


def _lotka_volterra_list(u, p, t):
    """A vector field built from a list, scaled by `asarray(t)`."""
    xp = namespace(u, p, t)
    return xp.asarray([p[0] * u[0] - p[1] * u[0] * u[1], -p[2] * u[1] + p[3] * u[0] * u[1]]) * xp.asarray(t)


def _matrix(x):
    return namespace(x).reshape(x, (2, 2))


# Enzyme compiles each case on its own (several seconds each): the full table runs with the slow tests.
SLOW_ENGINES = ("enzyme",)

CASES = {
    **{name: _unary(name) for name in UNARY},
    "acosh": _unary("acosh", 1.5),
    **{name: _binary(name) for name in BINARY},
    "asarray-of-a-list": _asarray_list,
    "asarray-of-nested-lists": _asarray_nested,
    "asarray-of-an-array": lambda x: namespace(x).asarray(x) ** 2,
    "asarray-scalar": lambda x: namespace(x).asarray(x[1]) * x,
    "flip": lambda x: namespace(x).flip(x) * x,
    "flip-axis": lambda x: namespace(x).flip(_matrix(x), axis=1) * _matrix(x),
    "where": lambda x: namespace(x).where(x > 0.4, x**2, -x),
    "clip": lambda x: namespace(x).clip(x, 0.25, 0.6) * x,
    "concat": lambda x: namespace(x).concat([x[:2] ** 2, x, namespace(x).sin(x[1:])]),
    "stack": lambda x: namespace(x).stack([x[0] * x[1], x[2], x[3] ** 2]),
    "stack-axis": lambda x: namespace(x).stack([x, x**2], axis=1),
    "matmul": lambda x: namespace(x).matmul(_matrix(x), _matrix(x) ** 2),
    "matmul-operator": lambda x: _matrix(x) @ x[:2],
    "tensordot": lambda x: namespace(x).tensordot(_matrix(x), _matrix(x), axes=1),
    "vecdot": lambda x: namespace(x).vecdot(_matrix(x), _matrix(x) ** 2),
    "matrix_transpose": lambda x: namespace(x).matrix_transpose(_matrix(x)) @ _matrix(x),
    "permute_dims": lambda x: namespace(x).permute_dims(_matrix(x), (1, 0)) * _matrix(x),
    "reshape": lambda x: namespace(x).reshape(x**2, (2, 2)),
    "squeeze-expand_dims": lambda x: namespace(x).squeeze(namespace(x).expand_dims(x, axis=0), axis=0) ** 3,
    "broadcast_to": lambda x: namespace(x).broadcast_to(x, (3, 4)) * namespace(x).reshape(x[:3], (3, 1)),
    "roll": lambda x: namespace(x).roll(x, 1) * x,
    "moveaxis": lambda x: namespace(x).moveaxis(_matrix(x), 0, 1) * _matrix(x),
    "tile": lambda x: namespace(x).tile(x, (2,)) ** 2,
    "repeat": lambda x: namespace(x).repeat(x, 2) ** 2,
    "sum": lambda x: namespace(x).sum(_matrix(x) ** 2, axis=0),
    "mean": lambda x: namespace(x).mean(_matrix(x) ** 2, axis=1),
    "prod": lambda x: namespace(x).prod(x),
    "max": lambda x: namespace(x).max(x**2),
    "min": lambda x: namespace(x).min(_matrix(x), axis=0),
    "std": lambda x: namespace(x).std(x),
    "var": lambda x: namespace(x).var(x),
    "cumulative_sum": lambda x: namespace(x).cumulative_sum(x**2),
    "sort": lambda x: namespace(x).sort(namespace(x).sin(3 * x)),
    "zeros-ones-like": lambda x: namespace(x).zeros_like(x) + namespace(x).ones_like(x) * x**2,
    "zeros-ones": lambda x: (namespace(x).zeros(4, dtype=x.dtype) + namespace(x).ones(4, dtype=x.dtype)) * x,
    "full": lambda x: namespace(x).full((4,), 2.0, dtype=x.dtype) * x,
    "eye": lambda x: namespace(x).eye(2, dtype=x.dtype) @ _matrix(x),
    "linspace": lambda x: namespace(x).linspace(0.0, 1.0, 4, dtype=x.dtype) * x,
    "linspace-of-traced-ends": lambda x: namespace(x).linspace(x[0], x[1] ** 2, 5),
    "arange": lambda x: namespace(x).arange(4, dtype=x.dtype) * x,
    "indexing": lambda x: namespace(x).stack([x[0], x[-1] * x[1]]) + x[1:3] * _matrix(x)[1, :] + _matrix(x)[..., 0],
    "take": lambda x: namespace(x).take(_matrix(x), namespace(x).asarray([1, 0, 1]), axis=1) * x[0],
    "unstack": lambda x: namespace(x).stack(namespace(x).unstack(_matrix(x), axis=1)[::-1]) ** 2,
    "reciprocal": lambda x: namespace(x).reciprocal(x),
    "piecewise-constant": lambda x: (
        (
            namespace(x).sign(x - 0.4)
            + namespace(x).floor(3 * x)
            + namespace(x).ceil(3 * x)
            + namespace(x).round(3 * x)
            + namespace(x).trunc(3 * x)
        )
        * x
    ),
    "cumulative_sum-include_initial": lambda x: namespace(x).cumulative_sum(
        _matrix(x) ** 2, axis=1, include_initial=True
    ),
    "integer-array-indexing": lambda x: x[namespace(x).asarray([2, 0, 0])] * x[:3],
}

MULTI = {"vector-field-from-a-list": ((U, P, T), _lotka_volterra_list)}


# What an engine cannot differentiate is refused with an error naming the function.
REFUSED = {
    ("enzyme", name): rf"enzyme-ad 0.0.16 cannot differentiate `{name}`.*'jax-reverse'"
    for name in ("atanh", "acosh", "tan", "sort")
}


def _tolerance(engine_name):
    return 1e-6 if engine_name == "finite-differences" else 1e-10


def _jacobian(engine_name, f, x):
    jacobian = ad.jacobian(ad.get(engine_name), f, x)
    return jax.tree.map(lambda J: np.asarray(ad.get(engine_name).numpy(J)), jacobian)


@pytest.mark.parametrize("case", list(CASES))
def test_standard_function(engine_name, case):
    f = CASES[case]
    expected = _jacobian("jax-reverse", f, X)
    assert np.any(expected != 0), "a case must have a nonzero derivative to catch dropped tapes"
    if (engine_name, case) in REFUSED:
        with pytest.raises(NotImplementedError, match=REFUSED[engine_name, case]):
            _jacobian(engine_name, f, X)
        return
    actual = _jacobian(engine_name, f, X)
    tol = _tolerance(engine_name)
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * max(1.0, float(np.max(np.abs(expected)))))


def test_autograd_names_a_function_it_cannot_differentiate():
    pytest.importorskip("autograd")
    with pytest.raises(NotImplementedError, match=r"autograd cannot differentiate `copysign`.*'jax-reverse'"):
        ad.gradient(ad.Autograd(), lambda x: namespace(x).sum(namespace(x).copysign(x, x - 0.4)), X)


def test_enzyme_reports_its_nan_derivative_of_neighbouring_products():
    """enzyme-ad 0.0.16 gives NaN for ∂(u[0] u[1]) at u = 0 (Robertson's kinetics at t = 0): an error
    naming the fix, not a NaN nor a backward solve that runs out of steps. Fails when enzyme-ad is fixed."""
    pytest.importorskip("enzyme_ad")
    f = lambda u: u[0] * u[1] + u[2]
    np.testing.assert_allclose(ad.gradient(ad.Enzyme(), f, np.array([2.0, 3.0, 1.0])), [3.0, 2.0, 1.0])
    with pytest.raises(Exception, match="product of neighbouring elements.*'jax-reverse'") as info:
        ad.gradient(ad.Enzyme(), f, np.array([0.0, 0.0, 1.0]))
    assert str(info.value).strip().splitlines()[-1].startswith("SolveError: the 'enzyme' engine's derivative is NaN")


def test_autograd_refuses_an_output_that_lost_the_tape():
    """NumPy's own asarray of a list of boxes would give a zero gradient."""
    pytest.importorskip("autograd")
    with pytest.raises(TypeError, match="dropped the tape.*sciad.ad.namespace"):
        ad.jacobian(ad.Autograd(), lambda x: np.asarray([x[0] * x[1], x[2]]), X)


@pytest.mark.parametrize("case", list(MULTI))
def test_several_arguments(engine_name, case):
    xs, f = MULTI[case]
    expected = _jacobian("jax-reverse", f, xs)
    actual = _jacobian(engine_name, f, xs)
    tol = _tolerance(engine_name)
    for a, e in zip(actual, expected, strict=True):
        assert np.any(e != 0)
        np.testing.assert_allclose(a, e, rtol=tol, atol=tol * max(1.0, float(np.max(np.abs(e)))))
