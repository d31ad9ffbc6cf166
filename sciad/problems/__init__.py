"""Benchmark problems of the AbstractDifferentiation.jl paper (Appendix B), stiff problems,
the Brusselator of the size sweep, a long-horizon neural ODE and a many-parameter gene
circuit, for tests, examples and the benchmark product
(`sciad_bench`, which times them).

Each function returns a `Benchmark`: an `ODEProblem`, its saveat times, a
loss of the saved states and the tolerances to solve at.

    bench = sciad.problems.lotka_volterra()
    g = jax.grad(bench.objective)(bench.problem.p)
"""

from sciad.problems._benchmark import Benchmark
from sciad.problems._brusselator import brusselator, brusselator_pde
from sciad.problems._gene_circuit import GeneCircuitRHS, gene_circuit
from sciad.problems._hamiltonian import hamiltonian_node
from sciad.problems._lotka_volterra import lotka_volterra
from sciad.problems._oregonator import oregonator
from sciad.problems._spiral import spiral_data, spiral_node

PROBLEMS = {
    "lotka-volterra": lotka_volterra,
    "spiral-node": spiral_node,
    "brusselator": brusselator,
    "brusselator-pde": brusselator_pde,
    "oregonator": oregonator,
    "hamiltonian-node": hamiltonian_node,
    "gene-circuit": gene_circuit,
}

__all__ = [
    "PROBLEMS",
    "Benchmark",
    "GeneCircuitRHS",
    "brusselator",
    "brusselator_pde",
    "gene_circuit",
    "hamiltonian_node",
    "lotka_volterra",
    "oregonator",
    "spiral_data",
    "spiral_node",
]
