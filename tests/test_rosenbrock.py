"""Rosenbrock (Rodas) solvers for M u' = f with a constant mass matrix (`sciad._rosenbrock`): the
published tableaus' order conditions, accuracy on DAEs with closed forms and on Robertson against
SciPy's Radau, observed orders with fixed steps, derivatives, jit/vmap, float32, one LU per step."""

import diffrax as dfx
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import quad, solve_ivp

from helpers import dae
from sciad._rosenbrock import AbstractRosenbrock, Rodas4, Rodas5P
from sciad._rosenbrock_tableaus import RODAS4, RODAS5P

SOLVERS = [Rodas5P, Rodas4]


# --- the tableaus -------------------------------------------------------------------------------


def _trees(order):
    """Rooted trees with `order` vertices, each a sorted tuple of its subtrees."""
    if order == 1:
        return [()]
    found = set()

    def forests(size, largest):  # multisets of trees of `size` vertices, subtrees ≤ `largest` each
        if size == 0:
            yield ()
            return
        for k in range(min(size, largest), 0, -1):
            for tree in _trees(k):
                for rest in forests(size - k, k):
                    yield (tree, *rest)

    for forest in forests(order - 1, order - 1):
        found.add(tuple(sorted(forest)))
    return sorted(found)


def _density(tree):
    size = lambda t: 1 + sum(size(c) for c in t)
    return size(tree) * np.prod([_density(c) for c in tree])


def _untransformed(tab):
    """(α, Γ) of the method: Γ⁻¹ = diag(1/γ) − C and α = a Γ."""
    Gamma = np.linalg.inv(np.eye(tab.num_stages) / tab.gamma - tab.C)
    return tab.a @ Gamma, Gamma


def _weights_error(tab, weights, order):
    """max over trees of `order` vertices of |weights · Φ(t) − 1/γ(t)| (weights in the u-basis):
    Rosenbrock elementary weights, β = α + Γ on single-child vertices, α on branching ones
    (Hairer & Wanner II, §IV.7)."""
    alpha, Gamma = _untransformed(tab)
    beta = alpha + Gamma
    b = weights @ Gamma

    def phi(tree):
        if len(tree) == 1:
            return beta @ phi(tree[0])
        return np.prod([alpha @ phi(c) for c in tree], axis=0) if tree else np.ones(tab.num_stages)

    return max(abs(b @ phi(t) - 1 / _density(t)) for t in _trees(order))


@pytest.mark.parametrize("tab", [RODAS5P, RODAS4], ids=["Rodas5P", "Rodas4"])
def test_tableau_order_conditions(tab):
    alpha, Gamma = _untransformed(tab)
    np.testing.assert_allclose(alpha.sum(1), tab.c, atol=1e-13)  # c_i = Σ α_ij (entries up to ~10: roundoff ~1e-14)
    np.testing.assert_allclose(Gamma.sum(1), tab.d, atol=1e-13)  # d_i = Σ γ_ij
    for order in range(1, tab.order + 1):
        assert _weights_error(tab, tab.m, order) < 1e-13
    assert _weights_error(tab, tab.m, tab.order + 1) > 1e-4
    embedded = tab.m - tab.error
    for order in range(1, tab.embedded_order + 1):
        assert _weights_error(tab, embedded, order) < 1e-13
    assert _weights_error(tab, embedded, tab.embedded_order + 1) > 1e-4
    # dense output at θ: weights θ m + θ(1 − θ) Σ_r θ^r dense_r, conditions θ^|t| / γ(t)
    dense_order = tab.order - 1
    for theta in (0.3, 0.5, 0.8):
        weights = theta * tab.m + theta * (1 - theta) * sum(theta**r * row for r, row in enumerate(tab.dense))
        for order in range(1, dense_order + 1):
            assert _weights_error(tab, weights / theta**order, order) < 1e-12 / theta**order


# --- accuracy -----------------------------------------------------------------------------------


def linear_dae(t, y, args):
    """y1' = −y1 + y2, 0 = y2 − sin t: y1 = 3/2 e^{−t} + (sin t − cos t)/2, y2 = sin t (y0 = (1, 0))."""
    return jnp.stack([-y[0] + y[1], y[1] - jnp.sin(t)])


def linear_dae_exact(t):
    return np.stack([1.5 * np.exp(-t) + (np.sin(t) - np.cos(t)) / 2, np.sin(t)], -1)


P = jnp.array([[1.0, 2.0], [0.5, 1.5]])  # an invertible mixing of the equations: M becomes P M


