"""`linear_map`: a linear function with a declared transpose, differentiable again.

`linear_map(fun, transpose, residuals, linear)` evaluates `fun(residuals, linear)`,
which is linear in `linear` (and possibly nonlinear in `residuals`), and declares
`transpose(residuals, cotangent)` its transpose. Each is traced only when used: the
transpose when a cotangent is pulled back, and, given its output's shapes (`out`), `fun` when
the map is evaluated, so `jax.grad` traces no pushforward and `jax.jvp` no pullback. It is what JAX's
`jax.custom_derivatives.linear_call` is, with the rules that make the rules
built on it composable:

- JVP: the product rule in both arguments, `fun(r, dl) + ∂_r fun(r, l)[dr]`.
  The second term (nonzero when an outer transformation differentiates the
  residuals: Hessians, Newton steps of implicit solvers) is itself a
  `linear_map` in `dr`, whose transpose is reverse mode through `fun`;
  `linear_call` asserts `dr = 0` instead.
- transpose: `transpose(r, ·)`, whose own transpose is `fun(r, ·)` again.
- batching: `jax.vmap` of both, or, for engines that cannot be vmapped
  (`vmappable=False`), a sequential `jax.lax.map` over the batch.

A map whose `fun` runs outside JAX (a host callback) cannot be differentiated
in its residuals; `nondifferentiable` then gives the reason, raised as a clear
error when that is attempted. Without `out`, a `fun` closing over traced values is
traced at once and the values hoisted into the residuals, so they are
differentiated too; with `out` it must close over none (pass them in `residuals`).
"""

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

# A new primitive needs JAX's internals, kept with the JAX versions they were
# tested on in sciad/_jax_internals.py, which says why.
from sciad._jax_internals import batching, convert_constvars_jaxpr, core, debug_info, jax_ad, lu, mlir, pe
from sciad._errors import raising_solve_errors

linear_map_p = core.Primitive("sciad_linear_map")
linear_map_p.multiple_results = True


class HigherOrderError(NotImplementedError):
    """A derivative of a rule that this rule cannot provide (named in the message)."""


REVERSE_OVER_REVERSE = (
    "reverse-over-reverse differentiation is not available here (the rules' inner solves support "
    "forward mode only): take second derivatives forward-over-reverse, e.g. jax.hessian(f), "
    "jax.jacfwd(jax.grad(f)) or jax.jvp(jax.grad(f), (x,), (v,))")


def linear_map(fun: Callable, transpose: Callable, residuals, linear, *, out=None, vmappable: bool = True,
               nondifferentiable: str | None = None):
    """`fun(residuals, linear)` (PyTrees of arrays in and out), linear in `linear`,
    with `transpose(residuals, cotangent) -> cotangent of linear` as its transpose. `out`: the
    structure, shapes and dtypes of fun's output (arrays or `jax.ShapeDtypeStruct`s), where known:
    `fun` is then traced only when the map is evaluated (it must close over no traced value)."""
    res_flat, res_tree = jax.tree.flatten(residuals)
    lin_flat, lin_tree = jax.tree.flatten(linear)
    out_tree = [] if out is None else [jax.tree.structure(out)]

    def flat_fun(*args):
        out = fun(jax.tree.unflatten(res_tree, args[: len(res_flat)]),
                  jax.tree.unflatten(lin_tree, args[len(res_flat):]))
        flat, tree = jax.tree.flatten(out)
        if out_tree and tree != out_tree[0]:
            raise TypeError(f"linear_map: fun returned structure {tree}, declared {out_tree[0]}")
        out_tree[:] = [tree]
        return flat

    if out is None:
        callee, consts = _trace(flat_fun, [*res_flat, *lin_flat])
        callee = _Callee(callee)
    else:
        avals = [jax.core.ShapedArray(np.shape(x), x.dtype) for x in jax.tree.leaves(out)]
        callee, consts = _Callee(None, lambda: _trace_closed(flat_fun, [*res_flat, *lin_flat], avals), avals), []

    def flat_transpose(*args):
        cts = transpose(jax.tree.unflatten(res_tree, args[: len(res_flat)]),
                        jax.tree.unflatten(out_tree[0], args[len(res_flat):]))
        flat, tree = jax.tree.flatten(cts)
        if tree != lin_tree:
            raise TypeError(f"linear_map: the transpose returned structure {tree}, but the linear "
                            f"input has structure {lin_tree}")
        return flat

    @functools.cache
    def transpose_thunk():
        return _trace(flat_transpose, [*res_flat, *callee.out_avals])

    out = linear_map_p.bind(*consts, *res_flat, *lin_flat, callee=callee, transpose_thunk=transpose_thunk,
                            num_consts=len(consts), num_res=len(res_flat), vmappable=vmappable,
                            nondifferentiable=nondifferentiable)
    return jax.tree.unflatten(out_tree[0], out)


