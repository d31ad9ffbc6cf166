"""`sciad bench spiral-node`: see sciad_bench.experiments. Arguments as the command's, e.g. `--quick`:

python experiments/spiral_node.py [--quick] [--repeats N] [--engines a,b] [--out DIR]
"""

import sys

from sciad_bench.cli import main

if __name__ == "__main__":
    main(["bench", "spiral-node", *sys.argv[1:]])
