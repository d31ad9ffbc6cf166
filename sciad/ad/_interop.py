"""`differentiate_with`: call a function from JAX, differentiate it with any engine."""

import functools
import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from sciad._errors import host_call, raising_solve_errors
from sciad.ad._backend import AbstractBackend
from sciad.ad._linear import HigherOrderError, linear_map
from sciad.ad._registry import get


def differentiate_with(f: Callable, backend: AbstractBackend | str) -> Callable:
    """`g(*xs) = f(*xs)`, callable from JAX code (under `jax.jit`, `jax.jvp`,
    `jax.vjp`, `jax.grad`, `jax.vmap`) with its derivatives computed by `backend`.

    `f` takes arrays and returns one array, written once with
    `sciad.ad.namespace`. JAX engines (jax-*, enzyme) are traced into the
    caller's program. Foreign engines (torch, autograd, finite-differences)
    run on the host through `jax.pure_callback`: each value, jvp and vjp is one
    round trip from the compiled program to Python (a real cost, reported by
    the benchmarks); under `jax.vmap` one round trip carries the whole batch,
    which the engine evaluates with its own batching (`map_batch`:
    `torch.func.vmap` for torch, a loop inside the call otherwise). Tangents
    use the engine's pushforward and cotangents its pullback (the other one
    derived from the Jacobian where the engine has only one), joined by a
    custom linear rule so both directions are native.
    On host engines only the differentiated arguments are variables; the
    others (e.g. `t` in `f(u, p, t)`) are constants to the engine: no tape,
    no boxes, no finite-difference columns.
    Second derivatives (Hessians, Newton steps through the products) work for
    engines that declare `higher_order` and raise a clear
    `sciad.ad._linear.HigherOrderError` for the others.
    What a host engine raises while the program runs (f failing at those
    inputs, an engine's refusal) is raised as a `sciad.SolveError` naming the
    engine and the product: as itself where `g` runs eagerly, as JAX's runtime
    error's last line under `jax.jit` (`sciad.errors.summary`).
    """
    backend = get(backend)
    return raising_solve_errors(_traced(f, backend) if backend.traced else _host(f, backend))


def custom_linear_rules(
    forward: Callable,
    pushforward: Callable,
    pullback: Callable,
    *,
    vmappable: bool = True,
    nondifferentiable: str | None = None,
) -> Callable:
    """A JAX function `g(*xs)` with its own forward and reverse rules.

    `forward(*xs, active) -> (y, residuals)`, where `active` (a tuple of bools,
    one per x) says which arguments are being differentiated, or is None for
    a plain evaluation (residuals are then unused); `pushforward(residuals,
    vs) -> tangent of y`; `pullback(residuals, w) -> tuple of cotangents, one
    per x` (entries of inactive arguments may be None). The two rules are
    declared transposes of each other (`sciad.ad._linear.linear_map`), so
    `jax.jvp` runs `pushforward` and `jax.vjp`/`jax.grad` run `pullback`.
    Only arguments with nonzero tangents enter the linear map, so
    differentiating some arguments leaves the others constant.

    The rules are differentiable again: an outer `jax.jvp` differentiates
    `forward` and the rules themselves (forward-over-reverse Hessians, Newton
    steps through the rules), so everything they run must support forward
    mode. `vmappable=False` batches the rules with a loop; `nondifferentiable`
    (a reason) makes second derivatives raise it. Under `jax.vmap`, the
    cotangents of arguments the batch shares are summed over it; `pullback`
    may sum them as it goes with `sciad.ad._linear.accumulate_pullback`, the
    argument's index in `xs` as its slot.
    """

    @jax.custom_jvp
    def g(*xs):
        return _batch_first(forward(*xs, active=None)[0])

    @functools.partial(g.defjvp, symbolic_zeros=True)
    def g_jvp(xs, vs):
        mask = tuple(not isinstance(v, SymbolicZero) for v in vs)
        active = tuple(i for i, on in enumerate(mask) if on)
        if not active:
            y = g(*xs)
            return y, jax.tree.map(jnp.zeros_like, y)
        y, residuals = forward(*xs, active=mask)
        y = _batch_first(y)
        shapes = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in xs]

        def lin(residuals, active_vs):  # traced only where a tangent is evaluated (jax.jvp), not under jax.grad
            full = [jnp.zeros(x.shape, x.dtype) for x in shapes]
            for i, v in zip(active, active_vs):
                full[i] = v
            return pushforward(residuals, tuple(full))

        def lin_t(residuals, w):
            cotangents = pullback(residuals, w)
            return tuple(cotangents[i] for i in active)

        slots = tuple(i for i in active for _ in jax.tree.leaves(vs[i]))  # each linear leaf's argument
        return y, linear_map(
            lin,
            lin_t,
            residuals,
            tuple(vs[i] for i in active),
            out=y,
            vmappable=vmappable,
            nondifferentiable=nondifferentiable,
            slots=slots,
        )

    return g


