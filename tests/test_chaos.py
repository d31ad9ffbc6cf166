"""A gradient more sensitive than 1/rtol relative to the solution (chaos) warns; stable and unstable
linear problems, whose gradients mean what they say, stay quiet."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
import sciad.ad as ad
from helpers import slow_except
from sciad.problems._lotka_volterra import lotka_volterra_rhs


def lorenz(u, p, t):
    xp = ad.namespace(u, p)
    return xp.stack([p[0] * (u[1] - u[0]), u[0] * (p[1] - u[2]) - u[1], u[0] * u[1] - p[2] * u[2]])


def linear(u, p, t):
    return p[0] * u


def warnings_of(prob, sensealg, loss=lambda us: jnp.mean(us[:, -1]), batch=None):
    """The chaos warnings of one gradient (under vmap over p when `batch` is given), and the gradient."""
    ts = np.linspace(*prob.tspan, 101)

    def objective(u0, p):
        return loss(
            sciad.solve(prob, u0=u0, p=p, saveat=ts, rtol=1e-6, atol=1e-6, sensealg=sensealg, max_steps=20_000).us
        )

    grad = jax.grad(objective, argnums=(0, 1))
    if batch is not None:
        grad = jax.vmap(grad, in_axes=(None, 0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = jax.jit(grad)(prob.u0, prob.p if batch is None else batch)
        jax.effects_barrier()
    return [str(w.message) for w in caught if "times as sensitive" in str(w.message)], g


LORENZ = sciad.ODEProblem(lorenz, np.array([1.0, 0.0, 0.0]), (0.0, 40.0), np.array([10.0, 28.0, 8 / 3]))


@pytest.mark.parametrize(
    "sensealg",
    slow_except(
        ["InterpolatingAdjoint()", "DiscreteAdjoint()", "ForwardDiffSensitivity()"], fast=["ForwardDiffSensitivity()"]
    ),
)
def test_a_chaotic_long_horizon_warns_and_names_shadowing(sensealg):
    caught, _ = warnings_of(LORENZ, sensealg)
    assert len(caught) == 1 and "shadowing" in caught[0]


def test_a_batch_warns_once():
    caught, g = warnings_of(LORENZ, "auto", batch=np.array([[10.0, 28.0, 8 / 3], [10.0, 28.5, 8 / 3]]))
    assert len(caught) == 1 and g[1].shape == (2, 3)


@pytest.mark.parametrize(
    "name, prob",
    [
        ("Lorenz, short horizon", sciad.ODEProblem(lorenz, LORENZ.u0, (0.0, 3.0), LORENZ.p)),
        ("unstable linear, growing 2e8-fold", sciad.ODEProblem(linear, np.array([1.0]), (0.0, 19.0), np.array([1.0]))),
        (
            "Lotka-Volterra, long horizon",
            sciad.ODEProblem(lotka_volterra_rhs, np.array([1.0, 1.0]), (0.0, 200.0), np.array([1.5, 1.0, 3.0, 1.0])),
        ),
    ],
)
def test_meaningful_gradients_stay_quiet(name, prob):
    caught, _ = warnings_of(prob, "ForwardDiffSensitivity()", loss=lambda us: jnp.sum(us[-1] ** 2))
    assert not caught, name
