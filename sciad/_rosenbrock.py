"""Rosenbrock (Rodas) solvers for M u' = f(u, p, t) with a constant mass matrix M, as diffrax solvers.

A Rosenbrock method is linearly implicit: each step takes the Jacobian J = ∂f/∂u and ∂f/∂t once at
(t0, y0), factorises W = M/(hγ) − J once (LU), and solves one linear system with it per stage —
no Newton iteration, so no root finder. In the transformed form of Hairer & Wanner (Solving ODEs
II, §IV.7 and, for M, §VI.4), stage i solves

    (M/(hγ) − J) u_i = f(t0 + c_i h, y0 + Σ_j a_ij u_j) + M Σ_j (C_ij/h) u_j + h d_i ∂f/∂t,

and y1 = y0 + Σ_j m_j u_j (a step solves these multiplied by h). M may be singular: rows of zeros mark algebraic
equations (index-1
semi-explicit DAEs), and the stiffly accurate Rodas methods keep their order on them. y0 must be
consistent (the algebraic equations hold at t0).

    solver = Rodas5P(mass_matrix=jnp.array([1.0, 1.0, 0.0]))
    diffrax.diffeqsolve(diffrax.ODETerm(f), solver, t0, t1, dt0, y0, args,
                        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10))

The state may be any PyTree; M acts on its flattened vector (`jax.flatten_util.ravel_pytree`).
The linear solves go through `lineax.linear_solve` with the step's factorisation as its state, so
derivatives of a step solve with the same LU factors and never differentiate the decomposition.
`stage_jacobian`: None (a dense Jacobian and a dense LU), a `sciad.stiff.Sparse` (W's pattern
from f's jaxpr ∪ M's, its entries by coloured JVPs, SciPy's sparse LU on the host once per step)
or a `sciad.stiff.MatrixFree` (GMRES on Jacobian-vector products to a tight tolerance, nothing of
size n × n formed; a solve that does not converge rejects the step): their `stage_solver`.
"""

import abc
from typing import Any, ClassVar

import diffrax as dfx
import equinox as eqx
import jax
import jax.core
import jax.flatten_util as jfu
import jax.numpy as jnp
import lineax as lx
import numpy as np

from sciad._rosenbrock_tableaus import RODAS4, RODAS5P, RosenbrockTableau


class StepPolynomial(dfx.AbstractLocalInterpolation):
    """A step's dense output on [t0, t1] as a polynomial `at(θ)` in θ = (t − t0)/(t1 − t0) (0 where the step
    spans no time: the discarded steps of a vmapped solve's finished members)."""

    t0: eqx.AbstractVar[Any]
    t1: eqx.AbstractVar[Any]

    @abc.abstractmethod
    def at(self, theta):
        """y at the fraction `theta` (a scalar) of the step."""

    def evaluate(self, t0, t1=None, left=True):
        del left
        if t1 is not None:
            return jax.tree.map(jnp.subtract, self.evaluate(t1), self.evaluate(t0))
        span = self.t1 - self.t0
        return self.at(jnp.where(span == 0, 0, (t0 - self.t0) / jnp.where(span == 0, 1, span)))


class RosenbrockInterpolation(StepPolynomial):
    """A Rodas method's own dense output on [t0, t1]: with θ = (t − t0)/(t1 − t0),
    y(t) = (1 − θ) y0 + θ (y1 + (1 − θ)(k_0 + θ k_1 + … + θ^{q−1} k_{q−1})).
    `y0`, `y1`: the state's structure; `k`: the same with a leading axis q (the tableau's `dense`
    rows applied to the stages)."""

    t0: Any
    t1: Any
    y0: Any
    y1: Any
    k: Any

    def at(self, theta):
        def leaf(y0, y1, k):
            th = theta.astype(y0.dtype)
            poly = k[-1]
            for k_r in k[-2::-1]:
                poly = k_r + th * poly
            return (1 - th) * y0 + th * (y1 + (1 - th) * poly)

        return jax.tree.map(leaf, self.y0, self.y1, self.k)


