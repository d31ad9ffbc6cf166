"""Every sensealg on a mass-matrix DAE: ForwardSensitivity (the sensitivity DAE from consistent
tangents) and the continuous adjoints (the adjoint DAE Mᵀλ' = -Jᵀλ - (∂g/∂u)ᵀw_Q with consistent λ
at every breakpoint and ∂L/∂u0 = Mᵀλ(t0), `sciad._dae`), in u0 and p, against closed forms, the
through-the-steps sensealgs (DiscreteAdjoint, ForwardDiffSensitivity), Robertson's ODE form and
finite differences: losses nonlinear in the algebraic state, an integrand, Robertson (also with a full M),
Backsolve's refusal, a Hessian. The linear DAE's closed form and the full singular M, for every sensealg, and
jit(vmap(grad)) over u0 and p for the continuous adjoints and ForwardSensitivity: tests/test_dae.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from helpers.dae import (
    P0,
    ROBERTSON_P,
    ROBERTSON_TS,
    TOL,
    TS,
    exact,
    exact_gradients,
    linear_loss,
    linear_problem,
    robertson,
    robertson_dae,
)

slow = pytest.mark.slow


def name(sensealg):
    return sciad.adjoints.describe(sensealg)


# --- (d, e) a nonlinear DAE: a loss on the algebraic state at save times, an integrand ------------------
# x' = -a x z, 0 = z³ + z - b x (∂/∂z = 3z² + 1 ≠ 0: index 1), the loss nonlinear in z.


def cubic(u, p, t):
    a, b = p
    return jnp.stack([-a * u[0] * u[1], u[1] ** 3 + u[1] - b * u[0]])


CUBIC_P = np.array([0.8, 1.3])
CUBIC_U0 = np.array([1.2, 0.0])


def cubic_problem():
    return sciad.ODEProblem(cubic, CUBIC_U0, (0.0, 2.0), CUBIC_P, mass_matrix=np.array([1.0, 0.0]))


def cubic_losses(sensealg):
    """(u0, p) -> two losses of one solve: Σ_t sin(z) + z² x at the save times, and ∫ z² + x z dt (an
    integrand); their gradients by one Jacobian, each loss's cotangent the other's zero."""
    prob = cubic_problem()

    def losses(u0, p):
        sol = sciad.solve(
            prob,
            u0=u0,
            p=p,
            saveat=TS,
            integrand=lambda u, p, t: u[1] ** 2 + u[0] * u[1],
            sensealg=sensealg,
            **TOL,
        )
        return jnp.stack([jnp.sum(jnp.sin(sol.us[:, 1]) + sol.us[:, 1] ** 2 * sol.us[:, 0]), sol.integral])

    return losses


STEP = 1e-5  # central differences' step, relative to |x| (at least STEP)


@pytest.fixture(scope="module")
def cubic_references():
    """Both losses' (ForwardDiffSensitivity's ∂L/∂u0, ∂L/∂p through the steps; central differences of L in x0
    and in p): the losses and their Jacobian at u0, p and at the six points the differences take, from one
    compiled program run at each."""
    h = STEP * np.maximum(1.0, np.abs(np.concatenate([CUBIC_U0[:1], CUBIC_P])))
    steps = np.concatenate([np.diag(h), -np.diag(h)])  # ±h in x0, a, b
    points = np.concatenate([np.zeros((1, 3)), steps]) + np.concatenate([CUBIC_U0[:1], CUBIC_P])
    u0s = np.stack([points[:, 0], np.zeros(len(points))], 1)
    losses = cubic_losses(sciad.ForwardDiffSensitivity())
    program = jax.jit(lambda u0, p: (losses(u0, p), jax.jacfwd(losses, argnums=(0, 1))(u0, p)))
    values, (g_u0, g_p) = jax.tree.map(lambda *a: np.stack(a), *(program(u0, p) for u0, p in zip(u0s, points[:, 1:])))
    differences = (values[1:4] - values[4:]) / (2 * h[:, None])  # (x0, a, b) × the two losses
    return g_u0[0], g_p[0], differences[0], differences[1:].T


@pytest.mark.parametrize(
    "sensealg",
    [
        sciad.GaussAdjoint(),
        sciad.InterpolatingAdjoint(),
        sciad.ForwardSensitivity(),
        pytest.param(sciad.QuadratureAdjoint(), marks=slow),
        pytest.param(sciad.GaussAdjoint(checkpointing=True), marks=slow),
        pytest.param(sciad.BacksolveAdjoint(), marks=slow),
    ],
    ids=name,
)
def test_nonlinear_loss_on_the_algebraic_state(sensealg, cubic_references):
    """∂L/∂(u0, p) of a loss on the algebraic state at the save times and of an integral of it (one solve, one
    Jacobian: each loss's cotangent with the other's zero), against forward mode through the steps (to 1e-6) and
    central differences of the loss (to 1e-5)."""
    g_u0, g_p = jax.jit(jax.jacrev(cubic_losses(sensealg), argnums=(0, 1)))(CUBIC_U0, CUBIC_P)
    r_u0, r_p, fd_x0, fd_p = cubic_references
    for i in range(2):  # the loss on the saves, the integral
        np.testing.assert_allclose(g_p[i], r_p[i], rtol=1e-6)
        np.testing.assert_allclose(g_u0[i], r_u0[i], rtol=1e-6, atol=1e-9)
        assert g_u0[i, 1] == 0  # the algebraic state is solved from the differential one
        np.testing.assert_allclose(g_p[i], fd_p[i], rtol=1e-5)
        np.testing.assert_allclose(g_u0[i, 0], fd_x0[i], rtol=1e-5)


# --- (b) Robertson: the DAE against its ODE form ------------------------------------------------------


def robertson_gradient(prob, solver, sensealg):
    """∂/∂(u0, log k) of Σ_t 10⁴ y2 + y3 (y3 algebraic in the DAE) at three save times up to t = 100."""

    def value(u0, log_k):
        us = sciad.solve(
            prob,
            u0=u0,
            p=jnp.exp(log_k),
            saveat=ROBERTSON_TS[:4],
            solver=solver,
            rtol=1e-9,
            atol=1e-12,
            max_steps=20_000,
            sensealg=sensealg,
        ).us
        return jnp.sum(us[:, 1] * 1e4 + us[:, 2])

    return jax.jit(jax.grad(value, argnums=(0, 1)))(np.array([1.0, 0.0, 0.0]), np.log(ROBERTSON_P))


ROBERTSON_DAE = dict(
    f=robertson_dae,
    u0=np.array([1.0, 0.0, 0.0]),
    tspan=(0.0, 100.0),
    p=ROBERTSON_P,
    mass_matrix=np.array([1.0, 1.0, 0.0]),
)


@pytest.fixture(scope="module")
def robertson_ode_gradient():
    """The ODE form's gradient through Kvaerno5, in u0 projected on the DAE's (y3 = 1 - y1 - y2)."""
    ode = sciad.ODEProblem(robertson, np.array([1.0, 0.0, 0.0]), (0.0, 100.0), ROBERTSON_P)
    g_u0, g_p = robertson_gradient(ode, "kvaerno5", sciad.DiscreteAdjoint())
    return np.array([g_u0[0] - g_u0[2], g_u0[1] - g_u0[2], 0.0]), g_p


@pytest.mark.parametrize(
    "sensealg",
    [
        pytest.param(sciad.GaussAdjoint(), marks=slow),
        pytest.param(sciad.InterpolatingAdjoint(), marks=slow),
        pytest.param(sciad.QuadratureAdjoint(), marks=slow),
        pytest.param(sciad.GaussAdjoint(checkpointing=True), marks=slow),
        pytest.param(sciad.ForwardSensitivity(), marks=slow),
    ],
    ids=name,
)
def test_robertson_against_the_ode_form(sensealg, robertson_ode_gradient):
    """∂/∂log k to 1e-6 of the ODE form's, ∂/∂u0 to 1e-5 of its largest entry (its y2 entry is a
    difference of two entries 3000 times larger)."""
    g_u0, g_p = robertson_gradient(sciad.ODEProblem(**ROBERTSON_DAE), None, sensealg)
    r_u0, r_p = robertson_ode_gradient
    np.testing.assert_allclose(g_p, r_p, rtol=1e-6)
    np.testing.assert_allclose(g_u0, r_u0, atol=1e-5 * np.max(np.abs(r_u0)))


@slow
def test_robertson_with_a_full_mass_matrix():
    """Robertson in u = R w with its equations mixed by Q (a full singular M, nonlinear f): GaussAdjoint's
    gradient in log k equals DiscreteAdjoint's on the diagonal form."""
    R = np.array([[1.0, 0.2, 0.0], [0.0, 1.0, 0.3], [0.1, 0.0, 1.0]])
    Q = np.array([[1.0, 0.5, 0.2], [0.0, 1.0, 0.4], [0.3, 0.0, 1.0]])
    R_inv = np.linalg.inv(R)

    def f(u, p, t):
        return jnp.asarray(Q) @ robertson_dae(jnp.asarray(R_inv) @ u, p, t)

    full = sciad.ODEProblem(
        f, R @ np.array([1.0, 0.0, 0.0]), (0.0, 100.0), ROBERTSON_P, mass_matrix=Q @ np.diag([1.0, 1.0, 0.0]) @ R_inv
    )

    def gradient(prob, sensealg, rotate):
        def value(log_k):
            us = sciad.solve(
                prob,
                p=jnp.exp(log_k),
                saveat=ROBERTSON_TS[:4],
                rtol=1e-9,
                atol=1e-12,
                max_steps=20_000,
                sensealg=sensealg,
            ).us
            w = us @ jnp.asarray(R_inv).T if rotate else us
            return jnp.sum(w[:, 1] * 1e4 + w[:, 2])

        return jax.jit(jax.grad(value))(np.log(ROBERTSON_P))

    np.testing.assert_allclose(
        gradient(full, sciad.GaussAdjoint(), True),
        gradient(sciad.ODEProblem(**ROBERTSON_DAE), sciad.DiscreteAdjoint(), False),
        rtol=1e-6,
    )


