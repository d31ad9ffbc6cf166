"""Operators derived from a backend's primitives, called `op(backend, f, x, ...)`.

`x` is an array (NumPy or the engine's own), or for `gradient`, `jacobian`,
`jvp`, `vjp`, `value_and_*` of those, a tuple of arguments (results are then
tuples), each an array or a PyTree of arrays (dicts, lists, tuples on every
engine; any PyTree, e.g. equinox modules, on the JAX-traced ones). Results
are the engine's own arrays; `numpy.asarray` converts them. Shapes: for
`f: x (n...) -> y (m...)`, `jacobian` is `(m..., n...)`, `hessian` is
`(n..., n...)`. For a PyTree argument, per-argument results have its
structure, with one array per leaf: the gradient and `vjp` the leaf's
shape, the Jacobian `y.shape + leaf.shape` (the Jacobian w.r.t. a dict is
a dict); `v` for `jvp` has x's structure.
"""

import types
import weakref
from typing import Callable

import numpy as np

from sciad.ad import trees
from sciad.ad.backend import AbstractBackend
from sciad.ad.namespace import namespace

# -- implementations on engine arrays (xs: tuple of arrays) -------------------


def _value_and_gradient(b, f, xs):
    return b.value_and_gradient(f, xs)


def _value_and_derivative(b, f, xs):
    y, pf = b.value_and_pushforward(f, xs)
    return y, pf((b.asarray(np.ones(()), like=xs[0]),))


def _value_and_jacobian(b, f, xs):
    return b.value_and_jacobian(f, xs)


def _value_and_jvp(b, f, xs, vs):
    y, pf = b.value_and_pushforward(f, xs)
    return y, pf(tuple(b.asarray(v, like=x) for v, x in zip(vs, xs)))


def _value_and_vjp(b, f, xs, w):
    y, pb = b.value_and_pullback(f, xs)
    if tuple(w.shape) != tuple(y.shape):
        raise ValueError(f"w has shape {tuple(w.shape)} but f's output has shape {tuple(y.shape)}: they must match")
    return y, pb(b.asarray(w, like=y))


def _gradient_function(inner, f):
    """x -> ∇f(x) computed by `inner`."""
    return lambda x: _value_and_gradient(inner, f, (inner.asarray(x),))[1][0]


def _value_gradient_and_hessian(b, f, xs):
    outer, inner = b.hessian_engines()
    y, (g,) = _value_and_gradient(inner, f, xs)
    xs = tuple(outer.asarray(x) for x in xs)
    _, (H,) = outer.value_and_jacobian(_gradient_function(inner, f), xs)
    return y, g, H


def _hvp(b, f, xs, vs):
    """H v: the outer pushforward of the gradient, or its pullback (H is symmetric)."""
    outer, inner = b.hessian_engines()
    xs = tuple(outer.asarray(x) for x in xs)
    vs = tuple(outer.asarray(v, like=x) for v, x in zip(vs, xs))
    if outer.mode == "forward":
        return outer.value_and_pushforward(_gradient_function(inner, f), xs)[1](vs)
    return outer.value_and_pullback(_gradient_function(inner, f), xs)[1](vs[0])[0]


# -- the operator table -------------------------------------------------------
# name -> (implementation, how many vectors follow x, multi-argument allowed,
#          how to shape the result for one array x)

_SPECS = {
    "derivative": (_value_and_derivative, 0, False, lambda r: r[1]),
    "gradient": (_value_and_gradient, 0, True, lambda r: r[1][0]),
    "jacobian": (_value_and_jacobian, 0, True, lambda r: r[1][0]),
    "hessian": (_value_gradient_and_hessian, 0, False, lambda r: r[2]),
    "hvp": (_hvp, 1, False, lambda r: r),
    "jvp": (_value_and_jvp, 1, True, lambda r: r[1]),
    "vjp": (_value_and_vjp, 1, True, lambda r: r[1][0]),
    "value_and_derivative": (_value_and_derivative, 0, False, lambda r: r),
    "value_and_gradient": (_value_and_gradient, 0, True, lambda r: (r[0], r[1][0])),
    "value_and_jacobian": (_value_and_jacobian, 0, True, lambda r: (r[0], r[1][0])),
    "value_and_hessian": (_value_gradient_and_hessian, 0, False, lambda r: (r[0], r[2])),
    "value_gradient_and_hessian": (_value_gradient_and_hessian, 0, False, lambda r: r),
    "value_and_jvp": (_value_and_jvp, 1, True, lambda r: r),
    "value_and_vjp": (_value_and_vjp, 1, True, lambda r: (r[0], r[1][0])),
}
# Multi-argument results: drop the per-argument unwrapping.
_MULTI = {
    "gradient": lambda r: r[1],
    "jacobian": lambda r: r[1],
    "jvp": lambda r: r[1],
    "vjp": lambda r: r[1],
    "value_and_gradient": lambda r: r,
    "value_and_jacobian": lambda r: r,
    "value_and_jvp": lambda r: r,
    "value_and_vjp": lambda r: r,
}


