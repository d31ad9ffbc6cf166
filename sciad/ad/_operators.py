"""Operators derived from a backend's primitives, called `op(backend, f, x, ...)`.

`x` is one argument or a tuple of several (results are then tuples, one entry
per argument, as JAX's `argnums=(0, 1, ...)` gives), each an array (NumPy or
the engine's own) or a PyTree of arrays: dicts, lists, tuples on every
engine; any PyTree (e.g. equinox modules) on the JAX-traced ones. f returns
an array or a PyTree of arrays. Results are the engine's own arrays
(`numpy.asarray` converts them), structured as JAX's own transformations
structure them. For `f: x (n...) -> y (m...)`:

- per-argument results (gradients, `vjp`) have x's structure and shapes;
- `jacobian` is `(m..., n...)`; for PyTrees, f's output structure of x's
  structure, each leaf `y_leaf.shape + x_leaf.shape` (`jax.jacobian`);
- `jvp` has f's output structure and shapes; `v` has x's, `w` f's output's;
- `hessian` (scalar f) is `(n..., n...)`; for PyTrees, x's structure of x's
  structure, each block `x_i.shape + x_j.shape` (`jax.hessian`).

Bad input raises at the call (TypeError for types, ValueError for shapes and
structures), naming the argument and the fix.
"""

import dataclasses
import threading
import types
import weakref
from collections.abc import Callable
from operator import itemgetter

import jax
import numpy as np
from jaxtyping import PyTree

from sciad.ad import _trees as trees
from sciad.ad._backend import AbstractBackend, check_scalar
from sciad.ad._namespace import namespace

# -- computations on the engine's arrays ------------------------------------------------
# `xs` are the differentiated leaves of the arguments, as engine arrays; `args` regroups
# per-leaf results into x's structure; each returns f's value first.


def _scalar(f: Callable, op: str) -> Callable:
    """`f`, raising the `op` error unless it returns a scalar."""

    def scalar(*xs):
        y = f(*xs)
        check_scalar(y, op)
        return y

    return scalar


def _value_and_gradient(b, f, xs, args):
    y, grads = b.value_and_gradient(_scalar(f, "gradient"), xs)
    return y, args.group(grads)


def _value_and_jvp(b, f, xs, args, vs):
    out = trees.Outputs(f)
    y, pf = b.value_and_pushforward(out, xs)
    return out.value(y), out.value(pf(tuple(b.asarray(v, like=x) for v, x in zip(vs, xs))))


def _value_and_derivative(b, f, xs, args):
    return _value_and_jvp(b, f, xs, args, (np.ones(()),))


def _value_and_vjp(b, f, xs, args, w):
    out = trees.Outputs(f)
    y, pb = b.value_and_pullback(out, xs)
    return out.value(y), args.group(pb(out.cotangent(w, y, b.asarray)))


def _blocks(out: trees.Outputs, jacobians: tuple, xs: tuple) -> list[tuple]:
    """The engine's Jacobians (one per argument leaf) as `[i][j]`: output leaf i w.r.t. argument leaf j."""
    return list(zip(*(out.leaves(J, tuple(x.shape)) for J, x in zip(jacobians, xs))))


def _value_and_jacobian(b, f, xs, args):
    out = trees.Outputs(f)
    y, jacobians = b.value_and_jacobian(out, xs)
    return out.value(y), out.group([args.group(row) for row in _blocks(out, jacobians, xs)])


def _gradients(inner, f: Callable) -> trees.Outputs:
    """x's leaves -> the tuple of `inner` gradients of scalar f, as one array for an outer engine."""
    return trees.Outputs(lambda *xs: inner.value_and_gradient(f, tuple(map(inner.asarray, xs)))[1])


def _value_gradient_and_hessian(b, f, xs, args):
    outer, inner = b.hessian_engines()
    f = _scalar(f, "hessian")
    y, g = inner.value_and_gradient(f, xs)
    grads, xs = _gradients(inner, f), tuple(map(outer.asarray, xs))
    _, jacobians = outer.value_and_jacobian(grads, xs)
    return y, args.group(g), args.group(tuple(args.group(row) for row in _blocks(grads, jacobians, xs)))


