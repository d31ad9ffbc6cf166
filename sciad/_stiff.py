"""Newton steps of implicit stages without a dense Jacobian: a root finder for diffrax's implicit solvers.

diffrax's implicit Runge–Kutta solvers (Kvaerno, KenCarp) solve each stage's relation
z − h γ f(y + h γ z) = 0 with a chord method (`diffrax.VeryChord`): the Jacobian I − h γ ∂f/∂y is
formed once per step, densely (n Jacobian-vector products and an n × n LU), and reused for every
stage and iteration. That is the whole cost at thousands of states. `StageNewton` is the same chord
method with the Jacobian's linear solves done another way (its `jacobian`):

- `Sparse`: the Jacobian's sparsity detected from the stage relation's jaxpr (`sciad.sparsity`),
  its entries from one Jacobian-vector product per colour (about ten for a 2-D stencil at any
  grid size) and one vector-Jacobian product per dense row, factorised once per step by SciPy's
  SuperLU on the host and reused for every stage and iteration (SciML's and SciPy's answer).
- `MatrixFree`: Newton–Krylov. The step's linearisation point is kept (arrays only) and each
  linear solve is GMRES on Jacobian-vector products of the stage relation there. Nothing of size
  n × n is formed, nothing leaves the device; without a preconditioner it suits mild stiffness.

Both serve any system the solver steps: the forward solve, forward-sensitivity systems, and the
adjoint systems that `sciad.adjoints` step backwards with the same solver (λ' = −Jᵀλ: the pattern
of Jᵀ, detected from that system's own jaxpr).

The Rosenbrock solvers (`sciad._rosenbrock`: Rodas5P, Rodas4, with a mass matrix M) have no root
finder: `Sparse` and `MatrixFree` serve them as their `stage_jacobian` (`stage_solver`). `Sparse`:
W = M/(hγ) − J once per step, its pattern J's (detected) ∪ M's ∪ I, its entries by coloured JVPs of
u ↦ M u/(hγ) − J u, factorised on the host and reused for every stage; its solves go through
`lineax.linear_solve` with `HostSparseLU`, so their derivatives (forward and reverse mode) solve
with the same factors (transposed for reverse mode), never differentiating the LU. `MatrixFree`:
GMRES on JVPs of the same map, to `stage_rtol` (no Newton iteration corrects a stage).

BDF (`sciad._bdf`) takes a `Sparse` as its `stage_jacobian` too: W = M − (h/α) J on the pattern, colouring
and host LU of `Sparse.factorisable`, J's and W's entries kept in its state across steps (the host finds
W's factorisation again by its entries), and its implicit derivative by `stage_solver` at the step's root.
A matrix-free solve keeps nothing across steps: BDF refuses it.

    solver = diffrax.Kvaerno5(root_finder=sciad._stiff.StageNewton(sciad.stiff.Sparse()))

`stiff_solver(solver, jacobian)` does that for a solver or its name; `sciad.solve(...,
jacobian=...)` applies it ("auto", the default: `Sparse` for an implicit solver on
`SPARSE_STATES` states or more whose f has a sparse Jacobian).

How they compare with each other, with diffrax's dense chord method and with SciPy's sparse BDF, by
size: `sciad bench large-stiff` (paper §14, paper/tables/large-stiff.md). Without a preconditioner
GMRES does not keep up with a diffusion's stiffness (h γ |λ_max| in the thousands): matrix-free
suits mild stiffness, the sparse LU the rest.
"""

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import diffrax as dfx
import equinox as eqx
import jax
import jax.flatten_util as jfu
import jax.numpy as jnp
import lineax as lx
import optimistix as optx

from sciad._diffrax_internals import use_stepsize_tol
from sciad._host_lu import HostLU, lu_solve


