"""`sciad.steady_state` and `SteadyStateAdjoint` against closed forms and finite differences.

Steady states of u' = A u + b (u* = −A⁻¹b), a Hill dose–response set point (u* = (k/γ) dʰ/(Kʰ + dʰ)),
Michaelis–Menten clearance (u* = s Km / (Vmax − s)) and a bistable toggle switch (Gardner et al.
2000; no closed form: f(u*) = 0 and central differences); gradients, jvps, Hessians, vmap, jit,
PyTree parameters and states, closures, every engine, dense and Krylov solves; the errors.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import sciad
from helpers import central_differences, slow_except, values_and_jacobian
from sciad.ad import namespace
from sciad.problems._gene_circuit import GeneCircuitRHS

TOL = 1e-10
A = np.array([[-2.0, 1.0, 0.0], [0.5, -3.0, 0.5], [0.0, 1.0, -1.5]])
B = np.array([1.0, 2.0, -0.5])
W = np.array([0.3, -0.7, 1.1])


def linear(u, p, t):
    return p["A"] @ u + p["b"]


LINEAR = sciad.ODEProblem(linear, np.zeros(3), (0.0, 1.0), {"A": A, "b": B})


def hill(u, p, t):
    """Production k dʰ/(Kʰ + dʰ) at dose d (Hill coefficient h = 2), first-order decay γ; p = (k, K, γ, d)."""
    k, K, gamma, d = p[0], p[1], p[2], p[3]
    return k * d**2 / (K**2 + d**2) - gamma * u


HILL = sciad.ODEProblem(hill, np.zeros(1), (0.0, 1.0), np.array([2.0, 1.5, 0.5, 1.0]))


def hill_closed_form(p):
    k, K, gamma, d = p
    return k / gamma * d**2 / (K**2 + d**2)


def michaelis_menten(u, p, t):
    """Infusion s, saturable clearance Vmax u / (Km + u); p = (s, Vmax, Km)."""
    return p[0] - p[1] * u / (p[2] + u)


MICHAELIS_MENTEN = sciad.ODEProblem(michaelis_menten, np.zeros(1), (0.0, 1.0), np.array([1.0, 3.0, 2.0]))


def toggle(u, p, t):
    """Two mutually repressing genes: x' = α/(1 + yⁿ) − x, y' = α/(1 + xⁿ) − y; p = (α, n)."""
    alpha, n = p[0], p[1]
    return {"x": alpha / (1 + u["y"] ** n) - u["x"], "y": alpha / (1 + u["x"] ** n) - u["y"]}


TOGGLE = sciad.ODEProblem(toggle, {"x": np.array(3.0), "y": np.array(0.1)}, (0.0, 1.0), np.array([4.0, 2.0]))


def test_linear_system_closed_form():
    """u* = −A⁻¹b from u0 = 0 with the default solver (Kvaerno5); ∂(wᵀu*)/∂b = −A⁻ᵀw,
    ∂/∂A = −(A⁻ᵀw) u*ᵀ (p a dict); ∂/∂u0 = 0; stats."""

    def loss(p, u0):
        ss = sciad.steady_state(LINEAR, u0=u0, p=p, rtol=TOL, atol=TOL)
        return jnp.dot(W, ss.u), ss

    (_, ss), (g_p, g_u0) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(LINEAR.p, LINEAR.u0)
    star = -np.linalg.solve(A, B)
    np.testing.assert_allclose(ss.u, star, rtol=1e-12)
    assert int(ss.stats["steps"]) > 0 and 1 <= int(ss.stats["newton_iterations"]) <= 3
    assert float(ss.stats["residual"]) < 1e-12
    lam = np.linalg.solve(A.T, W)
    np.testing.assert_allclose(g_p["b"], -lam, rtol=1e-10)
    np.testing.assert_allclose(g_p["A"], -np.outer(lam, star), rtol=1e-10)
    np.testing.assert_array_equal(g_u0, np.zeros(3))


def test_dose_response_curve_under_vmap_and_jit():
    """The set point over a range of doses (vmap of a jitted function): values and ∂u*/∂d against
    the closed form."""
    doses = np.linspace(0.2, 4.0, 7)

    def set_point(d):
        p = jnp.concatenate([HILL.p[:3], d[None]])
        return sciad.steady_state(HILL, p=p, solver="tsit5", rtol=TOL, atol=TOL).u[0]

    curve = jax.jit(jax.vmap(jax.value_and_grad(set_point)))(doses)
    expected = [
        jax.value_and_grad(lambda d: hill_closed_form(jnp.concatenate([HILL.p[:3], d[None]])))(d) for d in doses
    ]
    np.testing.assert_allclose(curve[0], [v for v, _ in expected], rtol=1e-10)
    np.testing.assert_allclose(curve[1], [g for _, g in expected], rtol=1e-9)


@pytest.mark.slow
def test_gradient_and_jvp_closed_form():
    """∂u*/∂(k, K, γ, d) of the Hill set point and a jvp against the closed form and central differences."""

    def steady(p):
        return sciad.steady_state(HILL, p=p, solver="tsit5", rtol=TOL, atol=TOL).u[0]

    grad = jax.grad(hill_closed_form)(HILL.p)
    np.testing.assert_allclose(jax.grad(steady)(HILL.p), grad, rtol=1e-9)
    np.testing.assert_allclose(central_differences(jax.jit(steady), HILL.p), grad, rtol=1e-7)
    v = np.array([0.3, -0.2, 0.5, 1.0])
    _, tangent = jax.jvp(steady, (HILL.p,), (v,))
    np.testing.assert_allclose(tangent, jnp.dot(grad, v), rtol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("linear_solver", ["dense", "gmres"])
def test_hessian_michaelis_menten(linear_solver):
    """jax.hessian (forward over reverse through the rules) of u*² with u* = s Km / (Vmax − s),
    dense and matrix-free."""

    def closed_form(p):
        return (p[0] * p[2] / (p[1] - p[0])) ** 2

    def loss(p):
        sensealg = sciad.SteadyStateAdjoint(linear_solver=linear_solver)
        return (
            sciad.steady_state(MICHAELIS_MENTEN, p=p, solver="tsit5", rtol=TOL, atol=TOL, sensealg=sensealg).u[0] ** 2
        )

    np.testing.assert_allclose(
        jax.jit(jax.hessian(loss))(MICHAELIS_MENTEN.p), jax.hessian(closed_form)(MICHAELIS_MENTEN.p), rtol=1e-8
    )


def test_closure_over_traced_dose():
    """f closes over the dose d being differentiated: ∂u*/∂d and ∂²u*/∂d² as the closed form's."""

    def set_point(d):
        def f(u, p, t):
            return p[0] * d**2 / (p[1] ** 2 + d**2) - p[2] * u

        prob = sciad.ODEProblem(f, np.zeros(1), (0.0, 1.0), HILL.p[:3])
        return sciad.steady_state(prob, solver="tsit5", rtol=TOL, atol=TOL).u[0]

    def closed_form(d):
        return hill_closed_form(jnp.concatenate([HILL.p[:3], jnp.atleast_1d(d)]))

    def gradient(d):
        g = jax.grad(set_point)(d)
        return g, g

    second, first = jax.jit(jax.jacfwd(gradient, has_aux=True))(1.3)  # forward over reverse, as jax.hessian
    # the closed form's derivatives compiled (eagerly, a small program per operation)
    np.testing.assert_allclose(first, jax.jit(jax.grad(closed_form))(1.3), rtol=1e-9)
    np.testing.assert_allclose(second, jax.jit(jax.hessian(closed_form))(1.3), rtol=1e-7)