def _hvp(b, f, xs, args, vs):
    """H v: the outer pushforward of the gradients, or their pullback (H is symmetric)."""
    outer, inner = b.hessian_engines()
    grads, xs = _gradients(inner, _scalar(f, "hvp")), tuple(map(outer.asarray, xs))
    vs = tuple(outer.asarray(v, like=x) for v, x in zip(vs, xs))
    if outer.mode == "forward":
        return args.group(tuple(grads.leaves(outer.value_and_pushforward(grads, xs)[1](vs))))
    y, pb = outer.value_and_pullback(grads, xs)
    return args.group(pb(grads.cotangent(vs, y, outer.asarray)))


def _whole(result):
    return result


@dataclasses.dataclass(frozen=True)
class _Operator:
    """What an operator computes (`core`, then `pick` from its result) and what it takes after x:
    `vector` "v" (structured as x), "w" (structured as f's output) or nothing; `scalar_x`: one scalar."""

    core: Callable
    pick: Callable = _whole
    vector: str = ""
    scalar_x: bool = False


# -- the operators ----------------------------------------------------------------------


def derivative(backend: AbstractBackend, f: Callable, x: PyTree) -> PyTree:
    """f'(x) for one scalar x: f's output structure and shapes.

    Raises ValueError unless x is one scalar (use `jacobian` or `jvp`)."""
    return _apply(derivative, backend, f, x)


def gradient(backend: AbstractBackend, f: Callable, x: PyTree) -> PyTree:
    """∇f(x) for scalar f: x's structure and shapes (a tuple for a tuple x).

    Raises ValueError unless f returns a scalar (use `jacobian` or `vjp`)."""
    return _apply(gradient, backend, f, x)


def jacobian(backend: AbstractBackend, f: Callable, x: PyTree) -> PyTree:
    """∂f/∂x: shape `f(x).shape + x.shape`; for PyTrees, f's output structure of x's structure
    (a tuple per output leaf for a tuple x), as `jax.jacobian`."""
    return _apply(jacobian, backend, f, x)


def hessian(backend: AbstractBackend, f: Callable, x: PyTree) -> PyTree:
    """∇²f(x) for scalar f: shape `x.shape + x.shape`; for a tuple x (or a PyTree), blocks
    `[i][j]` of shape `x_i.shape + x_j.shape` structured as x of x, as `jax.hessian`.
    Computed by `backend.hessian_engines()` (outer over inner).

    Raises ValueError unless f returns a scalar."""
    return _apply(hessian, backend, f, x)


def hvp(backend: AbstractBackend, f: Callable, x: PyTree, v: PyTree) -> PyTree:
    """∇²f(x) v for scalar f, v structured as x: x's structure and shapes (forward over reverse
    by default, `backend.hessian_engines()`).

    Raises ValueError unless v has x's structure and shapes and f returns a scalar."""
    return _apply(hvp, backend, f, x, v)


def jvp(backend: AbstractBackend, f: Callable, x: PyTree, v: PyTree) -> PyTree:
    """∂f/∂x · v, v structured as x (a tuple for a tuple x): f's output structure and shapes.

    Raises ValueError unless v has x's structure and shapes."""
    return _apply(jvp, backend, f, x, v)


def vjp(backend: AbstractBackend, f: Callable, x: PyTree, w: PyTree) -> PyTree:
    """wᵀ ∂f/∂x, w structured as f's output: x's structure and shapes (a tuple for a tuple x).

    Raises ValueError unless w has f's output structure and shapes."""
    return _apply(vjp, backend, f, x, w)


def value_and_derivative(backend: AbstractBackend, f: Callable, x: PyTree) -> tuple[PyTree, PyTree]:
    """`(f(x), derivative(backend, f, x))`."""
    return _apply(value_and_derivative, backend, f, x)


def value_and_gradient(backend: AbstractBackend, f: Callable, x: PyTree) -> tuple[PyTree, PyTree]:
    """`(f(x), gradient(backend, f, x))`."""
    return _apply(value_and_gradient, backend, f, x)