# -- validation at the boundary ---------------------------------------------


def _check_float(arg: str, x) -> None:
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        dtype = np.asarray(x).dtype
    if hasattr(dtype, "is_floating_point"):  # torch dtype
        ok = dtype.is_floating_point
    else:
        ok = np.issubdtype(np.dtype(dtype), np.floating)
    if not ok:
        raise TypeError(
            f"{arg} has dtype {dtype}, but derivatives need floating-point inputs: "
            f"pass {arg} as a float array (e.g. numpy.asarray({arg}, dtype=float))"
        )


def _check_inputs(op: str, backend, f, x, vectors):
    """Validate the call; return `(multi, tree)`: whether `x` is a tuple of arguments,
    and their PyTree structure, or None when every argument is an array."""
    if not isinstance(backend, AbstractBackend):
        raise TypeError(f"backend must be a sciad.ad backend (e.g. sciad.ad.get('jax-reverse')), got {backend!r}")
    if not callable(f):
        raise TypeError(f"f must be callable, got {f!r}")
    _, n_vectors, multi_ok, _ = _SPECS[op]
    multi = isinstance(x, tuple)
    if multi and not multi_ok:
        raise TypeError(f"{op} takes one array x, not a tuple of {len(x)} arguments")
    xs = x if multi else (x,)
    if multi and not xs:
        raise ValueError(f"{op}: x is an empty tuple; pass at least one array")
    tree, static = trees.structure(xs, backend.host, multi)
    if not multi_ok and not trees.is_flat(tree):
        raise TypeError(f"{op} takes one array x, not a {type(x).__name__} PyTree: ravel it "
                        "(jax.flatten_util.ravel_pytree) or use the first-order operators, which take PyTrees")
    for name, leaf in trees.named_leaves("x", xs, multi):
        _check_float(name, leaf)
    if op in ("derivative", "value_and_derivative") and tuple(np.shape(x)) != ():
        raise ValueError(f"derivative needs a scalar x, got shape {tuple(np.shape(x))}: use jacobian or jvp")
    if len(vectors) != n_vectors:
        raise TypeError(f"{op} takes {n_vectors} vector argument(s) after x, got {len(vectors)}")
    if op in ("jvp", "value_and_jvp", "hvp"):
        (v,) = vectors
        vs = v if multi else (v,)
        if multi and (not isinstance(v, tuple) or len(v) != len(xs)):
            raise ValueError(f"v must be a tuple of {len(xs)} arrays, one per argument in x")
        trees.check_like("v", vs, xs, multi)
        for (name, vi), (x_name, xi) in zip(trees.named_leaves("v", vs, multi), trees.named_leaves("x", xs, multi)):
            _check_float(name, vi)
            if tuple(np.shape(vi)) != tuple(np.shape(xi)):
                raise ValueError(f"{name} has shape {tuple(np.shape(vi))} but {x_name} has shape "
                                 f"{tuple(np.shape(xi))}: they must match")
    if op in ("vjp", "value_and_vjp"):
        _check_float("w", vectors[0])
    return multi, None if trees.is_flat(tree) and not static else (tree, static)


# -- compilation and dispatch ------------------------------------------------


# Compiled calls per user function, held weakly: a function the caller drops takes its compiled
# programs (and the arrays it closes over) with it. A bound method, made anew at each attribute
# access, is held through its instance.
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cached(op: str, backend, f, multi: bool, tree) -> Callable:
    """`_compile`'s call, reused while `f` (or a bound method's instance) lives; compiled anew for
    functions that cannot be weakly referenced or hashed."""
    method = getattr(f, "__func__", None)
    anchor = getattr(f, "__self__", None) if method is not None else f
    try:
        entries = _COMPILED.setdefault(anchor, {})
        key = (op, backend, multi, tree, method)
        hash(key)
    except TypeError:
        return _compile(op, backend, f, multi, tree)
    if key not in entries:
        ref = weakref.ref(anchor)
        held = (lambda *a: types.MethodType(method, ref())(*a)) if method is not None else (lambda *a: ref()(*a))
        entries[key] = _compile(op, backend, held, multi, tree)
    return entries[key]