@pytest.mark.slow
def test_toggle_switch_attractors_and_gradient():
    """The initial guess picks the attractor (x high or y high, mirror images); f(u*) = 0 there;
    ∂x*/∂(α, n) against central differences; a PyTree (dict) state."""
    high_x = sciad.steady_state(TOGGLE, rtol=TOL, atol=TOL).u
    high_y = sciad.steady_state(TOGGLE, u0={"x": np.array(0.1), "y": np.array(3.0)}, rtol=TOL, atol=TOL).u
    assert float(high_x["x"]) > 3 * float(high_x["y"])
    np.testing.assert_allclose([high_y["x"], high_y["y"]], [high_x["y"], high_x["x"]], rtol=1e-10)
    residual = toggle(high_x, TOGGLE.p, 0.0)
    assert max(abs(float(residual["x"])), abs(float(residual["y"]))) < 1e-12

    def x_star(p):
        return sciad.steady_state(TOGGLE, p=p, rtol=TOL, atol=TOL).u["x"]

    grad = jax.jit(jax.grad(x_star))
    np.testing.assert_allclose(grad(TOGGLE.p), central_differences(jax.jit(x_star), TOGGLE.p), rtol=1e-7)


@pytest.mark.slow
def test_hessian_against_differences_of_gradients():
    """jax.hessian of a loss of the toggle's steady state against central differences of its gradient."""

    def loss(p):
        u = sciad.steady_state(TOGGLE, p=p, rtol=TOL, atol=TOL).u
        return u["x"] ** 2 + 3 * u["y"]

    grad = jax.jit(jax.grad(loss))
    np.testing.assert_allclose(jax.jit(jax.hessian(loss))(TOGGLE.p), central_differences(grad, TOGGLE.p), rtol=1e-6)


class Production(eqx.Module):
    """An equinox model as p: rates (arrays) and a static name."""

    rates: jax.Array
    decay: jax.Array
    name: str = eqx.field(static=True, default="production")


