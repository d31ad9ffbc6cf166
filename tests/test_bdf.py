"""sciad's variable-order BDF (`sciad._bdf`): the steps each order takes as rtol falls, accuracy on
Robertson against SciPy's BDF and Radau and on a stiff linear system with a closed form, factorisations
kept across steps (a rejected attempt's too), a mass-matrix DAE against Rodas5P, jit/vmap/PyTree/float32,
gradients by forward mode, the discrete adjoint and a continuous adjoint against finite differences and
Rodas5P, and sparse stages (the host's LU of W kept across steps) against dense ones on a 1-D Brusselator."""

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import sciad
from helpers import dae
from sciad._bdf import BDF, BDFController
from sciad._host_lu import COUNTS
from sciad._stiff import MatrixFree, Sparse, auto_jacobian
from sciad.adjoints._loop import Stepper, integrate


def _stepped(vf, solver, y0, args, t1, rtol, atol, ts=None, max_steps=100_000, dt0=None):
    """sciad's loop over `solver`'s steps of vf(t, y, args) from t = 0 (its end state's counts readable)."""
    stepper = Stepper.of(dfx.ODETerm(vf), solver, BDFController(rtol=rtol, atol=atol))
    return integrate(stepper, y0, args, 0.0, t1, ts=ts, max_steps=max_steps, dt0=dt0)


def _cosine(t, u, lam):  # u' = λ (u − cos t) − sin t: u = cos t from u(0) = 1, for any λ
    return lam * (u - jnp.cos(t)) - jnp.sin(t)


RTOLS = np.array([1e-3, 1e-4, 1e-5, 1e-6, 1e-7])


@pytest.mark.parametrize("max_order", [1, 2])
def test_steps_and_errors_scale_as_the_order(max_order):
    """At order q the local error is ~ h^(q+1): steps grow as rtol^(-1/(q+1)) and the global error (a sum of
    local errors held at rtol) falls as rtol^(q/(q+1)). A batch of tolerances in one vmapped solve, each
    member stepping its own way."""

    def run(rtol):
        sol = _stepped(_cosine, BDF(max_order=max_order), jnp.array([1.0]), -10.0, 5.0, rtol, rtol)
        return jnp.abs(sol.ys[-1, 0] - jnp.cos(5.0)), sol.stats["num_accepted_steps"]

    errors, steps = jax.jit(jax.vmap(run))(jnp.asarray(RTOLS))
    assert len(set(np.asarray(steps).tolist())) == RTOLS.size
    steps_slope = np.polyfit(np.log(RTOLS), np.log(steps), 1)[0]
    error_slope = np.polyfit(np.log(RTOLS), np.log(errors), 1)[0]
    assert abs(steps_slope + 1 / (max_order + 1)) < 0.03
    assert abs(error_slope - max_order / (max_order + 1)) < 0.1
    if max_order == 2:  # one member alone takes the steps it took in the batch (a property of vmap, once)
        alone = jax.jit(run)(RTOLS[2])
        assert int(alone[1]) == int(steps[2]) and np.isclose(alone[0], errors[2], rtol=1e-6)


ROBERTSON_TS = np.array([1e-2, 1.0, 1e2, 1e4, 1e5])


def _robertson(t, u, p):
    return dae.robertson(u, p, t)


@pytest.fixture(scope="module")
def robertson_bdf():
    return jax.jit(
        lambda p: _stepped(_robertson, BDF(), jnp.array([1.0, 0.0, 0.0]), p, 1e5, 1e-8, 1e-10, ts=ROBERTSON_TS)
    )(jnp.asarray(dae.ROBERTSON_P))


def _robertson_numpy(t, u):
    k1, k2, k3 = dae.ROBERTSON_P
    return np.array([-k1 * u[0] + k3 * u[1] * u[2], k1 * u[0] - k3 * u[1] * u[2] - k2 * u[1] ** 2, k2 * u[1] ** 2])


def _robertson_jacobian(t, u):
    k1, k2, k3 = dae.ROBERTSON_P
    return np.array(
        [[-k1, k3 * u[2], k3 * u[1]], [k1, -k3 * u[2] - 2 * k2 * u[1], -k3 * u[1]], [0.0, 2 * k2 * u[1], 0.0]]
    )