class AbstractStageJacobian(eqx.Module):
    """How the chord method solves with the stage relation's Jacobian: `linearise` once per step,
    `solve` for every Newton iteration of every stage. Each declares its `kind` (the name
    `jacobian=` takes for it, reported) and the `pattern` of ∂f/∂u it was given (None: none)."""

    kind: eqx.AbstractClassVar[str]
    pattern: eqx.AbstractVar[Any]

    @abc.abstractmethod
    def linearise(self, fn, y, args):
        """What the step's solves need of ∂fn/∂y at (y, args) (a PyTree of arrays, static parts
        allowed): fn(y, args) = (residual, aux), the residual y's structure."""

    @abc.abstractmethod
    def solve(self, state, fn, args, b, atol) -> tuple[Any, lx.RESULTS]:
        """(x, lineax result): x with (∂fn/∂y at the linearisation) x = b, b and x y's structure;
        `atol` the root finder's absolute tolerance."""

    @abc.abstractmethod
    def stage_solver(self, fn, y, args, also=None, identity=None):
        """(operator, solver, state) for `lineax.linear_solve(operator, b, solver, state=state)` with
        A = ∂fn/∂y at (y, args) (fn(y, args) (n,), y flat (n,), args a PyTree of arrays): a
        Rosenbrock step's W, y ↦ M y/γ − h f(y), whose stages no Newton iteration corrects. lineax's
        rules solve the derivatives' systems the same way. `also`: a boolean (n, n) pattern A may
        hold beyond ∂fn/∂y's (M's); where `identity` (a boolean scalar) holds, A is taken as I
        (diffrax's discarded zero-length steps of a vmapped solve's finished members, where W = M/γ
        may be singular)."""


class MatrixFree(AbstractStageJacobian):
    """(I − h γ J) x = b by restarted GMRES on Jacobian-vector products of the stage relation at the
    step's linearisation point: to `rtol` relative to |b| (max norm), in at most `max_steps`
    products, restarted every `restart`. An inexact solve only slows the chord iteration, which
    checks its own convergence; a failed one (out of products) rejects the step. A Rosenbrock
    stage (W = M/(hγ) − J, no Newton iteration to correct it) is solved to `stage_rtol` relative
    to |b|; a failed one rejects the step too."""

    rtol: float = 1e-3
    restart: int = 50
    max_steps: int = 1000
    stage_rtol: float = 1e-10
    kind: ClassVar[str] = "matrix-free"
    pattern: ClassVar[None] = None  # forms no Jacobian

    def linearise(self, fn, y, args):
        """The arrays of the linearisation point (y, args): the step's chord Jacobian."""
        return jax.lax.stop_gradient((y, eqx.filter(args, eqx.is_array)))

    def solve(self, state, fn, args, b, atol):
        """x with (∂fn/∂y at the linearisation point) x = b, and lineax's result: to `rtol` relative
        to max |b|, or `rtol` × `atol` (the root finder's absolute tolerance: a residual far below
        it moves no Newton iterate; b itself is roundoff at an adjoint's start, λ = 0)."""
        y, dynamic = state
        point = eqx.combine(dynamic, eqx.filter(args, eqx.is_array, inverse=True))
        operator = lx.JacobianLinearOperator(_NoAux(fn), y, point)
        # lineax's test is per entry, |r_i| ≤ atol + rtol |b_i|: relative to max |b| it is atol alone.
        atol = self.rtol * jnp.maximum(optx.max_norm(b), atol)
        gmres = lx.GMRES(rtol=0.0, atol=atol, restart=self.restart, max_steps=self.max_steps)  # pyright: ignore[reportArgumentType]  # a traced tolerance serves
        sol = lx.linear_solve(operator, b, gmres, throw=False)
        # lineax calls a breakdown (an invariant Krylov space: the exact solution, in small systems)
        # outside its tolerance a failure when the iterate moved in the last restart cycle: the
        # residual itself decides.
        residual = optx.max_norm(jax.tree.map(jnp.subtract, b, operator.mv(sol.value)))
        return sol.value, lx.RESULTS.where(residual <= atol, lx.RESULTS.successful, sol.result)

    def stage_solver(self, fn, y, args, also=None, identity=None):
        """GMRES on Jacobian-vector products of fn at (y, args) (`stage_rtol`: its rtol, and its atol
        relative to max |b| at the call, `_StageGMRES`); nothing of size n × n is formed."""
        del also  # forms no matrix

        def operator_fn(v, args_identity):
            args, identity = args_identity
            return fn(v, args) if identity is None else jnp.where(identity, v, fn(v, args))

        operator = lx.JacobianLinearOperator(operator_fn, y, (args, identity))
        solver = _StageGMRES(self.stage_rtol, self.restart, self.max_steps)
        return operator, solver, solver.init(operator, {})


