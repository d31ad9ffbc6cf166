"""Benchmark problems of the AbstractDifferentiation.jl paper (Appendix B), stiff problems,
the Brusselator of the size sweep, a long-horizon neural ODE and a many-parameter gene
circuit, for tests, examples and the benchmark product
(`sciad_bench`, which times them).

Each function returns a `Benchmark`: an `ODEProblem`, its saveat times, a
loss of the saved states and the tolerances to solve at.

    bench = sciad.problems.lotka_volterra()
    g = jax.grad(bench.objective)(bench.problem.p)
"""

from sciad.problems.benchmark import Benchmark
from sciad.problems.brusselator import brusselator, brusselator_pde
from sciad.problems.gene_circuit import gene_circuit
from sciad.problems.hamiltonian import hamiltonian_node
from sciad.problems.lotka_volterra import lotka_volterra
from sciad.problems.oregonator import oregonator
from sciad.problems.spiral import spiral_node

PROBLEMS = {"lotka-volterra": lotka_volterra, "spiral-node": spiral_node, "brusselator": brusselator,
            "brusselator-pde": brusselator_pde, "oregonator": oregonator, "hamiltonian-node": hamiltonian_node,
            "gene-circuit": gene_circuit}