def forward_mode_only(tree, reason: str):
    """`tree` unchanged; its tangents flow forward, but pulling a cotangent back through them
    (reverse mode over code whose derivatives only forward mode can enter) raises
    `HigherOrderError(reason)`. Not equinox's `nondifferentiable_backward`: it raises a plain
    RuntimeError, and callers catch `HigherOrderError` (sciad.ad's error for a derivative a rule
    cannot provide)."""
    leaves, treedef = jax.tree.flatten(tree)
    inexact = [i for i, x in enumerate(leaves) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]

    def refuse(_, cotangent):
        raise HigherOrderError(reason)

    @jax.custom_jvp
    def mark(xs):
        return xs

    @mark.defjvp
    def mark_jvp(primals, tangents):
        return primals[0], linear_map(lambda _, v: v, refuse, (), tangents[0])

    marked = mark([leaves[i] for i in inexact])
    for i, x in zip(inexact, marked):
        leaves[i] = x
    return jax.tree.unflatten(treedef, leaves)


class _Callee:
    """The map's function as a closed jaxpr taking (closed-over values, *args): `closed`, ready, or
    traced by `trace()` when first asked for, its `out_avals` declared (then it holds its constants
    itself and has no effects). Read as a `ClosedJaxpr` is (`jaxpr`, `consts`, `out_avals`, `effects`:
    jaxpr walkers such as `sciad.sparsity` enter it alike); a primitive parameter, hashed by identity."""

    def __init__(self, closed: core.ClosedJaxpr | None, trace: Callable | None = None, out_avals=None):
        self._closed, self._trace = closed, trace
        self.out_avals = closed.out_avals if closed is not None else out_avals
        self.effects = closed.effects if closed is not None else core.no_effects

    @functools.cached_property
    def closed(self) -> core.ClosedJaxpr:
        return self._closed if self._closed is not None else self._trace()

    @property
    def jaxpr(self) -> core.Jaxpr:
        return self.closed.jaxpr

    @property
    def consts(self) -> list:
        return self.closed.consts

    def __repr__(self) -> str:
        return f"Callee({'traced' if self._closed is not None or 'closed' in self.__dict__ else 'deferred'})"


def _trace_closed(flat_fun: Callable, args, out_avals) -> core.ClosedJaxpr:
    """`flat_fun` as a closed jaxpr holding its constants, checked against the `out_avals` declared."""
    avals = [jax.typeof(a) if not isinstance(a, jax.core.AbstractValue) else a for a in args]
    wrapped = lu.wrap_init(flat_fun, debug_info=debug_info("sciad linear_map", flat_fun, avals, {}))
    jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(wrapped, avals)
    traced = [c for c in consts if isinstance(c, jax.core.Tracer)]
    if traced:
        raise TypeError("linear_map(out=...): fun closes over a traced value; pass it in `residuals`")
    closed = core.ClosedJaxpr(jaxpr, consts)
    got = [(a.shape, a.dtype) for a in closed.out_avals]
    if got != [(a.shape, a.dtype) for a in out_avals] or closed.effects:
        raise TypeError(f"linear_map(out=...): fun returned {got} (effects {closed.effects}), declared "
                        f"{[(a.shape, a.dtype) for a in out_avals]} and no effects")
    return closed


def _trace(flat_fun: Callable, args) -> tuple[core.ClosedJaxpr, list]:
    """`flat_fun` as a closed jaxpr taking (closed-over values, *args), and those values."""
    avals = [jax.typeof(a) if not isinstance(a, jax.core.AbstractValue) else a for a in args]
    wrapped = lu.wrap_init(flat_fun, debug_info=debug_info("sciad linear_map", flat_fun, avals, {}))
    jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(wrapped, avals)
    return core.ClosedJaxpr(convert_constvars_jaxpr(jaxpr), []), consts


def _run(jaxpr: "core.ClosedJaxpr | _Callee", *args):
    return jax.core.eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, *args)


@raising_solve_errors  # run eagerly (an eager jax.grad's backward pass): sciad's checks raise a SolveError
def _impl(*args, callee, **_):
    return _run(callee, *args)


def _abstract_eval(*args, callee, **_):
    return callee.out_avals, callee.effects


def _is_zero(t) -> bool:
    return type(t) is jax_ad.Zero or getattr(t, "dtype", None) == jax.dtypes.float0


def _jvp(primals, tangents, *, callee, transpose_thunk, num_consts, num_res, vmappable, nondifferentiable):
    params = dict(callee=callee, transpose_thunk=transpose_thunk, num_consts=num_consts, num_res=num_res,
                  vmappable=vmappable, nondifferentiable=nondifferentiable)
    nres = num_consts + num_res
    res, lin = list(primals[:nres]), list(primals[nres:])
    dres, dlin = tangents[:nres], tangents[nres:]
    out = linear_map_p.bind(*primals, **params)
    terms = []
    if not all(_is_zero(t) for t in dlin):
        dlin = [jax_ad.instantiate_zeros(t) if type(t) is jax_ad.Zero else t for t in dlin]
        terms.append(linear_map_p.bind(*res, *dlin, **params))
    active = [i for i, t in enumerate(dres) if not _is_zero(t)]
    if active:
        if nondifferentiable is not None:
            raise HigherOrderError(nondifferentiable)
        terms.append(_residual_term(callee, res, lin, active, [dres[i] for i in active], vmappable))
    if not terms:
        return out, [jax_ad.Zero(a.to_tangent_aval()) for a in callee.out_avals]
    return out, [sum(ts[1:], ts[0]) for ts in zip(*terms)]