@pytest.mark.parametrize("mass", ["diagonal", "dense"])
@pytest.mark.parametrize("solver_cls", SOLVERS)
def test_linear_dae_closed_form(solver_cls, mass):
    ts = np.linspace(0.0, 10.0, 41)[1:]
    vf, M = linear_dae, jnp.array([1.0, 0.0])
    if mass == "dense":  # P M u' = P f: the same solution through a full, singular M
        vf, M = (lambda t, y, args: P @ linear_dae(t, y, args)), P @ jnp.diag(M)
    sol = dfx.diffeqsolve(
        dfx.ODETerm(vf),
        solver_cls(mass_matrix=M),
        0.0,
        10.0,
        1e-3,
        jnp.array([1.0, 0.0]),
        stepsize_controller=dfx.PIDController(rtol=1e-8, atol=1e-10),
        saveat=dfx.SaveAt(ts=ts),
    )
    assert np.abs(np.asarray(sol.ys) - linear_dae_exact(ts)).max() <= 1e-6


def test_backwards_in_time():
    """t1 < t0 (how adjoints step): the closed form from t = 3 back to 0."""
    y3 = jnp.asarray(linear_dae_exact(np.array(3.0)))
    sol = dfx.diffeqsolve(
        dfx.ODETerm(linear_dae),
        Rodas5P(mass_matrix=jnp.array([1.0, 0.0])),
        3.0,
        0.0,
        -1e-3,
        y3,
        stepsize_controller=dfx.PIDController(rtol=1e-9, atol=1e-11),
        saveat=dfx.SaveAt(ts=[2.0, 1.0, 0.0]),
    )
    np.testing.assert_allclose(sol.ys, linear_dae_exact(np.array([2.0, 1.0, 0.0])), atol=1e-7)


def robertson(t, y, args):
    """Robertson's kinetics as an ODE (3 rates)."""
    return jnp.stack(
        [-0.04 * y[0] + 1e4 * y[1] * y[2], 0.04 * y[0] - 1e4 * y[1] * y[2] - 3e7 * y[1] ** 2, 3e7 * y[1] ** 2]
    )


def robertson_dae(t, y, args):
    """Robertson with its conservation law as the algebraic equation (mass matrix diag(1, 1, 0))."""
    return robertson(t, y, args).at[2].set(y[0] + y[1] + y[2] - 1)


ROBERTSON_TS = np.array([1e-2, 1.0, 10.0, 40.0, 1e2, 1e3, 1e4])


@pytest.fixture(scope="module")
def robertson_reference():
    ref = solve_ivp(
        lambda t, y: np.asarray(robertson(t, y, None)),
        (0.0, 1e4),
        [1.0, 0.0, 0.0],
        method="Radau",
        rtol=1e-10,
        atol=1e-12,
        t_eval=ROBERTSON_TS,
    )
    return ref.y.T


@pytest.mark.parametrize("solver_cls", SOLVERS)
def test_robertson_dae_against_radau(solver_cls, robertson_reference):
    sol = dfx.diffeqsolve(
        dfx.ODETerm(robertson_dae),
        solver_cls(mass_matrix=jnp.array([1.0, 1.0, 0.0])),
        0.0,
        1e4,
        1e-6,
        jnp.array([1.0, 0.0, 0.0]),
        max_steps=10_000,
        stepsize_controller=dfx.PIDController(rtol=1e-8, atol=1e-10),
        saveat=dfx.SaveAt(ts=ROBERTSON_TS),
    )
    assert (np.abs(np.asarray(sol.ys) - robertson_reference) / np.abs(robertson_reference)).max() <= 1e-5


def van_der_pol(t, y, mu):
    return jnp.stack([y[1], mu * ((1 - y[0] ** 2) * y[1]) - y[0]])


def test_stiff_ode_against_kvaerno5():
    ts = jnp.linspace(0.0, 200.0, 21)[1:]
    solve = lambda solver: (
        dfx.diffeqsolve(
            dfx.ODETerm(van_der_pol),
            solver,
            0.0,
            200.0,
            1e-4,
            jnp.array([2.0, 0.0]),
            100.0,
            stepsize_controller=dfx.PIDController(rtol=1e-10, atol=1e-10),
            saveat=dfx.SaveAt(ts=ts),
            max_steps=100_000,
        ).ys
    )
    np.testing.assert_allclose(solve(Rodas5P()), solve(dfx.Kvaerno5()), rtol=1e-6, atol=1e-6)


