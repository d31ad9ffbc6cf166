"""Differential-algebraic problems M u' = f(u, p, t) with a constant mass matrix M (index 1): the
matrix checked and held (`MassMatrix`), the solver that takes it (`dae_solver`), and consistent
initialisation (`initialise`, SciML's BrownFullBasicInit).

With M singular, the equations M splits off are algebraic: where M is a diagonal, the rows whose
entry is 0, and the states of the same indices; for a full M, an orthogonal split computed once on
the host (M is constant) from its SVD M = U S Vᵀ: the equations U₀ᵀ f = 0 (U₀ spans the left null
space, the rows of M u' that vanish) in the states V₀ᵀ u (V₀ spans the null space, the directions
M does not see). Consistent initialisation keeps u0's differential part (V₁V₁ᵀ u0, the entries of
nonzero diagonal) and solves the algebraic equations for the algebraic part by Newton
(`optimistix.root_find`): its implicit rule differentiates the solution, not the iterations, so
d/du0 of the differential part and d/dp are right (the implicit function theorem). A large sparse
algebraic block (`_algebraic_solver`) is solved by the host's sparse LU (`sciad._stiff.HostSparseLU`),
in Newton's steps and in the implicit rule.
"""

import dataclasses
import functools
import sys
import typing

import diffrax as dfx
import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.scipy.linalg
import lineax as lx
import numpy as np
import optimistix as optx

from sciad._errors import SolveError, error_if
from sciad._rosenbrock import Rodas5P

INITIALIZATIONS = ("consistent", "check", "none")
DAE_SOLVERS = "solver='rodas5p', 'rodas4' or 'bdf' (sciad.Rodas5P(), sciad.Rodas4(), sciad.BDF())"
NEWTON_STEPS = 50  # consistent initialisation: Newton iterations before it is called a failure
NEWTON_TIGHTER = 1e-3  # ... and its tolerances, the solve's rtol and atol times this


