"""Jacobian sparsity from a function's jaxpr, column colouring, and compressed Jacobians.

`jacobian_pattern(fn, x, *args)` traces fn(x, *args) (x a flat array (n,), the output flat
(N,)) to a jaxpr and carries, for every value in it, which entries of x it depends on: a boolean
sparse matrix (size, n). Elementwise operations unite their operands' sets (`select_n` with a known
choice takes the chosen case's, a product with a known zero nothing); data movement (slices,
rolls, reshapes, stacks, concatenations, tiles, pads, gathers and dynamic slices at fixed
indices) is followed exactly by running the primitive on the operands' indices (in NumPy where
it has the primitive: JAX would compile each shape and parameters once); scatters
(`.at[i].set/add/...`) at fixed indices through the gather that reads where they write;
convolutions with a known kernel on the kernel's nonzero taps; cumulative sums on the entries up
to each; reductions and products unite along the contracted axes. Calls (jit, custom rules,
remat) are entered with what is known of their operands' values (an index made outside a jit is
still an index inside), a cond at a known index takes its branch (else every branch's, united),
a scan of at most `_UNROLL` steps is followed step by step. What cannot be followed exactly
depends on everything its operands depend on, or for loops on what any number of iterations
reaches: a superset, named in `Pattern.conservative` with where it is ("sort at model.py:12").
The pattern is structural (no values of x), so it holds for every x; operations with a zero
derivative (comparisons, rounding, stop_gradient, integer results) carry nothing.

`Pattern.colouring()` splits the rows into dense ones (computed by one vector-Jacobian product
each) and the rest, whose columns are coloured so that no two columns of one colour share a row
(one Jacobian-vector product per colour: Curtis, Powell and Reid 1974). A 2-D five-point stencil
with two coupled species needs about ten colours at any grid size.

`PatternCache` remembers patterns by their jaxpr's content (its text and its constants' values):
solvers trace one stage relation dozens of times per program, and printing its jaxpr costs a
fraction of propagating it again (and less than any other content key tried: a walk of the
equations). `jacobian_pattern` uses the one `PATTERNS`; a `Pattern` keeps its colourings.
"""

import collections
import dataclasses
import hashlib
import os
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
from jax.extend import core as jex_core
from jax.extend import source_info_util

# operations whose derivative is zero (their outputs carry no dependence)
_ZERO = {
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "sign",
    "floor",
    "ceil",
    "round",
    "is_finite",
    "stop_gradient",
    "and",
    "or",
    "not",
    "xor",
    "argmax",
    "argmin",
    "iota",
    "shift_left",
    "shift_right_logical",
    "shift_right_arithmetic",
    "population_count",
    "random_bits",
    "random_seed",
    "random_wrap",
    "random_unwrap",
    "reduce_and",
    "reduce_or",
}
# each output entry depends on the same entry of each operand (rank-0 operands: on their one entry)
_ELEMENTWISE = {
    "add",
    "add_any",
    "sub",
    "mul",
    "div",
    "neg",
    "max",
    "min",
    "abs",
    "pow",
    "integer_pow",
    "exp",
    "exp2",
    "log",
    "log1p",
    "expm1",
    "sqrt",
    "rsqrt",
    "cbrt",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "atan2",
    "sinh",
    "cosh",
    "tanh",
    "asinh",
    "acosh",
    "atanh",
    "logistic",
    "erf",
    "erfc",
    "erf_inv",
    "lgamma",
    "digamma",
    "square",
    "convert_element_type",
    "reduce_precision",
    "copy",
    "copy_p",
    "select_n",
    "clamp",
    "rem",
    "nextafter",
    "real",
    "imag",
    "conj",
    "complex",
    "custom_lin",
    "pjit_identity",
    "optimization_barrier",
}
# data movement: followed exactly by running the primitive on indices (index operands must be known)
_MOVES = {
    "reshape",
    "squeeze",
    "expand_dims",
    "broadcast_in_dim",
    "transpose",
    "rev",
    "slice",
    "concatenate",
    "pad",
    "dynamic_slice",
    "dynamic_update_slice",
    "gather",
    "split",
    "stack",
    "unstack",
    "tile",
}
# `.at[i].set/add/...`: followed at known indices (`_Propagation.scattered`)
_SCATTERS = {"scatter", "scatter-add", "scatter-sub", "scatter-mul", "scatter-min", "scatter-max"}
_REDUCE = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod"}
_CUMULATIVE = {"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"}
_UNROLL = 128  # a scan of at most this many steps is followed step by step; loops settle within as many
# calls: the jaxpr parameter to enter
_CALLS = {
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
    "sciad_linear_map": "callee",
}


@dataclasses.dataclass(frozen=True, eq=False)
class Pattern:
    """The structural nonzeros of a Jacobian (N, n) and the operations followed conservatively (a
    superset taken for them: "<primitive> at <file>:<line>", empty when exact); its colourings,
    made once each."""

    matrix: sp.csr_matrix
    conservative: tuple
    _colourings: dict = dataclasses.field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def density(self) -> float:
        return self.matrix.nnz / max(1, self.matrix.shape[0] * self.matrix.shape[1])  # pyright: ignore[reportOptionalSubscript]  # SciPy's stubs

    def colouring(self, dense_row: int | None = None) -> "Colouring":
        """Rows with more than `dense_row` entries (default max(16, 4 √n)) by reverse mode, the columns of
        the rest coloured greedily, largest degree first."""
        n = self.matrix.shape[1]  # pyright: ignore[reportOptionalSubscript]  # SciPy's stubs
        limit = max(16, int(4 * np.sqrt(n))) if dense_row is None else dense_row
        with self._lock:
            if limit not in self._colourings:
                csr = self.matrix.tocsr()
                counts = np.diff(csr.indptr)
                sparse_rows = sp.csr_matrix(csr.multiply((counts <= limit)[:, None]))
                self._colourings[limit] = Colouring(csr, _greedy_colours(sparse_rows), np.flatnonzero(counts > limit))
            return self._colourings[limit]


