"""Errors at the boundary of `sciad.ad`: each names the argument and the fix."""

import importlib.util

import numpy as np
import pytest

import sciad.ad as ad
from sciad.ad import _errors as errors
from sciad.ad import namespace


def _sum_of_squares(x):
    return namespace(x).sum(x**2)


def _square(x):
    return x**2


X = np.array([0.5, -1.0, 2.0])


def test_unknown_registry_name():
    with pytest.raises(ValueError, match=r"unknown AD backend 'jax-backward'.*'jax-reverse'"):
        ad.get("jax-backward")


def test_get_returns_backends_and_settings():
    assert ad.get("jax-reverse", jit=False) == ad.JaxReverse(jit=False)
    b = ad.FiniteDifferences(step=1e-4)
    assert ad.get(b) is b
    assert set(ad.available()) <= set(ad.BACKENDS)
    assert {"jax-reverse", "jax-forward", "jax-transpose", "finite-differences"} <= set(ad.available())


@pytest.mark.parametrize(
    "name, package, extra",
    [("torch", "torch", "torch"), ("autograd", "autograd", "autograd"), ("enzyme", "enzyme_ad", "enzyme")],
)
def test_missing_engine_names_the_extra(monkeypatch, name, package, extra):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(errors.importlib.util, "find_spec", lambda p, *a: None if p == package else find_spec(p, *a))
    with pytest.raises(ad.MissingEngineError, match=rf"pip install 'sciad\[{extra}\]'") as info:
        ad.get(name)
    assert isinstance(info.value, ImportError)
    assert package in str(info.value)
    assert name not in ad.available()


def test_gradient_of_non_scalar_output(engine_name):
    with pytest.raises(ValueError, match=r"gradient needs f to return a scalar.*shape \(3,\)"):
        ad.gradient(ad.get(engine_name), _square, X)


def _to_dict(x):
    return {"square": x**2, "sum": namespace(x).sum(x)}


def test_pytree_output_errors(engine_name):
    """What no engine can do with f's output is one error, the same on every engine."""
    b = ad.get(engine_name)
    with pytest.raises(ValueError, match=r"^gradient needs f to return a scalar, but f returned a dict: use jacobian"):
        ad.gradient(b, _to_dict, X)
    with pytest.raises(ValueError, match=r"^hessian needs f to return a scalar, but f returned shape \(3,\)"):
        ad.hessian(b, _square, X)
    with pytest.raises(ValueError, match=r"^w must have the structure of f's output, but w\['sum'\] is missing"):
        ad.vjp(b, _to_dict, X, {"square": X})
    with pytest.raises(ValueError, match=r"^w\['sum'\] has shape \(3,\) but f's output\['sum'\] has shape \(\)"):
        ad.vjp(b, _to_dict, X, {"square": X, "sum": X})
    with pytest.raises(TypeError, match=r"^f's output\['name'\] is a str, not an array"):
        ad.jacobian(b, lambda x: {"y": x, "name": "y"}, X)


@pytest.mark.parametrize("op", [ad.jvp, ad.value_and_jvp, ad.hvp])
def test_v_shape_mismatch(op):
    f = _sum_of_squares if op is ad.hvp else _square
    with pytest.raises(ValueError, match=r"v has shape \(2,\) but x has shape \(3,\)"):
        op(ad.JaxReverse(), f, X, np.ones(2))


def test_v_of_several_arguments_must_match():
    with pytest.raises(ValueError, match="v must be a tuple of 2 arrays"):
        ad.jvp(ad.JaxReverse(), lambda a, b: a * b, (X, X), X)
    with pytest.raises(ValueError, match=r"v\[1\] has shape \(2,\)"):
        ad.jvp(ad.JaxReverse(), lambda a, b: a * b, (X, X), (X, np.ones(2)))


@pytest.mark.parametrize("op", [ad.vjp, ad.value_and_vjp])
def test_w_shape_mismatch(engine_name, op):
    with pytest.raises(ValueError, match=r"w has shape \(2,\) but f's output has shape \(3,\)"):
        op(ad.get(engine_name), _square, X, np.ones(2))


@pytest.mark.parametrize(
    "call, arg",
    [
        (lambda: ad.gradient(ad.JaxReverse(), _sum_of_squares, np.array([1, 2, 3])), "x"),
        (lambda: ad.gradient(ad.JaxReverse(), lambda a, b: a @ b, (X, np.array([1, 2, 3]))), r"x\[1\]"),
        (lambda: ad.jvp(ad.JaxForward(), _square, X, np.array([1, 0, 0])), "v"),
        (lambda: ad.vjp(ad.JaxReverse(), _square, X, np.array([1, 0, 0])), "w"),
        (lambda: ad.derivative(ad.FiniteDifferences(), _square, 2), "x"),
    ],
    ids=["x", "x-of-several", "v", "w", "python-int"],
)
def test_integer_inputs(call, arg):
    with pytest.raises(TypeError, match=rf"^{arg} has dtype .*floating-point"):
        call()


def test_integer_torch_tensor():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="x has dtype torch.int64"):
        ad.gradient(ad.Torch(), _sum_of_squares, torch.arange(3))


def test_non_callable_f():
    with pytest.raises(TypeError, match="f must be callable"):
        ad.gradient(ad.JaxReverse(), X, X)


def test_backend_must_be_a_backend():
    with pytest.raises(TypeError, match="backend must be a sciad.ad backend"):
        ad.gradient("jax-reverse", _sum_of_squares, X)
    with pytest.raises(TypeError, match=r"HigherOrder\(inner=...\) must be a sciad.ad backend"):
        ad.HigherOrder(ad.JaxForward(), "jax-reverse")


def test_wrong_op_in_prepare():
    with pytest.raises(ValueError, match="op must be one of .*'gradient'.*got 'grad'"):
        ad.prepare(ad.JaxReverse(), "grad", _sum_of_squares, X)
    with pytest.raises(ValueError, match="op must be one of"):
        ad.prepare(ad.JaxReverse(), np.sum, _sum_of_squares, X)


def test_derivative_needs_scalar_x():
    with pytest.raises(ValueError, match=r"derivative needs a scalar x, got shape \(3,\)"):
        ad.derivative(ad.JaxForward(), _square, X)


@pytest.mark.parametrize("op", [ad.lazy_jacobian, ad.lazy_hessian], ids=lambda op: op.__name__)
def test_lazy_operators_take_one_array(op):
    with pytest.raises(TypeError, match=rf"{op.__name__} takes one array x, not a tuple of 2 arguments"):
        op(ad.JaxReverse(), lambda a, b: a @ b, (X, X))
    with pytest.raises(TypeError, match=rf"{op.__name__} takes one array x, not a dict PyTree"):
        op(ad.JaxReverse(), lambda d: d["a"] @ d["a"], {"a": X})


def test_wrong_number_of_vectors():
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'v'"):
        ad.jvp(ad.JaxReverse(), _square, X)
    with pytest.raises(TypeError, match=r"jvp takes 1 vector argument\(s\) after x, got 0"):
        ad.prepare(ad.JaxReverse(), ad.jvp, _square, X)
    with pytest.raises(TypeError, match=r"gradient takes 0 vector argument\(s\) after x, got 1"):
        ad.prepare(ad.JaxReverse(), "gradient", _sum_of_squares, X, X)


def test_finite_difference_step_must_be_positive():
    with pytest.raises(ValueError, match="step must be a positive number"):
        ad.FiniteDifferences(step=-1e-3)
