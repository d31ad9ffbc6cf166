"""A variable-order BDF (orders 1–5) for M u' = f(u, p, t) with a constant mass matrix M, or for a fully implicit
DAE F(u', u, t) = 0 (a `ResidualTerm`), as a diffrax solver.

The method is the NDF form of Shampine & Reichelt's ode15s (MATLAB; SciPy's `scipy.integrate.BDF`
is the same method) with a quasi-constant step size. The solver's state keeps the backward
differences D (MAX_ORDER + 3 rows over the flattened state) of the interpolating polynomial through
the last steps, scaled to the last step size h; a step of another size first rescales them (D ← (RU)ᵀ D,
Shampine & Reichelt's change of basis). A step of order k predicts y⁽⁰⁾ = Σ_{j≤k} D_j and solves

    M (d + ψ) = (h/α_k) f(t_{n+1}, y⁽⁰⁾ + d),   ψ = Σ_{1≤j≤k} γ_j D_j / α_k,   α_k = (1 − κ_k) γ_k,

for the correction d = y_{n+1} − y⁽⁰⁾ by a chord Newton iteration with W = M − (h/α_k) J. A fully implicit DAE
F(u', u, t) = 0 (a `ResidualTerm`) is the same step with that equation written as its residual: it solves
(h/α_k) F((α_k/h)(d + ψ), y⁽⁰⁾ + d, t_{n+1}) = 0, which is M (d + ψ) − (h/α_k) f for F = M u' − f, with
W = ∂F/∂u' + (h/α_k) ∂F/∂u (the pair (∂F/∂u', ∂F/∂u) kept in place of J; dense stages only). J = ∂f/∂u and
W's factorisation are kept in the state across steps: W is refactorised when h/α_k has moved by more
than `REFACTOR_RATIO` since its LU (CVODE's rule; an order change enters through α_k), and when the
iteration fails to converge: first W refactorised with the same J (where it was made for another h/α_k),
then J re-evaluated at the prediction, and only then the step rejected (halved). `Linearisation` counts
both. A rejected step returns the state to retry from, its differences as they were with the Jacobian and
LU its attempt made (`rejects_itself`: sciad's loop keeps it). J and W are dense (n, n), or with `stage_jacobian` a
`sciad.stiff.Sparse` their entries on W's pattern (J's, detected from f's jaxpr or given, ∪ M's ∪ I):
J's by one Jacobian-vector product per colour, W's solved by SciPy's sparse LU on the host (band storage
for a banded pattern), which holds W's factorisation and finds it again by its entries (`sciad._host_lu`):
keeping W's entries in the state keeps its factorisation.

Order and step size. The solver chooses them, as SciPy's BDF does: its error estimate at order k is
E_k d (E the NDF's error constants), scaled as diffrax's controllers scale errors (atol + rtol ·
max(|y0|, |y1|)); a step is accepted when its RMS norm is ≤ 1; after k + 1 steps of one size, the norms
at orders k − 1, k, k + 1 (from D_k and D_{k+2}) each propose a step (norm^(−1/(order+1))) and the best
sets the next order and step, within [MIN_FACTOR, MAX_FACTOR] and a safety factor. Step-size control
with a fixed `error_order` (diffrax's PIDController) cannot follow an order that changes, holds the
step for k + 1 steps, or shrinks an accepted step, so the step's error output carries the solver's
verdict instead (every entry: the next step's ratio to this one, negated where the step is rejected)
and `BDFController`, which `BDF` declares as its `step_controller` (read by
`sciad.adjoints.step_controller`), applies it; its rtol, atol and norm reach the solver as diffrax's
implicit solvers get them (`root_finder`, filled in by sciad's `Stepper` and by diffrax.diffeqsolve).

Derivative. The correction d is the root of the NDF's equation, differentiated by the implicit function
theorem (`_correction`'s rule, as optimistix's `ImplicitAdjoint`): its tangent solves with W at the
converged root and the true Jacobian there (sparse too: `Sparse.stage_solver` of the residual), never
through the Newton iterates or the kept (stale) factorisation. Forward and reverse mode both enter a step
(reverse mode by transposing that linear solve); the order, the counters, J and the LU carry no derivative.

    solver = sciad.BDF(mass_matrix=jnp.array([1.0, 1.0, 0.0]))
    sciad.solve(prob, solver=solver, rtol=1e-8, atol=1e-10)   # or solver="bdf"
"""

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import diffrax as dfx
import equinox as eqx
import jax
import jax.flatten_util as jfu
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import lineax as lx
import numpy as np
import optimistix as optx