def value_and_jacobian(backend: AbstractBackend, f: Callable, x: PyTree) -> tuple[PyTree, PyTree]:
    """`(f(x), jacobian(backend, f, x))`."""
    return _apply(value_and_jacobian, backend, f, x)


def value_and_hessian(backend: AbstractBackend, f: Callable, x: PyTree) -> tuple[PyTree, PyTree]:
    """`(f(x), hessian(backend, f, x))`."""
    return _apply(value_and_hessian, backend, f, x)


def value_gradient_and_hessian(backend: AbstractBackend, f: Callable, x: PyTree) -> tuple[PyTree, PyTree, PyTree]:
    """`(f(x), gradient(backend, f, x), hessian(backend, f, x))`."""
    return _apply(value_gradient_and_hessian, backend, f, x)


def value_and_jvp(backend: AbstractBackend, f: Callable, x: PyTree, v: PyTree) -> tuple[PyTree, PyTree]:
    """`(f(x), jvp(backend, f, x, v))`."""
    return _apply(value_and_jvp, backend, f, x, v)


def value_and_vjp(backend: AbstractBackend, f: Callable, x: PyTree, w: PyTree) -> tuple[PyTree, PyTree]:
    """`(f(x), vjp(backend, f, x, w))`."""
    return _apply(value_and_vjp, backend, f, x, w)


_SECOND = itemgetter(1)
_OPERATORS = {
    derivative: _Operator(_value_and_derivative, _SECOND, scalar_x=True),
    gradient: _Operator(_value_and_gradient, _SECOND),
    jacobian: _Operator(_value_and_jacobian, _SECOND),
    hessian: _Operator(_value_gradient_and_hessian, itemgetter(2)),
    hvp: _Operator(_hvp, vector="v"),
    jvp: _Operator(_value_and_jvp, _SECOND, vector="v"),
    vjp: _Operator(_value_and_vjp, _SECOND, vector="w"),
    value_and_derivative: _Operator(_value_and_derivative, scalar_x=True),
    value_and_gradient: _Operator(_value_and_gradient),
    value_and_jacobian: _Operator(_value_and_jacobian),
    value_and_hessian: _Operator(_value_gradient_and_hessian, itemgetter(0, 2)),
    value_gradient_and_hessian: _Operator(_value_gradient_and_hessian),
    value_and_jvp: _Operator(_value_and_jvp, vector="v"),
    value_and_vjp: _Operator(_value_and_vjp, vector="w"),
}
_BY_NAME = {op.__name__: op for op in _OPERATORS}


# -- validation at the boundary -----------------------------------------------------------


def _check_float(arg: str, x) -> None:
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        dtype = np.asarray(x).dtype
    if hasattr(dtype, "is_floating_point"):  # torch dtype
        ok = dtype.is_floating_point  # pyright: ignore[reportAttributeAccessIssue]  # a torch dtype
    else:
        ok = np.issubdtype(np.dtype(dtype), np.floating)
    if not ok:
        raise TypeError(
            f"{arg} has dtype {dtype}, but derivatives need floating-point inputs: "
            f"pass {arg} as a float array (e.g. numpy.asarray({arg}, dtype=float))"
        )


def _arguments(name: str, backend, f, x, scalar_x: bool = False) -> trees.Arguments:
    """Validate the backend, f and x of a call of operator `name`; return x's `Arguments`."""
    if not isinstance(backend, AbstractBackend):
        raise TypeError(f"backend must be a sciad.ad backend (e.g. sciad.ad.get('jax-reverse')), got {backend!r}")
    if not callable(f):
        raise TypeError(f"f must be callable, got {f!r}")
    if scalar_x and not (trees.is_array(x) and np.shape(x) == ()):
        got = f"shape {tuple(np.shape(x))}" if trees.is_array(x) else f"a {type(x).__name__}"
        raise ValueError(f"{name} needs a scalar x, got {got}: use jacobian or jvp")
    if isinstance(x, tuple) and not x:
        raise ValueError(f"{name}: x is an empty tuple; pass at least one array")
    args = trees.Arguments.of(x, backend.host)
    for leaf_name, leaf in trees.named_leaves("x", x):
        _check_float(leaf_name, leaf)
    return args