@pytest.mark.slow
def test_equinox_model_parameters():
    """p an equinox module with a static field: gradients keep its structure."""

    def f(u, p, t):
        return p.rates - p.decay * u

    model = Production(jnp.array([1.0, 2.0]), jnp.array([0.5, 4.0]))
    prob = sciad.ODEProblem(f, np.zeros(2), (0.0, 1.0), model)
    g = eqx.filter_grad(lambda m: jnp.sum(sciad.steady_state(prob, p=m, solver="tsit5", rtol=TOL, atol=TOL).u))(model)
    np.testing.assert_allclose(g.rates, 1 / model.decay, rtol=1e-10)
    np.testing.assert_allclose(g.decay, -model.rates / model.decay**2, rtol=1e-10)


ENGINES = list(sciad.ad.BACKENDS)


@pytest.mark.parametrize("engine", slow_except(ENGINES, {"jax-forward"}))
def test_engines(engine):
    """Every `sciad.ad` engine as the products' engine, dense and Krylov: ∂u*/∂p of the Hill set
    point as the closed form's (f written with `sciad.ad.namespace`, so host engines run it)."""
    if engine not in sciad.ad.available():
        pytest.skip(f"the {engine} engine is not installed")

    def f(u, p, t):
        xp = namespace(u, p)
        return p[0] * p[3] ** 2 / (p[1] ** 2 + p[3] ** 2) - p[2] * u + 0 * xp.sin(u)

    prob = sciad.ODEProblem(f, np.zeros(1), (0.0, 1.0), HILL.p)

    def set_point(p, linear_solver):
        sensealg = sciad.SteadyStateAdjoint(engine, linear_solver=linear_solver)
        return sciad.steady_state(prob, p=p, solver="tsit5", rtol=TOL, atol=TOL, sensealg=sensealg).u[0]

    grads = jax.jit(lambda p: [jax.grad(set_point)(p, how) for how in ("dense", "gmres")])(HILL.p)
    for grad in grads:
        np.testing.assert_allclose(grad, jax.grad(hill_closed_form)(HILL.p), rtol=1e-6)


def circuit():
    """A 12-gene circuit whose weak couplings (|W| ≤ 0.3) make its steady state unique and stable."""
    rhs = GeneCircuitRHS(12)
    rng = np.random.default_rng(3)
    w = 0.3 * rng.uniform(-1, 1, (12, 12))
    p = np.concatenate([w.ravel(), rng.normal(0, 0.5, 12), rng.uniform(1, 3, 12), rng.uniform(0.5, 1.5, 12)])
    return sciad.ODEProblem(rhs, rng.uniform(0, 1, 12), (0.0, 1.0), p)


@pytest.mark.slow
@pytest.mark.parametrize("linear_solver", ["gmres", "lu"])
def test_dense_and_krylov_agree(linear_solver):
    """The gene circuit's gradient (156 parameters) with a matrix-free solve (GMRES) or a lineax
    solver (LU, which builds J from products itself) as with the dense one; "auto" is dense at 12
    states, GMRES above 100."""
    prob = circuit()
    how = lx.LU() if linear_solver == "lu" else linear_solver
    target = np.linspace(0.5, 2.0, 12)

    def loss(p, how):
        u = sciad.steady_state(
            prob, p=p, solver="tsit5", rtol=TOL, atol=TOL, sensealg=sciad.SteadyStateAdjoint(linear_solver=how)
        ).u
        return jnp.sum((u - target) ** 2)

    dense = jax.jit(jax.grad(loss), static_argnums=1)(prob.p, "dense")
    np.testing.assert_allclose(jax.jit(jax.grad(loss), static_argnums=1)(prob.p, how), dense, rtol=1e-7, atol=1e-12)
    assert sciad.SteadyStateAdjoint().linear(12, TOL, TOL) == "dense"
    assert isinstance(sciad.SteadyStateAdjoint().linear(101, TOL, TOL), lx.GMRES)


@pytest.mark.parametrize("jit", slow_except([False, True], {False}))
def test_oscillator_has_no_steady_state(jit):
    """A harmonic oscillator never settles: a SolveError naming max_steps, eagerly and under jit."""
    prob = sciad.ODEProblem(lambda u, p, t: jnp.stack([u[1], -u[0]]), np.ones(2), (0.0, 1.0))

    def u_star(u0):
        return sciad.steady_state(prob, u0=u0, solver="tsit5", max_steps=50).u

    with pytest.raises(Exception, match="no steady state was found within max_steps=50 time steps"):
        (jax.jit(u_star) if jit else u_star)(prob.u0)