from sciad._diffrax_internals import use_stepsize_tol
from sciad._equinox_internals import unvmap_any
from sciad._host_lu import HostLU, lu_solve
from sciad._rosenbrock import StepPolynomial, checked_mass_matrix, mass_operator, mass_pattern

MAX_ORDER = 5
NEWTON_MAXITER = 4  # chord iterations per attempt (`BDF.root_find_max_steps`'s default)
MIN_FACTOR, MAX_FACTOR = 0.2, 10.0  # a proposed step's ratio to the last, at least and at most
NEWTON_FAILURE_FACTOR = 0.5  # the step after one whose iteration failed with a fresh J and LU
REFACTOR_RATIO = 0.3  # W refactorised when h/α_k moved by more than this share since its LU (CVODE's)

_KAPPA = np.array([0, -0.1850, -1 / 9, -0.0823, -0.0415, 0])  # NDF's κ_k (k = 0..5; Shampine & Reichelt)
_GAMMA = np.concatenate([[0.0], np.cumsum(1 / np.arange(1, MAX_ORDER + 1))])  # γ_k = Σ_{j≤k} 1/j
_ALPHA = (1 - _KAPPA) * _GAMMA
_ERROR_CONST = _KAPPA * _GAMMA + 1 / np.arange(1, MAX_ORDER + 2)


def _change_of_basis(factor):
    """R (MAX_ORDER + 1, MAX_ORDER + 1) of Shampine & Reichelt for the step ratio `factor`: the differences of
    the same polynomial at spacing factor · h are (RU)ᵀ D, U = R(1)."""
    i = jnp.arange(1, MAX_ORDER + 1, dtype=factor.dtype)[:, None]
    j = jnp.arange(1, MAX_ORDER + 1, dtype=factor.dtype)[None, :]
    m = jnp.ones((MAX_ORDER + 1, MAX_ORDER + 1), factor.dtype)
    m = m.at[1:, 0].set(0).at[1:, 1:].set((i - 1 - factor * j) / i)
    return jnp.cumprod(m, axis=0)


def rescaled(D, order, factor):
    """D (MAX_ORDER + 3, n) for a step `factor` times as long: rows 0..order rescaled, the rest as they are."""
    rows = jnp.arange(MAX_ORDER + 1)
    inside = (rows[:, None] <= order) & (rows[None, :] <= order)
    R = jnp.where(inside, _change_of_basis(factor), 0)
    U = jnp.where(inside, _change_of_basis(jnp.ones((), factor.dtype)), 0)
    RU = jnp.where(inside, R @ U, jnp.eye(MAX_ORDER + 1, dtype=D.dtype))
    return D.at[: MAX_ORDER + 1].set(RU.T @ D[: MAX_ORDER + 1])


class BDFInterpolation(StepPolynomial):
    """The step's interpolating polynomial on [t0, t1], of the step's order k: with θ = (t − t1)/(t1 − t0),
    y(t) = D_0 + Σ_{j≥1} D_j Π_{m<j} (θ + m)/(m + 1). `D`: the state's structure with a leading axis
    MAX_ORDER + 1 (the differences after the step, zero past k)."""

    t0: Any
    t1: Any
    D: Any

    def at(self, theta):
        def leaf(D):
            th = theta.astype(D.dtype) - 1  # from t1
            m = jnp.arange(MAX_ORDER, dtype=D.dtype)
            weights = jnp.cumprod((th + m) / (m + 1))
            return D[0] + jnp.tensordot(weights, D[1:], axes=1)

        return jax.tree.map(leaf, self.D)


class Linearisation(eqx.Module):
    """What the chord iteration solves with, kept across steps: J = ∂f/∂u where last evaluated, W = M − c J
    factorised for the c = h/α_k in it, and how many factorisations and Jacobian evaluations the solve has
    made (floats). Dense: J (n, n) and W's LU factors (n, n) and pivots (n,) (as floats); sparse: J's and
    W's entries (nnz,) on W's pattern (the host's LU of W found again by them)."""

    jacobian: jax.Array
    factors: Any
    c: jax.Array
    factorisations: jax.Array
    jacobians: jax.Array