@dataclasses.dataclass(frozen=True, eq=False)
class Colouring:
    """A Jacobian's entries from `colours.max() + 1` JVPs and `len(dense)` VJPs: `seeds` (c, n) for the
    JVPs, and where each structural entry (row, col) of `matrix` sits in the stacked products
    [JVP results (c, N); VJP results (d, n)] flattened (`source`, (nnz,))."""

    matrix: sp.csr_matrix
    colours: np.ndarray
    dense: np.ndarray

    @property
    def count(self) -> int:
        return int(self.colours.max(initial=-1)) + 1

    @property
    def seeds(self) -> np.ndarray:
        return (np.arange(self.count)[:, None] == self.colours[None, :]).astype(np.float64)

    @property
    def rows_cols(self) -> tuple[np.ndarray, np.ndarray]:
        coo = self.matrix.tocoo()
        return coo.row.astype(np.int64), coo.col.astype(np.int64)

    @property
    def source(self) -> np.ndarray:
        N, n = self.matrix.shape  # pyright: ignore[reportGeneralTypeIssues]  # SciPy's stubs
        rows, cols = self.rows_cols
        position = np.full(N, -1)
        position[self.dense] = np.arange(len(self.dense))
        by_colour = self.colours[cols] * N + rows
        by_row = self.count * N + position[rows] * n + cols
        return np.where(position[rows] >= 0, by_row, by_colour)

    def jacobian_values(self, fn, x):
        """The structural entries (nnz,) of ∂fn/∂x at x (x (n,), fn's output (N,)), in `rows_cols` order."""
        parts = []
        if self.count:
            seeds = jnp.asarray(self.seeds, x.dtype)
            parts.append(jax.vmap(lambda s: jax.jvp(fn, (x,), (s,))[1])(seeds).ravel())
        if len(self.dense):
            _, pullback = jax.vjp(fn, x)
            unit = (
                jnp.zeros((len(self.dense), self.matrix.shape[0]), x.dtype)  # pyright: ignore[reportOptionalSubscript]  # SciPy's stubs
                .at[np.arange(len(self.dense)), self.dense]
                .set(1)
            )
            parts.append(jax.vmap(lambda w: pullback(w)[0])(unit).ravel())
        return jnp.concatenate(parts)[self.source]


def _greedy_colours(pattern: sp.csr_matrix) -> np.ndarray:
    """Colours (n,) of the columns of `pattern`, no two columns that share a row alike (greedy, in
    order of decreasing degree in the column intersection graph); columns no row depends on: -1."""
    n = pattern.shape[1]  # pyright: ignore[reportOptionalSubscript]  # SciPy's stubs
    p = sp.csc_matrix(pattern, dtype=np.int32)
    conflicts = (p.T @ p).tocsr()
    indptr, indices = conflicts.indptr.tolist(), conflicts.indices.tolist()
    colours = [-1] * n
    for col in np.argsort(-np.diff(conflicts.indptr), kind="stable").tolist():
        taken = {colours[nb] for nb in indices[indptr[col] : indptr[col + 1]]}
        colour = 0
        while colour in taken:
            colour += 1
        colours[col] = colour
    colours = np.asarray(colours)
    colours[np.diff(p.indptr) == 0] = -1
    return colours


class PatternCache:
    """Patterns found before, by their jaxpr's content (its text, its constants' values: never fn
    nor what it captures); the `size` latest used kept. Safe to share between threads."""

    def __init__(self, size: int = 64):
        self.size = size
        self._patterns = collections.OrderedDict()
        self._lock = threading.Lock()

    def pattern(self, fn, x, *args) -> Pattern:
        """`jacobian_pattern(fn, x, *args)`, found again for a jaxpr seen before."""
        closed = jax.make_jaxpr(fn)(x, *args)
        return self._remembered(
            (str(closed.jaxpr), *map(_const_key, closed.consts)), lambda: _propagated(closed, x.size)
        )

    def given(self, given: "GivenPattern") -> Pattern:
        """A user's pattern as a `Pattern`: the same one (and its colourings) for equal ones."""
        return self._remembered(("given", *given.key), lambda: Pattern(given.matrix, ()))

    def _remembered(self, key, make) -> Pattern:
        with self._lock:
            if key in self._patterns:
                self._patterns.move_to_end(key)
                return self._patterns[key]
        pattern = make()  # unlocked: other threads' patterns are found meanwhile
        with self._lock:
            pattern = self._patterns.setdefault(key, pattern)  # another thread's, if it came first
            if len(self._patterns) > self.size:
                self._patterns.popitem(last=False)
        return pattern


PATTERNS = PatternCache()  # the patterns `jacobian_pattern` found