def test_robertson_against_scipy(robertson_bdf):
    """Robertson to t = 1e5 at rtol 1e-8: within 1e-6 (relative, each state) of SciPy's Radau at rtol 1e-12,
    in about as many steps as SciPy's BDF (the same method) takes."""
    kw = dict(jac=_robertson_jacobian)
    tight = solve_ivp(
        _robertson_numpy, (0, 1e5), [1.0, 0, 0], method="Radau", rtol=1e-12, atol=1e-14, t_eval=ROBERTSON_TS, **kw
    )
    scipy_bdf = solve_ivp(_robertson_numpy, (0, 1e5), [1.0, 0, 0], method="BDF", rtol=1e-8, atol=1e-10, **kw)
    ys = np.asarray(robertson_bdf.ys)
    assert np.max(np.abs(ys - tight.y.T) / np.abs(tight.y.T)) < 1e-6
    steps = int(robertson_bdf.stats["num_steps"])
    assert 0.8 < steps / (scipy_bdf.t.size - 1) < 1.25


def test_factorisations_kept_across_steps(robertson_bdf):
    """Over Robertson's ~600 steps, W's LU is made on about one step in six and J on one in forty: they
    are kept while h/α_k stays within REFACTOR_RATIO and the chord iteration converges."""
    lin = robertson_bdf.end.solver_state.linearisation
    steps = int(robertson_bdf.stats["num_accepted_steps"])
    assert int(lin.factorisations) < steps / 4
    assert 1 <= int(lin.jacobians) < steps / 20
    assert int(robertson_bdf.end.solver_state.order) == 5


def test_stiff_linear_closed_form_by_name():
    """u' = A u with eigenvalues −1 and −1e4, solver="bdf" through sciad.solve, against exp(tA) u0."""
    A = np.array([[-1.0, 0.0], [1e4 - 1.0, -1e4]])  # eigenvectors (1, 1), (0, 1)
    u0, ts = np.array([1.0, 3.0]), np.array([1e-3, 0.1, 1.0, 5.0])
    prob = sciad.ODEProblem(lambda u, p, t: p @ u, u0, (0.0, 5.0), A)
    sol = jax.jit(lambda: sciad.solve(prob, saveat=ts, solver="bdf", rtol=1e-8, atol=1e-10))()  # compiled whole
    exact = np.stack([np.exp(-ts), np.exp(-ts) + 2 * np.exp(-1e4 * ts)], -1)
    np.testing.assert_allclose(sol.us, exact, rtol=1e-6, atol=1e-9)


def test_mass_matrix_dae_against_rodas5p():
    """Robertson as an index-1 DAE (the conservation law as its algebraic equation, M = diag(1, 1, 0)):
    BDF's solution against Rodas5P's, and the linear DAE's closed form through a full singular M."""
    prob = sciad.ODEProblem(
        dae.robertson_dae, np.array([1.0, 0.0, 0.0]), (0.0, 1e3), dae.ROBERTSON_P, mass_matrix=np.array([1.0, 1.0, 0.0])
    )

    def mixed(u, p, t):  # M u' = Q R⁻¹ ... : the linear DAE in u = R w, its equations mixed by Q
        return jnp.asarray(dae.Q) @ dae.linear(jnp.asarray(dae.R_INV) @ u, p, t)

    M = dae.Q @ np.diag([1.0, 0.0]) @ dae.R_INV
    x0 = 1.5
    u0 = dae.R @ np.array([x0, dae.P0[1] * x0])
    linear = sciad.ODEProblem(mixed, u0, (0.0, 2.0), dae.P0, mass_matrix=M)

    @jax.jit  # the three solves compiled as one program (eagerly, a small program per operation)
    def solves():
        return (
            sciad.solve(prob, saveat=dae.ROBERTSON_TS, solver="bdf", rtol=1e-8, atol=1e-10).us,
            sciad.solve(prob, saveat=dae.ROBERTSON_TS, solver="rodas5p", rtol=1e-10, atol=1e-12).us,
            sciad.solve(linear, saveat=dae.TS, solver=BDF(), rtol=1e-9, atol=1e-11).us,
        )

    bdf, rodas, mixed_us = solves()
    np.testing.assert_allclose(bdf, rodas, rtol=1e-5)
    np.testing.assert_allclose(bdf.sum(1), 1.0, rtol=1e-12)  # the algebraic equation holds at every step
    np.testing.assert_allclose(mixed_us, dae.exact(x0, dae.P0) @ dae.R.T, rtol=1e-6)


def _pytree_rhs(u, p, t):
    return {"x": -p["a"] * u["x"] + u["y"], "y": -1e3 * (u["y"] - jnp.sin(t))}