class MassMatrix:
    """A constant mass matrix over the flattened state (n,): `matrix`, float64 NumPy, its diagonal
    (n,) or in full (n, n) (a full matrix that is diagonal is kept as its diagonal). Hashable and
    compared by content (a static part of `ODEProblem`); `numpy.asarray(mass)` gives `matrix`."""

    def __init__(self, matrix: np.ndarray):
        self.matrix = matrix
        self.matrix.flags.writeable = False

    @functools.cached_property
    def rank(self) -> int:
        if self.matrix.ndim == 1:
            return int(np.count_nonzero(self.matrix))
        s = np.linalg.svd(self.matrix, compute_uv=False)
        return int(np.sum(s > s.max(initial=0.0) * self.matrix.shape[0] * np.finfo(float).eps))

    @classmethod
    def of(cls, M, n: int) -> "MassMatrix | None":
        """`M` (None, a vector (n,), a matrix (n, n) or a SciPy sparse matrix) checked against a state
        of `n` entries, else a TypeError or ValueError naming `mass_matrix` and the fix."""
        if M is None:
            return None
        sparse = sys.modules.get("scipy.sparse")  # a SciPy sparse matrix exists only where SciPy is imported
        if sparse is not None and sparse.issparse(M):
            M = M.toarray()  # dense for now: the Rosenbrock solvers factorise M/(hγ) − J densely
        if isinstance(M, jax.core.Tracer):
            raise TypeError(
                "mass_matrix must be constant (a NumPy or concrete JAX array), got a traced value: "
                "make the ODEProblem outside jax.jit / jax.grad, or close over M as a constant"
            )
        try:
            M = np.asarray(M)
        except Exception as e:
            raise TypeError(
                f"mass_matrix must be an array (a vector (n,), a matrix (n, n)) or a SciPy sparse "
                f"matrix, got {type(M).__name__}"
            ) from e
        if not (np.issubdtype(M.dtype, np.floating) or np.issubdtype(M.dtype, np.integer) or M.dtype == np.bool_):
            raise TypeError(f"mass_matrix has dtype {M.dtype}; pass real numbers")
        if M.shape not in ((n,), (n, n)):
            raise ValueError(
                f"mass_matrix has shape {M.shape} but the flattened u0 has {n} entries: give a vector "
                f"({n},) (M's diagonal; zeros mark algebraic equations) or a matrix ({n}, {n}) over "
                "the flattened state (jax.flatten_util.ravel_pytree's order)"
            )
        M = M.astype(np.float64)
        if not np.all(np.isfinite(M)):
            raise ValueError("mass_matrix contains non-finite values (NaN or inf): pass a finite matrix")
        if M.ndim == 2 and not np.any(M - np.diag(np.diag(M))):
            M = np.diag(M).copy()
        return cls(M)

    @property
    def n(self) -> int:
        return self.matrix.shape[0]

    @property
    def singular(self) -> bool:
        """Whether M is singular: the problem is a DAE with `algebraic` algebraic equations."""
        return self.rank < self.n

    @property
    def algebraic(self) -> int:
        return self.n - self.rank

    def extended(self, k: int) -> np.ndarray:
        """M over the state (u, q) (n + k,) a solve with an integrand integrates: q' = g (identity)."""
        if not k:
            return self.matrix
        if self.matrix.ndim == 1:
            return np.concatenate([self.matrix, np.ones(k)])
        out = np.eye(self.n + k)
        out[: self.n, : self.n] = self.matrix
        return out

    @property
    def transposed(self) -> np.ndarray:
        """Mᵀ (a diagonal is its own)."""
        return self.matrix if self.matrix.ndim == 1 else self.matrix.T

    def times_transposed(self, v):
        """Mᵀ v (n,)."""
        M = jnp.asarray(self.matrix, v.dtype)
        return M * v if M.ndim == 1 else M.T @ v

    def solve(self, v, transposed: bool = False):
        """M⁺ v (n,), M's pseudo-inverse: the x in M's row space with M x = v, for v in M's range; with
        `transposed`, (Mᵀ)⁺ v, the x in M's column space with Mᵀ x = v."""
        if self.matrix.ndim == 1:
            nonzero = self.matrix != 0
            return jnp.where(nonzero, v / jnp.asarray(np.where(nonzero, self.matrix, 1.0), v.dtype), 0)
        U, s, Vt = np.linalg.svd(self.matrix)
        r = self.rank
        inverse = (U[:, :r] / s[:r]) @ Vt[:r]  # (Mᵀ)⁺ = U₁Σ⁻¹V₁ᵀ
        return jnp.asarray(inverse if transposed else inverse.T, v.dtype) @ v

    def __array__(self, dtype=None, copy=None):
        return self.matrix if dtype is None else self.matrix.astype(dtype)

    def __eq__(self, other):
        return (
            isinstance(other, MassMatrix)
            and self.matrix.shape == other.matrix.shape
            and bool(np.array_equal(self.matrix, other.matrix))
        )

    def __hash__(self):
        return hash((self.matrix.shape, self.matrix.tobytes()))

    def __repr__(self):
        kind = "diagonal" if self.matrix.ndim == 1 else "matrix"
        return f"MassMatrix({kind} of {self.n} states, {self.algebraic} algebraic)"


