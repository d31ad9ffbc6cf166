"""Validate sensealg selection (`sciad bench selection`): is the heuristic pick
within 1.5x, and the autotuned pick within 1.1x, of the best measured combination?

For each case the plausible candidates (`sciad.select.candidates`) are timed
in interleaved rounds; the heuristic's pick (`sciad.auto`, what
`sensealg="auto"` chooses) and an independent autotuning trial's pick are
then looked up in that measurement.
"""

import json
import pathlib
import sys

import sciad
from sciad import problems
from sciad.adjoints import describe
from sciad.auto import heuristic
from sciad.select import candidates, features, measure
from sciad.timing import fastest


def cases(quick: bool):
    yield problems.lotka_volterra()
    yield problems.spiral_node(hidden=50)
    for n in (2, 4) if quick else (2, 4, 8, 16):
        yield problems.brusselator(n)


def validate(bench, budget: float, tune_budget: float) -> dict:
    prob, kw = bench.problem, dict(solver=bench.solver, rtol=bench.rtol, atol=bench.atol, max_steps=bench.max_steps)
    feat = features(prob, bench.saveat, **kw)
    rows = measure(prob, bench.saveat, bench.loss, candidates(feat), budget=budget, **kw)
    best = fastest(rows)
    by_name = {r["name"]: r for r in rows}
    pick = describe(heuristic(feat)[0])
    tuned = sciad.select_sensealg(prob, saveat=bench.saveat, loss=bench.loss, autotune=True,
                                  budget=tune_budget, **kw)
    tuned_pick = describe(tuned.sensealg)

    def ratio(name):
        row = by_name.get(name)
        return row["median_s"] / best["median_s"] if row and "median_s" in row else None

    return {"case": bench.name, "size": bench.size, "features": feat, "best": best["name"],
            "best_s": best["median_s"], "heuristic": pick, "heuristic_ratio": ratio(pick),
            "autotuned": tuned_pick, "autotuned_ratio": ratio(tuned_pick), "rows": rows}


def table(results: list[dict]) -> str:
    lines = ["| case | states+params | best (measured) | best median (s) | heuristic pick | ratio | "
             "autotuned pick | ratio | targets (≤1.5, ≤1.1) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        h, a = r["heuristic_ratio"], r["autotuned_ratio"]
        hit = "yes" if (h is not None and h <= 1.5 and a is not None and a <= 1.1) else "**miss**"
        lines.append(f"| {r['case']} | {r['size']} | {r['best']} | {r['best_s']:.3g} | {r['heuristic']} | "
                     f"{'–' if h is None else f'{h:.2f}'} | {r['autotuned']} | "
                     f"{'–' if a is None else f'{a:.2f}'} | {hit} |")
    return "\n".join(lines) + "\n"


def run_selection(*, quick: bool = False, out=None) -> list[dict]:
    """Validate every case; write selection.json and table.md to `out` (default results/selection)."""
    out = pathlib.Path(out or "results/selection")
    out.mkdir(parents=True, exist_ok=True)
    budget, tune_budget = (2.0, 1.0) if quick else (10.0, 3.0)
    results = []
    all_cases = list(cases(quick))
    for i, bench in enumerate(all_cases, 1):
        print(f"[{i}/{len(all_cases)}] {bench.name} (states+params {bench.size})", file=sys.stderr, flush=True)
        results.append(validate(bench, budget, tune_budget))
    (out / "selection.json").write_text(json.dumps(results, indent=1, default=str))
    md = f"# selection{' (quick)' if quick else ''}: picks against the measured best\n\n" + table(results)
    (out / "table.md").write_text(md)
    print(md)
    return results