def _check_vectors(name: str, op: _Operator, x, vectors: tuple) -> None:
    """Validate what follows x: `v` structured as x, or a floating-point `w`."""
    if len(vectors) != bool(op.vector):
        raise TypeError(f"{name} takes {int(bool(op.vector))} vector argument(s) after x, got {len(vectors)}")
    if op.vector == "v":
        (v,) = vectors
        if isinstance(x, tuple) and (not isinstance(v, tuple) or len(v) != len(x)):
            raise ValueError(f"v must be a tuple of {len(x)} arrays, one per argument in x")
        trees.check_like("v", v, x, "x")
    if op.vector:
        for leaf_name, leaf in trees.named_leaves(op.vector, vectors[0]):
            _check_float(leaf_name, leaf)


def _one_array(name: str, backend, f, x) -> None:
    """Validate a call of an operator that takes one array x (the lazy matrices)."""
    if _arguments(name, backend, f, x).nested or isinstance(x, tuple):
        what = f"a tuple of {len(x)} arguments" if isinstance(x, tuple) else f"a {type(x).__name__} PyTree"
        raise TypeError(f"{name} takes one array x, not {what}: use jvp, vjp and hvp, which take PyTrees")


# -- compilation and dispatch -------------------------------------------------------------


# Compiled calls per user function, held weakly: a function the caller drops takes its compiled
# programs (and the arrays it closes over) with it. A bound method, made anew at each attribute
# access, is held through its instance. Read and written under the lock (operators may be called
# from several threads).
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_COMPILED_LOCK = threading.Lock()


def _cached(op: _Operator, backend, f, args: trees.Arguments) -> Callable:
    """`_compile`'s call, reused while `f` (or a bound method's instance) lives; compiled anew for
    functions that cannot be weakly referenced or hashed."""
    method = getattr(f, "__func__", None)
    anchor = getattr(f, "__self__", None) if method is not None else f
    key = (op, backend, args, method)
    try:
        hash(key)
        with _COMPILED_LOCK:
            entries = _COMPILED.setdefault(anchor, {})
    except TypeError:
        return _compile(op, backend, f, args)
    with _COMPILED_LOCK:
        if key not in entries:
            ref = weakref.ref(anchor)
            held = (lambda *a: types.MethodType(method, ref())(*a)) if method is not None else (lambda *a: ref()(*a))  # pyright: ignore[reportOptionalCall]  # method: not None here
            entries[key] = _compile(op, backend, held, args)
        return entries[key]


def _compile(op: _Operator, backend, f, args: trees.Arguments) -> Callable:
    """`op` on `f` as one compiled call `(leaves, *vectors)` on the differentiated leaves of x
    (and of v)."""
    f, asarray = args.function(f), backend.asarray

    def run(leaves, *vectors):  # lean on purpose: a prepared call is this function, nothing more
        return op.pick(op.core(backend, f, tuple(map(asarray, leaves)), args, *vectors))

    return backend.compile(run)


def _prepared(op: _Operator, backend, f, args: trees.Arguments, compile: Callable) -> Callable:
    """`op`'s call `(x, *vectors)` on x structured as `args`."""
    run = compile(op, backend, f, args)
    if op.vector == "v":
        return lambda x, v: run(args.leaves(x), args.leaves(v))
    return lambda x, *vectors: run(args.leaves(x), *vectors)


def _explained(backend, call: Callable, *inputs):
    """`call(*inputs)`, a compiled engine's tracing error explained."""
    try:
        return call(*inputs)
    except jax.errors.ConcretizationTypeError as e:
        raise ValueError(
            f"f has value-dependent Python control flow (an `if`/`while` on array values), "
            f"which {backend} cannot trace into a compiled program. Use an engine that "
            "re-records at every call (sciad.ad.JaxReverse(jit=False), Torch(), Autograd()) "
            "or write the branch with jnp.where / jax.lax.cond."
        ) from e


def _checked(operator: Callable, backend, f, x, vectors: tuple) -> tuple[_Operator, trees.Arguments]:
    op = _OPERATORS[operator]
    args = _arguments(operator.__name__, backend, f, x, op.scalar_x)
    _check_vectors(operator.__name__, op, x, vectors)
    return op, args


