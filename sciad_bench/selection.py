"""Validate sensealg selection (`sciad bench selection`): is the heuristic pick
within 1.5x, and the autotuned pick within 1.1x, of the best measured combination?
And does the heuristic hold out of sample?

For each case the plausible candidates (`sciad.select.candidates`) are timed
in interleaved rounds; the heuristic's pick (`sciad.select.heuristic`, what
`sensealg="auto"` chooses) and an independent autotuning trial's pick are
then looked up in that measurement.

Out of sample: the heuristic's thresholds are refitted (`calibrate`) on the
calibration cases only and its picks, with the committed and the fitted
thresholds, are scored against the measured best on three sets apart:

- paper: Lotka–Volterra and the spiral, from which the committed thresholds
  were read (in sample for them, out of sample for the refit);
- held out: the long-horizon neural ODE and the stiff Brusselator PDE, used to
  set no threshold, one explicit and one implicit regime;
- calibration: the rest (the Brusselator size sweep, the Oregonator, the gene
  circuit): between them each rule of the heuristic can fire (m ≤ n and m ≫ n,
  explicit and implicit, 5 to 50 save points).
"""

import dataclasses
import itertools
import json
import math
import pathlib
import sys

import sciad
from sciad import problems
from sciad.adjoints import describe
from sciad.select import THRESHOLDS, Features, Thresholds, candidates, heuristic, measure
from sciad.select import features as problem_features
from sciad.timing import fastest

PAPER_CASES = ("lotka-volterra", "spiral-node")
HELD_OUT = ("hamiltonian-node", "brusselator-pde")
# Threshold values the calibration tries (each holds the committed one).
GRID = {
    "forward_mode_parameters": (0, 2, 4, 8, 16, 32, 64, 128, 256),
    "dense_saves": (2, 3, 5, 10, 20, 50, 100),
    "parameters_per_state": (0.5, 1, 2, 4, 8, 16, 32, 64),
}
MISSING_RATIO = 10.0  # the score of a pick that was not measured or gave a wrong gradient


def cases(quick: bool):
    yield problems.lotka_volterra()
    yield problems.spiral_node(hidden=50)
    for n in (2, 4) if quick else (2, 4, 8, 16):
        yield problems.brusselator(n)
    yield problems.hamiltonian_node()
    if not quick:
        yield from (problems.oregonator(), problems.gene_circuit(), problems.brusselator_pde(6))


def subset(case: str) -> str:
    """ "paper", "held out" or "calibration" (see the module's docstring)."""
    if case in PAPER_CASES:
        return "paper"
    return "held out" if case.startswith(HELD_OUT) else "calibration"


def features(bench) -> Features:
    """`sciad.select.features` of a `Benchmark` with its solver, tolerances and max_steps."""
    return problem_features(
        bench.problem, bench.saveat, solver=bench.solver, rtol=bench.rtol, atol=bench.atol, max_steps=bench.max_steps
    )


def validate(bench, budget: float, tune_budget: float) -> dict:
    prob, kw = bench.problem, dict(solver=bench.solver, rtol=bench.rtol, atol=bench.atol, max_steps=bench.max_steps)
    feat = features(bench)
    rows = measure(prob, bench.saveat, bench.loss, candidates(feat), budget=budget, **kw)
    best = fastest(rows)
    by_name = {r["name"]: r for r in rows}
    pick = describe(heuristic(feat).sensealg)
    tuned = sciad.select_sensealg(prob, saveat=bench.saveat, loss=bench.loss, autotune=True, budget=tune_budget, **kw)
    tuned_pick = describe(tuned.sensealg)

    def ratio(name):
        row = by_name.get(name)
        return row["median_s"] / best["median_s"] if row and "median_s" in row else None  # pyright: ignore[reportOptionalSubscript]  # found where the ratio is

    return {
        "case": bench.name,
        "size": bench.size,
        "features": feat,
        "best": best["name"],  # pyright: ignore[reportOptionalSubscript]  # found where the ratio is
        "best_s": best["median_s"],  # pyright: ignore[reportOptionalSubscript]  # found where the ratio is
        "heuristic": pick,
        "heuristic_ratio": ratio(pick),
        "autotuned": tuned_pick,
        "autotuned_ratio": ratio(tuned_pick),
        "rows": rows,
    }


def case(name: str, feat: Features, rows) -> dict:
    """A calibration case: its `features` and the median time of each correct sensealg, by the
    name `describe` writes (`rows`: dicts with name, ok, median_s, as `sciad.select.measure` gives)."""
    return {
        "case": name,
        "features": feat,
        "times": {r["name"]: r["median_s"] for r in rows if r.get("ok") is True and r.get("median_s")},
    }


def cases_from_records(records, features_by_problem: dict) -> list[dict]:
    """Cases from benchmark records that carry `name` (the sensealg as `describe` writes it; None for
    peers and baselines), one per problem in `features_by_problem`."""
    return [
        case(problem, feat, [r for r in records if r["problem"] == problem and r.get("name")])
        for problem, feat in features_by_problem.items()
    ]


def pick_ratio(c: dict, thresholds: Thresholds) -> tuple[str, str, float | None]:
    """The heuristic's pick with `thresholds`, its rule, and its time / the fastest measured (None: not measured)."""
    pick = heuristic(c["features"], thresholds)
    name, times = describe(pick.sensealg), c["times"]
    return name, pick.rule, times[name] / min(times.values()) if name in times else None