class BDFState(eqx.Module):
    """The solver's state between steps: the differences D (MAX_ORDER + 3, n) scaled to the step size `h`,
    the `order` and the `steps` taken at this order and step size (floats), and the `linearisation`."""

    D: jax.Array
    h: jax.Array
    order: jax.Array
    steps: jax.Array
    linearisation: Linearisation


class NewtonTolerances(eqx.Module):
    """The chord iteration's rtol, atol and norm: the step-size controller's unless given (as diffrax's
    implicit solvers take them from their root finder). It converges where the iterates' progress
    predicts a remaining correction below max(10 ε/rtol, min(0.03, √rtol)) in this norm (SciPy's)."""

    rtol: Any = use_stepsize_tol
    atol: Any = use_stepsize_tol
    norm: Any = use_stepsize_tol


class BDFController(dfx.AbstractAdaptiveStepSizeController):
    """Applies `BDF`'s own choice of step: its step's error output holds, in every entry, the next step's
    ratio to this one, negated where the step is rejected (a non-finite one rejects it with MIN_FACTOR).
    The first step is diffrax's PIDController's at rtol, atol and `norm`, which the solver's chord
    iteration and error estimate take as well."""

    rtol: float
    atol: float
    norm: Any = optx.rms_norm

    def wrap(self, direction):
        return self

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        return dfx.PIDController(rtol=self.rtol, atol=self.atol, norm=self.norm).init(
            terms, t0, t1, y0, dt0, args, func, error_order
        )

    def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state):
        code = jfu.ravel_pytree(y_error)[0][0]
        finite = jnp.isfinite(code)
        keep = finite & (code > 0)
        factor = jax.lax.stop_gradient(jnp.where(finite, jnp.abs(code), MIN_FACTOR))
        dt = (t1 - t0) * factor.astype(jnp.result_type(t1))
        next_t0 = jnp.where(keep, t1, t0)
        return keep, next_t0, next_t0 + dt, False, controller_state, dfx.RESULTS.successful


class _Mass(eqx.Module):
    """The solver's `mass_matrix` M over the flattened state (None: I; (n,): its diagonal; (n, n)), taken as I
    where `identity` holds: diffrax steps the finished members of a vmapped solve with t0 = t1 and discards
    the result; there W = M is singular for a DAE, and I gives the same d = 0."""

    matrix: jax.Array | None
    identity: jax.Array

    def __call__(self, v):
        """M v (n,)."""
        return jnp.where(self.identity, v, mass_operator(self.matrix, v.size, v.dtype)[1](v))

    def dense(self, n: int, dtype):
        """M (n, n)."""
        return jnp.where(self.identity, jnp.eye(n, dtype=dtype), mass_operator(self.matrix, n, dtype)[0])

    def entries(self, rows, cols, dtype):
        """M's entries (nnz,) at a pattern's `rows`, `cols` (nnz,)."""
        diagonal = jnp.asarray(rows == cols, dtype)
        M = self.matrix
        if M is None:
            values = diagonal
        elif M.ndim == 1:
            values = diagonal * M.astype(dtype)[rows]
        else:
            values = M.astype(dtype)[rows, cols]
        return jnp.where(self.identity, diagonal, values)


class _AbstractDenseStages(eqx.Module):
    """W as a dense matrix, its LU factors (n, n) and pivots (n,) (as floats) kept."""

    mass: eqx.AbstractVar[_Mass]

    @abc.abstractmethod
    def matrix(self, jacobian, c):
        """W (n, n) for c = h/α from the kept `jacobian`."""

    def factorised(self, jacobian, c):
        """W factorised."""
        lu, pivots = jsl.lu_factor(self.matrix(jacobian, c))
        return lu, pivots.astype(c.dtype)

    def solve(self, factors, b):
        """W⁻¹ b (n,) by W's factors."""
        lu, pivots = factors
        return jsl.lu_solve((lu, pivots.astype(jnp.int32)), b)

    def implicit_solve(self, residual, d, inputs, b):
        """x with (∂residual/∂d at (d, inputs)) x = b, linear in b and transposable (reverse mode)."""
        return lx.linear_solve(lx.MatrixLinearOperator(jax.jacfwd(residual)(d, inputs)), b, lx.LU()).value


class _DenseStages(_AbstractDenseStages):
    """W = M − c J, J (n, n) by forward mode."""

    mass: _Mass

    def jacobian(self, rate, y):
        """J = ∂rate/∂y at y (n,)."""
        return jax.jacfwd(rate)(y)

    def matrix(self, jacobian, c):
        return self.mass.dense(jacobian.shape[0], jacobian.dtype) - c * jacobian