class Sparse(AbstractStageJacobian):
    """(I − h γ J) x = b by a sparse LU of the stage relation's Jacobian at the step's linearisation
    point: the pattern detected from the relation's jaxpr, the entries from one Jacobian-vector
    product per colour and one vector-Jacobian product per row with more than `dense_row` entries
    (default max(16, 4√n): an adjoint's parameter rows), factorised on the host by SciPy's SuperLU
    once per step (the `kept` latest factorisations are held, keyed on the entries) and reused for
    every stage and iteration. Under vmap each member's system is factorised in turn.

    `pattern`: ∂f/∂u's sparsity (n, n) over the flattened state (a SciPy sparse matrix or a boolean
    array), used as I ∪ P ∪ Pᵀ for every stage relation of n states (the forward solve's, a λ
    adjoint's) in place of detection; larger systems (augmented adjoints, forward sensitivities)
    are still detected. Give it where detection cannot follow f (`Pattern.conservative` names
    what it could not). A pattern missing entries makes the Jacobian wrong: the chord iteration
    then converges slowly or not at all (smaller steps, or the solve fails), never to a wrong
    answer, as the residual is exact."""

    dense_row: int | None = None
    kept: int = 8
    pattern: Any = eqx.field(default=None, static=True, converter=lambda p: p if p is None else _given(p))
    kind: ClassVar[str] = "sparse"

    def linearise(self, fn, y, args):
        from sciad import _sparsity as sparsity  # SciPy on first use: importing sciad pulls no SciPy

        flat, unravel = jfu.ravel_pytree(y)
        dynamic, static = eqx.partition(args, eqx.is_array)

        def relation(x, dynamic):
            return jfu.ravel_pytree(fn(unravel(x), eqx.combine(dynamic, static))[0])[0]

        given = self.pattern is not None and self.pattern.matrix.shape[0] == flat.size
        pattern = sparsity.PATTERNS.given(self.pattern) if given else sparsity.jacobian_pattern(relation, flat, dynamic)  # pyright: ignore[reportArgumentType]  # given: a pattern
        colouring = pattern.colouring(self.dense_row)
        values = colouring.jacobian_values(lambda x: relation(x, dynamic), flat)
        rows, cols = colouring.rows_cols
        return _Factorised(jax.lax.stop_gradient(values), HostLU(rows, cols, colouring.matrix.shape, self.kept))  # pyright: ignore[reportArgumentType]  # SciPy's stubs: a matrix's shape

    def solve(self, state, fn, args, b, atol):
        flat, unravel = jfu.ravel_pytree(b)
        x = lu_solve(state.lu, state.values, flat)
        ok = jnp.all(jnp.isfinite(x))
        return unravel(jnp.where(ok, x, 0)), lx.RESULTS.where(ok, lx.RESULTS.successful, lx.RESULTS.singular)

    def factorisable(self, fn, y, args, also=None):
        """(colouring, host LU) for A = ∂fn/∂y at any (y, args) (fn(y, args) (n,), y flat (n,), args a
        PyTree of arrays): A's pattern `pattern` (given) or detected from fn's jaxpr, ∪ `also` (a boolean
        (n, n)), ∪ I, symmetrised; its entries (nnz,) `colouring.jacobian_values(lambda x: fn(x, args), y)`,
        in the order of the `HostLU`'s `rows`, `cols`, which `lu_solve` solves with."""
        import scipy.sparse as sp

        from sciad import _sparsity as sparsity  # SciPy on first use

        n = y.size
        given = self.pattern is not None and self.pattern.matrix.shape[0] == n
        found = self.pattern.matrix if given else sparsity.jacobian_pattern(fn, y, args).matrix  # pyright: ignore[reportOptionalMemberAccess]  # given: a pattern
        union = sp.csr_matrix(found, dtype=bool)
        if also is not None:
            union = union + sp.csr_matrix(also, dtype=bool)
        pattern = sparsity.PATTERNS.given(sparsity.GivenPattern(union))  # ∪ Pᵀ ∪ I; colourings kept
        colouring = pattern.colouring(self.dense_row)
        rows, cols = colouring.rows_cols
        return colouring, HostLU(rows, cols, colouring.matrix.shape, self.kept)  # pyright: ignore[reportArgumentType]  # SciPy's stubs: a matrix's shape

    def stage_solver(self, fn, y, args, also=None, identity=None):
        """A = ∂fn/∂y factorised once on the host and reused by every solve and by their derivatives
        (`HostSparseLU`). A's pattern and entries: `factorisable`'s."""
        colouring, lu = self.factorisable(fn, y, args, also)
        values = colouring.jacobian_values(lambda x: fn(x, args), y)
        if identity is not None:
            values = jnp.where(identity, jnp.asarray(lu.rows == lu.cols, values.dtype), values)
        state = (jax.lax.stop_gradient(values), lu, False)
        return lx.JacobianLinearOperator(fn, y, args), HostSparseLU(), state


