"""Mass-matrix problems M u' = f through `sciad.solve` (`sciad._dae`): Robertson as a DAE against its
ODE form, a linear index-1 DAE with closed-form solution and gradients (every sensealg, in p and u0),
consistent initialisation (diagonal and full singular M, gradients by the implicit function theorem), "check" and
"none", the boundary's refusals, jit / vmap / float32,
a PyTree state, a Hessian, `"auto"`, and Rodas's sparse stages (`jacobian="sparse"`) against its
dense ones."""

import functools

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse
from scipy.integrate import solve_ivp

import sciad
from helpers.dae import (
    P0,
    R_INV,
    ROBERTSON_P,
    ROBERTSON_TS,
    TOL,
    TS,
    Q,
    R,
    exact,
    exact_gradients,
    linear,
    linear_loss,
    linear_problem,
    robertson,
    robertson_dae,
)
from sciad._auto import auto_sensealg

# Every sensealg: through the solver's steps, the sensitivity DAE, the adjoint DAE (tests/test_dae_adjoints.py).
SENSEALGS = [
    sciad.ForwardDiffSensitivity(),
    sciad.DiscreteAdjoint(),
    sciad.ForwardSensitivity(),
    sciad.InterpolatingAdjoint(),
    sciad.GaussAdjoint(),
    sciad.QuadratureAdjoint(),
    sciad.GaussAdjoint(checkpointing=True),
    sciad.BacksolveAdjoint(),
    pytest.param(sciad.InterpolatingAdjoint(checkpointing=True), marks=pytest.mark.slow),
]


def test_linear_dae_closed_form_from_an_inconsistent_u0():
    """u0 = (1.5, 0): z0 is solved to b x0 = 0.75, the solution is the closed form."""
    # compiled whole (eagerly, one small program per operation)
    sol = jax.jit(lambda: sciad.solve(linear_problem(), saveat=TS, **TOL))()
    np.testing.assert_allclose(sol.us, exact(1.5, P0), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(sol.us[0], [1.5, 0.75], rtol=1e-12)


def test_backwards_in_time():
    """From t = 2 back to 0 (an inconsistent z(2) solved first): x(t) = x(2) e^{(b - a)(t - 2)}."""
    prob = sciad.ODEProblem(linear, np.array([1.5, 0.0]), (2.0, 0.0), P0, mass_matrix=np.array([1.0, 0.0]))
    ts = TS[::-1]
    sol = jax.jit(lambda: sciad.solve(prob, saveat=ts, **TOL))()
    np.testing.assert_allclose(sol.us, exact(1.5, P0, ts - 2.0), rtol=1e-7, atol=1e-9)


# jit(vmap(value_and_grad)) over u0 and p together for these (one program: each member against the closed form)
BATCHED = {
    sciad.adjoints.describe(s)
    for s in (sciad.DiscreteAdjoint(), sciad.ForwardSensitivity(), sciad.InterpolatingAdjoint(), sciad.GaussAdjoint())
}


@pytest.mark.parametrize("sensealg", SENSEALGS, ids=sciad.adjoints.describe)
def test_linear_dae_gradients_closed_form(sensealg):
    """∂L/∂(u0, p) through consistent initialisation and the solver's steps: the differential part's
    exact, the algebraic part's 0 (z0 is recomputed from x0). For DiscreteAdjoint, ForwardSensitivity and the
    plain Interpolating and Gauss adjoints under jax.jit(jax.vmap(jax.value_and_grad)) over u0 and p together,
    each member's value and gradient against the closed form."""
    prob = linear_problem()

    def loss(u0, p):
        return linear_loss(sciad.solve(prob, u0=u0, p=p, saveat=TS, sensealg=sensealg, **TOL).us)

    if sciad.adjoints.describe(sensealg) not in BATCHED:
        g_u0, g_p = jax.jit(jax.grad(loss, argnums=(0, 1)))(np.array([1.5, 0.3]), P0)
        d_x0, d_a, d_b = exact_gradients(1.5, P0)
        np.testing.assert_allclose(g_u0, [d_x0, 0.0], rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(g_p, [d_a, d_b], rtol=1e-7)
        return
    u0s = np.array([[1.5, 0.3], [0.5, 1.0], [2.0, -1.0]])
    ps = np.array([P0, [1.0, 0.2], [3.0, 1.0]])
    values, (g_u0, g_p) = jax.jit(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1))))(u0s, ps)
    for i, (x0, p) in enumerate(zip(u0s[:, 0], ps)):
        d_x0, d_a, d_b = exact_gradients(x0, p)
        rtol = 1e-7 if i == 0 else 1e-6
        np.testing.assert_allclose(values[i], linear_loss(exact(x0, p)), rtol=1e-7)
        np.testing.assert_allclose(g_u0[i], [d_x0, 0.0], rtol=rtol, atol=1e-12 if i == 0 else 1e-10)
        np.testing.assert_allclose(g_p[i], [d_a, d_b], rtol=rtol)