class _ResidualStages(_AbstractDenseStages):
    """W = ∂F/∂u' + c ∂F/∂u from the kept pair (∂F/∂u', ∂F/∂u) (2, n, n) (I where the mass's `identity` holds)."""

    mass: _Mass

    def matrix(self, jacobian, c):
        n = jacobian.shape[-1]
        return jnp.where(self.mass.identity, jnp.eye(n, dtype=jacobian.dtype), jacobian[0] + c * jacobian[1])


class _SparseStages(eqx.Module):
    """W = M − c J by their entries (nnz,) on W's pattern (`Sparse.factorisable`: J's ∪ M's ∪ I, symmetrised):
    J's by one JVP per colour, W's solved by the host's sparse LU, which holds W's factorisation and finds it
    again by its entries."""

    mass: _Mass
    stage_jacobian: Any  # a sciad.stiff.Sparse
    colouring: Any = eqx.field(static=True)
    lu: HostLU = eqx.field(static=True)

    def jacobian(self, rate, y):
        """J's entries (nnz,) at y (n,)."""
        return self.colouring.jacobian_values(rate, y)

    def factorised(self, jacobian, c):
        """W's entries (nnz,): the host factorises W at its first solve."""
        return self.mass.entries(self.lu.rows, self.lu.cols, jacobian.dtype) - c * jacobian

    def solve(self, factors, b):
        """W⁻¹ b (n,) by W's entries."""
        return lu_solve(self.lu, factors, b)

    def implicit_solve(self, residual, d, inputs, b):
        """x with (∂residual/∂d at (d, inputs)) x = b by the host's LU of that matrix (its entries by coloured
        JVPs of the residual), linear in b and transposable (reverse mode: the transposed solve)."""
        dynamic, static = eqx.partition(inputs, eqx.is_array)

        def fn(d, dynamic):
            return residual(d, eqx.combine(dynamic, static))

        also = mass_pattern(self.mass.matrix)
        operator, solver, state = self.stage_jacobian.stage_solver(fn, d, dynamic, also=also)
        return lx.linear_solve(operator, b, solver, state=state).value


def _factorised(lin: Linearisation, stages, c):
    """`lin` with W = M − c J factorised."""
    factors = stages.factorised(lin.jacobian, c)
    return Linearisation(lin.jacobian, factors, c, lin.factorisations + 1, lin.jacobians)


def _newton(inputs):
    """(d, (converged, iterations, linearisation)): the NDF's correction by the chord iteration, retried
    with W refactorised (where made for another c), then with J re-evaluated at the prediction, before giving up."""
    solver, field, t, control, y_pred, psi, alpha, stages, lin = inputs
    c = jnp.asarray(control, y_pred.dtype) / alpha
    tol = solver.root_finder
    rtol, atol, norm = tol.rtol, tol.atol, tol.norm
    maxiter = solver.root_find_max_steps
    eps = jnp.finfo(y_pred.dtype).eps
    newton_tol = jnp.maximum(10 * eps / rtol, jnp.minimum(0.03, jnp.sqrt(rtol)))
    scale = atol + rtol * jnp.abs(y_pred)

    def chord(lin):
        def going(carry):
            i, _, _, converged, diverged = carry
            return (i < maxiter) & ~converged & ~diverged

        def iteration(carry):
            i, d, old, _, _ = carry
            dy = stages.solve(lin.factors, -_ndf_residual(d, inputs))
            size = norm(dy / scale)
            rate = size / old
            diverged = ~jnp.isfinite(size) | (
                (i > 0) & ((rate >= 1) | (rate ** (maxiter - i) / (1 - rate) * size > newton_tol))
            )
            d = jnp.where(diverged, d, d + dy)
            converged = ~diverged & ((size == 0) | ((i > 0) & (rate / (1 - rate) * size < newton_tol)))
            return i + 1, d, size, converged, diverged

        no = jnp.asarray(False)
        start = (jnp.asarray(0), jnp.zeros_like(y_pred), jnp.asarray(jnp.inf, y_pred.dtype), no, no)
        i, d, _, converged, _ = jax.lax.while_loop(going, iteration, start)
        return d, converged, i

    def attempt(carry):
        lin, fresh_lu, fresh_jacobian, _, _, _, _ = carry
        d, converged, iterations = chord(lin)
        new_jacobian = ~converged & fresh_lu & ~fresh_jacobian
        refactorise = ~converged & (~fresh_lu | new_jacobian)
        lin = jax.lax.cond(
            new_jacobian,
            lambda: eqx.tree_at(
                lambda s: (s.jacobian, s.jacobians),
                lin,
                (field.linearised(stages, t, y_pred, psi / jnp.where(c == 0, 1, c)), lin.jacobians + 1),
            ),
            lambda: lin,
        )
        lin = jax.lax.cond(refactorise, lambda: _factorised(lin, stages, c), lambda: lin)
        done = converged | ~refactorise
        return lin, fresh_lu | refactorise, fresh_jacobian | new_jacobian, converged, d, iterations, done

    stale = ~(jnp.abs(c - lin.c) <= REFACTOR_RATIO * jnp.abs(lin.c))
    lin = jax.lax.cond(stale, lambda: _factorised(lin, stages, c), lambda: lin)
    no = jnp.asarray(False)
    # W made for this c already (refactorising it with the same J would give the same W): a failure re-evaluates J
    start = (lin, stale | (c == lin.c), no, no, jnp.zeros_like(y_pred), jnp.asarray(0), no)
    lin, _, _, converged, d, iterations, _ = jax.lax.while_loop(lambda s: ~s[-1], attempt, start)
    return d, (converged.astype(y_pred.dtype), iterations.astype(y_pred.dtype), lin)