def _residual_term(callee, res, lin, active, dres, vmappable):
    """∂_r fun(r, l)[dr] for the residuals at positions `active`: a linear_map in dr."""

    def at(res, lin, moving):
        full = list(res)
        for i, r in zip(active, moving):
            full[i] = r
        return _run(callee, *full, *lin)

    def pushforward(rl, dr):
        res, lin = rl
        moving = [res[i] for i in active]
        return jax.jvp(lambda *m: at(res, lin, m), moving, list(dr))[1]

    def pullback(rl, ct):
        res, lin = rl
        moving = [res[i] for i in active]
        try:
            _, pb = jax.vjp(lambda *m: at(res, lin, m), *moving)
            return list(pb(ct))
        except Exception as e:  # a rule whose inside forward mode can enter but reverse mode cannot
            raise HigherOrderError(REVERSE_OVER_REVERSE) from e

    return linear_map(pushforward, pullback, (res, lin), dres, vmappable=vmappable)


def _transpose(cts, *args, callee, transpose_thunk, num_consts, num_res, vmappable, nondifferentiable):
    nres = num_consts + num_res
    res, lin = args[:nres], args[nres:]
    if any(jax_ad.is_undefined_primal(r) for r in res):
        raise HigherOrderError("linear_map: transposing with respect to a residual (a nonlinear input)")
    consts, user_res = res[:num_consts], res[num_consts:]
    t_jaxpr, t_consts = transpose_thunk()
    cts = [jax_ad.instantiate_zeros(ct) if type(ct) is jax_ad.Zero else ct for ct in cts]
    cts = [jnp.zeros(a.shape, a.dtype) if ct is None else ct for ct, a in zip(cts, callee.out_avals)]
    out = linear_map_p.bind(*t_consts, *user_res, *cts, callee=t_jaxpr if isinstance(t_jaxpr, _Callee) else _Callee(t_jaxpr),
                            transpose_thunk=lambda: (callee, list(consts)), num_consts=len(t_consts),
                            num_res=num_res, vmappable=vmappable, nondifferentiable=nondifferentiable)
    return [None] * nres + list(out)


def _batch(axis_data, args, dims, *, callee, transpose_thunk, num_consts, num_res, vmappable, nondifferentiable):
    """vmap of the map and of its transpose (or lax.map where the engine cannot be vmapped);
    unbatched linear inputs are broadcast so the batched map stays linear in all of them."""
    params = dict(callee=callee, transpose_thunk=transpose_thunk, num_consts=num_consts, num_res=num_res,
                  vmappable=vmappable, nondifferentiable=nondifferentiable)
    if all(d is None for d in dims):
        out = linear_map_p.bind(*args, **params)
        return out, [None] * len(out)
    size = axis_data.size
    args = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    batched = [d is not None for d in dims]
    nres = num_consts + num_res
    res, res_batched = list(args[:nres]), batched[:nres]
    lin = [a if b else jnp.broadcast_to(a, (size, *a.shape)) for a, b in zip(args[nres:], batched[nres:])]

    def rows(jaxpr, consts, res, res_batched, rest):
        """`jaxpr(*consts, *res, *rest)` row by row: `res` batched where `res_batched`, `rest` all batched."""
        def row(batched_res, rest_row):
            it = iter(batched_res)
            return _run(jaxpr, *consts, *(next(it) if b else r for r, b in zip(res, res_batched)), *rest_row)

        batched_res = [r for r, b in zip(res, res_batched) if b]
        if vmappable:
            return jax.vmap(row)(batched_res, list(rest))
        return jax.lax.map(lambda xs: row(*xs), (batched_res, list(rest)))

    def fun(res, lin):
        return rows(callee, [], res, res_batched, lin)

    def transpose(res, cts):  # the transpose jaxpr takes (its own consts, the user residuals, cotangents)
        jaxpr, t_consts = transpose_thunk()
        return rows(jaxpr, t_consts, res[num_consts:], res_batched[num_consts:], cts)

    out = linear_map(fun, transpose, res, lin, vmappable=vmappable, nondifferentiable=nondifferentiable)
    return out, [0] * len(out)


linear_map_p.def_impl(_impl)
linear_map_p.def_effectful_abstract_eval(_abstract_eval)
jax_ad.primitive_jvps[linear_map_p] = _jvp
jax_ad.primitive_transposes[linear_map_p] = _transpose
batching.fancy_primitive_batchers[linear_map_p] = _batch
mlir.register_lowering(linear_map_p, mlir.lower_fun(_impl, multiple_results=True))