def _pytree_exact(a, t):
    """(x(t), y(t)) of `_pytree_rhs` from x(0) = (1, 2), y(0) = 0: y = c (c sin t − cos t + e^{−ct}) / (c² + 1),
    c = 1e3, and x = x(0) e^{−at} + ∫₀ᵗ e^{−a(t−s)} y(s) ds."""
    c, decay = 1e3, np.exp(-a * t)
    sine = (a * np.sin(t) - np.cos(t) + decay) / (a**2 + 1)  # ∫₀ᵗ e^{−a(t−s)} sin s ds
    cosine = (a * np.cos(t) + np.sin(t) - a * decay) / (a**2 + 1)
    fast = (np.exp(-c * t) - decay) / (a - c)
    x = np.array([1.0, 2.0]) * decay + c / (c**2 + 1) * (c * sine - cosine + fast)
    return x, c / (c**2 + 1) * (c * np.sin(t) - np.cos(t) + np.exp(-c * t))


def test_jit_vmap_pytree_and_float32():
    """A dict state under jit(vmap) over parameters (members taking different steps): each member's solve is
    its closed form, and its gradient under jit(vmap(grad)) central differences of the batch; in float32 the
    solve stays in float32 and near the float64 one."""
    u0 = {"x": jnp.array([1.0, 2.0]), "y": jnp.array(0.0)}

    def final(a, dtype=jnp.float64, rtol=1e-8, sensealg="auto"):
        prob = sciad.ODEProblem(_pytree_rhs, jax.tree.map(lambda x: x.astype(dtype), u0), (0.0, 3.0), {"a": a})
        return sciad.solve(prob, saveat=[3.0], solver="bdf", sensealg=sensealg, rtol=rtol, atol=rtol * 1e-2).us

    a = jnp.array([0.5, 2.0, 8.0])
    batch = jax.jit(jax.vmap(final))
    batched = batch(a)
    for i, member in enumerate(np.asarray(a)):
        x, y = _pytree_exact(member, 3.0)
        np.testing.assert_allclose(batched["x"][i, 0], x, rtol=1e-6)
        np.testing.assert_allclose(batched["y"][i, 0], y, rtol=1e-6)
    # each member's gradient through its own steps (the discrete adjoint), against central differences
    loss = lambda a: jnp.sum(final(a, sensealg=sciad.DiscreteAdjoint())["x"])  # noqa: E731
    grads = jax.jit(jax.vmap(jax.grad(loss)))(a)
    rel = 1e-6
    central = (batch(a * (1 + rel))["x"].sum((1, 2)) - batch(a * (1 - rel))["x"].sum((1, 2))) / (2 * rel * a)
    np.testing.assert_allclose(grads, central, rtol=1e-5)
    single = jax.jit(lambda a: final(a, jnp.float32, 1e-5))(jnp.float32(2.0))
    assert single["x"].dtype == jnp.float32
    np.testing.assert_allclose(single["x"], batched["x"][1], rtol=1e-4)


def _gradient_problem():
    return sciad.ODEProblem(dae.robertson, np.array([1.0, 0.0, 0.0]), (0.0, 10.0), np.array([0.04, 3e3, 1e4]))


def _loss(p, solver, sensealg):
    sol = sciad.solve(
        _gradient_problem(), p=p, saveat=[1.0, 10.0], solver=solver, sensealg=sensealg, rtol=1e-10, atol=1e-12
    )
    return jnp.sum(sol.us[:, 0] * jnp.array([1.0, 2.0])) + 1e3 * jnp.sum(sol.us[:, 1])


@pytest.fixture(scope="module")
def central_differences():
    p = jnp.array([0.04, 3e3, 1e4])
    loss = jax.jit(lambda p: _loss(p, "bdf", sciad.ForwardDiffSensitivity()))
    rel = 1e-5
    return np.array(
        [(loss(p.at[i].multiply(1 + rel)) - loss(p.at[i].multiply(1 - rel))) / (2 * rel * p[i]) for i in range(3)]
    )


@pytest.mark.parametrize("sensealg", [sciad.ForwardDiffSensitivity(), sciad.DiscreteAdjoint(), sciad.GaussAdjoint()])
def test_gradients_against_finite_differences(sensealg, central_differences):
    """∂L/∂p through BDF's steps (forward mode; the discrete adjoint, which recomputes each step from its
    stored state) and by a continuous adjoint solved backwards by BDF, against central differences of the
    solve at rtol 1e-10."""
    p = jnp.array([0.04, 3e3, 1e4])
    grad = jax.jit(jax.grad(_loss), static_argnums=(1, 2))(p, "bdf", sensealg)
    np.testing.assert_allclose(grad, central_differences, rtol=1e-6)


