"""Derivatives in the times (t0, t1, save times) of a solve with a mass matrix, and its dense output
(`sciad._dae.consistent_derivative`: a save time's derivative is the consistent u', the algebraic
states moving with their equations, ∂h/∂t included).

A linear index-1 DAE whose algebraic equation depends on t has a closed form; its derivatives (by
JAX through the closed form) are the reference for every sensealg, and central differences of the
solve (float64, rtol = atol = 1e-10) check the rule itself. A full singular M (the same DAE in
rotated coordinates), a backward-in-time solve, jit and vmap, `dense=True`, and Robertson against its
ODE form.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from helpers.dae import R_INV, ROBERTSON_P, Q, R, robertson, robertson_dae
from helpers.differences import gradient_and_central_differences, relative_steps

TOL = dict(rtol=1e-10, atol=1e-10)
AGREEMENT = 1e-7
P0 = np.array([2.0, 0.5])
X0 = 1.5
slow = pytest.mark.slow


# --- x' = -a x + z, 0 = z - b x - sin t: x' = c x + sin t (c = b - a), z = b x + sin t ----------------


def forced(u, p, t):
    a, b = p
    return jnp.stack([-a * u[0] + u[1], u[1] - b * u[0] - jnp.sin(t)])


def closed(x0, p, t0, t):
    """(x, z) at t (any shape) from x(t0) = x0, and ∫_{t0}^{t} z dt."""
    a, b = p[0], p[1]
    c = b - a
    A, B = -c / (1 + c**2), -1 / (1 + c**2)  # x_p = A sin t + B cos t

    def particular(t):
        return A * jnp.sin(t) + B * jnp.cos(t)

    def integral(t):  # ∫ x_p
        return -A * jnp.cos(t) + B * jnp.sin(t)

    k = x0 - particular(t0)
    x = particular(t) + k * jnp.exp(c * (t - t0))
    x_integral = integral(t) - integral(t0) + k * (jnp.exp(c * (t - t0)) - 1) / c
    return jnp.stack([x, b * x + jnp.sin(t)], -1), b * x_integral + jnp.cos(t0) - jnp.cos(t)


WEIGHTS = jnp.array([[0.3, 1.0], [0.7, 2.0], [-0.4, 3.0]])  # on (x, z) at t0, s, t1


def closed_loss(x):
    t0, s, t1, a, b = x
    us, _ = closed(X0, (a, b), t0, jnp.stack([t0, s, t1]))
    _, q = closed(X0, (a, b), t0, t1)
    return jnp.sum(WEIGHTS * us) + q


def solve_loss(sensealg=None, prob=None):
    prob = prob or sciad.ODEProblem(forced, np.array([X0, 0.0]), (0.0, 2.0), P0, mass_matrix=np.array([1.0, 0.0]))

    def loss(x):
        t0, s, t1 = x[0], x[1], x[2]
        sol = sciad.solve(
            prob,
            p=x[3:],
            tspan=(t0, t1),
            saveat=jnp.stack([t0, s, t1]),
            sensealg=sensealg,
            integrand=lambda u, p, t: u[1],
            **TOL,
        )
        return jnp.sum(WEIGHTS * sol.us) + sol.integral

    return loss


X = np.array([0.2, 0.9, 1.7, *P0])  # t0, s, t1, a, b


@pytest.fixture(scope="module")
def closed_gradient():
    return np.asarray(jax.jit(jax.grad(closed_loss))(X))  # one program (eagerly, one per operation)


def test_closed_form_and_central_differences(closed_gradient):
    """The solve and its closed form agree; the closed form's gradient matches central differences of
    the solve in (t0, s, t1, a, b): the reference is right, and so is the default sensealg under jit."""
    # the value, the gradient and the differences' values from one program
    value, grad, differences = gradient_and_central_differences(solve_loss(), X, relative_steps(X))
    np.testing.assert_allclose(value, jax.jit(closed_loss)(X), rtol=1e-8)
    np.testing.assert_allclose(differences, closed_gradient, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(grad, closed_gradient, rtol=AGREEMENT)


@pytest.mark.parametrize(
    "sensealg",
    [
        sciad.DiscreteAdjoint(),
        pytest.param(sciad.GaussAdjoint(), marks=slow),
        pytest.param(sciad.ForwardDiffSensitivity(), marks=slow),
        pytest.param(sciad.ForwardSensitivity(), marks=slow),
        pytest.param(sciad.InterpolatingAdjoint(), marks=slow),
        pytest.param(sciad.InterpolatingAdjoint(checkpointing=True), marks=slow),
    ],
    ids=sciad.adjoints.describe,
)
def test_gradient_in_the_times(sensealg, closed_gradient):
    """∂L/∂(t0, s, t1, a, b): a save at t0 (z(t0) moves with t0 through the consistent initialisation),
    one inside, one at t1, and ∫ z dt (its t1 derivative is z(t1))."""
    np.testing.assert_allclose(jax.jit(jax.grad(solve_loss(sensealg)))(X), closed_gradient, rtol=AGREEMENT)


def test_jvp_in_the_save_times_under_vmap():
    """d/ds of u(s) is the consistent u' (z' = b x' + cos s), a batch of save times by vmap of jvp."""
    prob = sciad.ODEProblem(forced, np.array([X0, 0.0]), (0.0, 2.0), P0, mass_matrix=np.array([1.0, 0.0]))

    def at(s):
        return sciad.solve(prob, saveat=s[None], sensealg=sciad.ForwardSensitivity(), **TOL).us[0]

    ss = jnp.array([0.3, 1.1, 2.0])
    tangents = jax.jit(jax.vmap(lambda s: jax.jvp(at, (s,), (jnp.ones_like(s),))[1]))(ss)
    expected = jax.jit(jax.vmap(jax.jacfwd(lambda s: closed(X0, P0, 0.0, s)[0])))(ss)  # one program, not eager
    np.testing.assert_allclose(tangents, expected, rtol=AGREEMENT)


