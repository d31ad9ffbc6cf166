"""`sciad bench gpu-crossover`: see sciad_bench.experiments. Arguments as the command's, e.g. `--quick`:

python experiments/gpu_crossover.py [--quick] [--repeats N] [--engines a,b] [--out DIR]
"""

import sys

from sciad_bench.cli import main

if __name__ == "__main__":
    main(["bench", "gpu-crossover", *sys.argv[1:]])
