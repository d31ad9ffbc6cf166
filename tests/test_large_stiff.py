"""Implicit stages without a dense Jacobian (`sciad.stiff`): a sparse LU from coloured JVPs, and
matrix-free Newton–Krylov.

On the stiff 2-D Brusselator PDE (3×3 grid, 18 states) with Kvaerno5 at rtol = atol = 1e-8, the
sparse and matrix-free forward solves agree with diffrax's dense Newton to 1e-6 relative, and so
do gradients of the continuous adjoints (whose backward solves step the same solver, λ's system
with its own detected pattern), of ForwardSensitivity (its augmented system's), of
DiscreteAdjoint and ForwardDiffSensitivity (forward mode through the Newton solves), and of central
differences; BacksolveAdjoint refuses the diffusion it cannot re-solve backwards; under jit, vmap,
jvp and Hessians, with PyTree states and parameters, in float32; "auto" picks the sparse Newton
and GaussAdjoint on a large grid and says so; bad `jacobian` options are refused naming the fix.
Each solve compiles for tens of seconds on two cores: the default run keeps the forward checks,
one gradient, the choice and the errors.
"""

import dataclasses
import functools

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from helpers import SENSEALGS as SCENARIOS
from helpers import reference_for, slow_except
from sciad._stiff import MatrixFree, Sparse, StageNewton, stiff_solver
from sciad.adjoints import (
    BacksolveAdjoint,
    DiscreteAdjoint,
    ForwardDiffSensitivity,
    ForwardSensitivity,
    GaussAdjoint,
    InterpolatingAdjoint,
    QuadratureAdjoint,
)
from sciad.problems import brusselator_pde

TOL = 1e-8
AGREEMENT = 1e-6
SENSEALGS = {
    "InterpolatingAdjoint": InterpolatingAdjoint(),
    "GaussAdjoint": GaussAdjoint(),
    "QuadratureAdjoint": QuadratureAdjoint(),
    "DiscreteAdjoint": DiscreteAdjoint(),
    "ForwardSensitivity": ForwardSensitivity(),
    "ForwardDiffSensitivity": ForwardDiffSensitivity(),
}
JACOBIANS = ["sparse", "matrix-free"]


def bench(n=3):
    return dataclasses.replace(brusselator_pde(n), rtol=TOL, atol=TOL)


def objective(b, p, sensealg, jacobian):
    sol = sciad.solve(
        b.problem,
        p=p,
        saveat=b.saveat,
        solver="kvaerno5",
        rtol=b.rtol,
        atol=b.atol,
        sensealg=sensealg,
        jacobian=jacobian,
    )
    return b.loss(sol.us)


@functools.cache
def dense_gradient():
    """Forward mode through the dense Newton's steps (`reference_for`: 3 parameters)."""
    b = bench()
    reference = SCENARIOS[reference_for("GaussAdjoint", 3)]()
    return np.asarray(jax.jit(jax.grad(lambda p: objective(b, p, reference, "dense")))(b.problem.p))


@functools.cache
def dense_solution():
    return np.asarray(solve(bench().problem.p, "dense"))


def solve(p, jacobian, u0=None, tol=TOL):
    b = bench()
    return jax.jit(
        lambda p: (
            sciad.solve(
                b.problem, u0=u0, p=p, saveat=b.saveat, solver="kvaerno5", rtol=tol, atol=tol, jacobian=jacobian
            ).us
        )
    )(p)