def jacobian_pattern(fn, x, *args) -> Pattern:
    """The sparsity of ∂fn(x, *args)/∂x for flat x (n,) and a flat output (N,) (see the module),
    found again in `PATTERNS` for a jaxpr seen before."""
    return PATTERNS.pattern(fn, x, *args)


def _propagated(closed, n) -> Pattern:
    deps = _Propagation(n)
    inputs = [sp.identity(n, dtype=bool, format="csr")] + [None] * (len(closed.jaxpr.invars) - 1)  # pyright: ignore[reportArgumentType]  # SciPy's stubs
    (out,), _ = deps.run(closed.jaxpr, closed.consts, inputs)
    matrix = sp.csr_matrix((np.prod(closed.out_avals[0].shape, dtype=int), n), dtype=bool) if out is None else out
    return Pattern(sp.csr_matrix(matrix, dtype=bool), tuple(sorted(deps.conservative)))


class GivenPattern:
    """A user's sparsity pattern of ∂f/∂u (n, n), for every stage relation of f's size: I ∪ P ∪ Pᵀ
    (the forward stages have I − hγ J's pattern, a λ adjoint's I − hγ Jᵀ's). Equal (and hashing
    equal) for equal patterns: a static part of a JAX program."""

    def __init__(self, pattern):
        matrix = sp.csr_matrix(pattern, dtype=bool)
        if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:  # pyright: ignore[reportOptionalSubscript]  # SciPy's stubs
            raise ValueError(
                f"pattern: ∂f/∂u's sparsity must be square (n, n) over the flattened state, got shape {matrix.shape}"
            )
        n = matrix.shape[0]  # pyright: ignore[reportOptionalSubscript]  # SciPy's stubs
        symmetric = matrix + matrix.T + sp.identity(n, dtype=bool, format="csr")  # pyright: ignore[reportArgumentType]  # SciPy's stubs
        self.matrix = sp.csr_matrix(symmetric, dtype=bool).sorted_indices()
        self.key = _structure_key(self.matrix)

    def __eq__(self, other):
        return isinstance(other, GivenPattern) and self.key == other.key

    def __hash__(self):
        return hash(self.key)