@pytest.mark.slow
def test_gradient_against_rodas5p(central_differences):
    p = jnp.array([0.04, 3e3, 1e4])
    bdf = jax.jit(jax.grad(_loss), static_argnums=(1, 2))(p, "bdf", sciad.DiscreteAdjoint())
    rodas = jax.jit(jax.grad(_loss), static_argnums=(1, 2))(p, "rodas5p", sciad.ForwardDiffSensitivity())
    np.testing.assert_allclose(bdf, rodas, rtol=1e-7)


def test_an_event_restarts_it():
    """A dose at t = 1 (the state jumps): BDF restarts from the new state at order 1, as Rodas5P steps on."""
    prob = sciad.ODEProblem(_pytree_rhs, {"x": jnp.array([1.0, 2.0]), "y": jnp.array(0.0)}, (0.0, 3.0), {"a": 0.7})
    dose = sciad.PresetTimeCallback([1.0], lambda u, p, t: {"x": u["x"] + 2.0, "y": u["y"]})
    kw = dict(saveat=[0.5, 1.0, 1.7, 3.0], callbacks=[dose], rtol=1e-9, atol=1e-11)
    bdf, rodas = jax.jit(lambda: [sciad.solve(prob, solver=s, **kw).us for s in ("bdf", "rodas5p")])()  # one program
    np.testing.assert_allclose(bdf["x"], rodas["x"], rtol=1e-7)


def test_options_checked():
    with pytest.raises(ValueError, match="max_order"):
        BDF(max_order=6)
    prob = sciad.ODEProblem(_pytree_rhs, {"x": jnp.ones(2), "y": jnp.array(0.0)}, (0.0, 1.0), {"a": 0.7})
    with pytest.raises(ValueError, match="jacobian='dense' or jacobian='sparse' only"):
        sciad.solve(prob, solver="bdf", jacobian=MatrixFree())


@pytest.mark.slow
@pytest.mark.parametrize("sensealg", [sciad.DiscreteAdjoint(), sciad.GaussAdjoint()])
def test_dae_gradients_against_the_closed_form(sensealg):
    """The linear index-1 DAE's ∂L/∂(x0, a, b) through BDF's steps and by the adjoint DAE solved backwards by BDF."""

    def loss(x0, p):
        u0 = jnp.stack([x0, 0.0])
        sol = sciad.solve(dae.linear_problem(), u0=u0, p=p, saveat=dae.TS, solver="bdf", sensealg=sensealg, **dae.TOL)
        return dae.linear_loss(sol.us)

    g = jax.jit(jax.grad(loss, argnums=(0, 1)))(1.5, jnp.asarray(dae.P0))
    np.testing.assert_allclose([g[0], *g[1]], dae.exact_gradients(1.5, dae.P0), rtol=1e-7)


def test_a_rejected_attempts_linearisation_is_kept():
    """A first step of 1e3 on Robertson is rejected: the loop keeps the state BDF returns with it (its
    differences as they were, with the W factorised and the J evaluated in the attempt; `rejects_itself`)."""
    sol = jax.jit(
        lambda p: _stepped(_robertson, BDF(), jnp.array([1.0, 0.0, 0.0]), p, 1e5, 1e-8, 1e-10, max_steps=1, dt0=1e3)
    )(jnp.asarray(dae.ROBERTSON_P))
    assert int(sol.stats["num_rejected_steps"]) == 1
    state = sol.end.solver_state
    assert int(state.linearisation.factorisations) >= 1 and int(state.linearisation.jacobians) >= 1
    assert float(state.linearisation.c) > 0  # W made for this attempt's h/α
    np.testing.assert_array_equal(state.D[0], [1.0, 0.0, 0.0])


def _brusselator(t, u, p):
    """The 1-D Brusselator u' = a + u²v − (b + 1) u + α Δu, v' = b u − u²v + α Δv (no-flux ends), u = (u, v)."""
    a, b, alpha = p[0], p[1], p[2]
    n = u.shape[0] // 2
    x, y = u[:n], u[n:]

    def laplacian(w):
        return jnp.concatenate([w[1:2] - w[:1], w[2:] - 2 * w[1:-1] + w[:-2], w[-2:-1] - w[-1:]])

    x2y = x * x * y
    return jnp.concatenate([a + x2y - (b + 1) * x + alpha * laplacian(x), b * x - x2y + alpha * laplacian(y)])


BRUSSELATOR_N = 128  # grid points: 256 states, where "auto" takes a sparse LU
BRUSSELATOR_TS = np.array([1.0, 4.0, 10.0])