def nonlinear_dae(t, y, args):
    """y1' = −y2 + r(t), 0 = y2 − y1², with y1 = cos t + 2, y2 = y1² exactly (index 1)."""
    return jnp.stack([-y[1] - jnp.sin(t) + (jnp.cos(t) + 2) ** 2, y[1] - y[0] ** 2])


def _slopes(errors):
    return -np.diff(np.log2(errors))


@pytest.mark.parametrize("solver_cls", SOLVERS)
def test_fixed_step_orders(solver_cls):
    """Step halving on a nonlinear, non-autonomous index-1 DAE with a closed form: the end value
    converges with the method's order, the dense output between steps with one less."""
    order = solver_cls.rosenbrock_tableau.order
    end, between = [], []
    for n in (8, 16, 32):
        ts = (np.arange(0, n, n // 8) + 0.37) * 2.0 / n  # 0.37 into every (n/8)th step: one program for each n
        sol = dfx.diffeqsolve(
            dfx.ODETerm(nonlinear_dae),
            solver_cls(mass_matrix=jnp.array([1.0, 0.0])),
            0.0,
            2.0,
            jnp.asarray(2.0 / n),
            jnp.array([3.0, 9.0]),
            saveat=dfx.SaveAt(ts=jnp.asarray(ts), t1=True),
        )
        exact = np.stack([np.cos(ts) + 2, (np.cos(ts) + 2) ** 2], -1)
        end.append(np.abs(sol.ys[-1] - np.array([np.cos(2.0) + 2, (np.cos(2.0) + 2) ** 2])).max())
        between.append(np.abs(sol.ys[:-1] - exact).max())
    assert _slopes(end).min() > order - 0.6  # Rodas5P: 5.3, 5.3; Rodas4: 4.7, 4.5
    assert _slopes(between).min() > order - 1.6  # Rodas5P: 4.2, 4.2; Rodas4: 3.1, 2.6


def test_fixed_step_order_ode():
    """Rodas5P with M = None on y1' = −2t y1², y2' = y1 − cos(t) y2: order 5, against the closed form
    y1 = 1 / (1 + t²), y2 = e^{−sin t} (1 + ∫₀ᵗ e^{sin s} y1(s) ds) (the integral by quadrature)."""
    vf = lambda t, y, args: jnp.stack([-2 * t * y[0] ** 2, y[0] - jnp.cos(t) * y[1]])
    y0 = jnp.array([1.0, 1.0])
    integral, _ = quad(lambda s: np.exp(np.sin(s)) / (1 + s**2), 0.0, 2.0, epsabs=1e-13, epsrel=1e-13)
    ref = np.array([1 / (1 + 2.0**2), np.exp(-np.sin(2.0)) * (1 + integral)])
    errors = [
        np.abs(dfx.diffeqsolve(dfx.ODETerm(vf), Rodas5P(), 0.0, 2.0, jnp.asarray(2.0 / n), y0).ys[-1] - ref).max()
        for n in (8, 16, 32)
    ]
    assert np.all(_slopes(errors) > 4.6)  # 5.4, 5.1


# --- the diffrax contract ------------------------------------------------------------------------


def test_jump_ts_and_pytree_state():
    """A PyTree state (M over its flattened vector, dict keys sorted) and a forcing switched on at
    t = 1, declared in jump_ts: y' = −y + [t ≥ 1], z = y algebraically."""

    def vf(t, y, args):
        return {"y": -y["y"] + jnp.where(t >= 1.0, 1.0, 0.0), "z": y["z"] - y["y"]}

    sol = dfx.diffeqsolve(
        dfx.ODETerm(vf),
        Rodas5P(mass_matrix=jnp.array([1.0, 0.0])),
        0.0,
        3.0,
        0.1,
        {"y": jnp.array(1.0), "z": jnp.array(1.0)},
        saveat=dfx.SaveAt(ts=[0.5, 2.0, 3.0]),
        stepsize_controller=dfx.PIDController(rtol=1e-8, atol=1e-10, jump_ts=[1.0], dtmin=1e-8),
    )
    t = np.array([0.5, 2.0, 3.0])
    exact = np.where(t < 1, np.exp(-t), np.exp(-t) + 1 - np.exp(1 - t))
    np.testing.assert_allclose(sol.ys["y"], exact, atol=1e-7)
    np.testing.assert_allclose(sol.ys["z"], exact, atol=1e-7)


def _dae_loss(p, solver_cls=Rodas5P, dtype=jnp.float64, rtol=1e-10):
    """A nonlinear index-1 DAE with a parameter: y1' = −p y1 + y2², 0 = y2 − cos(y1) (consistent
    y2(0)), the loss the sum of y at three save times; times and state in `dtype`."""

    def vf(t, y, p):
        return jnp.stack([-p * y[0] + y[1] ** 2, y[1] - jnp.cos(y[0])])

    y0, t0, t1, dt0 = (jnp.asarray(x, dtype) for x in ([1.0, np.cos(1.0)], 0.0, 2.0, 0.01))  # diffrax promotes
    sol = dfx.diffeqsolve(
        dfx.ODETerm(vf),
        solver_cls(mass_matrix=jnp.array([1.0, 0.0])),
        t0,
        t1,
        dt0,
        y0,
        p,
        stepsize_controller=dfx.PIDController(rtol=rtol, atol=rtol / 10),
        saveat=dfx.SaveAt(ts=jnp.array([0.5, 1.3, 2.0], dtype)),
        adjoint=dfx.RecursiveCheckpointAdjoint(),
    )
    return jnp.sum(sol.ys)


def test_gradient_matches_finite_differences():
    p, h = jnp.asarray(0.7), 1e-5
    grad = jax.jit(jax.grad(_dae_loss))(p)  # compiled whole (an eager gradient compiles one per operation)
    # one program for p ± h (eagerly, each call's fresh vector field closure made diffeqsolve compile anew)
    loss = jax.jit(_dae_loss)
    central = (loss(p + h) - loss(p - h)) / (2 * h)
    np.testing.assert_allclose(grad, central, rtol=1e-6)


@pytest.mark.slow
def test_jit_and_vmap_over_parameters():
    ps = jnp.array([0.5, 0.7, 1.1])
    batched = jax.jit(jax.vmap(_dae_loss))(ps)
    np.testing.assert_allclose(batched, [_dae_loss(p) for p in ps], rtol=1e-10)
    grads = jax.jit(jax.vmap(jax.grad(_dae_loss)))(ps)
    np.testing.assert_allclose(grads, [jax.grad(_dae_loss)(p) for p in ps], rtol=1e-8)


@pytest.mark.slow
def test_float32():
    loss = _dae_loss(jnp.float32(0.7), dtype=jnp.float32, rtol=1e-5)
    grad = jax.grad(lambda p: _dae_loss(p, dtype=jnp.float32, rtol=1e-5))(jnp.float32(0.7))
    assert loss.dtype == jnp.float32 and np.isfinite(loss) and np.isfinite(grad)
    np.testing.assert_allclose(loss, _dae_loss(0.7), rtol=1e-4)
    np.testing.assert_allclose(grad, jax.grad(_dae_loss)(0.7), rtol=1e-3)


def _count(jaxpr, name):
    """How many equations named `name` a jaxpr holds, its sub-jaxprs (scan, cond, pjit, …) included."""
    return sum(eqn.primitive.name == name for eqn in jaxpr.eqns) + sum(
        _count(sub, name) for sub in jax.extend.core.subjaxprs(jaxpr)
    )


@pytest.mark.parametrize("solver_cls", SOLVERS)
def test_one_lu_per_step(solver_cls):
    """A step factorises once, for all its stages; its derivative solves with the same factors."""
    solver = solver_cls(mass_matrix=jnp.array([1.0, 1.0, 0.0]))
    terms, y0 = dfx.ODETerm(robertson_dae), jnp.array([1.0, 0.0, 0.0])

    def step(y):
        return solver.step(terms, 0.0, 1e-3, y, None, None, False)[0]

    assert _count(jax.make_jaxpr(step)(y0).jaxpr, "lu") == 1
    assert _count(jax.make_jaxpr(lambda y: jax.grad(lambda y: step(y).sum())(y))(y0).jaxpr, "lu") == 1
    assert isinstance(solver, dfx.AbstractAdaptiveSolver) and isinstance(solver, AbstractRosenbrock)


def test_mass_matrix_shape_errors():
    with pytest.raises(ValueError, match="mass_matrix"):
        Rodas5P(mass_matrix=jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="mass_matrix"):
        dfx.diffeqsolve(dfx.ODETerm(linear_dae), Rodas5P(mass_matrix=jnp.ones(3)), 0.0, 1.0, 0.1, jnp.array([1.0, 0.0]))


# --- matrix-free stages ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sensealg",
    [
        "DiscreteAdjoint",
        pytest.param("ForwardDiffSensitivity", marks=pytest.mark.slow),
        pytest.param("GaussAdjoint", marks=pytest.mark.slow),
    ],
)
def test_matrix_free_stages_match_the_closed_form(sensealg):
    """`jacobian="matrix-free"` (GMRES on JVPs of u ↦ M u/γ − h f, `MatrixFree.stage_solver`): the linear
    index-1 DAE's closed form and its gradients by each kind of sensealg, under jit."""
    import sciad

    prob, tol = dae.linear_problem(), dict(rtol=1e-10, atol=1e-10)

    def loss(p):
        us = sciad.solve(prob, p=p, saveat=dae.TS, jacobian="matrix-free", sensealg=sensealg, **tol).us
        return jnp.sum(us @ jnp.array([1.0, 2.0])), us

    grad, us = jax.jit(jax.grad(loss, has_aux=True))(dae.P0)
    np.testing.assert_allclose(us, dae.exact(1.5, dae.P0), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(grad, dae.exact_gradients(1.5, dae.P0)[1:], rtol=1e-7)


@pytest.mark.slow
def test_matrix_free_stages_step_a_stiff_pde_as_the_lu_does():
    """A stiff PDE's forward solve by GMRES stages equals the dense LU's, step for step."""
    import sciad
    from sciad.problems import brusselator_pde

    b = brusselator_pde(4)
    solves = {
        jacobian: sciad.solve(b.problem, saveat=b.saveat, solver="rodas5p", jacobian=jacobian)
        for jacobian in ("dense", "matrix-free")
    }
    np.testing.assert_allclose(solves["matrix-free"].us, solves["dense"].us, rtol=1e-8)
    assert int(solves["matrix-free"].stats["steps"]) == int(solves["dense"].stats["steps"])


def test_a_stage_solve_that_fails_rejects_the_step():
    """GMRES out of products (`max_steps=1` on a coupled system) fails every stage: each step is
    rejected (error ∞, as diffrax's implicit solvers), never accepted with a wrong stage."""
    from sciad._stiff import MatrixFree

    M = jnp.array([1.0, 1.0, 0.0])
    solver = Rodas5P(mass_matrix=M, stage_jacobian=MatrixFree(max_steps=1, restart=1))
    y0 = jnp.array([1.0, 0.0, 1.0])
    fine = dfx.diffeqsolve(
        dfx.ODETerm(_coupled),
        Rodas5P(mass_matrix=M),
        0.0,
        0.1,
        0.01,
        y0,
        stepsize_controller=dfx.PIDController(rtol=1e-6, atol=1e-6),
    )
    assert fine.result == dfx.RESULTS.successful
    failing = dfx.diffeqsolve(
        dfx.ODETerm(_coupled),
        solver,
        0.0,
        0.1,
        0.01,
        y0,
        max_steps=20,
        throw=False,
        stepsize_controller=dfx.PIDController(rtol=1e-6, atol=1e-6),
    )
    assert failing.result == dfx.RESULTS.max_steps_reached and int(failing.stats["num_accepted_steps"]) == 0


def _coupled(t, y, args):
    """A 3-state index-1 DAE whose W needs more than one Krylov vector: y2 = y0 + y1 algebraic."""
    return jnp.stack([-2.0 * y[0] + y[1] - 0.1 * y[2], y[0] - 3.0 * y[1], y[0] + y[1] - y[2]])


@pytest.mark.slow
def test_matrix_free_stages_under_vmap_and_a_hessian():
    """GMRES stages compose: jit(vmap(grad)) over parameters matches the closed form; a Hessian by
    ForwardDiffSensitivity matches the dense LU's."""
    import sciad

    prob, tol = dae.linear_problem(), dict(rtol=1e-10, atol=1e-10)

    def loss(p, jacobian, sensealg):
        return jnp.sum(
            sciad.solve(prob, p=p, saveat=dae.TS, jacobian=jacobian, sensealg=sensealg, **tol).us
            @ jnp.array([1.0, 2.0])
        )

    ps = np.stack([dae.P0, 1.1 * dae.P0])
    grads = jax.jit(jax.vmap(jax.grad(lambda p: loss(p, "matrix-free", "DiscreteAdjoint"))))(ps)
    for p, g in zip(ps, grads):
        np.testing.assert_allclose(g, dae.exact_gradients(1.5, p)[1:], rtol=1e-7)
    hessians = [jax.hessian(lambda p: loss(p, j, "ForwardDiffSensitivity"))(dae.P0) for j in ("matrix-free", "dense")]
    np.testing.assert_allclose(*hessians, rtol=1e-8, atol=1e-10)