class HostSparseLU(lx.AbstractLinearSolver):
    """A lineax solver over a sparse LU held on the host (`sciad._host_lu`): its state, (entries
    (nnz,), `HostLU` pattern, transposed), comes from `Sparse.factorised`, or from `init` by
    `jacobian` (a `Sparse`) on any square operator over a flat array (an optimistix Newton's: the
    pattern read off its matrix-vector product). lineax's rules for `linear_solve` then solve the derivatives'
    systems with the same
    factors, Aᵀ by SuperLU's transposed solve for reverse mode; the LU is never differentiated."""

    jacobian: Any = None

    def init(self, operator, options):
        if self.jacobian is None:
            raise ValueError(
                "HostSparseLU(jacobian=None) factorises no operator itself: pass "
                "state=Sparse.stage_solver(...)[2] to lineax.linear_solve, or give it a Sparse"
            )
        x = jnp.zeros(operator.in_structure().shape, operator.in_structure().dtype)
        dynamic, static = eqx.partition(operator, eqx.is_array)
        return self.jacobian.stage_solver(lambda v, dynamic: eqx.combine(dynamic, static).mv(v), x, dynamic)[2]

    def compute(self, state, vector, options):
        values, lu, transpose = state
        # as lineax's dense LU: a singular matrix gives non-finite values, which reject the step
        return lu_solve(lu, values, vector, transpose), lx.RESULTS.successful, {}

    def transpose(self, state, options):
        values, lu, transpose = state
        return (values, lu, not transpose), options

    def conj(self, state, options):
        return state, options  # real entries

    def assume_full_rank(self):
        return True


def _given(pattern):
    from sciad import _sparsity as sparsity

    return pattern if isinstance(pattern, sparsity.GivenPattern) else sparsity.GivenPattern(pattern)


class _StageGMRES(lx.AbstractLinearSolver):
    """lineax's GMRES to `rtol` relative to max |b| of each right-hand side b, restarted every
    `restart`, in at most `max_steps` products: it solves A x = b / max |b| (GMRES breaks down on a
    right-hand side below its ε, such as a zero tangent's roundoff) and its residual decides success
    (lineax calls a breakdown, an invariant Krylov space and so the exact solution in small systems, a
    failure, and its derivative rules throw on any failure)."""

    rtol: float
    restart: int
    max_steps: int

    def _gmres(self):
        return lx.GMRES(rtol=self.rtol, atol=self.rtol, restart=self.restart, max_steps=self.max_steps)

    def init(self, operator, options):
        return self._gmres().init(operator, options)

    def compute(self, state, vector, options):
        scale = optx.max_norm(vector)
        b = vector / jnp.where(scale == 0, 1, scale)
        x, result, stats = self._gmres().compute(state, b, options)
        ok = optx.max_norm(b - state.mv(x)) <= 2 * self.rtol
        return x * scale, lx.RESULTS.where(ok, lx.RESULTS.successful, result), stats

    def transpose(self, state, options):
        return self._gmres().transpose(state, options)

    def conj(self, state, options):
        return self._gmres().conj(state, options)

    def assume_full_rank(self):
        return True


class _Factorised(eqx.Module):
    values: jax.Array  # the Jacobian's structural entries (nnz,)
    lu: HostLU = eqx.field(static=True)  # the pattern's solver on the host


class _NoAux(eqx.Module):
    fn: Callable

    def __call__(self, y, args):
        return self.fn(y, args)[0]


class _ChordState(eqx.Module):
    linearisation: Any
    diff: Any
    diffsize: jax.Array
    diffsize_prev: jax.Array
    result: optx.RESULTS
    step: jax.Array