def dae_solver(solver: dfx.AbstractSolver, mass: MassMatrix | None, integrand_size: int = 0) -> dfx.AbstractSolver:
    """`solver` given the problem's mass matrix (extended over an integrand's entries): a Rosenbrock
    solver without one takes it; a solver that cannot take one, or one holding another, is refused
    with a ValueError naming the fix."""
    if getattr(solver, "takes_mass_matrix", False):
        held = solver.mass_matrix  # pyright: ignore[reportAttributeAccessIssue]  # a solver that takes one holds it
        if mass is None:
            if held is not None:
                raise ValueError(
                    f"solver={type(solver).__name__}(mass_matrix=...) but the problem has no mass matrix: "
                    "give it to the problem, sciad.ODEProblem(f, u0, tspan, p, mass_matrix=M), and "
                    f"pass {type(solver).__name__}() without one"
                )
            return solver
        if held is not None and MassMatrix.of(np.asarray(held), mass.n) != mass:
            raise ValueError(
                f"solver={type(solver).__name__}(mass_matrix=...) holds a mass matrix other than the "
                f"problem's: pass {type(solver).__name__}() and the problem's mass matrix is used"
            )
        # NumPy, not a JAX array: under jax.jit that would be traced, and the sensealgs read M at trace time
        # (`solver_mass`); the solver's steps make it a JAX array.
        matrix = np.asarray(mass.extended(integrand_size), jnp.result_type(float))
        return eqx.tree_at(lambda s: s.mass_matrix, solver, matrix, is_leaf=lambda x: x is None)
    if mass is None:
        return solver
    what = (
        f"a singular mass matrix (a DAE with {mass.algebraic} algebraic equation(s))"
        if mass.singular
        else "a mass matrix"
    )
    raise ValueError(f"{what} needs a solver that takes one: {DAE_SOLVERS}; {type(solver).__name__} solves u' = f only")


def default_solver(mass: MassMatrix | None, ode: str):
    """The solver used when none is given: `ode`, Rodas5P for a problem with a mass matrix."""
    return ode if mass is None else Rodas5P()


def check_initialization(initialization, mass: MassMatrix | None) -> str:
    """`initialization` checked ("consistent", "check", "none"; None: "consistent" where M is singular)."""
    if initialization is None:
        return "consistent" if mass is not None and mass.singular else "none"
    if not (isinstance(initialization, str) and initialization in INITIALIZATIONS):
        raise ValueError(f"initialization must be one of {list(INITIALIZATIONS)}, got {initialization!r}")
    return initialization


@dataclasses.dataclass(frozen=True)
class _Split:
    """The algebraic equations and states of a singular M (NumPy, computed once on the host):
    `index` (k,) where M is a diagonal, else orthonormal bases `equations` U₀ (n, k) and `states` V₀ (n, k)."""

    index: np.ndarray | None
    equations: np.ndarray | None
    states: np.ndarray | None

    @classmethod
    def of(cls, mass: MassMatrix) -> "_Split":
        if mass.matrix.ndim == 1:
            return cls(np.flatnonzero(mass.matrix == 0), None, None)
        U, _, Vt = np.linalg.svd(mass.matrix)
        return cls(None, U[:, mass.rank :], Vt[mass.rank :].T)

    def variables(self, u):
        """The algebraic part of u (k,)."""
        return u[self.index] if self.index is not None else jnp.asarray(self.states.T, u.dtype) @ u  # pyright: ignore[reportOptionalMemberAccess]  # index None: a full mass matrix's split

    def state(self, u0, z):
        """u0 with its algebraic part replaced by z (k,)."""
        if self.index is not None:
            return u0.at[self.index].set(z)
        V0 = jnp.asarray(self.states, u0.dtype)
        return u0 + V0 @ (z - V0.T @ u0)

    def residual(self, rate):
        """The algebraic equations' values (k,) from f (n,)."""
        return rate[self.index] if self.index is not None else jnp.asarray(self.equations.T, rate.dtype) @ rate  # pyright: ignore[reportOptionalMemberAccess]  # index None: a full mass matrix's split

    def transposed(self) -> "_Split":
        """The split of Mᵀ: its algebraic equations are M's algebraic states and the reverse."""
        return _Split(self.index, self.states, self.equations)


def _concrete(tree):
    """`tree` with its primal values where they are known now (eager `jax.grad`), else None (traced)."""
    values = jax.lax.stop_gradient(tree)
    return None if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(values)) else values


