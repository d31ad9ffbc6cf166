"""`sciad bench scaling`: see sciad_bench.experiments. Arguments as the command's, e.g. `--quick`:

python experiments/scaling.py [--quick] [--repeats N] [--engines a,b] [--out DIR]
"""

import sys

from sciad_bench.cli import main

if __name__ == "__main__":
    main(["bench", "scaling", *sys.argv[1:]])