def _apply(operator: Callable, backend, f, x, *vectors):
    """`operator(backend, f, x, *vectors)`, compiled once per function while it lives."""
    op, args = _checked(operator, backend, f, x, vectors)
    return _explained(backend, _prepared(op, backend, f, args, _cached), x, *vectors)


def prepare(backend: AbstractBackend, op, f: Callable, x: PyTree, *vectors: PyTree) -> Callable:
    """Do the per-function work (tracing, jit) once; return `g(x, *vectors)` for
    repeated calls of operator `op` (a function of this module or its name) at
    new points with the same shapes and dtypes as `x` (and `vectors`). `g` holds
    `f` and its compiled program; dropping `g` frees them."""
    operator = _BY_NAME.get(op) if isinstance(op, str) else op
    if not any(operator is known for known in _OPERATORS):
        raise ValueError(f"op must be one of {sorted(_BY_NAME)} (or the function), got {op!r}")
    op, args = _checked(operator, backend, f, x, vectors)  # pyright: ignore[reportArgumentType]  # checked above
    call = _prepared(op, backend, f, args, _compile)
    _explained(backend, call, x, *vectors)  # trace and compile now
    return call


def pushforward(backend: AbstractBackend, f: Callable, x: PyTree) -> Callable[[PyTree], PyTree]:
    """The linear map `v -> jvp(backend, f, x, v)` at `x`."""
    _arguments("pushforward", backend, f, x)
    return lambda v: jvp(backend, f, x, v)


def pullback(backend: AbstractBackend, f: Callable, x: PyTree) -> Callable[[PyTree], PyTree]:
    """The linear map `w -> vjp(backend, f, x, w)` at `x`."""
    _arguments("pullback", backend, f, x)
    return lambda w: vjp(backend, f, x, w)


class LazyJacobian:
    """∂f/∂x at one array x as an operator: `J @ v` (jvp), `w @ J` (vjp), `J.T`; never formed.
    `shape` is `(size of f(x), size of x)`; vectors keep their natural shapes."""

    __array_ufunc__ = None  # make NumPy defer `w @ J` to __rmatmul__

    def __init__(self, backend, f, x, transposed=False):
        _one_array("lazy_jacobian", backend, f, x)
        self.backend, self.f, self.x, self.transposed = backend, f, x, transposed
        m = int(np.prod(np.shape(f(backend.asarray(x)))))
        n = int(np.prod(np.shape(x)))
        self.shape = (n, m) if transposed else (m, n)

    @property
    def T(self):
        return LazyJacobian(self.backend, self.f, self.x, not self.transposed)

    def __matmul__(self, v):
        op = vjp if self.transposed else jvp
        return op(self.backend, self.f, self.x, v)

    def __rmatmul__(self, w):
        op = jvp if self.transposed else vjp
        return op(self.backend, self.f, self.x, w)


class LazyHessian:
    """∇²f(x) at one array x as an operator: `H @ v` and `v @ H` are Hessian-vector products; `H.T` is H."""

    __array_ufunc__ = None

    def __init__(self, backend, f, x):
        _one_array("lazy_hessian", backend, f, x)
        self.backend, self.f, self.x = backend, f, x
        n = int(np.prod(np.shape(x)))
        self.shape = (n, n)

    @property
    def T(self):
        return self

    def __matmul__(self, v):
        return hvp(self.backend, self.f, self.x, v)

    __rmatmul__ = __matmul__


def lazy_jacobian(backend: AbstractBackend, f: Callable, x: PyTree) -> LazyJacobian:
    """∂f/∂x at one array x as a lazy operator (`J @ v`, `w @ J`, `J.T`)."""
    return LazyJacobian(backend, f, x)


def lazy_hessian(backend: AbstractBackend, f: Callable, x: PyTree) -> LazyHessian:
    """∇²f(x) at one array x as a lazy operator (`H @ v`, `v @ H`)."""
    return LazyHessian(backend, f, x)


__all__ = [*_BY_NAME, "pushforward", "pullback", "lazy_jacobian", "lazy_hessian", "prepare", "namespace"]  # pyright: ignore[reportUnsupportedDunderAll]  # the operators by name
