"""ReversibleAdjoint on ODE solves: McCallum & Foster's reversible method on an explicit solver, its gradient
reconstructed backwards, checked against forward mode through the same steps (another code path), against
the base solver's own discrete gradient, in memory, and under jit, vmap and second derivatives."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from sciad.problems import lotka_volterra

PROB = lotka_volterra().problem
P, U0 = jnp.asarray(PROB.p), jnp.asarray(PROB.u0)
TS = np.array([0.0, 0.7, 2.5, 2.5, 4.0])  # t0, interior, repeated and end saves


def loss(u0, p, sensealg=None, solver="tsit5", max_steps=4096, ts=TS, rtol=1e-7):
    sol = sciad.solve(
        PROB,
        u0=u0,
        p=p,
        tspan=(0.0, 4.0),
        saveat=ts,
        solver=solver,
        rtol=rtol,
        atol=rtol,
        max_steps=max_steps,
        sensealg=sensealg or sciad.ReversibleAdjoint(),
    )
    return jnp.sum(jnp.sin(sol.us) * jnp.arange(1.0, 3.0))


@functools.cache
def gradient(solver="tsit5", max_steps=4096):
    """The reconstructed reverse pass's gradient in (u0, p) at a tight tolerance, compiled once per solver and
    max_steps for the module (called at several parameters; its memory analysis read by the memory test)."""
    grad = jax.grad(lambda u0, p: loss(u0, p, solver=solver, max_steps=max_steps, rtol=1e-9), argnums=(0, 1))
    return jax.jit(grad).lower(U0, P).compile()


@pytest.mark.parametrize("solver", ["tsit5", pytest.param("dopri5", marks=pytest.mark.slow)])
def test_gradient_is_forward_mode_through_the_steps(solver):
    """The reconstructed reverse pass against forward mode through the forward steps (the sensealg's
    pushforward): the same derivative of the same discrete solution, to rounding."""
    tangent = jax.jit(jax.jacfwd(lambda u0, p: loss(u0, p, solver=solver, rtol=1e-9), argnums=(0, 1)))(U0, P)
    for g, t in zip(gradient(solver)(U0, P), tangent):
        np.testing.assert_allclose(g, t, rtol=1e-8)


def test_close_to_the_solvers_own_gradient():
    """At a tight tolerance its gradient is Tsit5's (forward mode through Tsit5's steps) to about the tolerance."""
    base = jax.jit(jax.grad(lambda p: loss(U0, p, sciad.ForwardDiffSensitivity(), rtol=1e-9)))(P)  # compiled
    np.testing.assert_allclose(gradient()(U0, P)[1], base, rtol=1e-6)


def test_memory_holds_the_step_times_alone():
    """XLA's buffers for the gradient as max_steps grows 10×: the step times (a few scalars per allowed step),
    no state per step."""
    temp_bytes = [gradient(max_steps=n).memory_analysis().temp_size_in_bytes for n in (4096, 40960)]
    per_step = (temp_bytes[1] - temp_bytes[0]) / (40960 - 4096)
    assert per_step <= 3 * 8, per_step  # a stored Tsit5 step would be 8 states' worth (128 bytes here)


def test_vmap_and_second_derivatives():
    """Under `jax.vmap` over the parameters each member is the unbatched gradient; vᵀHv by forward mode over
    the reconstructed reverse pass against forward mode over forward mode through the steps."""
    ps = jnp.stack([P, 1.1 * P])
    grad = jax.grad(lambda u0, p: loss(u0, p, rtol=1e-9), argnums=1)
    batched = jax.jit(jax.vmap(grad, in_axes=(None, 0)))(U0, ps)
    for p, g in zip(ps, batched):
        np.testing.assert_allclose(g, gradient()(U0, p)[1], rtol=1e-10)
    # vᵀHv by forward mode over the reconstructed reverse pass, and over forward mode through the steps
    v = jnp.array([1.0, -0.5, 0.25, 2.0])
    over_reverse = jax.jit(lambda p: jax.jvp(lambda p: jax.grad(loss, argnums=1)(U0, p), (p,), (v,))[1] @ v)(P)
    directional = lambda p: jax.jvp(lambda p: loss(U0, p), (p,), (v,))[1]  # noqa: E731
    over_forward = jax.jit(lambda p: jax.jvp(directional, (p,), (v,))[1])(P)
    np.testing.assert_allclose(over_reverse, over_forward, rtol=1e-7)


def test_refusals_name_the_fix():
    with pytest.raises(ValueError, match=r"coupling=...\) must be in \(0, 1\]"):
        sciad.ReversibleAdjoint(coupling=0.0)
    with pytest.raises(ValueError, match="needs an explicit solver.*DiscreteAdjoint"):
        jax.grad(loss, argnums=1)(U0, P, solver="rodas5p")
    with pytest.raises(ValueError, match="pass a JAX engine"):
        jax.grad(loss, argnums=1)(U0, P, sciad.ReversibleAdjoint("finite-differences"))


def test_drift_raises_instead_of_a_wrong_number():
    """The scheme's limits, refused where they bite: its second mode grows forwards where a step damps more
    than 1 - coupling (a decaying problem at coupling 1), and the reconstruction amplifies rounding by about
    1/coupling per step (coupling 0.5 over a few dozen steps)."""
    decay = sciad.ODEProblem(lambda u, p, t: -p * u, np.array([1.0]), (0.0, 40.0), np.array([1.0]))

    def final(p, coupling):
        sol = sciad.solve(decay, p=p, saveat=[40.0], sensealg=sciad.ReversibleAdjoint(coupling=coupling))
        return sol.us[-1, 0]

    with pytest.raises(sciad.SolveError, match="two states drifted apart"):
        jax.grad(final)(jnp.array([1.0]), 1.0)
    with pytest.raises(sciad.SolveError, match="did not reconstruct u0"):
        jax.grad(loss, argnums=1)(U0, P, sciad.ReversibleAdjoint(coupling=0.5))