def _brusselator_start(n=BRUSSELATOR_N):
    x = np.linspace(0, 1, n)
    return jnp.asarray(np.concatenate([1 + np.sin(2 * np.pi * x), np.full(n, 3.0)])), jnp.array(
        [1.0, 3.0, 0.02 * (n - 1) ** 2]
    )


def test_sparse_stages_agree_with_dense_and_keep_their_factorisations():
    """On the 1-D Brusselator of 128 states BDF with sparse stages takes the dense stages' steps to roundoff;
    the host factorises W on about one step in ten, exactly as often as the `Linearisation` counts (each W
    made, in a rejected attempt too, is kept in the state and found again by its entries: none is factorised
    twice)."""
    u0, p = _brusselator_start(64)

    def run(solver):
        return jax.jit(lambda p: _stepped(_brusselator, solver, u0, p, 10.0, 1e-6, 1e-8, ts=BRUSSELATOR_TS))(p)

    dense = run(BDF())
    COUNTS.clear()
    sparse = jax.block_until_ready(run(BDF(stage_jacobian=Sparse())))
    host = COUNTS.snapshot()
    lin = sparse.end.solver_state.linearisation
    steps = int(sparse.stats["num_steps"])
    assert int(sparse.stats["num_rejected_steps"]) > 0
    assert steps == int(dense.stats["num_steps"])
    np.testing.assert_allclose(sparse.ys, dense.ys, rtol=1e-10)
    assert host["factorisations"] == int(lin.factorisations) < steps / 8
    assert host["solves"] > 2 * steps  # chord iterations: every one solved with a kept LU


def test_auto_takes_sparse_stages_and_differentiates_through_the_steps():
    """On 256 states "auto" takes a sparse LU for BDF, and (3 parameters) forward mode through its steps,
    whose Newton solves are differentiated at their roots with a sparse LU too."""
    u0, p = _brusselator_start()
    kind, why = auto_jacobian(BDF(), lambda u, p, t: _brusselator(t, u, p), u0, p, 0.0)
    assert kind == "sparse", why
    prob = sciad.ODEProblem(lambda u, p, t: _brusselator(t, u, p), u0, (0.0, 10.0), p)
    choice = sciad.select_sensealg(prob, saveat=BRUSSELATOR_TS, solver="bdf")
    assert isinstance(choice.sensealg, sciad.ForwardDiffSensitivity) and choice.features.stage_jacobian == "sparse"
    assert "a sparse LU of W at the step's root" in choice.report()


def _brusselator_loss(p, jacobian, sensealg, n=BRUSSELATOR_N):
    u0, _ = _brusselator_start(n)
    prob = sciad.ODEProblem(lambda u, p, t: _brusselator(t, u, p), u0, (0.0, 10.0), p)
    sol = sciad.solve(
        prob, saveat=BRUSSELATOR_TS, solver="bdf", jacobian=jacobian, sensealg=sensealg, rtol=1e-6, atol=1e-8
    )
    return jnp.sum(sol.us**2)


def test_sparse_gradient_through_the_steps():
    """∂L/∂p through sparse BDF's steps: the discrete adjoint (each step recomputed from the state its accepted
    attempt started from, the implicit function theorem's solve transposed on the host) equals forward mode
    through the same steps."""
    n = 32
    p = _brusselator_start(n)[1]
    grad = jax.jit(jax.grad(_brusselator_loss), static_argnums=(1, 2, 3))
    discrete = grad(p, "sparse", sciad.DiscreteAdjoint(), n)
    forward = grad(p, "sparse", sciad.ForwardDiffSensitivity(), n)
    np.testing.assert_allclose(discrete, forward, rtol=1e-12)  # 1e-10 from the state before a rejection


@pytest.mark.slow
@pytest.mark.parametrize("sensealg", [sciad.DiscreteAdjoint(), sciad.GaussAdjoint()])
def test_sparse_gradients_against_dense(sensealg):
    """∂L/∂p on 256 states by sparse BDF (the discrete adjoint; GaussAdjoint, its adjoint solved backwards by
    sparse BDF on λ's own pattern) against the dense stages' discrete adjoint."""
    p = _brusselator_start()[1]
    grad = jax.jit(jax.grad(_brusselator_loss), static_argnums=(1, 2))
    dense = grad(p, "dense", sciad.DiscreteAdjoint())
    sparse = grad(p, "sparse", sensealg)
    # the continuous adjoint differs from the discrete one by their errors at rtol 1e-6
    np.testing.assert_allclose(sparse, dense, rtol=1e-10 if isinstance(sensealg, sciad.DiscreteAdjoint) else 1e-3)
