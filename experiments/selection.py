"""`sciad bench selection`: see sciad_bench.selection. Arguments as the command's:

python experiments/selection.py [--quick] [--out DIR]
"""

import sys

from sciad_bench.cli import main

if __name__ == "__main__":
    main(["bench", "selection", *sys.argv[1:]])