@pytest.mark.slow
def test_hessian_through_forward_diff():
    """∂²/∂p² of Σ_t x(t) = Σ_t x0 e^{(b - a) t}: t² x times [[1, -1], [-1, 1]]."""
    prob = linear_problem()

    def loss(p):
        return jnp.sum(sciad.solve(prob, p=p, saveat=TS, sensealg=sciad.ForwardDiffSensitivity(), **TOL).us[:, 0])

    x = 1.5 * np.exp((P0[1] - P0[0]) * TS)
    second = np.sum(TS**2 * x)
    np.testing.assert_allclose(jax.hessian(loss)(P0), second * np.array([[1.0, -1.0], [-1.0, 1.0]]), rtol=1e-6)


# --- a full singular M: the orthogonal split ----------------------------------------------------------


def rotated(u, p, t):
    """The linear DAE in u = R w, each equation mixed by Q: (Q diag(1, 0) R⁻¹) u' = Q f(R⁻¹ u)."""
    return jnp.asarray(Q) @ linear(jnp.asarray(R_INV) @ u, p, t)


M_FULL = Q @ np.diag([1.0, 0.0]) @ R_INV


# The default run: ForwardDiffSensitivity and GaussAdjoint with a full M (the rest in the slow run, CI).
FULL_M = [
    s if i in (0, 4) or not isinstance(s, sciad.AbstractSensitivity) else pytest.param(s, marks=pytest.mark.slow)
    for i, s in enumerate(SENSEALGS)
]


@functools.cache
def full_mass_matrix_states():
    """The solve from u0 = (0.7, -0.2) along the full M, compiled once for every sensealg's test."""
    prob = sciad.ODEProblem(rotated, np.array([1.0, 1.0]), (0.0, 2.0), P0, mass_matrix=M_FULL)
    return jax.jit(lambda: sciad.solve(prob, u0=np.array([0.7, -0.2]), saveat=TS, **TOL).us)()


@pytest.mark.parametrize("sensealg", FULL_M, ids=sciad.adjoints.describe)
def test_full_mass_matrix_consistent_initialisation(sensealg):
    """Neither the algebraic equation nor the algebraic state is a coordinate: the split keeps u0's
    part in M's row space (x0 = (R⁻¹ u0)_1), solves the rest, and ∂L/∂u0 = ∂L/∂x0 (R⁻¹)_1."""
    prob = sciad.ODEProblem(rotated, np.array([1.0, 1.0]), (0.0, 2.0), P0, mass_matrix=M_FULL)
    u0 = np.array([0.7, -0.2])
    x0 = (R_INV @ u0)[0]
    np.testing.assert_allclose(full_mass_matrix_states(), exact(x0, P0) @ R.T, rtol=1e-7, atol=1e-9)

    def loss(u0, p):
        us = sciad.solve(prob, u0=u0, p=p, saveat=TS, sensealg=sensealg, **TOL).us
        return linear_loss(us @ jnp.asarray(R_INV).T)

    g_u0, g_p = jax.jit(jax.grad(loss, argnums=(0, 1)))(u0, P0)
    d_x0, d_a, d_b = exact_gradients(x0, P0)
    np.testing.assert_allclose(g_u0, d_x0 * R_INV[0], rtol=1e-7)
    np.testing.assert_allclose(g_p, [d_a, d_b], rtol=1e-7)


