"""`differentiate_with`: call a function from JAX, differentiate it with any engine."""

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero, linear_call

from sciad.ad.backend import AbstractBackend
from sciad.ad.jax_backends import Enzyme, _JaxTraced
from sciad.ad.registry import get


def differentiate_with(f: Callable, backend: AbstractBackend | str) -> Callable:
    """`g(*xs) = f(*xs)`, callable from JAX code (under `jax.jit`, `jax.jvp`,
    `jax.vjp`, `jax.grad`, `jax.vmap`) with its derivatives computed by `backend`.

    `f` takes arrays and returns one array, written once with
    `sciad.ad.namespace`. JAX engines (jax-*, enzyme) are traced into the
    caller's program. Foreign engines (torch, autograd, finite-differences)
    run on the host through `jax.pure_callback`: each value, jvp and vjp is one
    round trip from the compiled program to Python (a real cost, reported by
    the benchmarks). Tangents use the engine's pushforward and cotangents its
    pullback (the other one derived from the Jacobian where the engine has
    only one), joined by a custom linear rule so both directions are native.
    """
    backend = get(backend)
    if isinstance(backend, (_JaxTraced, Enzyme)):
        return _traced(f, backend)
    return _host(f, backend)


def custom_linear_rules(forward: Callable, pushforward: Callable, pullback: Callable) -> Callable:
    """A JAX function `g(*xs)` with its own forward and reverse rules.

    `forward(*xs, active) -> (y, residuals)`, where `active` (a tuple of bools,
    one per x) says which arguments are being differentiated, or is None for
    a plain evaluation (residuals are then unused); `pushforward(residuals,
    vs) -> tangent of y`; `pullback(residuals, w) -> tuple of cotangents, one
    per x` (entries of inactive arguments may be None). The two rules are
    declared transposes of each other (`jax.custom_derivatives.linear_call`),
    so `jax.jvp` runs `pushforward` and `jax.vjp`/`jax.grad` run `pullback`.
    Only arguments with nonzero tangents enter the linear map, so
    differentiating some arguments leaves the others constant.
    """

    @jax.custom_jvp
    def g(*xs):
        return forward(*xs, active=None)[0]

    @functools.partial(g.defjvp, symbolic_zeros=True)
    def g_jvp(xs, vs):
        mask = tuple(not isinstance(v, SymbolicZero) for v in vs)
        active = tuple(i for i, on in enumerate(mask) if on)
        if not active:
            y = g(*xs)
            return y, jax.tree.map(jnp.zeros_like, y)
        y, residuals = forward(*xs, active=mask)

        def lin(residuals, active_vs):
            full = [jnp.zeros_like(x) for x in xs]
            for i, v in zip(active, active_vs):
                full[i] = v
            return pushforward(residuals, tuple(full))

        def lin_t(residuals, w):
            cotangents = pullback(residuals, w)
            return tuple(cotangents[i] for i in active)

        return y, linear_call(lin, lin_t, residuals, tuple(vs[i] for i in active))

    return g


def _traced(f: Callable, backend: AbstractBackend) -> Callable:
    def pushforward(xs, vs):
        return backend.value_and_pushforward(f, xs)[1](vs)

    def pullback(xs, w):
        return tuple(backend.value_and_pullback(f, xs)[1](w))

    return custom_linear_rules(lambda *xs, active: (f(*xs), xs), pushforward, pullback)


def _host(f: Callable, backend: AbstractBackend) -> Callable:
    def engine(xs):
        return tuple(backend.asarray(np.asarray(x)) for x in xs)

    def out_struct(xs):
        try:  # functions written with sciad.ad.namespace trace under JAX
            y = jax.eval_shape(f, *xs)
        except Exception:  # engine-specific code: evaluate it once on the host
            y = backend.numpy(f(*engine(np.ones(x.shape, x.dtype) for x in xs)))
        return jax.ShapeDtypeStruct(y.shape, jnp.result_type(*xs))

    def call(host_fn, result, *args):
        return jax.pure_callback(host_fn, result, *args, vmap_method="sequential")

    def primal(*xs):
        result = out_struct(xs)

        def host(*xs):
            return backend.numpy(f(*engine(xs))).astype(result.dtype)

        return call(host, result, *xs)

    def pushforward(xs, vs):
        result = out_struct(xs)

        def host(xs, vs):
            tangent = backend.value_and_pushforward(f, engine(xs))[1](engine(vs))
            return backend.numpy(tangent).astype(result.dtype)

        return call(host, result, xs, vs)

    def pullback(xs, w):
        results = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs)

        def host(xs, w):
            cotangents = backend.value_and_pullback(f, engine(xs))[1](backend.asarray(np.asarray(w)))
            return tuple(backend.numpy(c).astype(r.dtype) for c, r in zip(cotangents, results))

        return call(host, results, xs, w)

    return custom_linear_rules(lambda *xs, active: (primal(*xs), xs), pushforward, pullback)


def _register_linear_call_batching():
    """vmap over `linear_call`, which JAX leaves without a batching rule: the
    callee and its transpose are vmapped, unbatched linear inputs broadcast."""
    from jax._src.custom_derivatives import linear_call_p
    from jax._src.interpreters import batching

    if linear_call_p in getattr(batching, "fancy_primitive_batchers", {}):
        return

    def rule(args, dims, *, callee, transpose_thunk, num_callee_consts, num_res):
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        args = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
        axes = [None if d is None else 0 for d in dims]
        nres = num_callee_consts + num_res
        res, res_axes = tuple(args[:nres]), tuple(axes[:nres])
        lin = tuple(a if d is not None else jnp.broadcast_to(a, (size, *a.shape)) for a, d in zip(args[nres:], axes[nres:]))

        def fun(res, lin):
            run = lambda r, l: jax.core.eval_jaxpr(callee.jaxpr, callee.consts, *r, *l)  # noqa: E731
            return tuple(jax.vmap(run, in_axes=(res_axes, 0))(res, lin))

        def fun_transpose(res, cts):
            jaxpr, t_consts = transpose_thunk()
            consts, r = res[:num_callee_consts], res[num_callee_consts:]
            del consts  # the transpose has its own constants
            run = lambda r, c: jax.core.eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, *t_consts, *r, *c)  # noqa: E731
            return tuple(jax.vmap(run, in_axes=(res_axes[num_callee_consts:], 0))(r, cts))

        out = linear_call(fun, fun_transpose, res, lin)
        return list(out), [0] * len(out)

    batching.primitive_batchers[linear_call_p] = rule


_register_linear_call_batching()