def initialise(mode: str, field, mass: MassMatrix | None, u0, p, t0, rtol: float, atol: float, what: str = "u0"):
    """u0 (n,) for the solve of M u' = field(u, p, t) from t0: with `mode` "consistent" (M singular),
    its algebraic part solved from its differential part (Newton, differentiated by the implicit
    function theorem; a failure raises `SolveError`); with "check", u0 itself, or a `SolveError`
    when its algebraic states are further from consistency than atol + rtol |u|; "none": u0. `what`
    names u0 in the errors (the state after an event's affect is initialised the same way)."""
    if mode == "none" or mass is None or not mass.singular:
        return u0
    split = _Split.of(mass)
    rate, n = field.open(), field.u.size

    def residual(z, args):
        u0, p, c, t = args
        return split.residual(rate(split.state(u0, z), p, c, t)[:n])

    args = (u0, p, field.held, jnp.asarray(t0, u0.dtype))
    z0 = split.variables(u0)
    solver = _algebraic_solver(residual, z0, args)
    if mode == "check":
        return _checked(residual, z0, args, u0, rtol, atol, solver, what)
    return split.state(u0, _solved(residual, z0, args, rtol, atol, INIT_FAILED.format(k=z0.size, what=what), solver))


def _solved(residual, z0, args, rtol: float, atol: float, failure: str, solver=None):
    """z (k,) with residual(z, args) = 0 by Newton from z0 at tolerances `NEWTON_TIGHTER` times rtol and atol
    (`solver`: `_algebraic_solver`'s), differentiated by the implicit function theorem; `SolveError(failure)`
    where it fails."""
    floor = 100 * float(jnp.finfo(z0.dtype).eps)  # a tolerance the dtype can meet
    # Cauchy termination (small corrections and residual): without it optimistix calls an iteration
    # that has not converged within two steps diverged, which a start far from the solution is.
    linear: dict[str, typing.Any] = {} if solver is None else dict(linear_solver=solver)
    newton = optx.Newton(rtol=max(rtol * NEWTON_TIGHTER, floor), atol=atol * NEWTON_TIGHTER, **linear)
    sol = optx.root_find(
        residual, newton, z0, args, max_steps=NEWTON_STEPS, throw=False, adjoint=optx.ImplicitAdjoint(**linear)
    )
    # A result short of the tightened tolerances (a residual whose rounding exceeds atol / 1000) stands
    # where "check" would accept it.
    ratio, _ = jax.lax.stop_gradient(_distance(residual, sol.value, args, rtol, atol, solver))
    failed = ((sol.result != optx.RESULTS.successful) & ~(ratio <= 1)) | ~jnp.all(jnp.isfinite(sol.value))
    return _refused(sol.value, failed, failure)


def _refused(x, pred, message: str):
    """`x`, or `SolveError(message)` where `pred` holds: now where `pred` is known, else when the
    program runs (`error_if`)."""
    known = _concrete(pred)
    if known is None:
        return error_if(x, pred, message)
    if np.any(known):
        raise SolveError(message)
    return x


INIT_FAILED = (
    "initialization='consistent': Newton's method did not solve the {k} algebraic equation(s) for the "
    f"algebraic states within {NEWTON_STEPS} iterations from {{what}} (diverged, or a singular ∂f/∂u on the algebraic "
    "states: the DAE is not index 1 there): start {what}'s algebraic states closer to a solution, or "
    "check the algebraic equations"
)
INCONSISTENT = (
    "initialization='check': {what} is not consistent: its algebraic states are {distance} from "
    "solving the {k} algebraic equation(s) (the Newton correction, against atol + rtol |u|){residual}: pass "
    "initialization='consistent' (the default with a singular mass matrix) to solve them from the "
    "differential states, or correct {what}"
)


def _algebraic_solver(residual, z0, args):
    """How Newton solves with the algebraic block ∂residual/∂z (k, k): None (dense) or, for at least
    `sciad._stiff.SPARSE_STATES` equations whose block has at most `SPARSE_DENSITY` of its entries
    structurally nonzero, the host's sparse LU (`sciad._stiff.HostSparseLU`, as the Rosenbrock
    solvers' sparse stages: a dense Newton on 500 algebraic states cost more than the solve itself)."""
    from sciad import _sparsity as sparsity
    from sciad._stiff import SPARSE_DENSITY, SPARSE_STATES, HostSparseLU, Sparse

    if z0.size < SPARSE_STATES:
        return None
    pattern = sparsity.jacobian_pattern(residual, z0, args)
    if pattern.density > SPARSE_DENSITY:
        return None
    # the block's own pattern: read off the Newton operator's product it would be dense (k² entries by VJPs)
    return HostSparseLU(Sparse(pattern=pattern.matrix))