class AbstractRosenbrock(dfx.AbstractAdaptiveSolver):
    """A stiffly accurate Rosenbrock method (`rosenbrock_tableau`) for M u' = f with a constant
    `mass_matrix` M: None (the identity), a vector (n,) (its diagonal) or a matrix (n, n), n the
    flattened state's size. Linearly implicit: one Jacobian and one LU factorisation per step,
    no root finder; dense, or by `stage_jacobian` (a `sciad.stiff.Sparse` or `MatrixFree`). Any term whose
    `vf_prod` is linear in its control (`diffrax.ODETerm`, and the direction-reversing wrapper
    diffrax puts around it for t1 < t0) steps with it."""

    rosenbrock_tableau: eqx.AbstractClassVar[RosenbrockTableau]
    mass_matrix: eqx.AbstractVar[jax.Array | None]
    stage_jacobian: eqx.AbstractVar[Any]

    term_structure: ClassVar = dfx.AbstractTerm
    interpolation_cls: ClassVar = RosenbrockInterpolation
    # Its capabilities, read where they matter (`sciad._stiff.is_implicit`, `stiff_solver`, `sciad._dae`): one
    # linear system per stage, solved by its `stage_jacobian` (of these kinds), with W = M/(hγ) - ∂f/∂u for its
    # `mass_matrix`.
    linearly_implicit: ClassVar[bool] = True
    stage_jacobians: ClassVar[tuple[str, ...]] = ("dense", "sparse", "matrix-free")
    takes_mass_matrix: ClassVar[bool] = True

    def order(self, terms):
        return self.rosenbrock_tableau.order

    def error_order(self, terms):
        return self.rosenbrock_tableau.embedded_order + 1

    def init(self, terms, t0, t1, y0, args):
        return None

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)

    def jacobian(self, increment, y):
        """∂increment/∂y at y (n,), dense (n, n): increment(y) = h f(t0, y) over the flattened state.
        The one place a step differentiates f in u (override for sparse or matrix-free Jacobians)."""
        return jax.jacfwd(increment)(y)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        del solver_state, made_jump
        tab = self.rosenbrock_tableau
        flat, unravel = jfu.ravel_pytree(y0)
        dtype, n = flat.dtype, flat.size
        coef = lambda x: jnp.asarray(x, dtype)
        control = terms.contr(t0, t1)
        dt = jnp.asarray(t1 - t0)

        def increment(t, y):  # h f(t, y), (n,)
            return jfu.ravel_pytree(terms.vf_prod(t, unravel(y), args, control))[0]

        g0, g_t = jax.jvp(lambda t: increment(t, flat), (jnp.asarray(t0, dt.dtype),), (jnp.ones((), dt.dtype),))
        g_t = dt.astype(dtype) * g_t  # h² ∂f/∂t
        mass, times_mass = mass_operator(self.mass_matrix, n, dtype)
        # diffrax steps the finished members of a vmapped solve with t0 = t1 and discards the result:
        # there every right-hand side is 0 and W = M/γ is singular for a DAE; I gives the same u = 0.
        if self.stage_jacobian is None:
            W = mass / coef(tab.gamma) - self.jacobian(lambda y: increment(t0, y), flat)  # h (M/(hγ) − J)
            W = lx.MatrixLinearOperator(jnp.where(dt == 0, jnp.eye(n, dtype=dtype), W))
            lu = lx.LU()
            factors = lu.init(jax.lax.stop_gradient(W), {})  # the step's one factorisation
        else:
            W, lu, factors = self._stage_solver(terms, t0, control, args, flat, unravel, dt == 0)

        def solve(rhs):  # (u, whether the solve succeeded: an iterative one may not)
            sol = lx.linear_solve(W, rhs, lu, state=factors, throw=False)
            return sol.value, sol.result == lx.RESULTS.successful

        u_1, ok = solve(g0 + coef(tab.d[0]) * g_t)
        us = [u_1]
        for i in range(1, tab.num_stages):  # (M/γ − h J) u_i = h f(t_i, Y_i) + M Σ_j C_ij u_j + h² d_i ∂f/∂t
            u = jnp.stack(us)
            y_i = flat + coef(tab.a[i, :i]) @ u
            rhs = increment(t0 + float(tab.c[i]) * dt, y_i)
            rhs = rhs + times_mass(coef(tab.C[i, :i]) @ u) + float(tab.d[i]) * g_t
            u_i, ok_i = solve(rhs)
            us.append(u_i)
            ok = ok & ok_i
        u = jnp.stack(us)
        y1 = jnp.where(ok, flat + coef(tab.m) @ u, flat)
        # a failed solve rejects the step, as in diffrax's implicit solvers
        error = jnp.where(ok, coef(tab.error) @ u, jnp.inf)
        k = coef(tab.dense) @ u
        y1, error = unravel(y1), unravel(error)
        dense_info = dict(y0=y0, y1=y1, k=jax.vmap(unravel)(k))
        return y1, error, dense_info, None, dfx.RESULTS.successful

    def _stage_solver(self, terms, t0, control, args, flat, unravel, identity):
        """(operator, solver, state) of W = M/γ − h J (the step's h (M/(hγ) − J)) by `stage_jacobian`
        (`sciad.stiff.Sparse` or `MatrixFree`: its `stage_solver`): its arrays (terms, args, times,
        M) passed explicitly, so that pattern detection reads the step's jaxpr rather than captured
        values."""
        gamma = self.rosenbrock_tableau.gamma
        dynamic, static = eqx.partition((terms, t0, control, args, self.mass_matrix), eqx.is_array)

        def w(y, dynamic):  # y ↦ M y/γ − h f(t0, y)
            terms, t0, control, args, M = eqx.combine(dynamic, static)
            increment = jfu.ravel_pytree(terms.vf_prod(t0, unravel(y), args, control))[0]
            My = y if M is None else (M.astype(y.dtype) * y if M.ndim == 1 else M.astype(y.dtype) @ y)
            return My / jnp.asarray(gamma, y.dtype) - increment

        also = mass_pattern(self.mass_matrix)
        return self.stage_jacobian.stage_solver(w, flat, dynamic, also=also, identity=identity)