@slow
def test_backsolve_refuses_robertson():
    """BacksolveAdjoint re-solves u backwards: stiff Robertson is unstable that way, and its own check
    refuses it, naming the adjoints that serve."""
    with pytest.raises(Exception, match="BacksolveAdjoint: the state re-solved backwards.*GaussAdjoint"):
        robertson_gradient(sciad.ODEProblem(**ROBERTSON_DAE), None, sciad.BacksolveAdjoint())


@slow
def test_hessian_forward_over_reverse():
    """jax.hessian (forward over GaussAdjoint's reverse) of Σ_t x = Σ_t x0 e^{(b - a) t}: t² x [[1, -1], [-1, 1]]."""
    prob = linear_problem()

    def loss(p):
        return jnp.sum(sciad.solve(prob, p=p, saveat=TS, sensealg=sciad.GaussAdjoint(), **TOL).us[:, 0])

    x = exact(1.5, P0)[:, 0]
    np.testing.assert_allclose(
        jax.hessian(loss)(P0), np.sum(TS**2 * x) * np.array([[1.0, -1.0], [-1.0, 1.0]]), rtol=1e-6
    )


def test_nonsingular_mass_matrix_against_the_ode():
    """M u' = f with M invertible and not diagonal: no algebraic part, λ jumps by M⁻ᵀw and ∂L/∂u0 = Mᵀλ(t0);
    GaussAdjoint's gradient in (u0, p) equals the ODE u' = M⁻¹f's."""
    M = np.array([[2.0, 1.0], [0.0, 1.0]])

    def f(u, p, t):
        return jnp.stack([-p[0] * u[0] + u[1], -p[1] * u[1] * u[0]])

    def gradient(prob, sensealg, solver):
        def loss(u0, p):
            return jnp.sum(sciad.solve(prob, u0=u0, p=p, saveat=TS, sensealg=sensealg, solver=solver, **TOL).us ** 2)

        return jax.jit(jax.grad(loss, argnums=(0, 1)))(np.array([1.0, 0.5]), P0)

    dae = gradient(sciad.ODEProblem(f, np.ones(2), (0.0, 2.0), P0, mass_matrix=M), sciad.GaussAdjoint(), None)
    ode = gradient(
        sciad.ODEProblem(lambda u, p, t: jnp.linalg.solve(jnp.asarray(M), f(u, p, t)), np.ones(2), (0.0, 2.0), P0),
        sciad.ForwardDiffSensitivity(),
        "tsit5",
    )
    for g, r in zip(dae, ode):
        np.testing.assert_allclose(g, r, rtol=1e-6)


def test_float32():
    """GaussAdjoint on the linear DAE in float32: the closed form to 1e-3."""
    prob = sciad.ODEProblem(
        linear_problem().f,
        np.array([1.5, 0.0], np.float32),
        (0.0, 2.0),
        P0.astype(np.float32),
        mass_matrix=np.array([1.0, 0.0]),
    )

    def loss(p):
        return linear_loss(sciad.solve(prob, p=p, saveat=TS, rtol=1e-5, atol=1e-6, sensealg=sciad.GaussAdjoint()).us)

    grad = jax.jit(jax.grad(loss))(P0.astype(np.float32))
    assert grad.dtype == jnp.float32
    np.testing.assert_allclose(grad, exact_gradients(1.5, P0)[1:], rtol=1e-3)
