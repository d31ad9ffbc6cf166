"""`sciad bench lotka-volterra`: see sciad_bench.experiments. Arguments as the command's, e.g. `--quick`:

python experiments/lotka_volterra.py [--quick] [--repeats N] [--engines a,b] [--out DIR]
"""

import sys

from sciad_bench.cli import main

if __name__ == "__main__":
    main(["bench", "lotka-volterra", *sys.argv[1:]])
