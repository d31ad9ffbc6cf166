"""Benchmarks of gradients through ODE solves: every sensealg × engine, peers in the same
run, raw JSON, violin plots, Markdown tables and the paper's claims (`sciad bench NAME`)."""

from sciad.bench.claims import claims_table
from sciad.bench.experiments import PLANS, run_experiment
from sciad.bench.harness import Combination, forward_solve, reference_gradient, run, sciad_combination
from sciad.bench.peers import peers
from sciad.bench.tables import markdown_table
