"""mkdocs hooks.

- Serve the paper (paper/paper.md, its figures and tables) under `paper/` without copying it into
  docs/: the files stay where `sciad reproduce` writes them, and the site links to them.
- Compile the pages' examples (run by markdown-exec in this process) as the tests do
  (tests/conftest.py): XLA's older CPU fusion emitters and most optimisations off, the same programs
  in about half the compile time, which is nearly all of an example's time.
"""

import os
import sys
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

SERVED = {".md", ".png"}


def on_startup(command, dirty):
    if "jax" not in sys.modules:  # XLA reads its flags once, when JAX starts
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_use_fusion_emitters=false".strip()
    import jax

    jax.config.update("jax_disable_most_optimizations", True)


def on_files(files, config):
    root = Path(config.config_file_path).parent
    for path in sorted((root / "paper").rglob("*")):
        if path.is_file() and path.suffix in SERVED:
            uri = path.relative_to(root).as_posix()
            inclusion = InclusionLevel.NOT_IN_NAV if uri.startswith("paper/tables/") else InclusionLevel.UNDEFINED
            files.append(File.generated(config, uri, abs_src_path=str(path), inclusion=inclusion))
    return files