# --- Robertson: the DAE against its ODE form ------------------------------------------------------


def test_robertson_dae_against_the_ode_form():
    """Against SciPy's Radau on the ODE at 1e-10 (relative 1e-5 at every save), from an inconsistent
    u0 (y3 = 0.5 is reset to 0 by the conservation law)."""
    ref = solve_ivp(
        lambda t, y: np.asarray(robertson(y, ROBERTSON_P, t)),
        (0.0, 1e3),
        [1.0, 0.0, 0.0],
        method="Radau",
        rtol=1e-10,
        atol=1e-12,
        t_eval=ROBERTSON_TS,
    ).y.T
    prob = sciad.ODEProblem(
        robertson_dae, np.array([1.0, 0.0, 0.5]), (0.0, 1e3), ROBERTSON_P, mass_matrix=np.array([1.0, 1.0, 0.0])
    )
    # compiled whole (eagerly, the consistent initialisation and the rest compile a small program per operation)
    us = jax.jit(lambda: sciad.solve(prob, saveat=ROBERTSON_TS, rtol=1e-8, atol=1e-10, max_steps=10_000).us)()
    np.testing.assert_allclose(us, ref, rtol=1e-5, atol=1e-12)


@pytest.mark.slow
def test_robertson_gradient_against_the_ode_form():
    """∂ y2(t) / ∂ log k over three rates (DiscreteAdjoint through Rodas5P on the DAE) against the ODE
    form through Kvaerno5 at tight tolerances."""

    def loss(prob, solver):
        def value(log_k):
            us = sciad.solve(
                prob,
                p=jnp.exp(log_k),
                saveat=ROBERTSON_TS[:4],
                solver=solver,
                rtol=1e-9,
                atol=1e-12,
                max_steps=20_000,
                sensealg=sciad.DiscreteAdjoint(),
            ).us
            return jnp.sum(us[:, 1] * 1e4)

        return value

    dae = sciad.ODEProblem(
        robertson_dae, np.array([1.0, 0.0, 0.0]), (0.0, 100.0), ROBERTSON_P, mass_matrix=np.array([1.0, 1.0, 0.0])
    )
    ode = sciad.ODEProblem(robertson, np.array([1.0, 0.0, 0.0]), (0.0, 100.0), ROBERTSON_P)
    log_k = np.log(ROBERTSON_P)
    g_dae = jax.grad(loss(dae, None))(log_k)
    g_ode = jax.grad(loss(ode, "kvaerno5"))(log_k)
    np.testing.assert_allclose(g_dae, g_ode, rtol=1e-5)


# --- initialisation options ---------------------------------------------------------------------------


def test_check_refuses_an_inconsistent_u0_and_passes_a_consistent_one():
    prob = linear_problem()
    with pytest.raises(sciad.SolveError, match=r"initialization='check'.*residual's largest entry is 7\.500e-01"):
        sciad.solve(prob, initialization="check")
    sol = sciad.solve(prob, u0=np.array([1.5, 0.75]), initialization="check", saveat=TS, **TOL)
    np.testing.assert_allclose(sol.us, exact(1.5, P0), rtol=1e-7, atol=1e-9)
    jitted = jax.jit(lambda u0: sciad.solve(prob, u0=u0, initialization="check").us)
    with pytest.raises(Exception) as raised:
        jitted(np.array([1.5, 0.0])).block_until_ready()
    assert "initialization='check'" in sciad.errors.summary(raised.value)