def mass_pattern(M):
    """The boolean pattern (n, n) a solver's `mass_matrix` M adds to ∂f/∂u's in a stage matrix (all of it
    where M is traced), or None where I holds it (None, a diagonal)."""
    if M is None or M.ndim == 1:
        return None
    return np.ones(M.shape, bool) if isinstance(M, jax.core.Tracer) else np.asarray(M) != 0


def mass_operator(M, n: int, dtype) -> tuple:
    """(M as a dense (n, n) matrix, v ↦ M v) in `dtype` for a solver's `mass_matrix` M (None: the identity;
    a vector: its diagonal) over a flattened state of n entries."""
    if M is None:
        return jnp.eye(n, dtype=dtype), lambda v: v
    if M.shape not in ((n,), (n, n)):
        raise ValueError(
            f"mass_matrix has shape {M.shape} for a state of {n} entries: give a vector "
            f"({n},) (the diagonal) or a matrix ({n}, {n}) over the flattened state."
        )
    M = M.astype(dtype)
    if M.ndim == 1:
        return jnp.diag(M), lambda v: M * v
    return M, lambda v: M @ v


def checked_mass_matrix(M):
    """A solver's `mass_matrix` field: None, or a JAX array (n,) or (n, n)."""
    if M is None:
        return None
    M = jnp.asarray(M)
    if M.ndim not in (1, 2) or (M.ndim == 2 and M.shape[0] != M.shape[1]):
        raise ValueError(
            f"mass_matrix has shape {M.shape}: give None (the identity), a vector (n,) "
            f"(its diagonal) or a square matrix (n, n)."
        )
    return M


class Rodas5P(AbstractRosenbrock):
    """Rodas5P (Steinebach 2023): 8 stages, order 5 with an embedded order-4 error estimate, stiffly
    accurate, dense output of order 4. Linearly implicit (one Jacobian and LU per step). For stiff
    ODEs and index-1 DAEs given by `mass_matrix` (None, a diagonal (n,) or a matrix (n, n))."""

    mass_matrix: jax.Array | None = eqx.field(default=None, converter=checked_mass_matrix)
    stage_jacobian: Any = None
    rosenbrock_tableau: ClassVar[RosenbrockTableau] = RODAS5P


class Rodas4(AbstractRosenbrock):
    """Rodas4 (Hairer & Wanner 1996): 6 stages, order 4 with an embedded order-3 error estimate,
    stiffly accurate, dense output of order 3. Linearly implicit (one Jacobian and LU per step). For
    stiff ODEs and index-1 DAEs given by `mass_matrix` (None, a diagonal (n,) or a matrix (n, n))."""

    mass_matrix: jax.Array | None = eqx.field(default=None, converter=checked_mass_matrix)
    stage_jacobian: Any = None
    rosenbrock_tableau: ClassVar[RosenbrockTableau] = RODAS4
