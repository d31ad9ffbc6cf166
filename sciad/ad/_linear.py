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
  (`vmappable=False`), a sequential `jax.lax.map` over the batch. Unbatched
  linear inputs (a batch's shared parameters) stay unbatched: their cotangents
  are summed over the batch, inside the transpose wherever it accumulates them
  with `accumulate_pullback` (one pullback of the batched function with respect
  to the shared input per step, instead of one cotangent per member per step).

A map whose `fun` runs outside JAX (a host callback) cannot be differentiated
in its residuals; `nondifferentiable` then gives the reason, raised as a clear
error when that is attempted. Without `out`, a `fun` closing over traced values is
traced at once and the values hoisted into the residuals, so they are
differentiated too; with `out` it must close over none (pass them in `residuals`).
"""

import functools
from collections.abc import Callable

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from sciad._errors import raising_solve_errors

# A new primitive needs JAX's internals, kept with the JAX versions they were
# tested on in sciad/_jax_internals.py, which says why.
from sciad._jax_internals import batching, convert_constvars_jaxpr, core, debug_info, jax_ad, lu, mlir, pe

linear_map_p = core.Primitive("sciad_linear_map")
linear_map_p.multiple_results = True


class HigherOrderError(NotImplementedError):
    """A derivative of a rule that this rule cannot provide (named in the message)."""


REVERSE_OVER_REVERSE = (
    "reverse-over-reverse differentiation is not available here (the rules' inner solves support "
    "forward mode only): take second derivatives forward-over-reverse, e.g. jax.hessian(f), "
    "jax.jacfwd(jax.grad(f)) or jax.jvp(jax.grad(f), (x,), (v,))"
)


def linear_map(
    fun: Callable,
    transpose: Callable,
    residuals,
    linear,
    *,
    out=None,
    vmappable: bool = True,
    nondifferentiable: str | None = None,
    slots: tuple | None = None,
):
    """`fun(residuals, linear)` (PyTrees of arrays in and out), linear in `linear`,
    with `transpose(residuals, cotangent) -> cotangent of linear` as its transpose. `out`: the
    structure, shapes and dtypes of fun's output (arrays or `jax.ShapeDtypeStruct`s), where known:
    `fun` is then traced only when the map is evaluated (it must close over no traced value).
    `slots`: one key per leaf of `linear` (default: its index), as `accumulate_pullback` names them."""
    res_flat, res_tree = jax.tree.flatten(residuals)
    lin_flat, lin_tree = jax.tree.flatten(linear)
    slots = tuple(range(len(lin_flat))) if slots is None else tuple(slots)
    if len(slots) != len(lin_flat):
        raise TypeError(f"linear_map: {len(slots)} slots for {len(lin_flat)} linear leaves")
    out_tree = [] if out is None else [jax.tree.structure(out)]

    def flat_fun(*args):
        out = fun(
            jax.tree.unflatten(res_tree, args[: len(res_flat)]), jax.tree.unflatten(lin_tree, args[len(res_flat) :])
        )
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
        cts = transpose(
            jax.tree.unflatten(res_tree, args[: len(res_flat)]), jax.tree.unflatten(out_tree[0], args[len(res_flat) :])
        )
        flat, tree = jax.tree.flatten(cts)
        if tree != lin_tree:
            raise TypeError(
                f"linear_map: the transpose returned structure {tree}, but the linear input has structure {lin_tree}"
            )
        return flat

    @functools.cache
    def transpose_thunk():
        return _trace(flat_transpose, [*res_flat, *callee.out_avals])  # pyright: ignore[reportOptionalIterable]

    out = linear_map_p.bind(
        *consts,
        *res_flat,
        *lin_flat,
        callee=callee,
        transpose_thunk=transpose_thunk,
        num_consts=len(consts),
        num_res=len(res_flat),
        vmappable=vmappable,
        nondifferentiable=nondifferentiable,
        slots=slots,
    )
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
        return self._closed if self._closed is not None else self._trace()  # pyright: ignore[reportOptionalCall]

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
        raise TypeError(
            f"linear_map(out=...): fun returned {got} (effects {closed.effects}), declared "
            f"{[(a.shape, a.dtype) for a in out_avals]} and no effects"
        )
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


def _jvp(primals, tangents, *, callee, transpose_thunk, num_consts, num_res, vmappable, nondifferentiable, slots):
    params = dict(
        callee=callee,
        transpose_thunk=transpose_thunk,
        num_consts=num_consts,
        num_res=num_res,
        vmappable=vmappable,
        nondifferentiable=nondifferentiable,
        slots=slots,
    )
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


def _transpose(cts, *args, callee, transpose_thunk, num_consts, num_res, vmappable, nondifferentiable, slots):
    nres = num_consts + num_res
    res = args[:nres]
    if any(jax_ad.is_undefined_primal(r) for r in res):
        raise HigherOrderError("linear_map: transposing with respect to a residual (a nonlinear input)")
    consts, user_res = res[:num_consts], res[num_consts:]
    t_jaxpr, t_consts = transpose_thunk()
    cts = [jax_ad.instantiate_zeros(ct) if type(ct) is jax_ad.Zero else ct for ct in cts]
    cts = [jnp.zeros(a.shape, a.dtype) if ct is None else ct for ct, a in zip(cts, callee.out_avals)]
    out = linear_map_p.bind(
        *t_consts,
        *user_res,
        *cts,
        callee=t_jaxpr if isinstance(t_jaxpr, _Callee) else _Callee(t_jaxpr),
        transpose_thunk=lambda: (callee, list(consts)),
        num_consts=len(t_consts),
        num_res=num_res,
        vmappable=vmappable,
        nondifferentiable=nondifferentiable,
        slots=tuple(range(len(cts))),
    )
    return [None] * nres + list(out)


def _batch(axis_data, args, dims, *, callee, transpose_thunk, num_consts, num_res, vmappable, nondifferentiable, slots):
    """vmap of the map and of its transpose (or lax.map where the engine cannot be vmapped). Unbatched
    linear inputs stay unbatched: the transpose sums their cotangents over the batch, under a named
    axis (`_Summed`) that lets `accumulate_pullback` sum them step by step."""
    params = dict(
        callee=callee,
        transpose_thunk=transpose_thunk,
        num_consts=num_consts,
        num_res=num_res,
        vmappable=vmappable,
        nondifferentiable=nondifferentiable,
        slots=slots,
    )
    if all(d is None for d in dims):
        out = linear_map_p.bind(*args, **params)
        return out, [None] * len(out)
    args = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    batched = [d is not None for d in dims]
    nres = num_consts + num_res
    res, res_batched = list(args[:nres]), batched[:nres]
    lin, lin_batched = list(args[nres:]), batched[nres:]
    shared = [i for i, b in enumerate(lin_batched) if not b]

    def rows(jaxpr, consts, res, res_batched, rest, rest_batched, out_batched=None, axis_name=None):
        """`jaxpr(*consts, *res, *rest)` row by row, `res` and `rest` batched where marked; outputs
        batched except where `out_batched` says not (summed over the batch: `_total`)."""

        def row(batched_args):
            it = iter(batched_args)
            full = [next(it) if b else a for a, b in zip([*res, *rest], [*res_batched, *rest_batched])]
            out = _run(jaxpr, *consts, *full)
            if out_batched is None:
                return out
            return [o if b else total_p.bind(o, axis_name=axis_name) for o, b in zip(out, out_batched)]

        batched_args = [a for a, b in zip([*res, *rest], [*res_batched, *rest_batched]) if b]
        out_axes = 0 if out_batched is None else [0 if b else None for b in out_batched]
        if vmappable:
            return jax.vmap(row, axis_name=axis_name, out_axes=out_axes)(batched_args)
        out = jax.lax.map(row, batched_args)
        return out if out_batched is None else [o if b else jnp.sum(o, axis=0) for o, b in zip(out, out_batched)]

    def fun(res, lin):
        return rows(callee, [], res, res_batched, lin, lin_batched)

    def transpose(res, cts):  # the transpose jaxpr takes (its own consts, the user residuals, cotangents)
        jaxpr, t_consts = transpose_thunk()
        name = _Summed(frozenset(slots[i] for i in shared), frozenset(slots)) if shared else None
        return rows(
            jaxpr, t_consts, res[num_consts:], res_batched[num_consts:], cts, [True] * len(cts), lin_batched, name
        )

    out = linear_map(fun, transpose, res, lin, vmappable=vmappable, nondifferentiable=nondifferentiable, slots=slots)
    return out, [0] * len(out)


class _Summed:
    """The name of the batch axis of a transpose whose cotangents for `slots` (linear inputs shared by
    the batch, among its `linear` ones) are summed over it: `accumulate_pullback` may sum them step by
    step. Equal only to itself."""

    def __init__(self, slots: frozenset, linear: frozenset):
        self.slots, self.linear = slots, linear

    def __repr__(self) -> str:
        return f"Summed({sorted(self.slots)})"


def _summing(axis_data, slots) -> bool:
    """Whether an accumulation into `slots` may sum over this batch axis: those of them that are linear
    inputs of the transpose (an undifferentiated one, e.g. an empty p beside a closure's values, is
    not) are all shared by the batch."""
    if not isinstance(axis_data.name, _Summed):
        return False
    linear = set(slots) & axis_data.name.linear
    return bool(linear) and linear <= axis_data.name.slots


# `total(x)`: x; under a `_Summed` axis, an unbatched x is already the batch's total and a batched one is summed.
total_p = core.Primitive("sciad_total")
total_p.def_impl(lambda x, axis_name: x)
total_p.def_abstract_eval(lambda x, axis_name: x)
mlir.register_lowering(total_p, mlir.lower_fun(lambda x, axis_name: x, multiple_results=False))


def _total_batch(axis_data, args, dims, *, axis_name):
    (x,), (d,) = args, dims
    if d is not None and axis_data.name is axis_name:
        return jnp.sum(x, axis=d), None
    return total_p.bind(x, axis_name=axis_name), d


batching.fancy_primitive_batchers[total_p] = _total_batch
jax_ad.deflinear2(total_p, lambda ct, x, axis_name: [total_p.bind(ct, axis_name=axis_name)])


def accumulate_pullback(fun: Callable, x, p, cotangent, p_bar, slots: tuple):
    """(xᵀ: the cotangent of x, p_bar + pᵀ) for `fun(x, p)` pulled back from `cotangent`
    (`value_and_accumulated_pullback`'s, without the value)."""
    return value_and_accumulated_pullback(fun, x, p, cotangent, p_bar, slots)[1:]


def value_and_accumulated_pullback(fun: Callable, x, p, cotangent, p_bar, slots: tuple) -> tuple:
    """(fun(x, p), xᵀ: the cotangent of x, p_bar + pᵀ) for `fun(x, p)` pulled back from `cotangent`, from one
    evaluation of fun: a step of a
    transpose that accumulates the cotangent `p_bar` of its linear inputs `slots` (their keys in
    `linear_map`). Under the batch axis of a transpose whose inputs `slots` the batch shares (p and
    p_bar unbatched), p_bar stays unbatched: the batch's total, added to by one pullback of the
    batched `fun` with respect to the shared p. `p_bar` must then reach the transpose's output only
    through these steps (an unbatched p_bar is a total, not a member's)."""
    x_flat, x_tree = jax.tree.flatten(x)
    p_flat, p_tree = jax.tree.flatten(p)
    out_tree = []

    def flat_fun(*args):
        out = fun(jax.tree.unflatten(x_tree, args[: len(x_flat)]), jax.tree.unflatten(p_tree, args[len(x_flat) :]))
        leaves, structure = jax.tree.flatten(out)
        out_tree[:] = [structure]
        return leaves

    jaxpr, consts = _trace(flat_fun, [*x_flat, *p_flat])
    ct_flat = jax.tree.leaves(cotangent)
    acc_flat, acc_tree = jax.tree.flatten(p_bar)
    if acc_tree != p_tree:
        raise TypeError(f"accumulate_pullback: p_bar has structure {acc_tree}, p {p_tree}")
    out = accumulate_p.bind(
        *consts,
        *x_flat,
        *p_flat,
        *ct_flat,
        *acc_flat,
        jaxpr=jaxpr,
        num_consts=len(consts),
        num_x=len(x_flat),
        num_p=len(p_flat),
        slots=tuple(slots),
    )
    x_bar = jax.tree.unflatten(x_tree, out[: len(x_flat)])
    p_bar = jax.tree.unflatten(p_tree, out[len(x_flat) : len(x_flat) + len(acc_flat)])
    return jax.tree.unflatten(out_tree[0], out[len(x_flat) + len(acc_flat) :]), x_bar, p_bar


accumulate_p = core.Primitive("sciad_accumulate_pullback")
accumulate_p.multiple_results = True


def _split_accumulate(args, num_consts, num_x, num_p):
    consts, rest = args[:num_consts], args[num_consts:]
    x, rest = rest[:num_x], rest[num_x:]
    p, rest = rest[:num_p], rest[num_p:]
    return consts, x, p, rest[:-num_p], rest[-num_p:]


def _accumulate_impl(*args, jaxpr, num_consts, num_x, num_p, slots):
    """[x̄, p_bar + p̄, fun(x, p)]: the pullback and fun's value from one evaluation."""
    consts, x, p, ct, acc = _split_accumulate(args, num_consts, num_x, num_p)
    y, pullback = jax.vjp(lambda x, p: _run(jaxpr, *consts, *x, *p), list(x), list(p))
    x_bar, p_bar = pullback(list(ct))
    return [*x_bar, *(a + g for a, g in zip(acc, p_bar)), *y]


def _accumulate_abstract_eval(*args, jaxpr, num_consts, num_x, num_p, slots):
    _, x, p, _, acc = _split_accumulate(args, num_consts, num_x, num_p)
    return [*x, *acc, *jaxpr.out_avals]


def _accumulate_batch(axis_data, args, dims, *, jaxpr, num_consts, num_x, num_p, slots):
    params = dict(jaxpr=jaxpr, num_consts=num_consts, num_x=num_x, num_p=num_p, slots=slots)
    args = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    axes = [None if d is None else 0 for d in dims]
    c_axes, _, p_axes, _, acc_axes = _split_accumulate(axes, num_consts, num_x, num_p)
    if not (_summing(axis_data, slots) and all(d is None for d in (*p_axes, *acc_axes))):
        out = jax.vmap(lambda *a: _accumulate_impl(*a, **params), in_axes=axes, axis_size=axis_data.size)(*args)
        return out, [0] * len(out)

    # The batch shares p and sums its cotangent: one pullback of the batched fun with respect to p.
    def rows(xs, xs_axes):  # x and the cotangent: batched throughout
        return [
            a if d is not None else jnp.broadcast_to(a, (axis_data.size, *jnp.shape(a))) for a, d in zip(xs, xs_axes)
        ]

    consts, x, p, ct, acc = _split_accumulate(args, num_consts, num_x, num_p)
    _, x_axes, _, ct_axes, _ = _split_accumulate(axes, num_consts, num_x, num_p)
    x, ct = rows(x, x_axes), rows(ct, ct_axes)

    def batched(x, p):
        return jax.vmap(lambda c, x: _run(jaxpr, *c, *x, *p), in_axes=(c_axes, 0))(list(consts), x)

    y, pullback = jax.vjp(batched, list(x), p)
    x_bar, p_bar = pullback(list(ct))
    return [*x_bar, *(a + g for a, g in zip(acc, p_bar)), *y], [0] * num_x + [None] * num_p + [0] * len(y)


def _accumulate_jvp(primals, tangents, *, jaxpr, num_consts, num_x, num_p, slots):
    """Primal and tangent as one pullback of fun's jvp, (x, dx), (p, dp) -> (y, dy), from (dct, ct):
    its cotangent of (x, p) is the tangent of fun's pullback, that of (dx, dp) the pullback itself."""
    tangents = [jax_ad.instantiate_zeros(t) if type(t) is jax_ad.Zero else t for t in tangents]
    consts, x, p, ct, acc = _split_accumulate(primals, num_consts, num_x, num_p)
    dconsts, dx, dp, dct, dacc = _split_accumulate(tangents, num_consts, num_x, num_p)

    def doubled(x2, p2):
        (x, dx), (p, dp) = x2, p2
        y, dy = jax.jvp(lambda c, x, p: _run(jaxpr, *c, *x, *p), (list(consts), x, p), (list(dconsts), dx, dp))
        return y, dy

    (y, dy), (dx_bar, x_bar), (dp_bar, p_bar) = value_and_accumulated_pullback(
        doubled, (list(x), list(dx)), (list(p), list(dp)), (list(dct), list(ct)), (list(dacc), list(acc)), slots
    )
    return [*x_bar, *p_bar, *y], [*dx_bar, *dp_bar, *dy]


def _accumulate_transpose(*args, **params):
    raise HigherOrderError(REVERSE_OVER_REVERSE)


def summed_in_batches(fun: Callable, batched: Callable, args, slots: tuple, totals):
    """`fun(args)` (PyTrees of arrays in and out), with a rule of its own under `jax.vmap` inside a
    transpose whose cotangents for `slots` the batch sums (a `linear_map`'s, over a batch that shares
    those inputs): `batched(args, axes, size)` computes the whole batch at once, args' leaves with the
    batch axis first where `axes` (args' structure, bools) says, and returns fun's outputs with a
    leading batch axis, but the batch's total where `totals` (a prefix of fun's output, bools: the
    cotangents of `slots`) says; or None where it cannot serve. Otherwise `fun` is vmapped, its
    `totals` summed over the batch (`accumulate_pullback` inside it may sum them as it goes).
    Forward mode enters `fun`."""
    flat, tree = jax.tree.flatten(args)
    out_tree = []

    def flat_fun(*leaves):
        out, structure = jax.tree.flatten(fun(jax.tree.unflatten(tree, leaves)))
        out_tree[:] = [structure]
        return out

    def flat_batched(leaves, axes, size):
        out = batched(jax.tree.unflatten(tree, leaves), jax.tree.unflatten(tree, axes), size)
        if out is None:
            return None
        leaves, structure = jax.tree.flatten(out)
        if structure != out_tree[0]:
            raise TypeError(f"summed_in_batches: batched returned structure {structure}, fun {out_tree[0]}")
        return leaves

    jaxpr, consts = _trace(flat_fun, flat)
    out = jax.tree.unflatten(out_tree[0], [0] * out_tree[0].num_leaves)
    summed = jax.tree.leaves(jax.tree.map(lambda t, x: jax.tree.map(lambda _: t, x), totals, out))
    out = summed_p.bind(
        *consts,
        *flat,
        jaxpr=jaxpr,
        batched=flat_batched,
        num_consts=len(consts),
        slots=tuple(slots),
        totals=tuple(summed),
    )
    return jax.tree.unflatten(out_tree[0], out)


summed_p = core.Primitive("sciad_summed_in_batches")
summed_p.multiple_results = True


def _summed_impl(*args, jaxpr, **_):
    return _run(jaxpr, *args)


def _summed_abstract_eval(*args, jaxpr, **_):
    return jaxpr.out_avals, jaxpr.effects


def _summed_batch(axis_data, args, dims, *, jaxpr, batched, num_consts, slots, totals):
    args = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    axes = [d is not None for d in dims]
    summing = _summing(axis_data, slots)
    if summing and not any(axes[:num_consts]):
        out = batched(args[num_consts:], axes[num_consts:], axis_data.size)
        if out is not None:
            return out, [None if t else 0 for t in totals]
    totals = totals if summing else (False,) * len(totals)

    def row(*a):
        out = _run(jaxpr, *a)
        return [total_p.bind(o, axis_name=axis_data.name) if t else o for o, t in zip(out, totals)]

    out_axes = [None if t else 0 for t in totals]
    in_axes = [0 if b else None for b in axes]  # under the same axis name: `accumulate_pullback` reads it
    out = jax.vmap(row, in_axes=in_axes, out_axes=out_axes, axis_size=axis_data.size, axis_name=axis_data.name)(*args)
    return out, out_axes


def _summed_jvp(primals, tangents, *, jaxpr, **_):
    tangents = [jax_ad.instantiate_zeros(t) if type(t) is jax_ad.Zero else t for t in tangents]
    return jax.jvp(lambda *a: _run(jaxpr, *a), list(primals), tangents)


def _summed_transpose(*args, **params):
    raise HigherOrderError(REVERSE_OVER_REVERSE)


linear_map_p.def_impl(_impl)
linear_map_p.def_effectful_abstract_eval(_abstract_eval)
jax_ad.primitive_jvps[linear_map_p] = _jvp
jax_ad.primitive_transposes[linear_map_p] = _transpose
batching.fancy_primitive_batchers[linear_map_p] = _batch
mlir.register_lowering(linear_map_p, mlir.lower_fun(_impl, multiple_results=True))

accumulate_p.def_impl(_accumulate_impl)
accumulate_p.def_abstract_eval(_accumulate_abstract_eval)
jax_ad.primitive_jvps[accumulate_p] = _accumulate_jvp
jax_ad.primitive_transposes[accumulate_p] = _accumulate_transpose
batching.fancy_primitive_batchers[accumulate_p] = _accumulate_batch
mlir.register_lowering(accumulate_p, mlir.lower_fun(_accumulate_impl, multiple_results=True))

summed_p.def_impl(_summed_impl)
summed_p.def_effectful_abstract_eval(_summed_abstract_eval)
jax_ad.primitive_jvps[summed_p] = _summed_jvp
jax_ad.primitive_transposes[summed_p] = _summed_transpose
batching.fancy_primitive_batchers[summed_p] = _summed_batch
mlir.register_lowering(summed_p, mlir.lower_fun(_summed_impl, multiple_results=True))