def test_none_leaves_u0():
    sol = sciad.solve(linear_problem(), initialization="none", saveat=TS, **TOL)
    np.testing.assert_array_equal(sol.us[0], [1.5, 0.0])


def test_consistent_initialisation_failure_is_a_solve_error():
    """0 = z² + 1 has no real root: Newton does not converge."""
    prob = sciad.ODEProblem(
        lambda u, p, t: jnp.stack([-u[0], u[1] ** 2 + 1]),
        np.array([1.0, 0.5]),
        (0.0, 1.0),
        mass_matrix=np.array([1.0, 0.0]),
    )
    with pytest.raises(sciad.SolveError, match="initialization='consistent': Newton"):
        sciad.solve(prob)


# --- the boundary -----------------------------------------------------------------------------------


def test_mass_matrix_checked_at_the_problem():
    u0 = np.array([1.5, 0.0])
    make = lambda M: sciad.ODEProblem(linear, u0, (0.0, 1.0), P0, mass_matrix=M)  # noqa: E731
    with pytest.raises(ValueError, match=r"mass_matrix has shape \(3,\) but the flattened u0 has 2 entries"):
        make(np.ones(3))
    with pytest.raises(ValueError, match=r"mass_matrix has shape \(2, 3\)"):
        make(np.ones((2, 3)))
    with pytest.raises(ValueError, match="mass_matrix contains non-finite"):
        make(np.array([1.0, np.nan]))
    with pytest.raises(TypeError, match="mass_matrix must be constant"):
        jax.jit(lambda M: make(M).u0)(np.ones(2))
    sparse = make(scipy.sparse.diags([1.0, 0.0]).tocsr())  # SciPy sparse: made dense (here: its diagonal)
    assert sparse.mass_matrix == make(np.array([1.0, 0.0])).mass_matrix
    np.testing.assert_array_equal(np.asarray(make(np.array([[1.0, 0.0], [0.0, 0.0]])).mass_matrix), [1.0, 0.0])
    assert make(None).mass_matrix is None and make(np.eye(2)).mass_matrix.singular is False


def test_solve_refuses_what_a_mass_matrix_cannot_take():
    prob = linear_problem()
    with pytest.raises(
        ValueError,
        match=r"singular mass matrix \(a DAE with 1 algebraic equation\(s\)\) needs a "
        r"solver that takes one: solver='rodas5p', 'rodas4' or 'bdf'",
    ):
        sciad.solve(prob, solver="kvaerno5")
    with pytest.raises(ValueError, match="holds a mass matrix other than the problem's"):
        sciad.solve(prob, solver=sciad.Rodas5P(mass_matrix=np.array([1.0, 1.0])))
    with pytest.raises(ValueError, match="the problem has no mass matrix"):
        sciad.solve(sciad.ODEProblem(linear, np.ones(2), (0.0, 1.0), P0), solver=sciad.Rodas4(mass_matrix=np.ones(2)))
    with pytest.raises(ValueError, match="initialization must be one of"):
        sciad.solve(prob, initialization="brown")


def test_solvers_by_name_and_given_without_mass_matrix():
    prob = linear_problem()
    for solver in ("rodas4", sciad.Rodas4(), sciad.Rodas5P(mass_matrix=np.array([1.0, 0.0]))):
        sol = sciad.solve(prob, solver=solver, saveat=TS, **TOL)
        np.testing.assert_allclose(sol.us, exact(1.5, P0), rtol=1e-6, atol=1e-9)
    assert isinstance(sciad.get_solver("rodas5p"), sciad.Rodas5P) and "rodas4" in sciad.SOLVERS