def _distance(residual, z, args, rtol, atol, solver=None):
    """(the largest Newton correction of the algebraic states z over atol + rtol |z|, the residual's
    largest entry); the correction by `solver` (`_algebraic_solver`; None: dense)."""
    r = residual(z, args)
    if solver is None:
        step = jnp.linalg.solve(jax.jacfwd(residual)(z, args), r)
    else:
        step = lx.linear_solve(lx.JacobianLinearOperator(residual, z, args), r, solver, throw=False).value
    return jnp.max(jnp.abs(step) / (atol + rtol * jnp.abs(z)), initial=0.0), jnp.max(jnp.abs(r), initial=0.0)


def _checked(residual, z0, args, u0, rtol, atol, solver=None, what="u0", message=INCONSISTENT):
    """u0, or a `SolveError` (now where the values are known, else when the program runs) when the
    Newton correction of the algebraic states at u0 exceeds atol + rtol |u| somewhere (`what`: u0's name;
    `message`: `INCONSISTENT`'s fields)."""
    distance = functools.partial(_distance, residual, rtol=rtol, atol=atol, solver=solver)
    known = _concrete((z0, args))
    if known is not None:
        ratio, size = (float(x) for x in distance(*known))
        if not ratio <= 1:  # NaN too
            raise SolveError(
                message.format(
                    what=what,
                    distance=f"{ratio:.3g} tolerances",
                    k=z0.size,
                    residual=f"; the residual's largest entry is {size:.3e}",
                )
            )
        return u0
    ratio, _ = jax.lax.stop_gradient(distance(z0, args))
    return _refused(
        u0, ~(ratio <= 1), message.format(what=what, distance="more than the tolerances", k=z0.size, residual="")
    )


def consistent_derivative(mass: MassMatrix, rate, u, t):
    """u' (n,) of M u' = rate(u, t) at a consistent u (n,): what a save time's derivative is. Its part in
    M's row space is M⁺ f; along M's null space V₀ (a DAE's algebraic states) it solves the time
    derivative of the algebraic equations, U₀ᵀ (∂f/∂u u' + ∂f/∂t) = 0, whose block A = U₀ᵀ (∂f/∂u) V₀ is
    invertible (index 1): u' = M⁺f + V₀ b, A b = -U₀ᵀ (∂f/∂u M⁺f + ∂f/∂t). For M = diag(I, 0) and states
    (x, z), equations (f, h): x' = f, z' = -(∂h/∂z)⁻¹ (∂h/∂x x' + ∂h/∂t)."""
    rate_u = rate(u, t)
    row = mass.solve(rate_u)
    if not mass.singular:
        return row
    split = _Split.of(mass)
    _, moved = jax.jvp(lambda u, t: split.residual(rate(u, t)), (u, t), (row, jnp.ones_like(t)))
    block = jax.jacfwd(lambda z: split.residual(rate(split.state(u, z), t)))(split.variables(u))
    return split.state(row, -jnp.linalg.solve(block, moved))  # M⁺f has no part along V₀


# --- the fully implicit form F(u', u, t) = 0 (`sciad.DAEProblem`) --------------------------------------------------
# Its split is M's for M = ∂F/∂u' at (u0', u0), held for the solve (as IDAS holds its algebraic/differential `id`):
# U₀ spans the equations ∂F/∂u' does not see (U₀ᵀ F = 0 are the algebraic equations), V₀ the states it does not
# (V₀ᵀ u the algebraic states); F = M u' − f is the mass-matrix form. Index 1: A = U₀ᵀ (∂F/∂u) V₀ (k, k) is
# invertible. Along a solution the algebraic equations' time derivative, U₀ᵀ (∂F/∂u u' + ∂F/∂t) = 0, fixes u''s
# algebraic part; F = 0 fixes the rest.