class _Propagation:
    """Dependence sets through a jaxpr: each value maps to a boolean matrix (size, n) or None (no
    dependence); known constant values are kept where an index operand (or a structural zero)
    needs them, into calls and loop bodies too."""

    def __init__(self, n):
        self.n = n
        self.conservative = set()
        self.calls = []  # the equation being followed and the calls around it, outermost first

    def where(self, eqn) -> str:
        """Where `eqn` was traced in the user's code, else where the innermost call around it was
        (jnp's own jitted functions keep no user frame)."""
        for e in [eqn, *reversed(self.calls[:-1])]:
            found = _where(e)
            if found:
                return found
        return "an unknown line"

    def run(self, jaxpr, consts, inputs, known=None):
        """The dependence of `jaxpr`'s outputs on x (and their values where known: `known` gives the
        inputs' known values, None where unknown), as two lists."""
        deps, values = {}, {}
        for var, c in zip(jaxpr.constvars, consts):
            deps[var], values[var] = None, _concrete(c)
        for var, d, c in zip(jaxpr.invars, inputs, known or [None] * len(inputs)):
            deps[var], values[var] = d, c

        def read(v):
            if isinstance(v, jex_core.Literal):
                return None, np.asarray(v.val)
            return deps.get(v), values.get(v)

        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            self.calls.append(eqn)
            try:
                outs, out_values = self.equation(eqn, [d for d, _ in ins], [c for _, c in ins])
            finally:
                self.calls.pop()
            for var, d, c in zip(eqn.outvars, outs, out_values):
                # integers and booleans carry no derivative: an index computed from x is an unknown index
                deps[var] = d if jnp.issubdtype(var.aval.dtype, jnp.inexact) else None
                if c is not None:
                    values[var] = c
            if all(d is None for d, _ in ins) and all(c is not None for _, c in ins):
                for var, r in zip(eqn.outvars, _evaluated(eqn, [c for _, c in ins])):
                    values[var] = r  # a constant sub-expression: its value may be an index later
        found = [read(v) for v in jaxpr.outvars]
        return [d for d, _ in found], [c for _, c in found]

    def equation(self, eqn, deps, values):
        """(the outputs' dependence, their values where a call or loop body found them)."""
        name = eqn.primitive.name
        outs = eqn.outvars
        unknown = [None] * len(outs)
        if name in _ZERO:
            return unknown, unknown
        if all(d is None for d in deps):
            # entered all the same unless every operand is known (`run` evaluates those): what it computes
            # from known values alone is known (an index or kernel f's forward part hands its reverse part)
            if name not in _CALLS and name not in ("cond", "scan") or all(c is not None for c in values):
                return unknown, unknown
        if name in _CALLS:
            sub = eqn.params[_CALLS[name]]
            jaxpr, consts = (sub.jaxpr, sub.consts) if hasattr(sub, "consts") else (sub, ())
            k = len(jaxpr.invars)
            return self.run(jaxpr, consts, deps[:k], values[:k])
        if name == "cond":
            return self.branched(eqn, deps, values)
        if name == "scan":
            return self.scanned(eqn, deps, values)
        if name == "while":
            return self.looped(eqn, deps, values), unknown
        if name in _ELEMENTWISE:
            return [self.elementwise(eqn, deps, values)], unknown
        moved = None
        if name in _MOVES:
            moved = self.moved(eqn, deps, values)
        elif name in _SCATTERS:
            moved = self.scattered(eqn, deps, values)
        elif name == "conv_general_dilated":
            moved = self.convolved(eqn, deps, values)
        elif name in _REDUCE:
            moved = [self.reduced(eqn, deps[0])]
        elif name in _CUMULATIVE:
            moved = [self.accumulated(eqn, deps[0])]
        elif name == "dot_general":
            moved = [self.contracted(eqn, deps, values)]
        if moved is not None:
            return moved, unknown
        return self.dense(eqn, deps), unknown

    def dense(self, eqn, deps):
        """Every output entry depends on everything the operands depend on (a superset, named with
        where the operation is)."""
        self.conservative.add(f"{eqn.primitive.name} at {self.where(eqn)}")
        everything = _union([None if d is None else _rows_union(d) for d in deps])
        return [None if everything is None else _repeat(everything, _size(out)) for out in eqn.outvars]

    def elementwise(self, eqn, deps, values):
        """Each output entry depends on the same entry of each operand (broadcast: size-1 axes, rank 0);
        `select_n` with a known choice on the chosen case's entry alone, `mul` by a known zero on
        nothing."""
        shape = eqn.outvars[0].aval.shape
        name = eqn.primitive.name
        spread = [None if d is None else _broadcast(d, var.aval.shape, shape) for d, var in zip(deps, eqn.invars)]
        if name == "select_n":
            which = values[0]
            if which is None:  # any case may be chosen
                return _union(spread[1:])
            which = np.broadcast_to(np.asarray(which).astype(np.int64), shape).ravel()
            return _union([None if d is None else _masked(d, which == k) for k, d in enumerate(spread[1:])])
        total = _union(spread)
        if name == "mul" and total is not None:
            for d, c in zip(deps, values):
                if d is None and c is not None:
                    total = _masked(total, np.broadcast_to(np.asarray(c) != 0, shape).ravel())
        return total

    def branched(self, eqn, deps, values):
        """cond: the chosen branch where the index is known, else every branch's dependence united
        (each can be taken: the structural pattern)."""
        branches = eqn.params["branches"]
        if values[0] is not None:  # lax.cond clamps the index
            branches = [branches[int(np.clip(np.asarray(values[0]), 0, len(branches) - 1))]]
        found = [self.run(b.jaxpr, b.consts, deps[1:], values[1:]) for b in branches]
        outs = [_union([d[i] for d, _ in found]) for i in range(len(eqn.outvars))]
        return outs, (found[0][1] if len(found) == 1 else [None] * len(outs))

    def scanned(self, eqn, deps, values):
        """scan: its steps followed one by one up to `_UNROLL` steps (the carry's known values too: a
        loop counter stays an index), a longer one by `fixpoint` (its inputs xs and outputs ys united
        over the steps), named."""
        p = eqn.params
        body, length, n_consts, n_carry = p["jaxpr"], p["length"], p["num_consts"], p["num_carry"]
        consts, carry, xs = deps[:n_consts], deps[n_consts : n_consts + n_carry], deps[n_consts + n_carry :]
        const_values, carry_values = values[:n_consts], values[n_consts : n_consts + n_carry]
        xs_values = values[n_consts + n_carry :]
        per_x = [_size(v) // max(length, 1) for v in eqn.invars[n_consts + n_carry :]]
        per_y = [_size(v) // max(length, 1) for v in eqn.outvars[n_carry:]]
        if length > _UNROLL:
            united = [None if d is None else _united_steps(d, length) for d in xs]
            found = self.fixpoint(eqn, body, consts, carry, united, const_values)
            if found is None:
                return self.dense(eqn, deps), [None] * len(eqn.outvars)
            carry, ys = found
            if any(d is not None for d in xs):  # each step's inputs taken as every step's
                self.conservative.add(f"scan at {self.where(eqn)} (united over its iterations)")
            ys = [None if y is None else sp.csr_matrix(sp.vstack([y] * length), dtype=bool) for y in ys]
            return carry + ys, [None] * len(eqn.outvars)
        steps = [[None] * length for _ in per_y]
        step_values = [[None] * length for _ in per_y]
        for step in range(length):
            k = length - 1 - step if p["reverse"] else step
            x_k = [None if d is None else d[k * s : (k + 1) * s] for d, s in zip(xs, per_x)]
            x_values = [None if c is None else np.asarray(c)[k] for c in xs_values]
            out, out_values = self.run(
                body.jaxpr, body.consts, [*consts, *carry, *x_k], [*const_values, *carry_values, *x_values]
            )
            carry, carry_values = out[:n_carry], out_values[:n_carry]
            for j in range(len(per_y)):
                steps[j][k], step_values[j][k] = out[n_carry + j], out_values[n_carry + j]
        ys = [
            None
            if all(r is None for r in rows)
            else sp.csr_matrix(
                sp.vstack([sp.csr_matrix((s, self.n), dtype=bool) if r is None else r for r in rows]), dtype=bool
            )
            for rows, s in zip(steps, per_y)
        ]
        # outputs known at every step (a counter stacked for the reverse pass) are known
        ys_values = [np.stack(v) if length and all(c is not None for c in v) else None for v in step_values]
        return carry + ys, [*carry_values, *ys_values]

    def looped(self, eqn, deps, values):
        """while: the carry's dependence united over any number of iterations (the trip count is not
        known here: a superset of a fixed count's), named."""
        p = eqn.params
        start, count = p["cond_nconsts"], p["body_nconsts"]
        found = self.fixpoint(
            eqn, p["body_jaxpr"], deps[start : start + count], deps[start + count :], [], values[start : start + count]
        )
        return self.dense(eqn, deps) if found is None else found[0]

    def fixpoint(self, eqn, body, consts, carry, xs, const_values):
        """(the carry's dependence after any number of steps of `body`, its other outputs' united over
        the steps), iterated until nothing grows, at most `_UNROLL` times (None: not settled); named
        unless one step already gives back what it was given (then every count of steps does)."""
        carry, ys, steady = list(carry), None, None
        unknown = [None] * (len(carry) + len(xs))
        for _ in range(_UNROLL):
            out, _ = self.run(body.jaxpr, body.consts, [*consts, *carry, *xs], [*const_values, *unknown])
            steady = all(_same(c, d) for c, d in zip(carry, out)) if steady is None else steady
            grown = [_union([c, d]) for c, d in zip(carry, out)]
            ys = out[len(carry) :] if ys is None else [_union([a, b]) for a, b in zip(ys, out[len(carry) :])]
            if all(_nnz(g) == _nnz(c) for g, c in zip(grown, carry)):
                if not steady:
                    self.conservative.add(f"{eqn.primitive.name} at {self.where(eqn)} (united over its iterations)")
                return carry, ys
            carry = grown
        return None

    def moved(self, eqn, deps, values):
        """Data movement followed on indices (a list, one per output, or None where it cannot be):
        operands that carry dependence are replaced by their entries' positions (1-based, 0 for none)
        in the stacked matrices; the rest need known values."""
        stacked, offset, operands = [], 0, []
        for var, d, c in zip(eqn.invars, deps, values):
            is_data = jnp.issubdtype(var.aval.dtype, jnp.inexact)
            if is_data:
                size = _size(var)
                stacked.append(sp.csr_matrix((size, self.n), dtype=bool) if d is None else d)
                operands.append((np.arange(size, dtype=np.int32) + offset + 1).reshape(var.aval.shape))
                offset += size
            elif c is None:
                return None
            else:
                operands.append(np.asarray(c))
        results = _numpy_moved(eqn.primitive.name, operands, eqn.params)
        if results is None:  # by JAX itself: one XLA compilation per shape and parameters
            params = dict(eqn.params)
            if eqn.primitive.name == "gather":
                params["fill_value"] = 0
            try:
                with jax.ensure_compile_time_eval():
                    results = eqn.primitive.bind(*operands, **params)
            except Exception:  # noqa: BLE001  (an index form the trick does not cover: conservative)
                return None
        source = sp.vstack(stacked, format="csr")
        moved = []
        for positions in results if eqn.primitive.multiple_results else [results]:
            positions = np.asarray(positions).ravel()
            picked = source[np.maximum(positions - 1, 0)]  # pyright: ignore[reportIndexIssue]  # SciPy's stubs
            moved.append(sp.csr_matrix(picked.multiply((positions > 0)[:, None]), dtype=bool))
        return moved

    def scattered(self, eqn, deps, values):
        """scatter (`.at[i].set/add/mul/min/max`) at known indices: each update entry goes where a
        gather with the same indices would read it (the transpose's gather, as in JAX's own rule);
        `scatter` keeps the operand's entries it does not overwrite, the others all of them. None
        where the indices are not known."""
        operand, _, updates = eqn.invars
        indices = values[1]
        if indices is None:
            return None
        dn = eqn.params["dimension_numbers"]
        gathered = jax.lax.GatherDimensionNumbers(
            offset_dims=dn.update_window_dims,
            collapsed_slice_dims=dn.inserted_window_dims,
            start_index_map=dn.scatter_dims_to_operand_dims,
            operand_batching_dims=dn.operand_batching_dims,
            start_indices_batching_dims=dn.scatter_indices_batching_dims,
        )
        window = iter(dn.update_window_dims)
        slice_sizes = [
            1 if a in dn.inserted_window_dims or a in dn.operand_batching_dims else updates.aval.shape[next(window)]
            for a in range(operand.aval.ndim)
        ]
        size = _size(operand)
        positions = np.arange(1, size + 1, dtype=np.int32).reshape(operand.aval.shape)
        try:
            with jax.ensure_compile_time_eval():
                target = jax.lax.gather(
                    positions, np.asarray(indices), gathered, tuple(slice_sizes), mode=eqn.params["mode"], fill_value=0
                )
        except Exception:  # noqa: BLE001  (an index form not covered: conservative)
            return None
        target = np.asarray(target).ravel()
        if target.size != _size(updates):
            return None
        hit = np.flatnonzero(target > 0)
        parts = []
        if deps[2] is not None:
            goes = sp.csr_matrix((np.ones(hit.size, bool), (target[hit] - 1, hit)), shape=(size, target.size))
            parts.append(sp.csr_matrix(goes @ deps[2], dtype=bool))
        if deps[0] is not None:
            kept = np.ones(size, bool)
            if eqn.primitive.name == "scatter":
                kept[target[hit] - 1] = False
            parts.append(_masked(deps[0], kept))
        return [_union(parts)]

    def convolved(self, eqn, deps, values):
        """conv_general_dilated: an output entry depends on the input entries under its window where
        the kernel is not structurally zero (kernel unknown: everywhere), and on the kernel's taps
        over input entries inside the input (padding carries nothing). None for batch groups."""
        p = eqn.params
        if p["batch_group_count"] != 1:
            return None
        lhs, rhs = eqn.invars
        out = eqn.outvars[0]
        dn = p["dimension_numbers"]
        lhs_pos = np.arange(_size(lhs)).reshape(lhs.aval.shape).transpose(dn.lhs_spec)  # (N, C, *S)
        rhs_pos = np.arange(_size(rhs)).reshape(rhs.aval.shape).transpose(dn.rhs_spec)  # (O, I, *K)
        out_pos = np.arange(_size(out)).reshape(out.aval.shape).transpose(dn.out_spec)  # (N, O, *Y)
        nonzero = [None if c is None else (np.asarray(c) != 0) for c in values]
        lhs_nz = np.ones(lhs_pos.shape, bool) if nonzero[0] is None else nonzero[0].transpose(dn.lhs_spec)
        rhs_nz = np.ones(rhs_pos.shape, bool) if nonzero[1] is None else nonzero[1].transpose(dn.rhs_spec)
        batch, out_ch, *spatial_out = out_pos.shape
        in_per_group = rhs_pos.shape[1]
        groups = p["feature_group_count"]
        out_per_group = out_ch // groups
        spatial_in, kernel = lhs_pos.shape[2:], rhs_pos.shape[2:]
        strides, pads = p["window_strides"], p["padding"]
        lhs_dil = p["lhs_dilation"] or (1,) * len(kernel)
        rhs_dil = p["rhs_dilation"] or (1,) * len(kernel)
        # (N, O, I, *Y) index grids: the batch, output channel, input channel (in its group)
        full = (batch, out_ch, in_per_group, *spatial_out)
        nb, no, ni = (np.arange(s).reshape((-1,) + (1,) * (len(full) - 1 - a)) for a, s in enumerate(full[:3]))
        channel = (no // out_per_group) * in_per_group + ni  # the input channel of (o, i)
        grid = np.indices(spatial_out)
        rows_l, cols_l, rows_r, cols_r = [], [], [], []
        for tap in np.ndindex(*kernel):
            coords, inside = [], np.ones(spatial_out, bool)
            for d, k in enumerate(tap):  # the input coordinate under output y at this tap
                c = grid[d] * strides[d] + k * rhs_dil[d] - pads[d][0]
                inside &= (c >= 0) & (c % lhs_dil[d] == 0) & (c // lhs_dil[d] < spatial_in[d])
                coords.append(np.clip(c // lhs_dil[d], 0, spatial_in[d] - 1))
            outs = np.broadcast_to(out_pos[(nb, no, *grid)], full)
            live = np.broadcast_to(inside, full)
            take_l = live & rhs_nz[(no, ni, *tap)]
            rows_l.append(outs[take_l])
            cols_l.append(np.broadcast_to(lhs_pos[(nb, channel, *coords)], full)[take_l])
            take_r = live & lhs_nz[(nb, channel, *coords)]
            rows_r.append(outs[take_r])
            cols_r.append(np.broadcast_to(rhs_pos[(no, ni, *tap)], full)[take_r])
        parts = []
        for d, rows, cols, width in ((deps[0], rows_l, cols_l, _size(lhs)), (deps[1], rows_r, cols_r, _size(rhs))):
            if d is not None:
                rows, cols = np.concatenate(rows), np.concatenate(cols)
                m = sp.csr_matrix((np.ones(rows.size, bool), (rows, cols)), shape=(_size(out), width))
                parts.append(sp.csr_matrix(m @ d, dtype=bool))
        return [_union(parts)]

    def accumulated(self, eqn, d):
        """cumsum and its kin along `axis`: each entry depends on the entries before it (after it,
        reversed) and itself: lower-triangular, exact for cumsum."""
        shape = eqn.invars[0].aval.shape
        axis = eqn.params["axis"]
        length = shape[axis]
        before, after = int(np.prod(shape[:axis], dtype=int)), int(np.prod(shape[axis + 1 :], dtype=int))
        out_at, in_at = np.tril_indices(length)
        if eqn.params.get("reverse", False):
            out_at, in_at = in_at, out_at
        a = np.arange(before)[:, None, None]
        b = np.arange(after)[None, None, :]
        rows = ((a * length + out_at[None, :, None]) * after + b).ravel()
        cols = ((a * length + in_at[None, :, None]) * after + b).ravel()
        m = sp.csr_matrix((np.ones(rows.size, bool), (rows, cols)), shape=(_size(eqn.invars[0]),) * 2)
        return sp.csr_matrix(m @ d, dtype=bool)

    def reduced(self, eqn, d):
        """Each output entry depends on every input entry with its kept coordinates."""
        shape = eqn.invars[0].aval.shape
        axes = eqn.params["axes"]
        coords = np.indices(shape).reshape(len(shape), -1)
        kept = [a for a in range(len(shape)) if a not in axes]
        out_shape = tuple(shape[a] for a in kept)
        groups = np.ravel_multi_index(coords[kept], out_shape) if kept else np.zeros(coords.shape[1], int)
        g = sp.csr_matrix(
            (np.ones(groups.size, bool), (groups, np.arange(groups.size))), shape=(int(np.prod(out_shape)), groups.size)
        )
        return sp.csr_matrix(g @ d, dtype=bool)

    def contracted(self, eqn, deps, values):
        """dot_general: an output entry depends on the contracted entries of each operand where the
        other operand is not structurally zero (unknown values: everywhere)."""
        (contract_l, contract_r), (batch_l, batch_r) = eqn.params["dimension_numbers"]
        lhs, rhs = eqn.invars
        order_l = [*batch_l, *[a for a in range(lhs.aval.ndim) if a not in (*batch_l, *contract_l)], *contract_l]
        order_r = [*batch_r, *contract_r, *[a for a in range(rhs.aval.ndim) if a not in (*batch_r, *contract_r)]]
        B = int(np.prod([lhs.aval.shape[a] for a in batch_l]))
        K = int(np.prod([lhs.aval.shape[a] for a in contract_l]))
        I, J = _size(lhs) // (B * K), _size(rhs) // (B * K)
        perm_l = np.arange(_size(lhs)).reshape(lhs.aval.shape).transpose(order_l).ravel()
        perm_r = np.arange(_size(rhs)).reshape(rhs.aval.shape).transpose(order_r).ravel()
        nonzero = [None if c is None else (np.asarray(c) != 0) for c in values]
        left = np.ones((B, I, K), bool) if nonzero[0] is None else nonzero[0].transpose(order_l).reshape(B, I, K)
        right = np.ones((B, K, J), bool) if nonzero[1] is None else nonzero[1].transpose(order_r).reshape(B, K, J)
        parts = []
        if deps[0] is not None:  # (b, i, j) <- (b, i, k) where right[b, k, j]
            m = sp.block_diag([sp.kron(sp.identity(I, dtype=bool), sp.csr_matrix(right[b].T)) for b in range(B)])  # pyright: ignore[reportArgumentType]  # SciPy's stubs
            parts.append(sp.csr_matrix(m, dtype=bool) @ deps[0][perm_l])
        if deps[1] is not None:  # (b, i, j) <- (b, k, j) where left[b, i, k]
            m = sp.block_diag([sp.kron(sp.csr_matrix(left[b]), sp.identity(J, dtype=bool)) for b in range(B)])  # pyright: ignore[reportArgumentType]  # SciPy's stubs
            parts.append(sp.csr_matrix(m, dtype=bool) @ deps[1][perm_r])
        return _union(parts)


def _pad(x, fill, config):
    """lax.pad in NumPy: per axis, `interior` fills between entries, then `low`/`high` at the ends
    (negative: cropped)."""
    for axis, (low, high, interior) in enumerate(config):
        low, high, interior = int(low), int(high), int(interior)
        if interior and x.shape[axis] > 1:
            dilated = np.full(
                (*x.shape[:axis], x.shape[axis] + (x.shape[axis] - 1) * interior, *x.shape[axis + 1 :]), fill, x.dtype
            )
            dilated[(slice(None),) * axis + (slice(None, None, interior + 1),)] = x
            x = dilated
        widths = [(0, 0)] * x.ndim
        widths[axis] = (max(low, 0), max(high, 0))
        x = np.pad(x, widths, constant_values=fill)
        x = x[(slice(None),) * axis + (slice(max(-low, 0), x.shape[axis] - max(-high, 0)),)]
    return x


def _clamped(starts, shape, sizes):
    """dynamic_slice's starts as XLA takes them: clamped so that the window fits."""
    return tuple(
        slice(s, s + k) for s, k in ((int(np.clip(int(s), 0, n - k)), k) for s, n, k in zip(starts, shape, sizes))
    )


def _updated(x, update, *starts):
    x = x.copy()
    x[_clamped(starts, x.shape, update.shape)] = update
    return x


# data movement in NumPy, on integer positions (what `_Propagation.moved` runs; the rest by JAX)
_NUMPY_MOVES = {
    "reshape": lambda x, new_sizes, dimensions, **_: np.reshape(
        x if dimensions is None else np.transpose(x, dimensions), new_sizes
    ),
    "broadcast_in_dim": lambda x, shape, broadcast_dimensions, **_: np.broadcast_to(
        np.reshape(
            x, [x.shape[broadcast_dimensions.index(a)] if a in broadcast_dimensions else 1 for a in range(len(shape))]
        ),
        shape,
    ),
    "squeeze": lambda x, dimensions: np.reshape(x, [n for a, n in enumerate(x.shape) if a not in dimensions]),
    "transpose": lambda x, permutation: np.transpose(x, permutation),
    "rev": lambda x, dimensions: np.flip(x, tuple(dimensions)) if dimensions else x,
    "slice": lambda x, start_indices, limit_indices, strides: x[
        tuple(slice(s, e, k) for s, e, k in zip(start_indices, limit_indices, strides or (1,) * x.ndim))
    ],
    "concatenate": lambda *xs, dimension: np.concatenate(xs, axis=dimension),
    "stack": lambda *xs, axis: np.stack(xs, axis=axis),
    "unstack": lambda x, axis: [np.take(x, i, axis=axis) for i in range(x.shape[axis])],
    "split": lambda x, sizes, axis: np.split(x, np.cumsum(sizes)[:-1].astype(int), axis=axis),
    "tile": lambda x, reps: np.tile(x, reps),
    "pad": lambda x, fill, padding_config: _pad(x, fill, padding_config),
    "dynamic_slice": lambda x, *starts, slice_sizes: x[_clamped(starts, x.shape, slice_sizes)],
    "dynamic_update_slice": lambda x, update, *starts: _updated(x, update, *starts),
}


# constant sub-expressions (index arithmetic, masks) in NumPy where it agrees with lax
_NUMPY_ELEMENTWISE = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "neg": np.negative,
    "max": np.maximum,
    "min": np.minimum,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "not": np.invert,
    "select_n": lambda which, *cases: np.choose(np.asarray(which, int), cases),
    "convert_element_type": lambda x, new_dtype, **_: np.asarray(x).astype(new_dtype),
}


def _evaluated(eqn, operands) -> list:
    """The values of a constant equation's outputs (None where it cannot be run): NumPy for
    elementwise arithmetic and data movement, else JAX (one XLA compilation per shape and
    parameters)."""
    name = eqn.primitive.name
    if name in _NUMPY_ELEMENTWISE and len(eqn.outvars) == 1:
        try:
            with np.errstate(all="ignore"):
                result = np.asarray(_NUMPY_ELEMENTWISE[name](*operands, **eqn.params))
            if result.shape == eqn.outvars[0].aval.shape:
                return [result.astype(eqn.outvars[0].aval.dtype)]
        except Exception:  # noqa: BLE001  (JAX's own below)
            pass
    results = _numpy_moved(name, operands, eqn.params)
    if results is None:
        try:
            with jax.ensure_compile_time_eval():
                results = eqn.primitive.bind(*operands, **eqn.params)
        except Exception:  # noqa: BLE001  (only an optimisation: the value stays unknown)
            return [None] * len(eqn.outvars)
    return [_concrete(r) for r in (results if eqn.primitive.multiple_results else [results])]


def _numpy_moved(name, operands, params):
    """The primitive `name` run in NumPy on `operands` (a list for several results), None where
    there is no NumPy version or it does not apply (then JAX runs it)."""
    if name not in _NUMPY_MOVES:
        return None
    try:
        return _NUMPY_MOVES[name](*operands, **params)
    except Exception:  # noqa: BLE001  (parameters this version does not know: JAX's own)
        return None


def _structure_key(matrix) -> tuple:
    """(shape, indptr bytes, indices bytes) of a sparse matrix's structure, indices sorted: equal
    for equal patterns."""
    csr = sp.csr_matrix(matrix).sorted_indices()
    return csr.shape, csr.indptr.tobytes(), csr.indices.tobytes()


def _const_key(value):
    """A jaxpr constant's part in a pattern's key: its bytes where known (an index, a zero
    structure), its type where traced (taken as unknown)."""
    concrete = _concrete(value)
    if concrete is None:
        return str(jax.typeof(value))
    return concrete.dtype.str, concrete.shape, hashlib.blake2b(concrete.tobytes(), digest_size=16).digest()


def _concrete(value):
    try:
        return np.asarray(value)
    except Exception:  # noqa: BLE001  (a tracer: not known here)
        return None


def _size(var) -> int:
    return int(np.prod(var.aval.shape, dtype=int))


def _broadcast(d, shape, out_shape):
    """The rows of `d` (an operand of `shape`) for each entry of its broadcast to `out_shape`."""
    if tuple(shape) == tuple(out_shape):
        return d
    rows = np.broadcast_to(np.arange(d.shape[0]).reshape(shape), out_shape).ravel()
    return sp.csr_matrix(d[rows], dtype=bool)


def _masked(d, keep):
    """The rows of `d` where `keep` (a boolean vector, one per row) holds; the others empty."""
    return sp.csr_matrix(d.multiply(np.asarray(keep, bool)[:, None]), dtype=bool)


def _united_steps(d, length):
    """The rows of `d` ((length · s, n): `length` steps of s entries) united over the steps: (s, n)."""
    per = d.shape[0] // length
    steps = np.arange(length * per)
    g = sp.csr_matrix((np.ones(steps.size, bool), (steps % per, steps)), shape=(per, steps.size))
    return sp.csr_matrix(g @ d, dtype=bool)


def _nnz(d) -> int:
    return 0 if d is None else d.nnz


def _same(a, b) -> bool:
    """Whether two dependence sets (matrices or None) are equal."""
    if a is None or b is None:
        return _nnz(a) == _nnz(b) == 0
    return (a != b).nnz == 0


def _where(eqn) -> str:
    """Where in the user's code an equation was traced: "file.py:line" (JAX's frames skipped; ""
    when there is none, as inside jnp's own jitted functions)."""
    try:
        summary = source_info_util.summarize(eqn.source_info)
    except Exception:  # noqa: BLE001  (no traceback kept)
        return ""
    if summary in ("", "unknown"):
        return ""
    found = re.match(r"(.*?):(\d+)(?::\d+)? \(.*\)$", summary)
    return f"{os.path.basename(found[1])}:{found[2]}" if found else summary


def _repeat(d, size):
    return sp.csr_matrix(d[np.zeros(size, dtype=int)], dtype=bool)


def _rows_union(d):
    return sp.csr_matrix(d.sum(axis=0) > 0, dtype=bool)


def _union(parts):
    """The entrywise or of the matrices in `parts` (None: no dependence), or None if all are None."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    total = parts[0].astype(bool)
    for p in parts[1:]:
        total = total + p.astype(bool)
    return sp.csr_matrix(total, dtype=bool)