# --- composition ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_float32():
    prob = sciad.ODEProblem(
        linear, np.array([1.5, 0.0], np.float32), (0.0, 2.0), P0.astype(np.float32), mass_matrix=np.array([1.0, 0.0])
    )
    sol = sciad.solve(prob, saveat=TS, rtol=1e-5, atol=1e-6)
    assert sol.us.dtype == jnp.float32
    np.testing.assert_allclose(sol.us, exact(1.5, P0), rtol=1e-4, atol=1e-5)
    grad = jax.grad(lambda p: linear_loss(sciad.solve(prob, p=p, saveat=TS, rtol=1e-5, atol=1e-6).us))(
        P0.astype(np.float32)
    )
    np.testing.assert_allclose(grad, exact_gradients(1.5, P0)[1:], rtol=1e-3)


def test_pytree_state_with_a_diagonal_over_the_flattened_state():
    """u0 = {"x": (2,), "z": ()}: raveled in key order x0, x1, z; z = x0 + x1 algebraically."""

    def f(u, p, t):
        return {"x": -p * u["x"], "z": u["z"] - u["x"].sum()}

    prob = sciad.ODEProblem(
        f,
        {"x": np.array([1.0, 2.0]), "z": np.array(0.0)},
        (0.0, 1.0),
        np.array(0.5),
        mass_matrix=np.array([1.0, 1.0, 0.0]),
    )
    sol = jax.jit(lambda: sciad.solve(prob, saveat=TS[:3], **TOL))()  # compiled whole (eagerly, one per operation)
    decay = np.exp(-0.5 * TS[:3])
    np.testing.assert_allclose(sol.us["x"], np.outer(decay, [1.0, 2.0]), rtol=1e-7)
    np.testing.assert_allclose(sol.us["z"], 3 * decay, rtol=1e-7)
    grad = jax.jit(jax.grad(lambda u0: sciad.solve(prob, u0=u0, saveat=TS[:3], **TOL).us["z"].sum()))(prob.u0)
    np.testing.assert_allclose(grad["x"], [decay.sum()] * 2, rtol=1e-7)
    assert grad["z"] == 0


def test_integrand_rides_with_the_mass_matrix():
    """∫ x dt = x0 (1 - e^{(b - a) T}) / (a - b): the integral's entry takes q' = g (M extended by 1)."""
    sol = jax.jit(lambda: sciad.solve(linear_problem(), integrand=lambda u, p, t: u[0], **TOL))()
    a, b = P0
    np.testing.assert_allclose(sol.integral, 1.5 * (1 - np.exp((b - a) * 2.0)) / (a - b), rtol=1e-7)


def test_auto_picks_a_sensealg_that_serves_a_mass_matrix():
    for m, expected in ((2, sciad.ForwardDiffSensitivity), (40, sciad.DiscreteAdjoint)):
        choice = auto_sensealg(
            np.ones(3), np.ones(m), np.ones(4), solver=sciad.Rodas5P(), rtol=1e-6, atol=1e-6, mass_matrix=True
        )
        assert isinstance(choice.sensealg, expected) and choice.heuristic_pick.rule == "mass-matrix"
        assert "heuristic rule `mass-matrix`" in choice.report()


def test_select_sensealg_on_a_problem_with_a_mass_matrix():
    """The heuristic without a solver named (Rodas5P), and autotuning's candidates: those that serve M."""
    prob = linear_problem()
    choice = sciad.select_sensealg(prob, saveat=TS)
    assert isinstance(choice.sensealg, sciad.ForwardDiffSensitivity) and choice.features.mass_matrix
    assert choice.features.implicit_solver and choice.heuristic_pick.rule == "mass-matrix"
    candidates = [s for s, _ in sciad.select.candidates(sciad.select.features(prob, TS))]
    assert not any(isinstance(s, sciad.ReversibleAdjoint) for s in candidates)  # the one that refuses a DAE
    assert {"ForwardDiffSensitivity", "DiscreteAdjoint", "GaussAdjoint"} <= {type(s).__name__ for s in candidates}


