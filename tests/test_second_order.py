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

import sciad
from helpers import SENSEALGS, assert_agrees, central_differences, slow_except
from sciad.ad._linear import HigherOrderError
from sciad.adjoints import DiscreteAdjoint, InterpolatingAdjoint
from sciad.problems._lotka_volterra import lotka_volterra_rhs

TOL = 1e-10
AGREEMENT = 1e-5
PROBLEM = sciad.ODEProblem(lotka_volterra_rhs, np.ones(2), (0.0, 3.0), np.array([1.5, 1.0, 3.0, 1.0]))
SAVEAT = np.linspace(0.0, 3.0, 7)
V = np.array([0.3, -0.2, 0.5, 0.1])

# every shared variant, and one continuous adjoint's VJPs by forward mode
VARIANTS = {
    **{name: make() for name, make in SENSEALGS.items()},
    "InterpolatingAdjoint(jax-forward)": SENSEALGS["InterpolatingAdjoint"]("jax-forward"),
}


def loss(p, u0=PROBLEM.u0, sensealg=DiscreteAdjoint()):
    sol = sciad.solve(PROBLEM, u0=u0, p=p, saveat=SAVEAT, rtol=TOL, atol=TOL, sensealg=sensealg)
    return jnp.sum(sol.us**2)


@functools.cache
def hessian_by_differences() -> np.ndarray:
    """Central differences (relative step 1e-5) of DiscreteAdjoint gradients in p."""
    return central_differences(jax.jit(jax.grad(loss)), PROBLEM.p)


@pytest.mark.parametrize("name", slow_except(list(VARIANTS), fast=["InterpolatingAdjoint"]))
def test_hessian_vector_product(name):
    sensealg = VARIANTS[name]
    hvp = jax.jit(lambda p, v: jax.jvp(lambda q: jax.grad(loss)(q, sensealg=sensealg), (p,), (v,))[1])
    assert_agrees(hvp(PROBLEM.p, V), hessian_by_differences() @ V, f"{name}: H v", AGREEMENT)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_hessian(name):
    sensealg = VARIANTS[name]
    assert_agrees(
        jax.jit(jax.hessian(lambda p: loss(p, sensealg=sensealg)))(PROBLEM.p),
        hessian_by_differences(),
        f"{name}: jax.hessian",
        AGREEMENT,
    )


@pytest.mark.slow
def test_jacfwd_of_grad_in_u0_and_p():
    """Mixed second derivatives ∂²L/∂u0∂p by forward-over-reverse agree between sensealgs."""

    def mixed(sensealg):
        grad_u0 = jax.grad(lambda u0, p: loss(p, u0, sensealg))
        return jax.jit(jax.jacfwd(grad_u0, argnums=1))(PROBLEM.u0, PROBLEM.p)

    assert_agrees(mixed(InterpolatingAdjoint()), mixed(DiscreteAdjoint()), "d²L/du0 dp", AGREEMENT)


@pytest.mark.parametrize(
    "name",
    slow_except(["DiscreteAdjoint", "ForwardSensitivity", "InterpolatingAdjoint"], fast=["InterpolatingAdjoint"]),
)
def test_reverse_over_reverse_names_forward_over_reverse(name):
    with pytest.raises(HigherOrderError, match="forward-over-reverse"):
        jax.jit(jax.jacrev(jax.grad(lambda p: loss(p, sensealg=VARIANTS[name]))))(PROBLEM.p)  # refused as traced
