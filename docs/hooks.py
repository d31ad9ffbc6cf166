"""mkdocs hook: serve the paper (paper/paper.md, its figures and tables) under `paper/` without
copying it into docs/. The files stay where `sciad reproduce` writes them; the site links to them."""

from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

SERVED = {".md", ".png"}


def on_files(files, config):
    root = Path(config.config_file_path).parent
    for path in sorted((root / "paper").rglob("*")):
        if path.is_file() and path.suffix in SERVED:
            uri = path.relative_to(root).as_posix()
            inclusion = InclusionLevel.NOT_IN_NAV if uri.startswith("paper/tables/") else InclusionLevel.UNDEFINED
            files.append(File.generated(config, uri, abs_src_path=str(path), inclusion=inclusion))
    return files