def test_rosenbrock_solvers_count_as_implicit():
    from sciad._stiff import is_implicit
    from sciad.adjoints._base import step_controller

    assert is_implicit(sciad.Rodas5P()) and is_implicit(dfx.Kvaerno5()) and not is_implicit(dfx.Tsit5())
    assert step_controller(sciad.Rodas4(), 1e-6, 1e-6).pcoeff == 0.4


def test_rosenbrock_ode_with_a_continuous_adjoint():
    prob = sciad.ODEProblem(linear, np.array([1.0, 0.3]), (0.0, 2.0), P0)
    grads = [
        jax.jit(jax.grad(lambda p: sciad.solve(prob, p=p, solver="rodas5p", sensealg=s, **TOL).us.sum()))(P0)
        for s in (sciad.InterpolatingAdjoint(), sciad.DiscreteAdjoint())
    ]
    np.testing.assert_allclose(*grads, rtol=1e-6)


# --- sparse stages: W = M/(hγ) − J by the host's sparse LU ------------------------------------------
# A 1-D reaction–diffusion with an algebraic screened-Poisson potential (sciad_bench.dae's, small):
# u' = D Δu + a u (1 − u) − b u φ, 0 = Δφ − κ² φ + u, N cells, 2N states.

RD_CELLS = 20
RD_P = np.array([0.01, 1.0, 20.0])
RD_TS = np.array([0.5, 1.0, 2.0])
RD_TOL = dict(rtol=1e-8, atol=1e-10)


def _laplacian(v, mirror):
    h = 1.0 / v.shape[0]
    padded = jnp.concatenate([(1.0 if mirror else -1.0) * v[:1], v, (1.0 if mirror else -1.0) * v[-1:]])
    return (padded[2:] - 2 * v + padded[:-2]) / h**2


def reaction_diffusion(y, p, t):
    D, a, b = p
    u, phi = jnp.split(y, 2)
    return jnp.concatenate(
        [D * _laplacian(u, True) + a * u * (1 - u) - b * u * phi, _laplacian(phi, False) - 25.0 * phi + u]
    )


def reaction_diffusion_problem(cells=RD_CELLS):
    x = (np.arange(cells) + 0.5) / cells
    u0 = np.concatenate([0.1 + 0.8 * np.exp(-(((x - 0.3) / 0.1) ** 2)), np.zeros(cells)])
    return sciad.ODEProblem(
        reaction_diffusion, u0, (0.0, 2.0), RD_P, mass_matrix=np.concatenate([np.ones(cells), np.zeros(cells)])
    )


def consistent_potential(u):
    """φ solving the algebraic equations Δφ − 25 φ + u = 0 for the cells' u (NumPy: Δ with the ghost cells −φ at
    both ends, as `_laplacian(φ, mirror=False)`)."""
    cells = u.shape[0]
    laplacian = np.diag(np.full(cells, -2.0)) + np.diag(np.ones(cells - 1), 1) + np.diag(np.ones(cells - 1), -1)
    laplacian[0, 0] = laplacian[-1, -1] = -3.0
    return np.linalg.solve(25.0 * np.eye(cells) - laplacian * cells**2, u)


def rd_loss(us):
    u, phi = jnp.split(us, 2, axis=1)
    return jnp.sum(jnp.mean(u**2, axis=1) + jnp.mean(phi, axis=1))


def test_sparse_rodas_equals_dense_with_one_factorisation_per_step():
    prob = reaction_diffusion_problem()
    # each solve compiled whole (eagerly, one small program per operation); the host LU counts as the program runs
    solve = jax.jit(lambda jacobian: sciad.solve(prob, saveat=RD_TS, jacobian=jacobian, **RD_TOL), static_argnums=0)
    dense = solve("dense")
    sciad.stiff.LU_COUNTS.clear()
    sparse = solve("sparse")
    counts = sciad.stiff.LU_COUNTS.snapshot()
    np.testing.assert_allclose(sparse.us, dense.us, rtol=0, atol=1e-9)
    assert int(sparse.stats["steps"]) == int(dense.stats["steps"]) == counts["factorisations"]
    stages = sciad.Rodas5P.rosenbrock_tableau.num_stages
    assert counts["solves"] == stages * counts["factorisations"]  # every stage solves with the step's factors


