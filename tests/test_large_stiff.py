"""Implicit stages without a dense Jacobian (`sciad.stiff`): matrix-free Newton–Krylov.

On the stiff 2-D Brusselator PDE (3×3 grid, 18 states) with Kvaerno5 at rtol = atol = 1e-8, the
matrix-free forward solve agrees with diffrax's dense Newton to 1e-6 relative, and so do gradients
of the continuous adjoints (whose backward solves step the same solver) and of DiscreteAdjoint;
under jit and vmap; bad `jacobian` options are refused naming the fix. Each solve compiles for
tens of seconds on two cores: the default run keeps the forward check and the errors.
"""

import dataclasses
import functools

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from scenarios import slow_except
from sciad.adjoints import DiscreteAdjoint, GaussAdjoint, InterpolatingAdjoint
from sciad.problems import brusselator_pde
from sciad.stiff import MatrixFree, StageNewton, stiff_solver

pytestmark = pytest.mark.usefixtures("fast_compiles")

TOL = 1e-8
AGREEMENT = 1e-6
SENSEALGS = {"InterpolatingAdjoint": InterpolatingAdjoint(), "GaussAdjoint": GaussAdjoint(),
             "DiscreteAdjoint": DiscreteAdjoint()}


def bench(n=3):
    return dataclasses.replace(brusselator_pde(n), rtol=TOL, atol=TOL)


def objective(b, p, sensealg, jacobian):
    sol = sciad.solve(b.problem, p=p, saveat=b.saveat, solver="kvaerno5", rtol=b.rtol, atol=b.atol,
                      sensealg=sensealg, jacobian=jacobian)
    return b.loss(sol.us)


@functools.cache
def dense_gradient():
    b = bench()
    return np.asarray(jax.jit(jax.grad(lambda p: objective(b, p, DiscreteAdjoint(), "dense")))(b.problem.p))


def relative(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


def test_matrix_free_forward_solve_agrees_with_the_dense_newton():
    b = bench()
    solve = jax.jit(lambda p, jacobian: sciad.solve(b.problem, p=p, saveat=b.saveat, solver="kvaerno5", rtol=TOL,
                                                    atol=TOL, jacobian=jacobian).us, static_argnums=1)
    assert relative(solve(b.problem.p, "matrix-free"), solve(b.problem.p, "dense")) < AGREEMENT


@pytest.mark.parametrize("name", slow_except(list(SENSEALGS), fast=[]))
def test_matrix_free_gradient_agrees_with_the_dense_discrete_adjoint(name):
    b = bench()
    g = jax.jit(jax.grad(lambda p: objective(b, p, SENSEALGS[name], "matrix-free")))(b.problem.p)
    assert relative(g, dense_gradient()) < AGREEMENT


@pytest.mark.slow
def test_matrix_free_solves_batch_under_vmap():
    b = bench()
    ps = jnp.asarray(b.problem.p) * jnp.array([[1.0], [1.02]])
    solve = lambda p, jacobian: sciad.solve(b.problem, p=p, saveat=b.saveat, solver="kvaerno5", rtol=TOL, atol=TOL,
                                            jacobian=jacobian).us
    batched = jax.jit(jax.vmap(lambda p: solve(p, "matrix-free")))(ps)
    for p, us in zip(ps, batched):
        assert relative(us, jax.jit(lambda p: solve(p, "dense"))(p)) < AGREEMENT


def test_stiff_solver_puts_a_stage_newton_in_an_implicit_solver_and_leaves_dense_alone():
    solver = stiff_solver(dfx.Kvaerno5(), MatrixFree(rtol=1e-4))
    assert isinstance(solver.root_finder, StageNewton) and solver.root_finder.jacobian.rtol == 1e-4
    assert stiff_solver(solver, "dense") is solver


@pytest.mark.parametrize("solver, jacobian, error, match", [
    ("kvaerno5", "sparse-ish", ValueError, "unknown jacobian 'sparse-ish'; choose one of"),
    ("kvaerno5", 3, TypeError, "jacobian must be one of"),
    ("tsit5", "matrix-free", ValueError, "needs an implicit solver"),
])
def test_bad_jacobian_options_name_the_fix(solver, jacobian, error, match):
    b = brusselator_pde(3)
    with pytest.raises(error, match=match):
        sciad.solve(b.problem, solver=solver, jacobian=jacobian)
