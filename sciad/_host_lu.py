"""x = A⁻¹ b (or A⁻ᵀ b) on the host by SciPy's SuperLU, for sparse matrices A of one pattern given by
their entries: a JAX primitive, `lu_solve(lu, values, b, transpose)`, usable under `jit` and `vmap`
(each member solved in turn on the host), not differentiable itself (the chord method's solves are
not differentiated: the root finder's derivative is implicit; a Rosenbrock step's solves go through
`lineax.linear_solve`, whose rules solve again with the same factors, transposed for reverse mode:
`sciad._stiff.HostSparseLU`).

A primitive lowered to a host call rather than `jax.pure_callback`: pure_callback copies its
arguments into jax.Arrays before the call, a copy that costs several times the host call itself, and a
sparse Newton makes a thousand calls a solve (sciad._jax_internals).

Every factorisation is made and dropped on one thread of its own: SciPy's SuperLU frees a
factorisation's memory only on the thread that allocated it (a per-thread registry), and JAX makes
host calls from several threads, so factors released elsewhere would never be freed (their memory
grows with every solve). Solves run on the calling thread (a hop to another thread costs about as
much as one solve) under the held factors' lock, which keeps the factor they use held.

`HostLU` is a pattern: an immutable value, equal for equal patterns, the primitive's static
parameter. The factorisations belong to the pattern's `_Factorisations`, which every equal `HostLU`
shares (found by the pattern's content, held while one of them lives): the `kept` latest, found
again by their entries (every stage and Newton iteration of a step solves with one), every matrix
ordered as the first one's minimum-degree ordering on Aᵀ + A (stage matrices are structurally
near-symmetric; it fills a 2-D grid's LU about half as much as SuperLU's default, COLAMD),
computed once; a pattern that reverse Cuthill–McKee makes narrowly banded (a 1-D grid's) is
factorised in LAPACK's band storage instead (`_Band`: cheaper to factorise than a general sparse LU,
NumPy arrays that any thread may free). `COUNTS` tallies the factorisations and solves made
and the most bytes held in factors (the benchmark reports them).
"""

import collections
import concurrent.futures
import threading
import weakref

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from sciad._errors import host_call
from sciad._jax_internals import batching, callback_op_sharding, core, mlir

_SUPERLU = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sciad-superlu")  # started on use