@pytest.mark.slow
def test_sparse_rodas_gradients_equal_dense_under_jit_and_vmap():
    """DiscreteAdjoint under jit and vmap over p, ForwardDiffSensitivity eagerly (its tangents' solves
    reuse each step's factors: one factorisation per step)."""
    prob = reaction_diffusion_problem()

    def loss(p, jacobian, sensealg):
        return rd_loss(sciad.solve(prob, p=p, saveat=RD_TS, jacobian=jacobian, sensealg=sensealg, **RD_TOL).us)

    ps = np.array([RD_P, [0.02, 1.0, 10.0]])
    dense = jax.jit(jax.vmap(jax.grad(lambda p: loss(p, "dense", sciad.DiscreteAdjoint()))))(ps)
    values, grads = jax.jit(jax.vmap(jax.value_and_grad(lambda p: loss(p, "sparse", sciad.DiscreteAdjoint()))))(ps)
    np.testing.assert_allclose(grads, dense, rtol=1e-9)
    np.testing.assert_allclose(
        values[0], rd_loss(sciad.solve(prob, saveat=RD_TS, jacobian="dense", **RD_TOL).us), rtol=1e-10
    )
    sciad.stiff.LU_COUNTS.clear()
    forward = jax.grad(loss)(RD_P, "sparse", sciad.ForwardDiffSensitivity())
    factorisations = sciad.stiff.LU_COUNTS["factorisations"]
    np.testing.assert_allclose(forward, dense[0], rtol=1e-9)
    steps = int(sciad.solve(prob, saveat=RD_TS, jacobian="sparse", **RD_TOL).stats["steps"])
    assert factorisations <= steps  # (fewer where a step's factors are still held from an earlier solve)


def test_sparse_rodas_on_an_ode_and_with_a_full_mass_matrix():
    """Without M (the identity: Rodas4 on the reaction part alone), and with a full singular M."""
    prob = sciad.ODEProblem(
        lambda u, p, t: p[0] * _laplacian(u, True) + p[1] * u * (1 - u),
        reaction_diffusion_problem().u0[:RD_CELLS],
        (0.0, 2.0),
        RD_P[:2],
    )
    # each solve compiled whole (eagerly, one small program per operation)
    dense, sparse = (
        jax.jit(lambda j=j: sciad.solve(prob, saveat=RD_TS, solver="rodas4", jacobian=j, **RD_TOL).us)()
        for j in ("dense", "sparse")
    )
    np.testing.assert_allclose(sparse, dense, rtol=0, atol=1e-9)
    full = sciad.ODEProblem(rotated, R @ np.array([1.5, 0.0]), (0.0, 2.0), P0, mass_matrix=M_FULL)
    dense, sparse = (
        jax.jit(lambda j=j: sciad.solve(full, saveat=TS, jacobian=j, **TOL).us)() for j in ("dense", "sparse")
    )
    np.testing.assert_allclose(sparse, dense, rtol=0, atol=1e-10)


def test_auto_takes_sparse_stages_for_a_large_sparse_dae():
    from sciad._stiff import auto_jacobian

    large = reaction_diffusion_problem(200)  # 400 states: f's Jacobian a banded sparse one
    kind, why = auto_jacobian(sciad.Rodas5P(), large.f, large.u0, large.p, 0.0)
    assert kind == "sparse" and "colours" in why
    assert auto_jacobian(sciad.Rodas5P(), reaction_diffusion, reaction_diffusion_problem().u0, RD_P, 0.0)[0] == "dense"