def _compile(op: str, backend, f, multi: bool, tree) -> Callable:
    """`op` on `f` as one compiled call `(x, *vectors)` on arrays (`tree` None) or on the
    differentiated leaves of PyTree arguments structured as `tree` = (structure, static leaves)."""
    if tree is not None:
        f, multi = trees.flat_function(f, *tree), True
    impl, n_vectors, _, unwrap = _SPECS[op]
    if multi:
        unwrap = _MULTI[op]
    asarray = backend.asarray
    # Lean on purpose: a prepared call is this function, nothing more.
    if n_vectors == 0:

        def run(x):
            return unwrap(impl(backend, f, tuple(map(asarray, x)) if multi else (asarray(x),)))

    else:
        per_argument = op in ("jvp", "value_and_jvp", "hvp") and not multi

        def run(x, vector):
            xs = tuple(map(asarray, x)) if multi else (asarray(x),)
            return unwrap(impl(backend, f, xs, (vector,) if per_argument else vector))

    return _explain_tracing_errors(backend.compile(run), backend)


def _explain_tracing_errors(fn: Callable, backend) -> Callable:
    import jax

    def call(*args):
        try:
            return fn(*args)
        except jax.errors.ConcretizationTypeError as e:
            raise ValueError(
                f"f has value-dependent Python control flow (an `if`/`while` on array values), "
                f"which {backend} cannot trace into a compiled program. Use an engine that "
                "re-records at every call (sciad.ad.JaxReverse(jit=False), Torch(), Autograd()) "
                "or write the branch with jnp.where / jax.lax.cond."
            ) from e

    call.__wrapped__ = fn
    return call


def prepare(backend: AbstractBackend, op, f: Callable, x, *vectors) -> Callable:
    """Do the per-function work (tracing, jit) once; return `g(x, *vectors)` for
    repeated calls of operator `op` (a function of this module or its name) at
    new points with the same shapes and dtypes as `x` (and `vectors`). `g` holds
    `f` and its compiled program; dropping `g` frees them."""
    name = op if isinstance(op, str) else getattr(op, "__name__", None)
    if name not in _SPECS:
        raise ValueError(f"op must be one of {sorted(_SPECS)} (or the function), got {op!r}")
    run = _runner(name, backend, f, *_check_inputs(name, backend, f, x, vectors), compile=_compile)
    run(x, *vectors)  # trace and compile now
    return run.__wrapped__


def _runner(op: str, backend, f, multi: bool, tree, compile: Callable = _cached) -> Callable:
    """`op`'s compiled call `(x, *vectors)`; with the call without error translation as `__wrapped__`."""
    compiled = compile(op, backend, f, multi, tree)
    if tree is None:
        return compiled

    def call(x, *vectors):
        return _on_leaves(op, compiled, tree, multi, x, vectors)

    call.__wrapped__ = lambda x, *vectors: _on_leaves(op, compiled.__wrapped__, tree, multi, x, vectors)
    return call


# Where a result holds one entry per argument: the whole result, its second item, or nowhere.
_PER_ARGUMENT = {"gradient": ..., "jacobian": ..., "vjp": ..., "value_and_gradient": 1,
                 "value_and_jacobian": 1, "value_and_vjp": 1, "jvp": None, "value_and_jvp": None}


def _on_leaves(op: str, compiled: Callable, tree, multi: bool, x, vectors):
    """`op` on PyTree arguments (`tree` = (structure, static leaves)): run on their
    differentiated leaves, per-argument results regrouped to x's structure."""
    leaves = trees.array_leaves(x if multi else (x,), *tree)
    if op in ("jvp", "value_and_jvp"):
        vectors = (trees.array_leaves(vectors[0] if multi else (vectors[0],), *tree),)
    result = compiled(leaves, *vectors)
    where = _PER_ARGUMENT[op]
    if where is ...:
        return trees.regroup(result, *tree, multi)
    if where == 1:
        return result[0], trees.regroup(result[1], *tree, multi)
    return result


