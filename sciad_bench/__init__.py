"""sciad's benchmark product (`pip install 'sciad[bench]'`): gradients through ODE solves
timed over every sensealg × engine with peers in the same run, raw JSON, violin plots,
Markdown tables, the paper's claims, the selection validation and `sciad reproduce`.
Built on sciad's public API only."""

from sciad_bench.claims import claims_table
from sciad_bench.experiments import PLANS, run_experiment
from sciad_bench.harness import Combination, forward_solve, reference_gradient, run, sciad_combination
from sciad_bench.peers import peers
from sciad_bench.tables import markdown_table

__all__ = [
    "PLANS",
    "Combination",
    "claims_table",
    "forward_solve",
    "markdown_table",
    "peers",
    "reference_gradient",
    "run",
    "run_experiment",
    "sciad_combination",
]