def _batch_first(tree):
    """`tree` with every leaf's `jax.vmap` batch axis first (a reshape's batching rule moves it there),
    values unchanged. A custom_jvp's value and its rule must batch their outputs alike (JAX records the
    value's batch axes and reads the rule's outputs with them when it linearises a jitted call); their
    different programs could otherwise leave a batch axis in different places (e.g. a stack of batched
    scalars puts it last)."""
    return jax.tree.map(lambda x: jax.lax.reshape(jax.lax.reshape(x, (1, *x.shape, 1)), x.shape), tree)


class _Point(eqx.Module):
    """Where the rules linearise `f`: the arguments `xs`, and which of them are
    differentiated (`active`, static: it shapes the engine's work)."""

    xs: tuple
    active: tuple = eqx.field(static=True)


def _active(xs: tuple, active: tuple) -> tuple:
    return tuple(x for x, on in zip(xs, active) if on)


def _restricted(f: Callable, xs: tuple, active: tuple) -> Callable:
    """`f` as a function of the differentiated arguments only; the others are held
    at `xs`, constants to the engine (no tape, no finite-difference columns)."""

    def g(*moving):
        it = iter(moving)
        return f(*(next(it) if on else x for x, on in zip(xs, active)))

    return g


def _expanded(cotangents, active: tuple) -> tuple:
    """Cotangents of the active arguments, as one entry per argument (None where inactive)."""
    it = iter(cotangents)
    return tuple(next(it) if on else None for on in active)


def _traced(f: Callable, backend: AbstractBackend) -> Callable:
    """Traced in whole: JAX drops the unused cotangents (Enzyme fails on closures over traced values)."""

    def pushforward(xs, vs):
        return backend.value_and_pushforward(f, xs)[1](vs)

    def pullback(xs, w):
        return tuple(backend.value_and_pullback(f, xs)[1](w))

    return custom_linear_rules(
        lambda *xs, active: (f(*xs), xs),
        pushforward,
        pullback,
        vmappable=backend.vmappable,
        nondifferentiable=None
        if backend.higher_order
        else (
            f"second derivatives through the {backend.name!r} engine are not available (it cannot "
            "differentiate its own derivatives): use jax-reverse, jax-forward or jax-transpose here"
        ),
    )