def _operator(name: str, doc: str) -> Callable:
    def op(backend, f, x, *vectors):
        return _runner(name, backend, f, *_check_inputs(name, backend, f, x, vectors))(x, *vectors)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    return op


derivative = _operator("derivative", "f'(x) for scalar x (shape of f's output).")
gradient = _operator("gradient", "∇f(x) for scalar f (shape of x; a tuple for a tuple x).")
jacobian = _operator("jacobian", "∂f/∂x, shape f(x).shape + x.shape (a tuple for a tuple x).")
hessian = _operator("hessian", "∇²f(x) for scalar f, shape x.shape + x.shape, via backend.hessian_engines() (outer over inner).")
hvp = _operator("hvp", "∇²f(x) v (shape of x), forward-over-reverse by default.")
jvp = _operator("jvp", "jvp(b, f, x, v) = ∂f/∂x · v (shape of f(x)); v a tuple for a tuple x.")
vjp = _operator("vjp", "vjp(b, f, x, w) = wᵀ ∂f/∂x (shape of x; a tuple for a tuple x).")
value_and_derivative = _operator("value_and_derivative", "(f(x), f'(x)).")
value_and_gradient = _operator("value_and_gradient", "(f(x), ∇f(x)).")
value_and_jacobian = _operator("value_and_jacobian", "(f(x), ∂f/∂x).")
value_and_hessian = _operator("value_and_hessian", "(f(x), ∇²f(x)).")
value_gradient_and_hessian = _operator("value_gradient_and_hessian", "(f(x), ∇f(x), ∇²f(x)).")
value_and_jvp = _operator("value_and_jvp", "(f(x), ∂f/∂x · v).")
value_and_vjp = _operator("value_and_vjp", "(f(x), wᵀ ∂f/∂x).")


def pushforward(backend: AbstractBackend, f: Callable, x) -> Callable:
    """The linear map `v -> ∂f/∂x · v` at `x` (v a tuple for a tuple x)."""
    _check_inputs("jvp", backend, f, x, (x,))
    return lambda v: jvp(backend, f, x, v)


def pullback(backend: AbstractBackend, f: Callable, x) -> Callable:
    """The linear map `w -> wᵀ ∂f/∂x` at `x` (a tuple of results for a tuple x)."""
    _check_inputs("vjp", backend, f, x, (np.zeros(()),))
    return lambda w: vjp(backend, f, x, w)


class LazyJacobian:
    """∂f/∂x at x as an operator: `J @ v` (jvp), `w @ J` (vjp), `J.T`; never formed.
    `shape` is `(size of f(x), size of x)`; vectors keep their natural shapes."""

    __array_ufunc__ = None  # make NumPy defer `w @ J` to __rmatmul__

    def __init__(self, backend, f, x, transposed=False):
        if isinstance(x, tuple):
            raise TypeError(f"lazy_jacobian takes one array x, not a tuple of {len(x)} arguments")
        if _check_inputs("jvp", backend, f, x, (x,))[1] is not None:
            raise TypeError(f"lazy_jacobian takes one array x, not a {type(x).__name__} PyTree: use jvp and vjp")
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
    """∇²f(x) as an operator: `H @ v` and `v @ H` are Hessian-vector products; `H.T` is H."""

    __array_ufunc__ = None

    def __init__(self, backend, f, x):
        _check_inputs("hvp", backend, f, x, (x,))
        self.backend, self.f, self.x = backend, f, x
        n = int(np.prod(np.shape(x)))
        self.shape = (n, n)

    @property
    def T(self):
        return self

    def __matmul__(self, v):
        return hvp(self.backend, self.f, self.x, v)

    __rmatmul__ = __matmul__


def lazy_jacobian(backend: AbstractBackend, f: Callable, x) -> LazyJacobian:
    """∂f/∂x at x as a lazy operator (`J @ v`, `w @ J`, `J.T`)."""
    return LazyJacobian(backend, f, x)


def lazy_hessian(backend: AbstractBackend, f: Callable, x) -> LazyHessian:
    """∇²f(x) as a lazy operator (`H @ v`, `v @ H`)."""
    return LazyHessian(backend, f, x)


__all__ = [*_SPECS, "pushforward", "pullback", "lazy_jacobian", "lazy_hessian", "prepare", "namespace"]
