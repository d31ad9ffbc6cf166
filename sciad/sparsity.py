"""Jacobian sparsity from a function's jaxpr, column colouring, and compressed Jacobians.

`jacobian_pattern(fn, x, *args)` traces fn(x, *args) (x a flat array (n,), the output flat
(N,)) to a jaxpr and carries, for every value in it, which entries of x it depends on: a boolean
sparse matrix (size, n). Elementwise operations unite their operands' sets; data movement
(slices, rolls, reshapes, pads, gathers at fixed indices) is followed exactly by running the
primitive on the operands' indices; reductions and products unite along the contracted axes;
calls (jit, custom rules, remat, cond) are entered. Anything else depends on everything its
operands depend on: a superset, reported in `Pattern.conservative`. The pattern is structural
(no values), so it holds for every x; operations with a zero derivative (comparisons, rounding,
stop_gradient) carry nothing.

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
import threading

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
from jax.extend import core as jex_core

# operations whose derivative is zero (their outputs carry no dependence)
_ZERO = {"eq", "ne", "lt", "le", "gt", "ge", "sign", "floor", "ceil", "round", "is_finite", "stop_gradient",
         "and", "or", "not", "xor", "argmax", "argmin", "iota", "shift_left", "shift_right_logical",
         "shift_right_arithmetic", "population_count", "random_bits", "random_seed", "random_wrap",
         "random_unwrap", "reduce_and", "reduce_or"}
# each output entry depends on the same entry of each operand (rank-0 operands: on their one entry)
_ELEMENTWISE = {"add", "add_any", "sub", "mul", "div", "neg", "max", "min", "abs", "pow", "integer_pow", "exp",
                "exp2", "log", "log1p", "expm1", "sqrt", "rsqrt", "cbrt", "sin", "cos", "tan", "asin", "acos",
                "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "logistic", "erf", "erfc",
                "erf_inv", "lgamma", "digamma", "square", "convert_element_type", "reduce_precision", "copy",
                "copy_p", "select_n", "clamp", "rem", "nextafter", "real", "imag", "conj", "complex", "custom_lin",
                "pjit_identity", "optimization_barrier"}
# data movement: followed exactly by running the primitive on indices
_MOVES = {"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "transpose", "rev", "slice", "concatenate", "pad",
          "dynamic_slice", "dynamic_update_slice", "gather", "split"}
_REDUCE = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod"}
_CUMULATIVE = {"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"}
# calls: the jaxpr parameter to enter
_CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
          "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
          "remat": "jaxpr", "checkpoint": "jaxpr", "sciad_linear_map": "callee"}


@dataclasses.dataclass(frozen=True, eq=False)
class Pattern:
    """The structural nonzeros of a Jacobian (N, n) and the operations followed conservatively; its
    colourings, made once each."""

    matrix: sp.csr_matrix
    conservative: tuple
    _colourings: dict = dataclasses.field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def density(self) -> float:
        return self.matrix.nnz / max(1, self.matrix.shape[0] * self.matrix.shape[1])

    def colouring(self, dense_row: int | None = None) -> "Colouring":
        """Rows with more than `dense_row` entries (default max(16, 4 √n)) by reverse mode, the columns of
        the rest coloured greedily, largest degree first."""
        n = self.matrix.shape[1]
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
        N, n = self.matrix.shape
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
            unit = jnp.zeros((len(self.dense), self.matrix.shape[0]), x.dtype).at[
                np.arange(len(self.dense)), self.dense].set(1)
            parts.append(jax.vmap(lambda w: pullback(w)[0])(unit).ravel())
        return jnp.concatenate(parts)[self.source]


def _greedy_colours(pattern: sp.csr_matrix) -> np.ndarray:
    """Colours (n,) of the columns of `pattern`, no two columns that share a row alike (greedy, in
    order of decreasing degree in the column intersection graph); columns no row depends on: -1."""
    n = pattern.shape[1]
    p = sp.csc_matrix(pattern, dtype=np.int32)
    conflicts = (p.T @ p).tocsr()
    indptr, indices = conflicts.indptr.tolist(), conflicts.indices.tolist()
    colours = [-1] * n
    for col in np.argsort(-np.diff(conflicts.indptr), kind="stable").tolist():
        taken = {colours[nb] for nb in indices[indptr[col]:indptr[col + 1]]}
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
        return self._remembered((str(closed.jaxpr), *map(_const_key, closed.consts)),
                                lambda: _propagated(closed, x.size))

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
    inputs = [sp.identity(n, dtype=bool, format="csr")] + [None] * (len(closed.jaxpr.invars) - 1)
    (out,) = deps.run(closed.jaxpr, closed.consts, inputs)
    matrix = sp.csr_matrix((np.prod(closed.out_avals[0].shape, dtype=int), n), dtype=bool) if out is None else out
    return Pattern(sp.csr_matrix(matrix, dtype=bool), tuple(sorted(deps.conservative)))


class GivenPattern:
    """A user's sparsity pattern of ∂f/∂u (n, n), for every stage relation of f's size: I ∪ P ∪ Pᵀ
    (the forward stages have I − hγ J's pattern, a λ adjoint's I − hγ Jᵀ's). Equal (and hashing
    equal) for equal patterns: a static part of a JAX program."""

    def __init__(self, pattern):
        matrix = sp.csr_matrix(pattern, dtype=bool)
        if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
            raise ValueError(f"pattern: ∂f/∂u's sparsity must be square (n, n) over the flattened state, got shape "
                             f"{matrix.shape}")
        n = matrix.shape[0]
        symmetric = matrix + matrix.T + sp.identity(n, dtype=bool, format="csr")
        self.matrix = sp.csr_matrix(symmetric, dtype=bool).sorted_indices()
        self.key = _structure_key(self.matrix)

    def __eq__(self, other):
        return isinstance(other, GivenPattern) and self.key == other.key

    def __hash__(self):
        return hash(self.key)


class _Propagation:
    """Dependence sets through a jaxpr: each value maps to a boolean matrix (size, n) or None (no
    dependence); known constant values are kept where an index operand needs them."""

    def __init__(self, n):
        self.n = n
        self.conservative = set()

    def run(self, jaxpr, consts, inputs, const_values=None):
        deps, values = {}, {}
        for var, c in zip(jaxpr.constvars, consts):
            deps[var], values[var] = None, _concrete(c)
        for var, d in zip(jaxpr.invars, inputs):
            deps[var] = d
            if const_values is not None and var in const_values:
                values[var] = const_values[var]

        def read(v):
            if isinstance(v, jex_core.Literal):
                return None, np.asarray(v.val)
            return deps.get(v), values.get(v)

        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            outs = self.equation(eqn, [d for d, _ in ins], [c for _, c in ins])
            for var, d in zip(eqn.outvars, outs):
                deps[var] = d
            if all(d is None for d, _ in ins) and all(c is not None for _, c in ins):
                try:  # a constant sub-expression: its value may be an index later
                    with jax.ensure_compile_time_eval():
                        results = eqn.primitive.bind(*[c for _, c in ins], **eqn.params)
                    results = results if eqn.primitive.multiple_results else [results]
                    for var, r in zip(eqn.outvars, results):
                        values[var] = _concrete(r)
                except Exception:  # noqa: BLE001  (only an optimisation: the value stays unknown)
                    pass
        return [read(v)[0] for v in jaxpr.outvars]

    def equation(self, eqn, deps, values):
        name = eqn.primitive.name
        outs = eqn.outvars
        if all(d is None for d in deps) or name in _ZERO:
            return [None] * len(outs)
        if name in _CALLS:
            sub = eqn.params[_CALLS[name]]
            jaxpr, consts = (sub.jaxpr, sub.consts) if hasattr(sub, "consts") else (sub, ())
            return self.run(jaxpr, consts, deps[: len(jaxpr.invars)])
        if name == "cond":  # every branch's dependence, united
            branches = [self.run(b.jaxpr, b.consts, deps[1:]) for b in eqn.params["branches"]]
            return [_union([b[i] for b in branches]) for i in range(len(outs))]
        if name in _ELEMENTWISE:
            if name == "select_n":
                deps = [None, *deps[1:]]
            shape = outs[0].aval.shape  # operands broadcast to it (size-1 axes, rank 0)
            return [_union([None if d is None else _broadcast(d, var.aval.shape, shape)
                            for d, var in zip(deps, eqn.invars)])]
        if name in _MOVES:
            moved = self.moved(eqn, deps, values)
            if moved is not None:
                return moved
        if name in _REDUCE or name in _CUMULATIVE:
            return [self.reduced(eqn, deps[0])]
        if name == "dot_general":
            return [self.contracted(eqn, deps, values)]
        self.conservative.add(name)
        everything = _union([None if d is None else _rows_union(d) for d in deps])
        return [None if everything is None else _repeat(everything, _size(out)) for out in outs]

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
            picked = source[np.maximum(positions - 1, 0)]
            moved.append(sp.csr_matrix(picked.multiply((positions > 0)[:, None]), dtype=bool))
        return moved

    def reduced(self, eqn, d):
        """Each output entry depends on every input entry with its kept coordinates (cumulative
        operations: the whole axis, a superset)."""
        shape = eqn.invars[0].aval.shape
        axes = eqn.params["axes"] if "axes" in eqn.params else (eqn.params["axis"],)
        coords = np.indices(shape).reshape(len(shape), -1)
        if eqn.primitive.name in _CUMULATIVE:
            grouped = coords.copy()
            grouped[list(axes)] = 0
            groups = np.ravel_multi_index(grouped, shape)
            members = sp.csr_matrix((np.ones(groups.size, bool), (groups, np.arange(groups.size))),
                                    shape=(int(np.prod(shape)),) * 2)
            gathered = members @ d
            return sp.csr_matrix(gathered[groups], dtype=bool)
        kept = [a for a in range(len(shape)) if a not in axes]
        out_shape = tuple(shape[a] for a in kept)
        groups = np.ravel_multi_index(coords[kept], out_shape) if kept else np.zeros(coords.shape[1], int)
        g = sp.csr_matrix((np.ones(groups.size, bool), (groups, np.arange(groups.size))),
                          shape=(int(np.prod(out_shape)), groups.size))
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
            m = sp.block_diag([sp.kron(sp.identity(I, dtype=bool), sp.csr_matrix(right[b].T)) for b in range(B)])
            parts.append(sp.csr_matrix(m, dtype=bool) @ deps[0][perm_l])
        if deps[1] is not None:  # (b, i, j) <- (b, k, j) where left[b, i, k]
            m = sp.block_diag([sp.kron(sp.csr_matrix(left[b]), sp.identity(J, dtype=bool)) for b in range(B)])
            parts.append(sp.csr_matrix(m, dtype=bool) @ deps[1][perm_r])
        return _union(parts)


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