def score(cs: list[dict], thresholds: Thresholds) -> float:
    """The geometric mean over `cs` of the pick's ratio to the fastest (`MISSING_RATIO` where not measured)."""
    ratios = [pick_ratio(c, thresholds)[2] or MISSING_RATIO for c in cs]
    return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")


def calibrate(cs: list[dict], grid: dict = GRID) -> Thresholds:
    """The thresholds in `grid` with the least `score` on `cs`; of equal scores, the nearest the
    committed `THRESHOLDS` (in grid steps), so values the cases cannot tell apart stay as they are."""
    if not cs:
        raise ValueError("calibrate needs at least one case with measured times")
    committed = dataclasses.asdict(THRESHOLDS)

    def distance(values):
        return sum(abs(grid[k].index(v) - grid[k].index(committed[k])) for k, v in values.items())

    options = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    best = min(options, key=lambda values: (score(cs, Thresholds(**values)), distance(values)))
    return Thresholds(**best)


def out_of_sample(cs: list[dict]) -> dict:
    """Refit on the calibration cases; per set, each case's pick and ratio with the committed and the
    fitted thresholds, and their geometric means."""
    calibration = [c for c in cs if subset(c["case"]) == "calibration" and c["times"]]
    fitted = calibrate(calibration) if calibration else THRESHOLDS
    sets = {}
    for name in ("calibration", "held out", "paper"):
        members = [c for c in cs if subset(c["case"]) == name and c["times"]]
        rows = []
        for c in members:
            best = min(c["times"], key=c["times"].get)
            rows.append(
                {
                    "case": c["case"],
                    "best": best,
                    **{
                        f"{label} {k}": v
                        for label, t in (("committed", THRESHOLDS), ("fitted", fitted))
                        for k, v in zip(("pick", "rule", "ratio"), pick_ratio(c, t))
                    },
                }
            )
        sets[name] = {"rows": rows, "committed": score(members, THRESHOLDS), "fitted": score(members, fitted)}
    return {"committed": dataclasses.asdict(THRESHOLDS), "fitted": dataclasses.asdict(fitted), "sets": sets}


def out_of_sample_table(result: dict) -> str:
    lines = [
        "| set | case | best (measured) | committed pick (rule) | ratio | fitted pick (rule) | ratio |",
        "|---|---|---|---|---:|---|---:|",
    ]

    def fmt(x):
        return "–" if x is None else f"{x:.2f}"

    for name, s in result["sets"].items():
        for r in s["rows"]:
            lines.append(
                f"| {name} | {r['case']} | {r['best']} | {r['committed pick']} ({r['committed rule']}) | "
                f"{fmt(r['committed ratio'])} | {r['fitted pick']} ({r['fitted rule']}) | "
                f"{fmt(r['fitted ratio'])} |"
            )
    summary = [
        f"- {name}: geometric-mean ratio to the measured best {s['committed']:.2f} (committed), "
        f"{s['fitted']:.2f} (fitted) over {len(s['rows'])} case{'' if len(s['rows']) == 1 else 's'}"
        for name, s in result["sets"].items()
    ]
    return (
        "\n".join(lines) + "\n\n" + "\n".join(summary) + f"\n\nThresholds committed {result['committed']}; "
        f"fitted on the calibration set {result['fitted']} (a pick not measured scores {MISSING_RATIO:g}).\n"
    )


def table(results: list[dict]) -> str:
    lines = [
        "| case | states+params | best (measured) | best median (s) | heuristic pick | ratio | "
        "autotuned pick | ratio | targets (≤1.5, ≤1.1) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        h, a = r["heuristic_ratio"], r["autotuned_ratio"]
        hit = "yes" if (h is not None and h <= 1.5 and a is not None and a <= 1.1) else "**miss**"
        lines.append(
            f"| {r['case']} | {r['size']} | {r['best']} | {r['best_s']:.3g} | {r['heuristic']} | "
            f"{'–' if h is None else f'{h:.2f}'} | {r['autotuned']} | "
            f"{'–' if a is None else f'{a:.2f}'} | {hit} |"
        )
    return "\n".join(lines) + "\n"


def run_selection(*, quick: bool = False, out=None) -> list[dict]:
    """Validate every case and the heuristic out of sample; write selection.json and table.md to
    `out` (default results/selection)."""
    out = pathlib.Path(out or "results/selection")
    out.mkdir(parents=True, exist_ok=True)
    # tune_budget bounds the whole autotuned call, its compilations included (3–12 s each here)
    budget, tune_budget = (2.0, 60.0) if quick else (10.0, 300.0)
    results = []
    all_cases = list(cases(quick))
    for i, bench in enumerate(all_cases, 1):
        print(f"[{i}/{len(all_cases)}] {bench.name} (states+params {bench.size})", file=sys.stderr, flush=True)
        results.append(validate(bench, budget, tune_budget))
    held = out_of_sample([case(r["case"], r["features"], r["rows"]) for r in results])
    records = [{**r, "features": dataclasses.asdict(r["features"])} for r in results]
    (out / "selection.json").write_text(json.dumps({"cases": records, "out of sample": held}, indent=1, default=str))
    md = (
        f"# selection{' (quick)' if quick else ''}: picks against the measured best\n\n"
        + table(results)
        + "\n## Out of sample\n\n"
        + out_of_sample_table(held)
    )
    (out / "table.md").write_text(md)
    print(md)
    return results
