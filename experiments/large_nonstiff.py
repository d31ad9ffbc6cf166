"""Stored continuous adjoints on a large non-stiff problem: does their cost follow the steps taken?

The suite's family "large-nonstiff" (`sciad_bench.suite.run_large_nonstiff`, where the problem, the
combinations, the checks and the tables live): u' = −p ⊙ u + 0.3 sin t (1 + u / (1 + u²)), n states and
n parameters, Tsit5 at rtol = atol = 1e-6, saved at t = 0.5 and 1, gradient of Σ u(1)² in p, at 2,000
and 20,000 states and max_steps 4,096 and 100,000, against diffrax's RecursiveCheckpointAdjoint and
BacksolveAdjoint, with XLA's temporaries. The same as

    sciad bench suite --family large-nonstiff [--quick] [--repeats N] [--out results/suite]
"""

import sys

from sciad_bench.cli import main

if __name__ == "__main__":
    main(["bench", "suite", "--family", "large-nonstiff", *sys.argv[1:]])