class Counts:
    """A tally of the host LUs' work since `clear()`, safe to update from several threads:
    "factorisations", "solves", and "factor_bytes" (the most one pattern held in LU factors)."""

    def __init__(self):
        self._counts = collections.Counter()
        self._lock = threading.Lock()

    def add(self, name: str, count: int = 1) -> None:
        with self._lock:
            self._counts[name] += count

    def at_least(self, name: str, value: int) -> None:
        """Raise `name` to `value` where it is lower."""
        with self._lock:
            self._counts[name] = max(self._counts[name], value)

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._counts[name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()


COUNTS = Counts()  # every pattern's work, for the benchmark: COUNTS.clear(), a call, COUNTS.snapshot()


class HostLU:
    """Solves with matrices of the pattern `rows`, `cols` (nnz,) of `shape` (n, n), entries in that
    order; the `kept` latest factorisations held. Immutable, equal (and hashing equal) for equal
    patterns, which share their factorisations: a static part of a JAX program. A singular matrix
    gives NaN."""

    def __init__(self, rows: np.ndarray, cols: np.ndarray, shape: tuple, kept: int):
        self.rows, self.cols = _frozen(rows), _frozen(cols)
        self.shape, self.kept = tuple(shape), kept
        self.key = (self.shape, kept, self.rows.tobytes(), self.cols.tobytes())
        self._factorisations = _Factorisations.of(self)

    def __eq__(self, other):
        return isinstance(other, HostLU) and self.key == other.key

    def __hash__(self):
        return hash(self.key)

    def __repr__(self):
        return f"HostLU(n={self.shape[0]}, nnz={len(self.rows)}, kept={self.kept})"

    def __call__(self, values: np.ndarray, b: np.ndarray, transpose: bool = False) -> np.ndarray:
        """x (..., n) with A(values[i]) x[i] = b[i] (Aᵀ with `transpose`): values (..., nnz), b (..., n),
        one batch shape."""
        flat_values, flat_b = values.reshape(-1, values.shape[-1]), b.reshape(-1, b.shape[-1])
        return np.stack([self.solve(v, r, transpose) for v, r in zip(flat_values, flat_b)]).reshape(b.shape)

    def solve(self, values: np.ndarray, b: np.ndarray, transpose: bool = False) -> np.ndarray:
        """x (n,) with A(values) x = b (Aᵀ x = b with `transpose`, by the same factors): values (nnz,),
        b (n,); NaN where A is singular."""
        return self._factorisations.solve(values, b, transpose)


def _frozen(indices) -> np.ndarray:
    out = np.array(indices, dtype=np.int64)
    out.flags.writeable = False
    return out


class _Factorisations:
    """The held factorisations of one pattern (`HostLU`), shared by its equal values. A(values) is
    factorised on SuperLU's thread unless held; solves run on the calling thread under the lock."""

    _shared: "weakref.WeakValueDictionary[tuple, _Factorisations]" = weakref.WeakValueDictionary()
    _shared_lock = threading.Lock()

    @classmethod
    def of(cls, lu: HostLU) -> "_Factorisations":
        """The factorisations of `lu`'s pattern: those of an equal pattern still alive, or new ones."""
        with cls._shared_lock:
            held = cls._shared.get(lu.key)
            if held is None:
                held = cls._shared[lu.key] = cls(lu.rows, lu.cols, lu.shape, lu.kept)
            return held

    def __init__(self, rows, cols, shape, kept):
        self.rows, self.cols, self.shape = rows, cols, shape
        self.factors = collections.deque(maxlen=kept)  # (entries, SuperLU or None), the latest last
        self.lock = threading.Lock()  # over `factors`: a solve keeps its factor held
        self.order = None  # the fill-reducing ordering, from the first factorisation
        self.band = None  # a `_Band` where P A Pᵀ is narrow enough
        weakref.finalize(self, _release, self.factors)

    def solve(self, values: np.ndarray, b: np.ndarray, transpose: bool = False) -> np.ndarray:
        """x (n,) with A(values) x = b (Aᵀ with `transpose`): values (nnz,), b (n,); NaN where A is singular."""
        COUNTS.add("solves")
        while True:  # once, unless another thread's factorisations push this one out first
            with self.lock:
                x = self._solve_held(values, b, transpose)
            if x is not None:
                return x
            if self.band is not None:  # LAPACK's factors are NumPy arrays: any thread may make and drop them
                self.factorise(values)
            else:
                _SUPERLU.submit(self.factorise, values).result()

    def _solve_held(self, values, b, transpose=False):
        """x, or None where A(values) is not held; under the lock. No factor outlives this frame
        here: dropping the last reference to one off SuperLU's thread would leak it."""
        for held, lu in reversed(self.factors):
            if np.array_equal(held, values):
                if lu is None:
                    return np.full_like(b, np.nan)
                x = np.empty_like(b)
                # the factors are of P A Pᵀ (P: rows `order`), whose transpose is P Aᵀ Pᵀ
                x[self.order] = lu.solve(b[self.order], trans="T" if transpose else "N")
                return x
        return None

    def factorise(self, values: np.ndarray):
        """Hold the factorisation of A(values), reordered (None where A is singular), pushing out
        the oldest held. On SuperLU's thread."""
        import scipy.sparse as sp
        import scipy.sparse.linalg as spla

        COUNTS.add("factorisations")
        if self.order is None:
            first = sp.csc_matrix((values, (self.rows, self.cols)), shape=self.shape)
            try:
                sparse = spla.splu(first, permc_spec="MMD_AT_PLUS_A")
            except RuntimeError:  # exactly singular: its ordering is still a fill-reducing one
                sparse = spla.splu(sp.identity(self.shape[0], format="csc") + abs(first), permc_spec="MMD_AT_PLUS_A")
            self.order = np.argsort(sparse.perm_c)
            self.band = _Band.of(self.rows, self.cols, self.shape[0], sparse.nnz)
            if self.band is not None:
                self.order = self.band.order
            self.csc = _csc_structure(self.rows, self.cols, self.order, self.shape[0])
        if self.band is not None:
            lu = self.band.factorise(values)
        else:
            entries, indices, indptr = self.csc
            try:
                # small supernodes and panels: 25 % faster on 2-D grids' stage matrices than SuperLU's defaults
                lu = spla.splu(
                    sp.csc_matrix((values[entries], indices, indptr), shape=self.shape),
                    permc_spec="NATURAL",
                    relax=1,
                    panel_size=6,
                )
            except RuntimeError:  # exactly singular
                lu = None
        with self.lock:
            self.factors.append((values.copy(), lu))
            held = sum(f.nnz * (values.itemsize + 4) for _, f in self.factors if f is not None)  # entries, row indices
        COUNTS.at_least("factor_bytes", held)


class _Band:
    """A pattern whose reverse Cuthill–McKee ordering P makes P A Pᵀ banded (kl below the diagonal, ku
    above), factorised in LAPACK's band storage by ?gbtrf (partial pivoting) where that storage,
    (2 kl + ku + 1) n, is at most `BAND_FILL` times SuperLU's factors: a 1-D grid's stage matrix,
    whose band LU and solves cost less than SuperLU's (no sparse bookkeeping)."""

    def __init__(self, order, kl, ku, index, n):
        self.order, self.kl, self.ku, self.index, self.n = order, kl, ku, index, n

    @classmethod
    def of(cls, rows, cols, n: int, sparse_nnz: int) -> "_Band | None":
        import scipy.sparse as sp
        from scipy.sparse.csgraph import reverse_cuthill_mckee

        pattern = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, n))
        order = np.asarray(reverse_cuthill_mckee((pattern + pattern.T).tocsr(), symmetric_mode=True), dtype=np.int64)
        position = np.empty(n, dtype=np.int64)
        position[order] = np.arange(n)
        r, c = position[rows], position[cols]
        kl, ku = int(max(np.max(r - c, initial=0), 0)), int(max(np.max(c - r, initial=0), 0))
        if (2 * kl + ku + 1) * n > BAND_FILL * sparse_nnz:
            return None
        return cls(order, kl, ku, (kl + ku + r - c, c), n)

    def factorise(self, values: np.ndarray):
        """The band LU of P A(values) Pᵀ (`_BandLU`), or None where it is exactly singular."""
        from scipy.linalg import get_lapack_funcs

        ab = np.zeros((2 * self.kl + self.ku + 1, self.n), values.dtype)
        ab[self.index] = values  # a pattern's (row, column) pairs are distinct
        gbtrf, gbtrs = get_lapack_funcs(("gbtrf", "gbtrs"), (ab,))
        lu, piv, info = gbtrf(ab, self.kl, self.ku)
        return None if info > 0 else _BandLU(lu, piv, self.kl, self.ku, gbtrs)