class StageNewton(optx.AbstractRootFinder):
    """The chord method of `diffrax.VeryChord` (the Jacobian's linearisation point taken once per
    step, where the solver asks, and kept for every stage and iteration; the same convergence and
    divergence tests with `kappa`), its linear solves by `jacobian` (`Sparse` or `MatrixFree`). `rtol`, `atol`
    and `norm` are the step-size controller's unless given."""

    jacobian: AbstractStageJacobian
    rtol: Any = use_stepsize_tol
    atol: Any = use_stepsize_tol
    norm: Any = use_stepsize_tol
    kappa: float = 1e-2

    def init(self, fn, y, args, options, f_struct, aux_struct, tags):
        if "init_state" in options:
            return options["init_state"]
        diff_dtype = jnp.result_type(*jax.tree.leaves(y))
        return _ChordState(
            self.jacobian.linearise(fn, y, args),
            jax.tree.map(lambda x: jnp.full(x.shape, jnp.inf, x.dtype), y),
            jnp.array(jnp.inf, diff_dtype),
            jnp.array(1.0, diff_dtype),
            optx.RESULTS.successful,
            jnp.array(0),
        )

    def step(self, fn, y, args, options, state, tags):
        fx, aux = fn(y, args)
        diff, result = self.jacobian.solve(state.linearisation, fn, args, fx, self.atol)
        new_y = jax.tree.map(lambda a, d: a - d, y, diff)
        with jax.numpy_dtype_promotion("standard"):
            scaled = jax.tree.map(lambda d, a: d / (self.atol + self.rtol * jnp.abs(a)), diff, new_y)
            diffsize = self.norm(scaled)
        new_state = _ChordState(
            state.linearisation, diff, diffsize, state.diffsize, optx.RESULTS.promote(result), state.step + 1
        )
        return new_y, new_state, aux

    def terminate(self, fn, y, args, options, state, tags):
        at_least_two = state.step >= 2
        rate = state.diffsize / state.diffsize_prev
        factor = state.diffsize * rate / (1 - rate)
        small = state.diffsize < 10 ** (2 - jnp.finfo(state.diffsize.dtype).precision)
        diverged = ~jnp.isfinite(rate) | (rate > 2)
        converged = (factor > 0) & (factor < self.kappa)
        terminate = at_least_two & (small | diverged | converged)
        result = optx.RESULTS.where(
            at_least_two & ~small & (diverged | ~converged), optx.RESULTS.nonlinear_divergence, optx.RESULTS.successful
        )
        failed = state.result != optx.RESULTS.successful
        return failed | terminate, optx.RESULTS.where(failed, state.result, result)

    def postprocess(self, fn, y, aux, args, options, state, tags, result):
        return y, aux, {}


JACOBIANS = {"dense": None, **{cls.kind: cls for cls in (Sparse, MatrixFree)}}
SPARSE_STATES = 256  # "auto": a sparse Newton from this many states (an f whose Jacobian is sparse)
SPARSE_DENSITY = 0.05  # ... with at most this share of its entries structurally nonzero


def is_implicit(solver: dfx.AbstractSolver) -> bool:
    """Whether a diffrax solver solves implicit stages: it declares a root finder for them (diffrax's
    `AbstractImplicitSolver`), or it declares itself linearly implicit (a Rosenbrock solver: one linear system
    per stage)."""
    return isinstance(solver, dfx.AbstractImplicitSolver) or getattr(solver, "linearly_implicit", False)


def auto_jacobian(solver: dfx.AbstractSolver, f: Callable, u0, p, t0) -> tuple[str, str]:
    """(the jacobian "auto" picks, why) for `solver` on f(u, p, t) from u0 (PyTrees, traced or not):
    "sparse" for an implicit or Rosenbrock solver on at least `SPARSE_STATES` states whose ∂f/∂u has at most
    `SPARSE_DENSITY` of its entries structurally nonzero (`sciad.sparsity`), "dense" otherwise."""
    flat, unravel = jfu.ravel_pytree(u0)
    n = flat.size
    if not is_implicit(solver):
        return "dense", "an explicit solver solves no linear systems"
    if n < SPARSE_STATES:
        return "dense", f"{n} states: a dense LU is cheap below {SPARSE_STATES}"
    from sciad import _sparsity as sparsity

    dynamic, static = eqx.partition(p, eqx.is_array)

    def rate(u, dynamic, t):
        return jfu.ravel_pytree(f(unravel(u), eqx.combine(dynamic, static), t))[0]

    pattern = sparsity.jacobian_pattern(rate, flat, dynamic, jnp.asarray(t0, flat.dtype))
    nonzeros = f"∂f/∂u has {pattern.matrix.nnz} structural nonzeros ({pattern.density:.2%} of {n}²)"
    # a superset where detection could not follow f: which operations, and where
    dense_by = f"; taken as dense by: {', '.join(pattern.conservative)}" if pattern.conservative else ""
    if pattern.density > SPARSE_DENSITY:
        return "dense", nonzeros + dense_by
    colouring = pattern.colouring()
    return "sparse", f"{nonzeros}: {colouring.count} colours, {len(colouring.dense)} dense rows, a sparse LU{dense_by}"


