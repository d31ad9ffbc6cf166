"""`sciad reproduce`: every experiment from scratch, then the paper's figures and tables."""

import pathlib
import shutil

from sciad_bench.dae import run_dae
from sciad_bench.dde import run_dde
from sciad_bench.events import run_events
from sciad_bench.experiments import PLANS, run_experiment
from sciad_bench.large_stiff import run_large_stiff
from sciad_bench.losses import run_losses
from sciad_bench.sde import run_sde
from sciad_bench.selection import run_selection
from sciad_bench.suite import FAMILIES, MEMORY_FIGURE, PROBLEMS, class_figures, family_outputs, run_suite


def reproduce(*, results="results", paper="paper", repeats: int = 5, quick: bool = False) -> None:
    """Run the benchmarks, the selection validation and the suite into `results`/NAME, then copy
    each figure to `paper`/figures and each table (and the claims table) to `paper`/tables."""
    results, paper = pathlib.Path(results), pathlib.Path(paper)
    (paper / "figures").mkdir(parents=True, exist_ok=True)
    (paper / "tables").mkdir(parents=True, exist_ok=True)
    for name in PLANS:
        run_experiment(name, quick=quick, repeats=repeats, out=results / name)
        shutil.copy(results / name / f"{name}.png", paper / "figures" / f"{name}.png")
        shutil.copy(results / name / "table.md", paper / "tables" / f"{name}.md")
        shutil.copy(results / name / "records.json", paper / "tables" / f"{name}.json")
    shutil.copy(results / name / "claims.md", paper / "tables" / "claims.md")
    run_selection(quick=quick, out=results / "selection")
    shutil.copy(results / "selection" / "table.md", paper / "tables" / "selection.md")
    shutil.copy(results / "selection" / "selection.json", paper / "tables" / "selection.json")
    for name, run in (
        ("losses", run_losses),
        ("events", run_events),
        ("large-stiff", run_large_stiff),
        ("dae", run_dae),
        ("sde", run_sde),
        ("dde", run_dde),
    ):
        run(quick=quick, repeats=repeats, out=results / name)
        shutil.copy(results / name / f"{name}.png", paper / "figures" / f"{name}.png")
        shutil.copy(results / name / "table.md", paper / "tables" / f"{name}.md")
        shutil.copy(results / name / "records.json", paper / "tables" / f"{name}.json")
    suite = run_suite(quick=quick, repeats=repeats, out=results / "suite")
    for figure in (*class_figures(suite["records"]).values(), MEMORY_FIGURE):
        shutil.copy(results / "suite" / figure, paper / "figures" / figure)
    shutil.copy(results / "suite" / "table.md", paper / "tables" / "suite.md")
    shutil.copy(results / "suite" / "suite.json", paper / "tables" / "suite.json")
    for family in FAMILIES:
        if family != PROBLEMS:
            table, data, figure = family_outputs(family)
            shutil.copy(results / "suite" / figure, paper / "figures" / figure)
            for name in (table, data):
                shutil.copy(results / "suite" / name, paper / "tables" / name)