BAND_FILL = 2.0


class _BandLU:
    """A band LU as SuperLU's factors present themselves to `_Factorisations`: `solve(b, trans)`, `nnz`."""

    def __init__(self, lu, piv, kl, ku, gbtrs):
        self.lu, self.piv, self.kl, self.ku, self.gbtrs = lu, piv, kl, ku, gbtrs
        self.nnz = lu.size

    def solve(self, b, trans="N"):
        x, _ = self.gbtrs(self.lu, self.kl, self.ku, b, self.piv, trans=0 if trans == "N" else 1)
        return x


def _release(factors):
    """Drop held factorisations on the thread that made them (at interpreter exit the OS reclaims them)."""
    try:
        _SUPERLU.submit(factors.clear)
    except RuntimeError:  # the executor has shut down: the interpreter is exiting
        pass


def _csc_structure(rows, cols, order, n):
    """(entries, indices, indptr): the CSC arrays of P A Pᵀ (P the rows `order`) from A's entries in
    pattern order, `values[entries]` its data."""
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    new_rows, new_cols = position[rows], position[cols]
    entries = np.lexsort((new_rows, new_cols))
    indptr = np.concatenate([[0], np.cumsum(np.bincount(new_cols, minlength=n))])
    return entries, new_rows[entries].astype(np.int32), indptr.astype(np.int32)


def lu_solve(lu: HostLU, values, b, transpose: bool = False):
    """x (..., n) with A x = b (Aᵀ x = b with `transpose`), A the matrix of `lu`'s pattern with entries
    `values` (..., nnz); b (..., n)."""
    return lu_solve_p.bind(values, b, lu=lu, transpose=bool(transpose))


lu_solve_p = core.Primitive("sciad_host_lu_solve")


@lu_solve_p.def_abstract_eval
def _abstract(values, b, *, lu, transpose):
    return jax.core.ShapedArray(b.shape, b.dtype)


@lu_solve_p.def_impl
def _eager(values, b, *, lu, transpose):
    return jnp.asarray(lu(np.asarray(values), np.asarray(b), transpose))


def _lowering(ctx, values, b, *, lu, transpose):
    def host(values, b):
        return (lu(np.asarray(values), np.asarray(b), transpose),)

    def failure(e: Exception) -> str:
        return (
            f"the sparse LU solve on the host ({lu!r}) raised {type(e).__name__}: {str(e).rstrip('.')}; pass "
            "jacobian='dense' or jacobian='matrix-free' to sciad.solve to solve the stages without it"
        )

    sharding = callback_op_sharding(ctx.module_context.axis_context, None, ctx.avals_out)
    result, _, _ = mlir.emit_python_callback(
        ctx,
        host_call(host, failure),
        None,
        [values, b],
        ctx.avals_in,
        ctx.avals_out,
        has_side_effect=False,
        returns_token=False,
        sharding=sharding,
    )
    return result


mlir.register_lowering(lu_solve_p, _lowering, cacheable=False)


def _batch(args, dims, *, lu, transpose):
    """vmap: the batch axis first on both operands (broadcast where one is unbatched)."""
    size = next(arg.shape[dim] for arg, dim in zip(args, dims) if dim is not None)
    values, b = (
        jnp.broadcast_to(arg, (size, *arg.shape)) if dim is None else jnp.moveaxis(arg, dim, 0)
        for arg, dim in zip(args, dims)
    )
    return lu_solve_p.bind(values, b, lu=lu, transpose=transpose), 0


batching.primitive_batchers[lu_solve_p] = _batch