def algebraic_block(mass: MassMatrix, jacobian: np.ndarray) -> np.ndarray:
    """A = U₀ᵀ J V₀ (k, k) of `mass`'s split for J (n, n) (NumPy): for J = ∂F/∂u, invertible for an index-1 DAE."""
    split = _Split.of(mass)
    if split.index is not None:
        return jacobian[np.ix_(split.index, split.index)]
    return split.equations.T @ jacobian @ split.states  # pyright: ignore[reportOptionalMemberAccess]  # a full split


def _moved(equations: _Split, residual, du, u, t):
    """The algebraic equations' time derivative U₀ᵀ (∂F/∂u u' + ∂F/∂t) (k,) at (u', u, t) (`equations`: the split
    transposed, its `variables` U₀ᵀ)."""
    return jax.jvp(lambda u, t: equations.variables(residual(du, u, t)), (u, t), (du, jnp.ones_like(t)))[1]


def implicit_derivative(mass: MassMatrix, residual, u, t, rtol: float, atol: float):
    """u' (n,) of residual(u', u, t) = 0 (n,) at a consistent u (n,), `mass` the split of ∂F/∂u': F = 0 with its
    algebraic equations replaced by their time derivative, solved by Newton from u' = 0 (one step where F is
    linear in u'), differentiated by the implicit function theorem. What a save time's derivative is, and the
    slope a BDF restarts from."""
    equations = _Split.of(mass).transposed() if mass.singular else None

    def system(du, args):
        u, t = args
        F = residual(du, u, t)
        return F if equations is None else equations.state(F, _moved(equations, residual, du, u, t))

    return _solved(system, jnp.zeros_like(u), (u, t), rtol, atol, DERIVATIVE_FAILED)


def initialise_implicit(mode: str, mass: MassMatrix, residual, u0, du0, t0, rtol: float, atol: float, what="u0"):
    """u0 (n,) for the solve of residual(u', u, t) = 0 from t0, `mass` the split of ∂F/∂u': "consistent" solves
    its algebraic states, with u' (from du0), from its differential ones (F = 0 and the algebraic equations'
    time derivative: Newton, differentiated by the implicit function theorem, a failure raising `SolveError`);
    "check" raises `SolveError` where (u0, du0) are further from F = 0 than atol + rtol |·| (the Newton
    correction of u0's algebraic states and du0, du0's algebraic part held); "none": u0."""
    if mode == "none" or not mass.singular:
        return u0
    split = _Split.of(mass)
    equations, k = split.transposed(), mass.algebraic

    def system(x, args):
        u0, du0, t = args
        z, du = x[:k], x[k:]
        u = split.state(u0, z)
        held = split.variables(du - du0) if mode == "check" else _moved(equations, residual, du, u, t)
        return jnp.concatenate([residual(du, u, t), held])

    x0 = jnp.concatenate([split.variables(u0), du0])
    args = (u0, du0, jnp.asarray(t0, u0.dtype))
    if mode == "check":
        return _checked(system, x0, args, u0, rtol, atol, what=what, message=INCONSISTENT_IMPLICIT)
    return split.state(u0, _solved(system, x0, args, rtol, atol, INIT_FAILED.format(k=k, what=what))[:k])


INCONSISTENT_IMPLICIT = (
    "initialization='check': {what} and du0 are not consistent: they are {distance} from solving F(du, u, p, t0) "
    "= 0 (the Newton correction of {what}'s {k} algebraic states and du0, against atol + rtol |·|){residual}: pass "
    "initialization='consistent' (the default) to solve {what}'s algebraic states and du0 from its differential "
    "states, or correct them"
)
DERIVATIVE_FAILED = (
    "Newton's method did not find the consistent u' from F(u', u, p, t) = 0 and its algebraic equations' time "
    "derivative (a singular ∂F/∂u on the algebraic states: the DAE is not index 1 there)"
)