def _ndf_residual(d, inputs):
    """(h/α) F((α/h)(d + ψ), y⁽⁰⁾ + d, t) (for M u' = f: M (d + ψ) − (h/α) f(t, y⁽⁰⁾ + d)): zero at the step's
    correction d."""
    _, field, t, control, y_pred, psi, alpha, stages, _ = inputs
    return field.ndf(stages, t, y_pred + d, d + psi, control, alpha)


@eqx.filter_custom_jvp
def _correction(inputs):
    """`_newton`'s (d, (converged, iterations, linearisation)), d differentiated as the root of
    `_ndf_residual` (the implicit function theorem: its tangent solves with ∂residual/∂d at d itself,
    W = M − (h/α) J (or ∂F/∂u' + (h/α) ∂F/∂u) there, dense or sparse as the iteration's); the rest carries no
    derivative."""
    return _newton(inputs)


@_correction.def_jvp
def _correction_jvp(primals, tangents):
    (inputs,), (t_inputs,) = primals, tangents
    d, aux = _correction(inputs)
    none = lambda x: x is None  # noqa: E731
    nondiff, diff = eqx.partition(inputs, jax.tree.map(none, t_inputs, is_leaf=none), is_leaf=none)
    _, t_residual = jax.jvp(lambda diff: _ndf_residual(d, eqx.combine(diff, nondiff)), (diff,), (t_inputs,))
    stages = inputs[7]
    t_d = -stages.implicit_solve(_ndf_residual, d, inputs, t_residual)
    return (d, aux), (t_d, jax.tree.map(jnp.zeros_like, aux))


class _Field(eqx.Module):
    """M u' = f(t, u) over the flattened state: the term's rate f(t, y) and the NDF's residual."""

    terms: Any
    args: Any
    unravel: Any = eqx.field(static=True)

    def rate(self, t, y):
        return jfu.ravel_pytree(self.terms.vf(t, self.unravel(y), self.args))[0]

    def ndf(self, stages, t, y, z, control, alpha):
        """c F(z / c, y) for F(u', u) = M u' − f(t, u) and c = h/α: M z − (h/α) f(t, y) (n,)."""
        increment = jfu.ravel_pytree(self.terms.vf_prod(t, self.unravel(y), self.args, control))[0]
        return stages.mass(z) - increment / alpha

    def linearised(self, stages, t, y, du):
        """J = ∂f/∂u at y (u' unused): W = M − c J."""
        return stages.jacobian(lambda y: self.rate(t, y), y)


