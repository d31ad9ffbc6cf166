"""Second derivatives through `sciad.solve`, for every sensealg.

The Hessian of L(p) = Σ u(t_k)² (Lotka–Volterra, t ∈ [0, 3], 7 save points,
rtol = atol = 1e-10, float64) by `jax.hessian` and the Hessian-vector product
by `jax.jvp(jax.grad(L))`, both under `jax.jit`, agree with central finite
differences of `DiscreteAdjoint` gradients to 1e-5 relative. Reverse over
reverse raises an error that names forward-over-reverse.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import slow_except
import sciad
from sciad.ad.linear import HigherOrderError
from sciad.adjoints import (
    BacksolveAdjoint,
    DiscreteAdjoint,
    ForwardDiffSensitivity,
    ForwardSensitivity,
    InterpolatingAdjoint,
    GaussAdjoint,
)
from sciad.problems.lotka_volterra import lotka_volterra_rhs

pytestmark = pytest.mark.usefixtures("fast_compiles")

TOL = 1e-10
AGREEMENT = 1e-5
PROBLEM = sciad.ODEProblem(lotka_volterra_rhs, np.ones(2), (0.0, 3.0), np.array([1.5, 1.0, 3.0, 1.0]))
SAVEAT = np.linspace(0.0, 3.0, 7)
V = np.array([0.3, -0.2, 0.5, 0.1])

SENSEALGS = {
    "DiscreteAdjoint": DiscreteAdjoint(),
    "ForwardDiffSensitivity": ForwardDiffSensitivity(),
    "ForwardSensitivity": ForwardSensitivity(),
    "ForwardSensitivity-seminorm": ForwardSensitivity(seminorm=True),
    "BacksolveAdjoint": BacksolveAdjoint(),
    "InterpolatingAdjoint": InterpolatingAdjoint(),
    "InterpolatingAdjoint-checkpointing": InterpolatingAdjoint(checkpointing=True),
    "GaussAdjoint": GaussAdjoint(),
    "InterpolatingAdjoint(jax-forward)": InterpolatingAdjoint(vjp="jax-forward"),
}


def loss(p, u0=PROBLEM.u0, sensealg=DiscreteAdjoint()):
    sol = sciad.solve(PROBLEM, u0=u0, p=p, saveat=SAVEAT, rtol=TOL, atol=TOL, sensealg=sensealg)
    return jnp.sum(sol.us**2)


@functools.cache
def hessian_by_differences() -> np.ndarray:
    """Central differences (step 1e-5) of DiscreteAdjoint gradients in p."""
    grad = jax.jit(jax.grad(loss))
    p = np.asarray(PROBLEM.p)
    h = 1e-5
    return np.stack([(grad(p + h * e) - grad(p - h * e)) / (2 * h) for e in np.eye(p.size)])


def assert_agrees(actual, expected, what):
    np.testing.assert_allclose(actual, expected, rtol=AGREEMENT, atol=AGREEMENT * np.max(np.abs(expected)), err_msg=what)


@pytest.mark.parametrize("name", slow_except(list(SENSEALGS), fast=["ForwardSensitivity", "BacksolveAdjoint",
                                                                   "InterpolatingAdjoint"]))
def test_hessian_vector_product(name):
    sensealg = SENSEALGS[name]
    hvp = jax.jit(lambda p, v: jax.jvp(lambda q: jax.grad(loss)(q, sensealg=sensealg), (p,), (v,))[1])
    assert_agrees(hvp(PROBLEM.p, V), hessian_by_differences() @ V, f"{name}: H v")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SENSEALGS))
def test_hessian(name):
    sensealg = SENSEALGS[name]
    assert_agrees(jax.jit(jax.hessian(lambda p: loss(p, sensealg=sensealg)))(PROBLEM.p), hessian_by_differences(),
                  f"{name}: jax.hessian")


@pytest.mark.slow
def test_jacfwd_of_grad_in_u0_and_p():
    """Mixed second derivatives ∂²L/∂u0∂p by forward-over-reverse agree between sensealgs."""
    def mixed(sensealg):
        grad_u0 = jax.grad(lambda u0, p: loss(p, u0, sensealg))
        return jax.jit(jax.jacfwd(grad_u0, argnums=1))(PROBLEM.u0, PROBLEM.p)

    assert_agrees(mixed(InterpolatingAdjoint()), mixed(DiscreteAdjoint()), "d²L/du0 dp")


@pytest.mark.parametrize("name", [pytest.param("DiscreteAdjoint", marks=pytest.mark.slow), "ForwardSensitivity",
                                  "InterpolatingAdjoint"])
def test_reverse_over_reverse_names_forward_over_reverse(name):
    with pytest.raises(HigherOrderError, match="forward-over-reverse"):
        jax.jacrev(jax.grad(lambda p: loss(p, sensealg=SENSEALGS[name])))(PROBLEM.p)