# --- sensitivities and adjoints ---------------------------------------------------------------------
# M u' = f, index 1, J = ∂f/∂u. In M's split (`_Split`: M = U₁ΣV₁ᵀ, V₀ spanning its null space, U₀ its
# left null space), the algebraic equations are U₀ᵀ f = 0 and A = U₀ᵀ J V₀ (k, k) is invertible.
#
# Tangents. S = ∂u/∂x (direction dp in p) solves the sensitivity DAE M S' = J S + ∂f/∂p dp, and a
# consistent S solves its algebraic equations U₀ᵀ (J S + ∂f/∂p dp) = 0: S = V₁a + V₀b with
# b = -A⁻¹ U₀ᵀ (J V₁ a + ∂f/∂p dp). The consistent initial tangents are the derivative of the
# consistent initialisation (`initialise`: M's row-space part of u0 kept, the algebraic part solved),
# by its implicit function theorem (`consistent_tangents`).
#
# Adjoints. λ solves the adjoint DAE Mᵀ λ' = -Jᵀ λ - (∂g/∂u)ᵀ w_Q backwards (an integrand g with
# cotangent w_Q), whose algebraic equations are V₀ᵀ (Jᵀ λ + (∂g/∂u)ᵀ w_Q) = 0 in λ's algebraic part U₀ᵀλ
# (Mᵀ's null space is U₀: `_Split.transposed`). Along any consistent tangent,
#     d/dt (λᵀ M S) = λᵀ ∂f/∂p dp - w_Qᵀ (∂g/∂u) S,
# so λᵀ M S carries the loss back to t0, where ∂L/∂u0 = Mᵀ λ(t0) (`cotangent_u0`). A loss term wᵀ S(t_k)
# at a save time enters as a jump of λ (`adjoint_jump`): with S = V₁a + V₀b as above,
#     wᵀ S = w̃ᵀ V₁ a - νᵀ U₀ᵀ ∂f/∂p dp,   ν = A⁻ᵀ V₀ᵀ w,   w̃ = w - Jᵀ U₀ ν (V₀ᵀ w̃ = 0),
# and λᵀ M S = (Mᵀλ)ᵀ V₁ a, so Mᵀλ jumps by w̃ (λ by (Mᵀ)⁺ w̃, in Mᵀ's row space), ∂L/∂p gains
# -(∂f/∂p)ᵀ U₀ ν directly, and λ's algebraic part, which Mᵀ does not see, is solved from the adjoint's
# algebraic equations (linear in it: one Newton step). For a semi-explicit DAE (M = diag(I, 0), states
# (x, z), equations (f, h)) that is: ν = (∂h/∂z)⁻ᵀ w_z, λ_x += w_x - (∂h/∂x)ᵀ ν, ∂L/∂p -= (∂h/∂p)ᵀ ν, and
# λ_z = -(∂h/∂z)⁻ᵀ ((∂f/∂z)ᵀ λ_x + (∂g/∂z)ᵀ w_Q). Mᵀλ(t0) lies in M's row space, which the consistent
# initialisation keeps: its own derivative passes it on unchanged and adds nothing to ∂L/∂p, so the
# gradient is the same whether or not u0 was initialised here.


def solver_mass(solver, n: int) -> "MassMatrix | None":
    """The mass matrix over u (n,) of the problem `solver` solves: the first n rows and columns of
    a Rosenbrock solver's (`dae_solver` extends it over an integrand's entries), or None (u' = f)."""
    held = solver.mass_matrix if getattr(solver, "takes_mass_matrix", False) else None
    if held is None:
        return None  # NumPy (`dae_solver`, `with_mass`): known at trace time
    return MassMatrix.of(held[:n] if held.ndim == 1 else held[:n, :n], n)


def held_mass(solver) -> tuple:
    """(`solver` without its mass matrix, that matrix as a `MassMatrix`: a hashable constant, for a
    static field), or (`solver`, None) where it holds none; `released_mass` gives the solver back."""
    held = solver.mass_matrix if getattr(solver, "takes_mass_matrix", False) else None
    if held is None:
        return solver, None
    return eqx.tree_at(lambda s: s.mass_matrix, solver, None), MassMatrix(np.array(held))