def with_stage_jacobian(solver: dfx.AbstractSolver, jacobian, f: Callable, u0, p, t0) -> tuple[dfx.AbstractSolver, Any]:
    """(`solver` with its stages solved by `jacobian`, (kind, why)): "auto" decided by `auto_jacobian`
    on f from u0, anything else as given (`stiff_solver`)."""
    if isinstance(jacobian, str) and jacobian == "auto":
        kind, why = auto_jacobian(solver, f, u0, p, t0)
        return stiff_solver(solver, kind), (kind, why)
    solver = stiff_solver(solver, jacobian)
    if isinstance(jacobian, str):
        return solver, (jacobian, "given")
    states = jfu.ravel_pytree(u0)[0].size
    if jacobian.pattern is not None and jacobian.pattern.matrix.shape[0] != states:
        shape = jacobian.pattern.matrix.shape
        raise ValueError(
            f"pattern: ∂f/∂u's sparsity is {shape}, the state has {states} entries: give "
            f"it ({states}, {states}) over the flattened state (jax.flatten_util.ravel_pytree's order)"
        )
    return solver, (jacobian.kind, "given")


def stiff_solver(solver: dfx.AbstractSolver, jacobian) -> dfx.AbstractSolver:
    """`solver` with its implicit stages' linear solves by `jacobian`: "dense" (diffrax's own, the
    solver unchanged), "sparse" (`Sparse()`), "matrix-free" (`MatrixFree()`), or an
    `AbstractStageJacobian` instance. A solver that declares the `stage_jacobians` kinds it takes as its
    `stage_jacobian` gets it there: a Rosenbrock solver any of them (W = M/(hγ) − J: factorised sparsely once
    per step, or solved by GMRES), BDF a `Sparse` (W = M − (h/α) J kept across steps). Explicit solvers have no
    stages to solve: any `jacobian` but "dense" is an error for them ("auto" is decided by
    `auto_jacobian` before this)."""
    if isinstance(jacobian, str):
        if jacobian not in JACOBIANS:
            raise ValueError(
                f"unknown jacobian {jacobian!r}; choose one of {['auto', *sorted(JACOBIANS)]} or pass "
                "a sciad.stiff.Sparse(...) or sciad.stiff.MatrixFree(...)"
            )
        if JACOBIANS[jacobian] is None:
            return solver
        jacobian = JACOBIANS[jacobian]()
    if not isinstance(jacobian, AbstractStageJacobian):
        raise TypeError(
            f"jacobian must be one of {['auto', *sorted(JACOBIANS)]}, a sciad.stiff.Sparse or a "
            f"sciad.stiff.MatrixFree, got {type(jacobian).__name__}"
        )
    kinds = getattr(solver, "stage_jacobians", None)
    if kinds is not None:
        if jacobian.kind not in kinds:
            raise ValueError(
                f"jacobian={jacobian!r}: {type(solver).__name__} solves its stages with "
                f"{' or '.join(f'jacobian={kind!r}' for kind in kinds)} only; pass one of them"
            )
        return eqx.tree_at(lambda s: s.stage_jacobian, solver, jacobian, is_leaf=lambda x: x is None)
    if not isinstance(solver, dfx.AbstractImplicitSolver):
        raise ValueError(
            f"jacobian={jacobian!r} needs an implicit solver (e.g. solver='kvaerno5'); "
            f"{type(solver).__name__} is explicit and solves no linear systems"
        )
    return eqx.tree_at(lambda s: s.root_finder, solver, StageNewton(jacobian))  # pyright: ignore[reportCallIssue]  # optimistix's AbstractVar fields read as arguments