@pytest.mark.slow
def test_consistent_initialisation_of_a_large_sparse_algebraic_block():
    """300 algebraic equations: Newton's linear solves (and the implicit rule's) by the host's sparse LU."""
    cells = 300
    prob = reaction_diffusion_problem(cells)
    u = prob.u0[:cells]
    phi = consistent_potential(u)
    ts = np.array([0.0, 0.01])

    def loss(p, u0, initialization):
        return rd_loss(
            sciad.solve(
                prob,
                u0=u0,
                p=p,
                saveat=ts,
                jacobian="sparse",
                initialization=initialization,
                sensealg=sciad.DiscreteAdjoint(),
                **RD_TOL,
            ).us
        )

    sol = sciad.solve(prob, saveat=ts, jacobian="sparse", **RD_TOL)
    np.testing.assert_allclose(sol.us[0, cells:], phi, rtol=1e-10, atol=1e-13)
    consistent = np.concatenate([u, phi])  # φ(0) does not depend on p: the same gradient
    np.testing.assert_allclose(
        jax.grad(loss)(RD_P, prob.u0, "consistent"), jax.grad(loss)(RD_P, consistent, "none"), rtol=1e-9
    )


def test_the_initialisation_newton_solves_with_the_algebraic_blocks_own_sparse_pattern():
    """The sparse LU of the initialisation's Newton takes ∂residual/∂z's pattern from the residual (3k entries
    for a 1-D Laplacian), not from the Newton operator's product, which read dense: k² entries by VJPs, 2.9 s
    against IDAS's 0.06 s at 5,000 states."""
    from sciad._dae import _algebraic_solver

    cells = 300
    z0, args = jnp.zeros(cells), jnp.ones(cells)
    solver = _algebraic_solver(lambda z, u: _laplacian(z, False) - 25.0 * z + u, z0, args)
    assert solver.jacobian.pattern.matrix.nnz <= 3 * cells


@pytest.mark.parametrize(
    "sensealg", ["ForwardDiffSensitivity", pytest.param("ForwardSensitivity", marks=pytest.mark.slow)]
)
def test_forward_mode_tangents_pass_through_the_initialisation(sensealg):
    """The forward-mode sensealgs solve the consistent initialisation inside their rule (`Setup.consistent`): a
    gradient in p from an inconsistent u0 carries m tangents, as from a consistent one, not n more for a u0
    computed from p (60,384 host solves against 1,184 at 200 states, 25× the time)."""
    from sciad.stiff import LU_COUNTS

    prob = reaction_diffusion_problem(12)
    consistent = np.concatenate([prob.u0[:12], consistent_potential(prob.u0[:12])])
    solves = {}  # the host's sparse LU counts them
    for u0, initialization in ((prob.u0, "consistent"), (consistent, "none")):
        grad = jax.jit(jax.grad(lambda p: _rd_loss_from(prob, u0, p, sensealg, initialization)))
        grad(RD_P)
        LU_COUNTS.clear()
        grad(RD_P).block_until_ready()
        solves[initialization] = LU_COUNTS["solves"]
    assert solves["consistent"] <= 1.2 * solves["none"], solves


@pytest.mark.slow
@pytest.mark.parametrize("sensealg", ["ForwardDiffSensitivity", "ForwardSensitivity"])
def test_forward_mode_gradients_through_the_initialisation_in_u0_and_p(sensealg):
    """From an inconsistent u0, ∂L/∂(u0, p) as DiscreteAdjoint's (the initialisation differentiated outside)."""
    prob = reaction_diffusion_problem(12)
    both = jax.grad(lambda u0, p, s: _rd_loss_from(prob, u0, p, s, "consistent"), argnums=(0, 1))
    for got, want in zip(both(prob.u0, RD_P, sensealg), both(prob.u0, RD_P, "DiscreteAdjoint")):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


def _rd_loss_from(prob, u0, p, sensealg, initialization):
    return rd_loss(
        sciad.solve(
            prob,
            u0=u0,
            p=p,
            saveat=RD_TS,
            jacobian="sparse",
            sensealg=sensealg,
            initialization=initialization,
            **RD_TOL,
        ).us
    )