def relative(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


@pytest.mark.parametrize("jacobian", slow_except(JACOBIANS, fast=["sparse"]))
def test_forward_solves_agree_with_the_dense_newton(jacobian):
    assert relative(solve(bench().problem.p, jacobian), dense_solution()) < AGREEMENT


@pytest.mark.parametrize(
    "name, jacobian",
    [
        pytest.param(
            name,
            jacobian,
            id=f"{name}-{jacobian}",
            marks=[] if (name, jacobian) == ("GaussAdjoint", "sparse") else [pytest.mark.slow],
        )
        for name in SENSEALGS
        for jacobian in JACOBIANS
    ],
)
def test_gradient_agrees_with_forward_mode_through_the_dense_newton(name, jacobian):
    b = bench()
    g = jax.jit(jax.grad(lambda p: objective(b, p, SENSEALGS[name], jacobian)))(b.problem.p)
    assert relative(g, dense_gradient()) < AGREEMENT


@pytest.mark.slow
def test_backsolve_refuses_the_diffusion_it_cannot_re_solve_backwards():
    """u re-solved backwards through a stiff diffusion departs from the forward solution: the sparse
    Newton's BacksolveAdjoint says so, naming the sensealgs to use, rather than a wrong gradient."""
    b = bench()
    with pytest.raises(Exception, match="unstable backwards in time .* Use InterpolatingAdjoint"):
        jax.jit(jax.grad(lambda p: objective(b, p, BacksolveAdjoint(), "sparse")))(b.problem.p)


@pytest.mark.slow
@pytest.mark.parametrize("jacobian", JACOBIANS)
def test_solves_batch_under_vmap(jacobian):
    ps = jnp.asarray(bench().problem.p) * jnp.array([[1.0], [1.02]])
    batched = jax.vmap(lambda p: solve(p, jacobian))(ps)
    for p, us in zip(ps, batched):
        assert relative(us, solve(p, "dense")) < AGREEMENT


@pytest.mark.slow
def test_sparse_jvp_and_hessian_agree_with_the_dense_newton():
    """Forward over reverse through GaussAdjoint's rules: the tangent's Newton solves are optimistix's
    own (the sparse LU's callback sees primal values only)."""
    b = bench()
    direction = np.array([1.0, -0.5, 0.1])
    hvp = {
        jacobian: jax.jit(
            lambda p: jax.jvp(jax.grad(lambda q: objective(b, q, GaussAdjoint(), jacobian)), (p,), (direction,))[1]
        )(b.problem.p)
        for jacobian in ("sparse", "dense")
    }
    assert relative(hvp["sparse"], hvp["dense"]) < 1e-5


def test_float32_stays_float32_with_the_sparse_newton():
    b = bench()
    sparse = solve(np.asarray(b.problem.p, np.float32), "sparse", np.asarray(b.problem.u0, np.float32), tol=1e-4)
    assert sparse.dtype == jnp.float32 and relative(sparse, dense_solution()) < 1e-3


def test_auto_picks_the_sparse_newton_and_gauss_on_a_large_grid_and_says_why():
    big = brusselator_pde(12)  # 288 states: the choice only, nothing solved
    choice = sciad.select_sensealg(big.problem, saveat=big.saveat, solver="kvaerno5")
    assert isinstance(choice.sensealg, GaussAdjoint) and choice.features.stage_jacobian == "sparse"
    assert "10 colours" in choice.report() and "sparse-stages" in choice.report()
    assert not choice.sensealg.checkpointing
    budgeted = sciad.select_sensealg(big.problem, saveat=big.saveat, solver="kvaerno5", memory_budget=2**20)
    assert isinstance(budgeted.sensealg, GaussAdjoint) and budgeted.sensealg.checkpointing
    small = sciad.select_sensealg(bench().problem, saveat=bench().saveat, solver="kvaerno5")
    assert small.features.stage_jacobian == "dense" and "a dense LU is cheap" in small.report()
    explicit = sciad.select_sensealg(big.problem, saveat=big.saveat, solver="tsit5")
    assert explicit.features.stage_jacobian == "dense"
    given = sciad.select_sensealg(big.problem, saveat=big.saveat, solver="kvaerno5", jacobian=MatrixFree())
    assert given.features.stage_jacobian == "matrix-free" and given.features.stage_jacobian_reason == "given"


def test_stiff_solver_puts_a_stage_newton_in_an_implicit_solver_and_leaves_dense_alone():
    solver = stiff_solver(dfx.Kvaerno5(), MatrixFree(rtol=1e-4))
    assert isinstance(solver.root_finder, StageNewton) and solver.root_finder.jacobian.rtol == 1e-4
    assert isinstance(stiff_solver(dfx.Kvaerno5(), "sparse").root_finder.jacobian, Sparse)
    assert stiff_solver(solver, "dense") is solver


@pytest.mark.parametrize(
    "solver, jacobian, error, match",
    [
        ("kvaerno5", "sparse-ish", ValueError, "unknown jacobian 'sparse-ish'; choose one of"),
        ("kvaerno5", 3, TypeError, "jacobian must be one of"),
        ("tsit5", "matrix-free", ValueError, "needs an implicit solver"),
    ],
)
def test_bad_jacobian_options_name_the_fix(solver, jacobian, error, match):
    b = brusselator_pde(3)
    with pytest.raises(error, match=match):
        sciad.solve(b.problem, solver=solver, jacobian=jacobian)


def ring_diffusion(n=60):
    """u' = a n² (u_{i-1} - 2 u_i + u_{i+1}) + b u (1 - u) on a ring, its stencil a windowed sum (`reduce_window`),
    which the pattern detection does not follow; ∂f/∂u's pattern, periodic tridiagonal."""

    def f(u, p, t):
        stencil = jax.lax.reduce_window(jnp.pad(u, 1, mode="wrap"), 0.0, jax.lax.add, (3,), (1,), "VALID") - 3 * u
        return p[0] * n**2 * stencil + p[1] * u * (1 - u)

    u0 = 0.5 + 0.4 * np.sin(2 * np.pi * np.arange(n) / n)
    pattern = (
        np.eye(n, dtype=bool) | np.roll(np.eye(n, dtype=bool), 1, axis=1) | np.roll(np.eye(n, dtype=bool), -1, axis=1)
    )
    return sciad.ODEProblem(f, u0, (0.0, 0.1), np.array([1.0, 2.0])), pattern


def ring_loss(prob, p, sensealg, jacobian):
    sol = sciad.solve(
        prob, p=p, saveat=[0.05, 0.1], solver="kvaerno5", rtol=TOL, atol=TOL, sensealg=sensealg, jacobian=jacobian
    )
    return jnp.sum(sol.us**2), sol.us


@pytest.mark.slow
def test_a_given_pattern_stands_in_for_detection_that_cannot_follow_f():
    from sciad._host_lu import COUNTS
    from sciad._sparsity import jacobian_pattern

    prob, pattern = ring_diffusion()
    detected = jacobian_pattern(lambda u, p: prob.f(u, p, 0.0), jnp.asarray(prob.u0), prob.p)
    assert detected.conservative and detected.density == 1.0
    COUNTS.clear()
    given = jax.jit(lambda p: ring_loss(prob, p, None, Sparse(pattern=pattern))[1])(prob.p)
    assert COUNTS["factorisations"] > 0
    dense = jax.jit(lambda p: ring_loss(prob, p, None, "dense")[1])(prob.p)
    assert relative(given, dense) < AGREEMENT
    with pytest.raises(ValueError, match=r"pattern: ∂f/∂u's sparsity is \(59, 59\), the state has 60 entries"):
        sciad.solve(prob, solver="kvaerno5", jacobian=Sparse(pattern=pattern[1:, 1:]))
    with pytest.raises(ValueError, match="must be square"):
        Sparse(pattern=pattern[1:])


@pytest.mark.slow
def test_a_given_pattern_serves_the_adjoint_stages_too():
    """GaussAdjoint's λ stages (pattern Jᵀ) take the given pattern; InterpolatingAdjoint's (λ, μ) are detected."""
    prob, pattern = ring_diffusion()
    reference = jax.jit(
        jax.grad(lambda p: ring_loss(prob, p, SCENARIOS[reference_for("GaussAdjoint", 2)](), "dense")[0])
    )(prob.p)
    for sensealg in (GaussAdjoint(), InterpolatingAdjoint()):
        g = jax.jit(jax.grad(lambda p: ring_loss(prob, p, sensealg, Sparse(pattern=pattern))[0]))(prob.p)
        assert relative(g, reference) < AGREEMENT


@pytest.mark.slow
def test_a_large_state_stores_fewer_dense_steps():
    """4,096 dense Tsit5 steps of 40,000 states would be 10 GB: the interpolation keeps STORED_BYTES'
    worth, at least MIN_STORED steps (and would re-solve with checkpoints past them), and XLA's
    temporaries stay within a few copies of that (diffrax's dense output makes two more); the
    gradient is still exact."""
    import diffrax as dfx

    from sciad.adjoints._base import interpolation_step_bytes, stored_steps

    n = 40_000
    prob = sciad.ODEProblem(lambda u, p, t: -p * u, np.ones(n), (0.0, 1.0), np.array(1.0))
    grad = jax.jit(jax.grad(lambda p: jnp.sum(sciad.solve(prob, p=p, saveat=[1.0], sensealg=GaussAdjoint()).us)))
    compiled = grad.lower(prob.p).compile()
    stats = compiled.memory_analysis()
    if stats is not None:
        step = interpolation_step_bytes(dfx.Tsit5(), n, 8)
        assert stored_steps(4096, step) < 4096 and stats.temp_size_in_bytes < 4 * stored_steps(4096, step) * step
    np.testing.assert_allclose(compiled(prob.p), -n * np.exp(-1.0), rtol=1e-5)


def two_species_ring(n=24):
    """A ring of n cells, species {"u", "v"} (a PyTree state), parameters {"d": diffusion (2,),
    "k": reaction rates (2,)}: u' = d₀ n² Δu − k₀ u v², v' = d₁ n² Δv + k₀ u v² − k₁ v."""

    def laplacian(x):
        return jnp.roll(x, 1) - 2 * x + jnp.roll(x, -1)

    def f(y, p, t):
        reaction = p["k"][0] * y["u"] * y["v"] ** 2
        return {
            "u": p["d"][0] * n**2 * laplacian(y["u"]) - reaction,
            "v": p["d"][1] * n**2 * laplacian(y["v"]) + reaction - p["k"][1] * y["v"],
        }

    x = np.arange(n) / n
    y0 = {"u": 1 + 0.2 * np.sin(2 * np.pi * x), "v": 0.5 + 0.2 * np.cos(2 * np.pi * x)}
    return sciad.ODEProblem(f, y0, (0.0, 0.2), {"d": np.array([0.5, 0.2]), "k": np.array([1.0, 0.3])})


@pytest.mark.slow
@pytest.mark.parametrize("sensealg", ["GaussAdjoint", "InterpolatingAdjoint"])
def test_pytree_states_parameters_and_a_traced_closure_through_the_sparse_newton(sensealg):
    """The sparse Newton ravels a PyTree state and takes PyTree parameters; an f closing over a
    traced value (a source term's strength, differentiated through the closure) is followed."""
    prob = two_species_ring()

    def loss(p, strength, jacobian):
        def f(y, p, t):
            rates = prob.f(y, p, t)
            return {"u": rates["u"] + strength, "v": rates["v"]}

        sol = sciad.solve(
            dataclasses.replace(prob, f=f),
            p=p,
            saveat=[0.1, 0.2],
            solver="kvaerno5",
            rtol=TOL,
            atol=TOL,
            sensealg=sensealg,
            jacobian=jacobian,
        )
        return jnp.sum(sol.us["u"] ** 2) + jnp.sum(sol.us["v"])

    gradients = {
        jacobian: jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(prob.p, 0.3, jacobian)
        for jacobian in ("dense", "sparse")
    }
    for got, want in zip(jax.tree.leaves(gradients["sparse"]), jax.tree.leaves(gradients["dense"])):
        assert relative(got, want) < AGREEMENT
    fd = (loss(prob.p, 0.3 + 1e-4, "sparse") - loss(prob.p, 0.3 - 1e-4, "sparse")) / 2e-4
    assert relative(gradients["sparse"][1], fd) < 1e-5


@pytest.mark.slow
def test_sparse_gradient_agrees_with_finite_differences():
    """Central differences of the loss through the sparse Newton's own forward solves at rtol = 1e-11."""
    b = bench()
    loss = jax.jit(
        lambda p: b.loss(
            sciad.solve(
                b.problem,
                p=p,
                saveat=b.saveat,
                solver="kvaerno5",
                rtol=1e-11,
                atol=1e-11,
                jacobian="sparse",
                max_steps=20_000,
            ).us
        )
    )
    p = np.asarray(b.problem.p)
    steps = 1e-4 * np.abs(p)
    fd = [(loss(p + e) - loss(p - e)) / (2 * h) for e, h in zip(np.diag(steps), steps)]
    assert relative(jax.jit(jax.grad(lambda p: objective(b, p, GaussAdjoint(), "sparse")))(p), fd) < 1e-5
