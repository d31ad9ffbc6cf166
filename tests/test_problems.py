"""The benchmark problems: their specifications, one definition for every engine, and
objective gradients that match central finite differences."""

import jax
import numpy as np
import pytest

import sciad
from helpers import central_differences
from sciad.problems import brusselator, gene_circuit, hamiltonian_node, lotka_volterra, spiral_node
from sciad.problems._gene_circuit import GeneCircuitRHS


def test_lotka_volterra_is_the_papers_setup():
    bench = lotka_volterra()
    np.testing.assert_array_equal(bench.problem.p, [1.5, 1.0, 3.0, 1.0])
    np.testing.assert_array_equal(bench.problem.u0, [1.0, 1.0])
    assert bench.problem.tspan == (0.0, 10.0) and bench.saveat.shape == (101,)
    assert bench.problem.p.dtype == np.float64 and bench.size == 6
    assert bench.loss(np.ones((3, 2))) == 6.0


def test_spiral_node_is_float32_with_seeded_weights():
    bench = spiral_node(hidden=8)
    assert bench.problem.p.dtype == np.float32 and bench.problem.p.shape == (5 * 8 + 2,)
    np.testing.assert_array_equal(bench.problem.p, spiral_node(hidden=8).problem.p)
    assert bench.saveat.shape == (30,) and bench.problem.tspan == (0.0, 1.5)
    data = bench.loss.data
    assert data.dtype == np.float32 and data.shape == (30, 2)
    np.testing.assert_allclose(data[0], [2.0, 0.0])
    assert bench.loss(data) == 0.0


def test_brusselator_size_and_validation():
    bench = brusselator(4)
    assert bench.problem.u0.shape == (32,) and bench.size == 35
    with pytest.raises(ValueError, match="at least 2"):
        brusselator(1)


@pytest.mark.parametrize(
    "make",
    [lotka_volterra, lambda: spiral_node(hidden=6), lambda: brusselator(3)],
    ids=["lotka-volterra", "spiral", "brusselator"],
)
def test_rhs_agrees_across_array_modules(make):
    """One definition of f runs on NumPy, torch and JAX with the same result."""
    torch = pytest.importorskip("torch")
    prob = make().problem
    u, p = np.asarray(prob.u0, np.float64), np.asarray(prob.p, np.float64)
    expected = np.asarray(prob.f(jax.numpy.asarray(u), jax.numpy.asarray(p), 0.0))
    np.testing.assert_allclose(prob.f(u, p, 0.0), expected, rtol=1e-6)
    np.testing.assert_allclose(prob.f(torch.as_tensor(u), torch.as_tensor(p), 0.0).numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize(
    "make",
    [
        lotka_volterra,
        lambda: spiral_node(hidden=6),
        lambda: brusselator(2),
        lambda: hamiltonian_node(hidden=3, t1=20.0),
        lambda: gene_circuit(n=4, saves=10),
    ],
    ids=["lotka-volterra", "spiral", "brusselator", "hamiltonian-node", "gene-circuit"],
)
def test_objective_gradient_matches_finite_differences(make):
    """∇objective · v against a central difference of the objective in float64 along a random v."""
    bench = make()
    p = np.asarray(bench.problem.p, np.float64)
    v = np.random.default_rng(0).standard_normal(p.shape)
    objective = jax.jit(bench.objective)
    grad = jax.jit(jax.grad(lambda p: bench.objective(p, sciad.ForwardDiffSensitivity())))(p)
    fd = central_differences(lambda s: objective(p + s * v), 0.0)  # step 1e-5 along v
    np.testing.assert_allclose(np.dot(grad, v), fd, rtol=1e-3)


def test_hamiltonian_node_is_long_horizon_with_two_saves_and_conserves_its_energy():
    bench = hamiltonian_node()
    prob = bench.problem
    assert prob.p.shape == (400,) and prob.p.dtype == np.float64 and bench.size == 402
    assert prob.tspan == (0.0, 100.0) and list(bench.saveat) == [50.0, 100.0]
    assert bench.loss.data.shape == (2, 2) and bench.loss(bench.loss.data) == 0.0
    w1, b, w2 = prob.p[:200].reshape(100, 2), prob.p[200:300], prob.p[300:]

    def energy(u):
        return u @ u / 2 + w2 @ np.tanh(w1 @ u + b)

    us = sciad.solve(prob, saveat=bench.saveat, rtol=bench.rtol, atol=bench.atol, max_steps=bench.max_steps).us
    np.testing.assert_allclose([energy(np.asarray(u)) for u in us], energy(prob.u0), rtol=1e-6)
    with pytest.raises(ValueError, match="hidden must be at least 1"):
        hamiltonian_node(hidden=0)
    with pytest.raises(ValueError, match="t1 must be positive"):
        hamiltonian_node(t1=-1.0)


def test_gene_circuit_has_many_parameters_dense_data_and_an_oscillating_core():
    bench = gene_circuit()
    assert bench.problem.p.shape == (130,) and bench.problem.u0.shape == (10,) and bench.saveat.shape == (50,)
    data = bench.loss.data
    assert data.shape == (50, 10) and np.all(data > 0)
    assert np.ptp(data[25:, :3], axis=0).min() > 0.5  # the repressilator still oscillates in the second half
    truth = GeneCircuitRHS(10).true_parameters(0)  # the data's; the benchmark's are 10% off
    assert bench.loss(data) == 0.0
    assert np.allclose(bench.problem.p, truth, rtol=0.5) and not np.allclose(bench.problem.p, truth)
    with pytest.raises(ValueError, match="at least 3"):
        gene_circuit(n=2)
    with pytest.raises(ValueError, match="saves must be at least 2"):
        gene_circuit(saves=1)