def _host(f: Callable, backend: AbstractBackend) -> Callable:
    def out_struct(xs):
        try:  # functions written with sciad.ad.namespace trace under JAX
            y = jax.eval_shape(f, *xs)
        except Exception:  # engine-specific code: evaluate it once on the host
            y = backend.numpy(f(*(backend.asarray(np.ones(x.shape, x.dtype)) for x in xs)))
        return jax.ShapeDtypeStruct(y.shape, jnp.result_type(*xs))

    no_second_order = (
        f"second derivatives through the host engine {backend.name!r} are not available inside "
        "JAX (its products run in host callbacks, which JAX cannot differentiate): use a JAX "
        "engine (jax-reverse, jax-forward, jax-transpose) here"
    )

    @jax.custom_jvp
    def primal(*xs):
        return _callback(backend, lambda engine, *xs: f(*xs), xs, out_struct(xs), "f")

    @primal.defjvp
    def primal_jvp(xs, vs):  # reached only when the rules' forward pass is differentiated again
        raise HigherOrderError(no_second_order)

    def pushforward(at, vs):
        def product(engine, xs, vs):
            return engine.value_and_pushforward(_restricted(f, xs, at.active), _active(xs, at.active))[1](vs)

        return _callback(backend, product, (at.xs, _active(vs, at.active)), out_struct(at.xs), "the pushforward of f")

    def pullback(at, w):
        def product(engine, xs, w):
            return tuple(engine.value_and_pullback(_restricted(f, xs, at.active), _active(xs, at.active))[1](w))

        results = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in _active(at.xs, at.active))
        return _expanded(_callback(backend, product, (at.xs, w), results, "the pullback of f"), at.active)

    return custom_linear_rules(
        lambda *xs, active: (primal(*xs), _Point(xs, active)), pushforward, pullback, nondifferentiable=no_second_order
    )


def _callback(backend: AbstractBackend, product: Callable, args: tuple, results, what: str):
    """`product(backend, *args)` run on the host through `jax.pure_callback`: engine arrays in,
    `results`' structure out (one array, or a tuple of them), cast to `results`' dtypes. What it
    raises is raised as a `SolveError` naming the engine and `what` it computed (`host_call`).

    Under `jax.vmap` the host receives the whole batch (`vmap_method="expand_dims"`): each
    enclosing vmap gives every argument one more leading axis, of the batch's size, or 1 for
    an argument it does not batch (shared by the members). The batch's members, flattened to
    one axis, run in one `backend.map_batch`; the results get the batch axes back.
    """
    leaves, tree = jax.tree.flatten(args)
    ndims = tuple(jnp.ndim(x) for x in leaves)
    outs, out_tree = jax.tree.flatten(results)

    def host(*leaves):
        if all(x.ndim == n for x, n in zip(leaves, ndims)):  # not under vmap: the product, directly
            ys, batch = product(backend, *tree.unflatten([backend.asarray(x) for x in leaves])), ()
        else:
            batch = np.broadcast_shapes(*(x.shape[: x.ndim - n] for x, n in zip(leaves, ndims)))
            if math.prod(batch) == 0:
                return out_tree.unflatten([np.zeros(batch + r.shape, r.dtype) for r in outs])
            ys = _map_batch(backend, product, tree, leaves, ndims, batch)
        ys = ys if isinstance(ys, tuple) else (ys,)
        return out_tree.unflatten(
            [np.reshape(backend.numpy(y).astype(r.dtype), batch + r.shape) for y, r in zip(ys, outs, strict=True)]
        )

    def failure(e: Exception) -> str:
        return (
            f"{what} raised {type(e).__name__} on the host (the {backend.name!r} engine, called from JAX): "
            f"{str(e).rstrip('.')}; where f itself fails at these inputs, fix f, else differentiate it with "
            "another engine, e.g. 'jax-reverse'"
        )

    return jax.pure_callback(host_call(host, failure), results, *leaves, vmap_method="expand_dims")


def _map_batch(backend: AbstractBackend, product: Callable, tree, leaves: tuple, ndims: tuple, batch: tuple):
    """`product`'s results stacked (size, ...) over a nonempty batch of shape `batch`: `leaves` have
    leading axes (`batch`'s, or 1 where shared) before their members' `ndims`."""
    size = math.prod(batch)
    shapes = [x.shape[x.ndim - n :] for x, n in zip(leaves, ndims)]
    batched = tuple(x.size > math.prod(s) for x, s in zip(leaves, shapes))
    members = [
        np.reshape(np.broadcast_to(x, batch + s), (size, *s)) if b else np.reshape(x, s)
        for x, s, b in zip(leaves, shapes, batched)
    ]
    if not any(batched):  # a batch of one
        return product(backend, *tree.unflatten([backend.asarray(m) for m in members]))
    return backend.map_batch(
        lambda engine, *member: product(engine, *tree.unflatten(member)),
        tuple(backend.asarray(m) for m in members),
        batched,
    )
