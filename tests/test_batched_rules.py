"""Every sensealg under `jax.vmap` over initial states, p shared by the batch: the gradients equal the
members' one by one (whose p cotangents the batch sums, by `accumulate_pullback` where a sensealg
accumulates it step by step, and by the continuous adjoints' one sweep of the batch as one state,
whose steps, held to the largest of the members' errors, agree with theirs to the tolerances), and
with p batched too, each member's own."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from sciad.adjoints._discrete import SEGMENT_STEPS

U0S = jnp.array([[1.0, 0.5], [-0.4, 1.2], [0.3, -0.8]])
P = jnp.array([0.9, -1.4, 1.1, 0.2, 0.1, -0.3])
SAVES = jnp.array([0.4, 1.0, 1.5])
SENSEALGS = ["DiscreteAdjoint()", "GaussAdjoint()", "InterpolatingAdjoint()"] + [
    pytest.param(name, marks=pytest.mark.slow)
    for name in (
        "ForwardDiffSensitivity()",
        "ForwardSensitivity()",
        "InterpolatingAdjoint(checkpointing=True)",
        "QuadratureAdjoint()",
        "BacksolveAdjoint()",
    )
]


# The continuous adjoints' batch is swept as one state: its steps are not the members', and agree to rtol.
SWEPT_AS_ONE = ("GaussAdjoint", "InterpolatingAdjoint", "QuadratureAdjoint", "BacksolveAdjoint")


def _rtol(name: str) -> float:
    return 1e-7 if name.startswith(SWEPT_AS_ONE) else 1e-10


def _loss(sensealg, integrand=None):
    def loss(u0, p):
        prob = sciad.ODEProblem(lambda u, p, t: jnp.tanh(p[:4].reshape(2, 2) @ u + p[4:]), u0, (0.0, 1.5), p)
        sol = sciad.solve(
            prob,
            u0=u0,
            p=p,
            saveat=SAVES,
            solver="tsit5",
            rtol=1e-8,
            atol=1e-8,
            sensealg=sensealg,
            integrand=integrand,
        )
        return jnp.sum(jnp.sin(sol.us)) + (0.0 if integrand is None else jnp.sum(sol.integral))

    return loss


@functools.cache
def _member_grad(name):
    """A member's jitted gradient in (u0, p), compiled once per sensealg for the module."""
    return jax.jit(jax.grad(_loss(sciad.adjoints.parse(name)), argnums=(0, 1)))


@pytest.mark.parametrize("name", SENSEALGS)
def test_vmap_equals_members(name):
    members = [_member_grad(name)(u0, P) for u0 in U0S]
    g_u0, g_p = jax.jit(
        jax.grad(lambda u0s, p: jnp.sum(jax.vmap(_loss(sciad.adjoints.parse(name)), (0, None))(u0s, p)), argnums=(0, 1))
    )(U0S, P)
    np.testing.assert_allclose(g_u0, jnp.stack([m[0] for m in members]), rtol=_rtol(name), atol=1e-12)
    np.testing.assert_allclose(g_p, sum(m[1] for m in members), rtol=_rtol(name), atol=1e-12)