@pytest.mark.parametrize("linear_solver", slow_except(["dense", "gmres"], {"dense"}))
def test_conserved_quantity_is_singular(linear_solver):
    """u' = [−(u₁ − u₂), u₁ − u₂] conserves u₁ + u₂: the steady states are a line, ∂f/∂u is singular;
    the error says so and how to fix it (dense), or that the Krylov solve failed."""
    prob = sciad.ODEProblem(
        lambda u, p, t: jnp.stack([u[1] - u[0], u[0] - u[1]]), np.array([1.0, 0.0]), (0.0, 1.0), np.zeros(1)
    )
    sensealg = sciad.SteadyStateAdjoint(linear_solver=linear_solver)
    match = (
        "singular at the steady state found.*conserved quantity"
        if linear_solver == "dense"
        else "Krylov solve with the Jacobian ∂f/∂u did not converge"
    )
    with pytest.raises(Exception, match=match):
        jax.grad(lambda p: jnp.sum(sciad.steady_state(prob, p=p, solver="tsit5", sensealg=sensealg).u))(prob.p)


@pytest.mark.slow
def test_drift_has_no_steady_state():
    """u' = 1 drifts: ∂f/∂u = 0 is singular and the error says there is no steady state."""
    prob = sciad.ODEProblem(lambda u, p, t: jnp.ones_like(u), np.zeros(1), (0.0, 1.0))
    with pytest.raises(Exception, match="u' = c, drift"):
        sciad.steady_state(prob, solver="tsit5")


def test_other_sensealgs_are_refused():
    with pytest.raises(ValueError, match="steady_state takes sensealg=SteadyStateAdjoint.*got InterpolatingAdjoint"):
        sciad.steady_state(HILL, sensealg=sciad.InterpolatingAdjoint())
    with pytest.raises(ValueError, match="linear_solver='cg'.*choose 'auto', 'dense'"):
        sciad.SteadyStateAdjoint(linear_solver="cg")
    assert "SteadyStateAdjoint" not in sciad.adjoints.SENSEALGS


def test_krylov_gradient_does_not_depend_on_the_loss_scale():
    """GMRES solves (∂f/∂u)ᵀλ = ∂L/∂u* for ∂L/∂u* over its largest entry: a loss × 1e-8 gives 1e-8 × the
    gradient at the default tolerances (with the residual held to atol it was 6e-5 off at these 40 states,
    0.2 % at 150), as a loss × 1e8."""
    n = 40

    def reaction_diffusion(u, p, t):
        lap = jnp.concatenate([u[1:2] - u[:1], u[2:] - 2 * u[1:-1] + u[:-2], u[-2:-1] - u[-1:]])
        return p[0] * n * lap - p[1] * u + 1.0 / (1.0 + jnp.arange(n) / n) - 0.1 * u**3

    prob = sciad.ODEProblem(reaction_diffusion, np.zeros(n), (0.0, 1.0), np.array([0.3, 1.0]))
    scales = jnp.asarray([1e-8, 1.0, 1e8])

    def loss(p, s, how):
        return s * jnp.sum(sciad.steady_state(prob, p=p, sensealg=sciad.SteadyStateAdjoint(linear_solver=how)).u ** 2)

    gradients = jax.jit(jax.vmap(jax.grad(loss), (None, 0, None)), static_argnums=2)(prob.p, scales, "gmres")
    gradients = gradients / scales[:, None]
    np.testing.assert_allclose(gradients, np.broadcast_to(gradients[1], gradients.shape), rtol=1e-9)
    dense = jax.jit(jax.grad(loss), static_argnums=2)(prob.p, 1.0, "dense")
    np.testing.assert_allclose(gradients[1], dense, rtol=1e-6)


def test_a_mass_matrix_steady_state_keeps_its_algebraic_equations():
    """M u' = f with an algebraic row 0 = z − p1 x² (as an ODE, z' = z − p1 x² runs away): stepped by Rodas5P
    with M from a consistent u0, so f = 0 with the algebraic rows; the gradient is the closed form's
    (p0 = x + p1 x³), under jit too."""

    def f(u, p, t):
        x, z = u
        return jnp.stack([p[0] - x - x * z, z - p[1] * x**2])

    prob = sciad.ODEProblem(f, np.array([0.2, 5.0]), (0.0, 1.0), np.array([2.0, 0.5]), mass_matrix=np.array([1.0, 0.0]))
    tol = dict(rtol=1e-10, atol=1e-12)
    (x, z), grad = values_and_jacobian(lambda p: sciad.steady_state(prob, p=p, **tol).u, prob.p)
    np.testing.assert_allclose([x + 0.5 * x**3, z], [2.0, 0.5 * x**2], rtol=1e-10)
    d = 1 + 3 * 0.5 * x**2
    np.testing.assert_allclose(grad[0], [1 / d, -(x**3) / d], rtol=1e-8)
    np.testing.assert_allclose(grad[1], [x * grad[0, 0], x**2 + x * grad[0, 1]], rtol=1e-8)