class _Implicit(_Field):
    """F(u', u, t) = 0 over the flattened state (a `ResidualTerm`): the consistent u' at y (`rate`, the term's
    `vf`), the residual and the NDF's residual."""

    def residual(self, t, y, du):
        return jfu.ravel_pytree(self.terms.residual(t, self.unravel(y), self.unravel(du), self.args))[0]

    def ndf(self, stages, t, y, z, control, alpha):
        """c F(z / c, y) for c = h/α (n,) (z where c = 0: a finished member of a vmapped solve, W = I)."""
        c = jnp.asarray(control, y.dtype) / alpha
        safe = jnp.where(c == 0, 1, c)
        return jnp.where(c == 0, z, safe * self.residual(t, y, z / safe))

    def linearised(self, stages, t, y, du):
        """(∂F/∂u', ∂F/∂u) (2, n, n) at (u', y) (u' None: the consistent one): W = ∂F/∂u' + c ∂F/∂u."""
        du = self.rate(t, y) if du is None else du
        return jnp.stack(jax.jacfwd(lambda du, y: self.residual(t, y, du), argnums=(0, 1))(du, y))


class ResidualTerm(dfx.AbstractTerm):
    """A fully implicit DAE F(u', u, t) = 0 as the term `BDF` steps: `residual(t, y, u', args)` (y's structure)
    and `derivative(t, y, args)`, the consistent u' at y, which is the term's `vf` (a restart's slope, the first
    step's size)."""

    residual: Callable
    derivative: Callable

    def vf(self, t, y, args):
        return self.derivative(t, y, args)

    def contr(self, t0, t1, **kwargs):
        return t1 - t0

    def prod(self, vf, control):
        return jax.tree.map(lambda v: v * control, vf)