# --- a full singular M: u = R w, (Q diag(1, 0) R⁻¹) u' = Q f(R⁻¹ u) ------------------------------------


def rotated(u, p, t):
    return jnp.asarray(Q) @ forced(jnp.asarray(R_INV) @ u, p, t)


@pytest.mark.parametrize(
    "sensealg",
    [sciad.ForwardDiffSensitivity(), pytest.param(sciad.GaussAdjoint(), marks=slow)],
    ids=sciad.adjoints.describe,
)
def test_full_mass_matrix(sensealg):
    """Along a full singular M (its null space not a coordinate), the time derivatives of u = R w are R
    times the closed form's; u0 = R (x0, 0) is initialised along M's split to the same solution."""
    prob = sciad.ODEProblem(
        rotated, R @ np.array([X0, 0.0]), (0.0, 2.0), P0, mass_matrix=Q @ np.diag([1.0, 0.0]) @ R_INV
    )

    def states(x):
        t0, s, t1 = x
        return sciad.solve(prob, tspan=(t0, t1), saveat=jnp.stack([s, t1]), sensealg=sensealg, **TOL).us

    def expected(x):  # M u = Q (x, 0): initialisation keeps x0 and solves z0 along M's null space R (0, 1)
        t0, s, t1 = x
        return closed(X0, P0, t0, jnp.stack([s, t1]))[0] @ jnp.asarray(R).T

    x = np.array([0.0, 0.8, 1.6])
    reference = jax.jit(jax.jacrev(expected))(x)  # one program (eagerly, a small program per operation)
    np.testing.assert_allclose(jax.jit(jax.jacrev(states))(x), reference, rtol=AGREEMENT, atol=1e-12)


@slow
def test_backwards_in_time():
    """From t0 = 2 back to t1 = 0.4: ∂/∂(t0, s, t1) of the saved states against the closed form."""
    prob = sciad.ODEProblem(forced, np.array([X0, 0.0]), (2.0, 0.0), P0, mass_matrix=np.array([1.0, 0.0]))

    def states(x):
        t0, s, t1 = x
        return sciad.solve(prob, tspan=(t0, t1), saveat=jnp.stack([s, t1]), sensealg=sciad.DiscreteAdjoint(), **TOL).us

    x = np.array([2.0, 1.1, 0.4])
    expected = jax.jacrev(lambda x: closed(X0, P0, x[0], x[1:])[0])(x)
    np.testing.assert_allclose(jax.jit(jax.jacrev(states))(x), expected, rtol=AGREEMENT, atol=1e-12)


# --- dense output ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sensealg",
    [
        pytest.param(sciad.ForwardDiffSensitivity(), marks=slow),
        pytest.param(sciad.DiscreteAdjoint(), marks=slow),
        pytest.param(sciad.GaussAdjoint(), marks=slow),
    ],
    ids=sciad.adjoints.describe,
)
def test_dense_output(sensealg):
    """`interpolation(t)` (Rodas's own dense output) against the closed form, and its derivatives in t
    (the consistent u') and p (the sensealg's) under jit."""
    prob = sciad.ODEProblem(forced, np.array([X0, 0.0]), (0.0, 2.0), P0, mass_matrix=np.array([1.0, 0.0]))

    def at(t, p):
        return sciad.solve(prob, p=p, dense=True, sensealg=sensealg, **TOL).interpolation(t)

    ts = jnp.array([0.05, 0.77, 1.9])
    np.testing.assert_allclose(at(ts, P0), closed(X0, P0, 0.0, ts)[0], rtol=1e-6, atol=1e-9)
    d_t, d_p = jax.jit(jax.jacrev(at, argnums=(0, 1)))(0.77, P0)
    e_t, e_p = jax.jacrev(lambda t, p: closed(X0, p, 0.0, t)[0], argnums=(0, 1))(0.77, P0)
    np.testing.assert_allclose(d_t, e_t, rtol=AGREEMENT)
    np.testing.assert_allclose(d_p, e_p, rtol=AGREEMENT)


# --- Robertson: the DAE's t1 derivative against the ODE form's -----------------------------------------


@slow
def test_robertson_time_derivatives_against_the_ode_form():
    """d/d(s, t1) of (y1, y2, y3) at s and t1: y3' of the conservation law's derivative, -(y1' + y2'),
    against the ODE form's y3' = k2 y2² (both by Rodas5P)."""

    def states(mass):
        prob = sciad.ODEProblem(
            robertson_dae if mass is not None else robertson,
            np.array([1.0, 0.0, 0.0]),
            (0.0, 10.0),
            ROBERTSON_P,
            mass_matrix=mass,
        )

        def at(x):
            us = sciad.solve(
                prob,
                tspan=(0.0, x[1]),
                saveat=x,
                solver="rodas5p",
                sensealg=sciad.DiscreteAdjoint(),
                rtol=1e-10,
                atol=1e-12,
                max_steps=20_000,
            ).us
            return us * np.array([1.0, 1e4, 1.0])

        return jax.jit(jax.jacrev(at))(np.array([1.0, 10.0]))

    expected = states(None)
    # Two different solves at rtol 1e-10: the stiff y2's t1 derivative agrees to a few 1e-6 (its last digits
    # move with XLA's code generation).
    np.testing.assert_allclose(
        states(np.array([1.0, 1.0, 0.0])), expected, rtol=1e-5, atol=1e-7 * np.max(np.abs(expected))
    )
