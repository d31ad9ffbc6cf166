"""The programs users run: one gradient per sensealg compiled with XLA's optimisations on.

The test run switches XLA's optimisations off (tests/conftest.py: the same programs, faster compiles).
Optimisations reorder and fuse floating-point work, so a rule that is right only unoptimised (or
only optimised) would pass those modules. Here each sensealg of the matrix (tests/helpers.py) takes
one gradient of L = Σ u(t_k)² on Lotka–Volterra in p and u0 under `jax.jit`, checked against central
finite differences of the loss solved at tight tolerances.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from helpers import SENSEALGS, assert_agrees, central_differences
from sciad.problems._lotka_volterra import lotka_volterra_rhs

pytestmark = pytest.mark.usefixtures("xla_optimisations")

U0, P = np.array([1.0, 1.0]), np.array([1.5, 1.0, 3.0, 1.0])
TS = np.linspace(0.0, 3.0, 7)
TOL = 1e-10


def loss(u0, p, sensealg):
    sol = sciad.solve(
        sciad.ODEProblem(lotka_volterra_rhs, u0, (0.0, 3.0), p),
        u0=u0,
        p=p,
        saveat=TS,
        sensealg=sensealg,
        rtol=TOL,
        atol=TOL,
    )
    return jnp.sum(sol.us**2)


@pytest.fixture(scope="module")
def finite_differences():
    """(∂L/∂u0, ∂L/∂p) by central differences of the loss (DiscreteAdjoint's primal: any solve will do)."""
    primal = jax.jit(lambda u0, p: loss(u0, p, sciad.DiscreteAdjoint()))
    return (central_differences(lambda u0: primal(u0, P), U0), central_differences(lambda p: primal(U0, p), P))


@pytest.mark.parametrize("name", list(SENSEALGS))
def test_optimised_gradient_matches_finite_differences(name, finite_differences):
    assert not jax.config.values["jax_disable_most_optimizations"], "this module runs XLA's optimisations"
    gradient = jax.jit(jax.grad(lambda u0, p: loss(u0, p, SENSEALGS[name]()), argnums=(0, 1)))(U0, P)
    assert_agrees(gradient, finite_differences, f"{name} (XLA optimisations on)", 1e-6)