class BDF(dfx.AbstractImplicitSolver, dfx.AbstractAdaptiveSolver):
    """Variable-order BDF (1–5, NDF form, quasi-constant step size; Shampine & Reichelt) for stiff ODEs and
    index-1 DAEs M u' = f, M the `mass_matrix`: None (the identity), a vector (n,) (its diagonal) or a
    matrix (n, n) over the flattened state; orders up to `max_order` (1–5). The Jacobian and W = M − (h/α_k) J's
    factorisation are kept across steps and remade only when the step or order moves W far or the chord
    iteration fails: dense, or with `stage_jacobian` a `sciad.stiff.Sparse` (`jacobian="sparse"`) sparse, its
    LU on the host. It chooses its own order and steps (`BDFController`, its `step_controller`). Any term
    whose `vf_prod` is its `vf` times the step (`diffrax.ODETerm`) steps with it, and a `ResidualTerm`, a fully
    implicit DAE F(u', u, t) = 0 (without a mass matrix; dense stages)."""

    mass_matrix: jax.Array | None = eqx.field(default=None, converter=checked_mass_matrix)
    root_finder: NewtonTolerances = NewtonTolerances()  # pyright: ignore[reportIncompatibleVariableOverride]  # tolerances only
    root_find_max_steps: int = eqx.field(default=NEWTON_MAXITER, static=True)  # chord iterations per attempt
    max_order: int = eqx.field(default=MAX_ORDER, static=True)
    stage_jacobian: Any = None  # None (dense) or a sciad.stiff.Sparse

    term_structure: ClassVar = dfx.AbstractTerm
    interpolation_cls: ClassVar = BDFInterpolation
    # Its capabilities, read where they matter (`sciad._dae`; `sciad._stiff.stiff_solver`: the `jacobian=` kinds its
    # `stage_jacobian` takes, a matrix-free solve keeping nothing across steps; `sciad.adjoints.step_controller`;
    # `sciad.adjoints._loop`: a rejected step's state, with the Jacobian and LU its attempt made, is kept;
    # `sciad._auto`: its steps' derivatives solve at each root with its own stage solves, sparse where they are).
    takes_mass_matrix: ClassVar[bool] = True
    stage_jacobians: ClassVar[tuple[str, ...]] = ("dense", "sparse")
    step_controller: ClassVar[type] = BDFController
    rejects_itself: ClassVar[bool] = True
    root_derivative: ClassVar[bool] = True
    takes_residual: ClassVar[bool] = True  # steps a `ResidualTerm` (`sciad._dae_problem`)

    def __check_init__(self):
        if not (isinstance(self.max_order, int) and 1 <= self.max_order <= MAX_ORDER):
            raise ValueError(f"BDF(max_order=...) must be an int from 1 to {MAX_ORDER}, got {self.max_order!r}")

    def order(self, terms):
        return self.max_order

    def error_order(self, terms):
        return 2  # the first step's, at order 1 (the controller's first step size)

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)

    def init(self, terms, t0, t1, y0, args):
        flat, unravel = jfu.ravel_pytree(y0)
        field = self._field(terms, args, unravel)
        h = jnp.asarray(t1 - t0, flat.dtype)
        stages = self._stages(terms, t0, args, flat, unravel, False)
        jacobian = jax.lax.stop_gradient(field.linearised(stages, t0, flat, None))
        zero = jnp.zeros((), flat.dtype)
        factors = jax.tree.map(jnp.zeros_like, jax.eval_shape(lambda: stages.factorised(jacobian, zero)))
        lin = Linearisation(jacobian, factors, zero, zero, zero + 1)  # c = 0: factorised at the first step
        return BDFState(self._restarted(field, t0, flat, h), h, zero + 1, zero, lin)

    def _field(self, terms, args, unravel):
        """The equation the steps solve: M u' = f (`_Field`), or F(u', u, t) = 0 for a `ResidualTerm` (`_Implicit`)."""
        if getattr(terms, "residual", None) is None:
            return _Field(terms, args, unravel)
        if self.mass_matrix is not None or self.stage_jacobian is not None:
            raise ValueError(
                "BDF steps a fully implicit DAE F(u', u, t) = 0 without a mass matrix (F holds it) and with dense "
                "stages: pass sciad.BDF() (jacobian='dense')"
            )
        return _Implicit(terms, args, unravel)

    def _stages(self, terms, t, args, flat, unravel, identity):
        """How a step's chord iteration forms and solves with W = M − c J (M taken as I where `identity`):
        densely, or by `stage_jacobian` on W's pattern, J's detected from f's jaxpr at t over the flattened
        state (its arrays passed explicitly, so that detection reads the step's jaxpr rather than captured
        values) ∪ M's; for a `ResidualTerm`, W = ∂F/∂u' + c ∂F/∂u densely."""
        mass = _Mass(self.mass_matrix, jnp.asarray(identity))
        if getattr(terms, "residual", None) is not None:
            return _ResidualStages(mass)
        if self.stage_jacobian is None:
            return _DenseStages(mass)
        dynamic, static = eqx.partition((terms, t, args), eqx.is_array)

        def rate(y, dynamic):
            terms, t, args = eqx.combine(dynamic, static)
            return jfu.ravel_pytree(terms.vf(t, unravel(y), args))[0]

        colouring, lu = self.stage_jacobian.factorisable(rate, flat, dynamic, also=mass_pattern(self.mass_matrix))
        return _SparseStages(mass, self.stage_jacobian, colouring, lu)

    def _restarted(self, field, t0, flat, h):
        """D at order 1 from y (n,): [y, h u'], u' solving M u' = f(t0, y) (least squares where M is singular; a
        `ResidualTerm`'s consistent u')."""
        f0 = field.rate(t0, flat)
        M = self.mass_matrix
        if M is None:
            slope = f0
        elif M.ndim == 1:
            M = M.astype(flat.dtype)
            slope = jnp.where(M == 0, 0, f0 / jnp.where(M == 0, 1, M))
        else:
            slope = jnp.linalg.pinv(M.astype(flat.dtype)) @ f0
        D = jnp.zeros((MAX_ORDER + 3, flat.size), flat.dtype)
        return D.at[0].set(flat).at[1].set(h * slope)

    def step(self, terms, t0, t1, y0, args, solver_state: BDFState, made_jump):
        tol = self.root_finder
        if any(x is use_stepsize_tol for x in (tol.rtol, tol.atol, tol.norm)):
            raise ValueError(
                "BDF takes its rtol, atol and norm from its step-size controller: step it with sciad.solve, "
                "or with diffrax.diffeqsolve(..., stepsize_controller=sciad.BDF.step_controller(rtol=..., atol=...))"
            )
        flat, unravel = jfu.ravel_pytree(y0)
        dtype = flat.dtype
        field = self._field(terms, args, unravel)
        control = terms.contr(t0, t1)
        dt = jnp.asarray(t1 - t0, dtype)
        stages = self._stages(terms, t1, args, flat, unravel, dt == 0)
        state = solver_state
        # after a jump (an event's), from y alone at order 1
        restart = jnp.asarray(made_jump)
        D = jax.lax.cond(
            unvmap_any(restart),
            lambda: jnp.where(restart, self._restarted(field, t0, flat, dt), state.D),
            lambda: state.D,
        )
        h = jnp.where(restart, dt, state.h)
        order = jax.lax.stop_gradient(jnp.where(restart, 1, state.order))
        steps = jax.lax.stop_gradient(jnp.where(restart, 0, state.steps))
        lin = jax.lax.stop_gradient(state.linearisation)
        D = D.at[0].set(flat)

        # the differences for this step's size: a step of another size than the last restarts the count
        ratio = jnp.where(h == 0, 1, dt / jnp.where(h == 0, 1, h))
        D = rescaled(D, order, ratio)
        eps = jnp.finfo(dtype).eps
        steps = jnp.where(jnp.abs(dt - h) <= 16 * eps * (jnp.abs(jnp.asarray(t1, dtype)) + jnp.abs(h)), steps, 0)

        k = order.astype(jnp.int32)
        rows = jnp.arange(MAX_ORDER + 3)
        table = lambda x: jnp.asarray(np.concatenate([x, np.zeros(MAX_ORDER + 3 - x.size)]), dtype)  # noqa: E731
        alpha = jax.lax.stop_gradient(table(_ALPHA)[k])
        alpha = jnp.where(dt == 0, 1, alpha)
        y_pred = jnp.where(rows[:, None] <= k, D, 0).sum(0)
        psi = jnp.where((rows >= 1) & (rows <= k), table(_GAMMA), 0) @ D / alpha

        inputs = (self, field, t1, control, y_pred, psi, alpha, stages, lin)
        d, (converged, iterations, lin) = _correction(inputs)
        converged, iterations, lin = jax.lax.stop_gradient((converged == 1, iterations, lin))
        y_new = y_pred + d

        norm = tol.norm
        scale = tol.atol + tol.rtol * jnp.maximum(jnp.abs(flat), jnp.abs(y_new))
        errors = jax.lax.stop_gradient(table(_ERROR_CONST))

        def error_norm(j, difference):
            return jax.lax.stop_gradient(norm(errors[j] * difference / scale))

        error = error_norm(k, d)
        accepted = converged & (error <= 1)
        maxiter = self.root_find_max_steps
        safety = 0.9 * (2 * maxiter + 1) / (2 * maxiter + iterations)

        # the differences after the step (SciPy's update: D_{k+2} = d − D_{k+1}, D_{k+1} = d, then
        # D_i += D_{i+1} down from i = k)
        D = D.at[k + 2].set(d - D[k + 1]).at[k + 1].set(d)
        summed = jnp.flip(jnp.cumsum(jnp.flip(jnp.where(rows[:, None] <= k + 1, D, 0), 0), 0), 0)
        D = jnp.where(rows[:, None] <= k, summed, D)

        # the next order and step ratio, once k + 1 steps were taken at this size and order
        steps = steps + 1
        lower = jnp.where(k > 1, error_norm(k - 1, D[k]), jnp.inf)
        higher = jnp.where(k < self.max_order, error_norm(jnp.minimum(k + 1, MAX_ORDER), D[k + 2]), jnp.inf)
        norms = jnp.stack([lower, error, higher])
        with jax.numpy_dtype_promotion("standard"):
            factors = norms ** (-1 / (k + jnp.arange(3, dtype=dtype)))
        factors = jnp.where(jnp.isnan(factors), 0, factors)
        change = steps >= k + 1
        new_order = jnp.where(change, k - 1 + jnp.argmax(factors), k).astype(dtype)
        grown = jnp.minimum(MAX_FACTOR, safety * jnp.max(factors))
        shrunk = jnp.maximum(MIN_FACTOR, safety * error ** (-1 / (k + 1)))
        factor = jnp.where(accepted, jnp.where(change, grown, 1), -jnp.where(converged, shrunk, NEWTON_FAILURE_FACTOR))
        factor = jnp.where(jnp.isnan(factor), -MIN_FACTOR, factor)

        new_state = BDFState(
            jnp.where(accepted, D, state.D),
            jnp.where(accepted, dt, state.h),
            jnp.where(accepted, new_order, order),
            jnp.where(accepted & ~change, steps, 0),
            lin,
        )
        y1 = unravel(jnp.where(accepted, D[0], flat))
        code = jax.tree.map(lambda x: jnp.full(x.shape, factor, x.dtype), y0)
        dense = jax.vmap(unravel)(jnp.where(rows[: MAX_ORDER + 1, None] <= k, D[: MAX_ORDER + 1], 0))
        return y1, code, dict(D=dense), new_state, dfx.RESULTS.successful
