"""`sciad bench ensemble`: see sciad_bench.ensemble. Arguments as the command's, e.g. `--quick --devices 8`:

python experiments/ensemble.py [--quick] [--repeats N] [--devices N] [--out DIR]
"""

import sys

from sciad_bench.cli import main

if __name__ == "__main__":
    main(["bench", "ensemble", *sys.argv[1:]])