def released_mass(solver, mass: MassMatrix):
    """`solver` holding `mass`'s matrix again (NumPy; `held_mass`)."""
    return eqx.tree_at(lambda s: s.mass_matrix, solver, mass.matrix, is_leaf=lambda x: x is None)


def with_mass(solver, blocks):
    """`solver` (a Rosenbrock solver) for a state of several parts, flattened in order, each part's
    mass matrix in `blocks` (NumPy): an int s (the identity on s entries), a diagonal (s,) or a matrix
    (s, s). A diagonal over the whole state where every part's is one, else the dense block diagonal."""
    dtype = jnp.result_type(float)
    parts = [np.ones((b,), dtype) if isinstance(b, int) else np.asarray(b, dtype) for b in blocks]
    if any(b.ndim == 2 for b in parts):
        matrix = np.zeros((sum(b.shape[0] for b in parts),) * 2, dtype)
        start = 0
        for b in parts:
            end = start + b.shape[0]
            matrix[start:end, start:end] = b if b.ndim == 2 else np.diag(b)
            start = end
    else:
        matrix = np.concatenate(parts)
    return eqx.tree_at(lambda s: s.mass_matrix, solver, matrix, is_leaf=lambda x: x is None)


def consistent_tangents(field, mass: MassMatrix, u0, p, t0, du0, dp, rtol: float, atol: float):
    """Consistent tangents (c, n) of the initial state in the directions du0 (c, n), dp (c, m): the
    derivative of `initialise`'s consistent u0 (the implicit function theorem at u0, consistent), so
    u0's row-space part is kept and the algebraic part solves the linearised algebraic equations."""
    _, tangent = jax.linearize(lambda u0, p: initialise("consistent", field, mass, u0, p, t0, rtol, atol), u0, p)
    return jax.vmap(tangent)(du0, dp)


def adjoint_jump(mass: MassMatrix, lam, w, pullback, rate):
    """(λ⁺, ∂L/∂p's increment (m,) or None) at a save time where the loss has ∂L/∂u = w (n,), λ (n,)
    arriving from later times: Mᵀλ jumps by w - Jᵀ U₀ ν, ∂L/∂p by -(∂f/∂p)ᵀ U₀ ν (ν = A⁻ᵀ V₀ᵀ w), and
    λ's algebraic part solves the adjoint's algebraic equations (see above). `pullback(v)` gives
    (Jᵀ v, (∂f/∂p)ᵀ v) at u(t_k); `rate(λ)`, Jᵀλ + (∂g/∂u)ᵀ w_Q with the integral's cotangent on the
    interval before t_k (minus λ's rate in Mᵀ λ' = …)."""
    if not mass.singular:
        return lam + mass.solve(w, transposed=True), None
    split = _Split.of(mass).transposed()  # λ's algebraic states U₀ᵀλ, its equations V₀ᵀ(·)
    directions = jax.vmap(lambda e: split.state(jnp.zeros_like(lam), e))(jnp.eye(mass.algebraic, dtype=lam.dtype))
    G, P = jax.vmap(pullback)(directions)  # rows Jᵀ U₀ e_i (k, n) and (∂f/∂p)ᵀ U₀ e_i (k, m)
    factors = jax.scipy.linalg.lu_factor(jax.vmap(split.residual)(G).T)  # V₀ᵀ Jᵀ U₀ = Aᵀ (k, k)
    nu = jax.scipy.linalg.lu_solve(factors, split.residual(w))
    lam = lam + mass.solve(w - nu @ G, transposed=True)
    algebraic = split.variables(lam) - jax.scipy.linalg.lu_solve(factors, split.residual(rate(lam)))
    return split.state(lam, algebraic), -(nu @ P)


def cotangent_u0(mass: MassMatrix, lam):
    """∂L/∂u0 from λ(t0) (n,): Mᵀλ (see above)."""
    return mass.times_transposed(lam)