@pytest.mark.parametrize("name", ["GaussAdjoint()", pytest.param("InterpolatingAdjoint()", marks=pytest.mark.slow)])
def test_vmap_with_an_integrand_equals_members(name):
    """A loss of the states and of an integral (a state q beside u, laid out after the members' u when
    the batch is swept as one state): the batch's gradients equal the members'."""
    loss = _loss(sciad.adjoints.parse(name), integrand=lambda u, p, t: jnp.stack([u[0] ** 2, u[0] * u[1] * p[0]]))
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    members = [grad(u0, P) for u0 in U0S]
    g_u0, g_p = jax.jit(jax.grad(lambda u0s, p: jnp.sum(jax.vmap(loss, (0, None))(u0s, p)), argnums=(0, 1)))(U0S, P)
    np.testing.assert_allclose(g_u0, jnp.stack([m[0] for m in members]), rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(g_p, sum(m[1] for m in members), rtol=1e-7, atol=1e-12)


@pytest.mark.parametrize("name", ["DiscreteAdjoint()", "ForwardSensitivity()"])
def test_gradient_of_a_jitted_batch(name):
    """jax.grad of a jitted vmapped solve (as of diffrax's own jitted diffeqsolve under a user's grad): JAX
    linearises the compiled batch, reading the rules' outputs with the batch axes of their value."""
    loss = jax.jit(lambda p: jnp.sum(jax.vmap(_loss(sciad.adjoints.parse(name)), (0, None))(U0S, p)))
    if name == "DiscreteAdjoint()":  # the module's member gradient in (u0, p), compiled once for the module
        member = lambda u0, p: _member_grad(name)(u0, p)[1]  # noqa: E731
    else:  # not in u0: ForwardSensitivity steps on p's only
        member = jax.jit(jax.grad(_loss(sciad.adjoints.parse(name)), 1))
    np.testing.assert_allclose(jax.grad(loss)(P), sum(member(u0, P) for u0 in U0S), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["DiscreteAdjoint()", "GaussAdjoint()"])
def test_vmap_with_a_differentiated_closure_equals_members(name):
    """f closing over the differentiated weights (no p): the batch's gradient is the members' sum."""

    def loss(w, u0):
        prob = sciad.ODEProblem(lambda u, p, t: jnp.tanh(w[:4].reshape(2, 2) @ u + w[4:]), u0, (0.0, 1.5))
        return jnp.sum(
            jnp.sin(
                sciad.solve(
                    prob, saveat=SAVES, solver="tsit5", rtol=1e-8, atol=1e-8, sensealg=sciad.adjoints.parse(name)
                ).us
            )
        )

    batch = jax.jit(jax.grad(lambda w: jnp.sum(jax.vmap(loss, (None, 0))(w, U0S))))(P)
    member = jax.jit(jax.grad(loss))
    np.testing.assert_allclose(batch, sum(member(P, u0) for u0 in U0S), rtol=_rtol(name), atol=1e-12)


def test_vmap_with_batched_p_equals_members():
    """p batched with u0 (per-member parameters): each member's own p cotangent, not the batch's sum."""
    ps = P + 0.1 * jnp.arange(3.0)[:, None]
    loss, grad = _loss(sciad.DiscreteAdjoint()), _member_grad("DiscreteAdjoint()")
    g_u0, g_p = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))(U0S, ps)
    for i, (u0, p) in enumerate(zip(U0S, ps)):
        m_u0, m_p = grad(u0, p)
        np.testing.assert_allclose(g_u0[i], m_u0, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(g_p[i], m_p, rtol=1e-10, atol=1e-12)


def test_vmap_over_members_of_several_segments():
    """DiscreteAdjoint's solve in segments (`SEGMENT_STEPS` steps each) under vmap, the members taking
    different numbers of segments (their own frequencies ω in the state): the members' gradients, p's summed
    (each member's by forward mode through the same steps)."""

    def f(u, p, t):
        x, v, omega = u
        return jnp.stack([v, -(omega**2) * x - p[0] * v + p[1] * jnp.sin(t), 0.0 * omega])

    def solve(u0, p, sensealg):
        return sciad.solve(
            sciad.ODEProblem(f, u0, (0.0, 6.0), p),
            u0=u0,
            p=p,
            saveat=jnp.array([2.0, 6.0]),
            solver="tsit5",
            rtol=1e-6,
            atol=1e-6,
            sensealg=sensealg,
        )

    def loss(u0, p):
        return jnp.sum(solve(u0, p, sciad.DiscreteAdjoint()).us[:, :2] ** 2)

    def loss_and_steps(u0, p):
        sol = solve(u0, p, sciad.ForwardDiffSensitivity())
        return jnp.sum(sol.us[:, :2] ** 2), sol.stats["accepted_steps"]

    u0s, p = jnp.array([[1.0, 0.0, 2.0], [0.5, 1.0, 20.0], [0.0, 1.0, 60.0]]), jnp.array([0.1, 0.5])
    grad = jax.jit(jax.grad(loss_and_steps, argnums=(0, 1), has_aux=True))  # each member's gradient and steps
    members, steps = zip(*(grad(u0, p) for u0 in u0s))
    segments = [int(s) // SEGMENT_STEPS for s in steps]
    assert segments[0] == 0 and segments[-1] >= 2, segments
    g_u0, g_p = jax.jit(jax.grad(lambda u0s, p: jnp.sum(jax.vmap(loss, (0, None))(u0s, p)), argnums=(0, 1)))(u0s, p)
    np.testing.assert_allclose(g_u0, jnp.stack([m[0] for m in members]), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(g_p, sum(m[1] for m in members), rtol=1e-9, atol=1e-12)
