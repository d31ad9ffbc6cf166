"""`ReversibleAdjoint`: the exact gradient of an algebraically reversible SDE solver (reversible
Heun), its states reconstructed backwards step by step, in memory independent of the number of steps."""

import equinox as eqx
import jax
import jax.numpy as jnp

import sciad.ad as ad
from sciad.adjoints._base import AbstractSensitivity, Setup

ODE_REFUSAL = (
    "ReversibleAdjoint differentiates an algebraically reversible SDE solver (reversible Heun, "
    "sciad.solve(sde_problem, solver='reversible_heun')); an ODE solve has none in sciad: pass "
    "sensealg=sciad.DiscreteAdjoint() (the exact gradient of the solver's steps) or "
    "sciad.InterpolatingAdjoint(checkpointing=True) (memory flat in the steps)"
)


class ReversibleAdjoint(AbstractSensitivity):
    """The exact gradient of reversible Heun (Kidger et al. 2021, torchsde's and diffrax's open
    pull request): the backward pass reconstructs each step's state (y, ŷ) from the next one
    algebraically, on the same Brownian increments, and pulls the cotangent back through the step
    with one vector-Jacobian product of drift and diffusion per step (`vjp`: a `sciad.ad` JAX
    engine or its name). The forward pass keeps only the final state: memory independent of the
    number of steps. Reconstruction is exact in exact arithmetic; in floating point it follows the
    forward states to rounding (tests/test_sde.py checks it against `DiscreteAdjoint`).

    SDE problems with `solver="reversible_heun"` only; other solvers and ODE problems are refused
    naming what serves them. Forward mode (`jax.jvp`) runs through the steps, also in flat memory."""

    stores_interpolation = False

    vjp: ad.AbstractBackend

    def __init__(self, vjp: str | ad.AbstractBackend = "jax-reverse"):
        self.vjp = ad.get(vjp)

    def forward(self, setup: Setup, u0, p, active):
        raise ValueError(ODE_REFUSAL)

    def pullback(self, setup: Setup, residuals, w):
        raise ValueError(ODE_REFUSAL)

    def pushforward(self, setup: Setup, residuals, du0, dp):
        raise ValueError(ODE_REFUSAL)


class _Final(eqx.Module):
    """ReversibleAdjoint's residuals: the solver's final state (y, ŷ, a(ŷ), σ(ŷ)), y0 and θ."""

    state: tuple
    y0: jax.Array
    theta: jax.Array


def through_steps(setup, res, vs):
    """The tangent of the saves by forward mode through the steps, from the residuals' y0 and θ."""
    return jax.jvp(lambda y0, theta: setup.run(y0, theta), (res.y0, res.theta), vs)[1]


def reversible_rules(sensealg):
    """(forward, pushforward, pullback), each taking the solve's setup (a reversible-Heun
    `sciad._sde_solvers.SDESetup`) first, for `sciad.ad.custom_linear_rules` over (y0, θ)."""

    def forward(setup, y0, theta, active):
        ys, state = setup.run(y0, theta, final_state=True)
        return ys, _Final(state, y0, theta)

    def pullback(setup, res, w):
        system = setup.system
        saves = jnp.asarray(setup.save_steps)
        dt = setup.dt
        y_N, yh_N, a_N, sigma_N = res.state
        theta = res.theta
        n, N = system.n, setup.steps

        def jump(k):
            return (saves == k).astype(w.dtype) @ w

        def pulled(yh, t, cot_a, cot_sigma):
            """(a, σ) at ŷ and the cotangent (ŷ̄, θ̄) of (cot_a, cot_σ) through them."""
            rates, pb = jax.vjp(lambda x, th: system.rates(x, th, t), yh, theta)
            return rates, pb((cot_a, cot_sigma))

        def later_use(ybar, k):
            """The cotangent on (a, σ)(ŷ_k) from y_k = y_{k-1} + ... + ½ Δ_{k-1}(ŷ_k) (none for k = 0)."""
            c2 = jnp.where(k > 0, 0.5, 0.0) * ybar
            dW = setup.increment(jnp.maximum(k - 1, 0)).astype(w.dtype)
            return c2 * dt, system.noise_cotangent(c2[:n], dW)

        ybar_N = jump(N)
        cot = later_use(ybar_N, N)
        _, (ghat_N, theta_bar) = pulled(yh_N, setup.time(N), *cot)

        def body(carry, _):  # the step index rides in the carry (memory flat in the steps)
            (y1, yh1, a1, s1), ybar1, ghat1, theta_bar, k = carry
            k = k - 1
            t = jnp.asarray(setup.time(k), y1.dtype)
            dW = setup.increment(k).astype(y1.dtype)
            second = system.increment(a1, s1, dt, dW)
            yh = 2 * y1 - yh1 - second
            c1 = 0.5 * ybar1 + ghat1
            ybar = ybar1 + 2 * ghat1 + jump(k)
            later_a, later_sigma = later_use(ybar, k)
            (a, s), (xbar, tbar) = pulled(yh, t, c1 * dt + later_a, system.noise_cotangent(c1[:n], dW) + later_sigma)
            y = y1 - 0.5 * (system.increment(a, s, dt, dW) + second)
            return ((y, yh, a, s), ybar, -ghat1 + xbar, theta_bar + tbar, k), None

        carry = ((y_N, yh_N, a_N, sigma_N), ybar_N, ghat_N, theta_bar, jnp.asarray(N, jnp.int32))
        (_, ybar0, ghat0, theta_bar, _), _ = jax.lax.scan(body, carry, None, length=N)
        return ybar0 + ghat0, theta_bar

    return forward, through_steps, pullback
