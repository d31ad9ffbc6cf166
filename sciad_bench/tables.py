"""Markdown tables of benchmark records: median time and its ratios to the forward solve and the best peer."""

import json
import pathlib
from collections.abc import Callable

from sciad.timing import fastest
from sciad_bench.harness import FORWARD_SOLVE


def _group(records):
    groups = {}
    for r in records:
        groups.setdefault((r["problem"], r["device"]), []).append(r)
    return groups


def status(record) -> str:
    if record["ok"]:
        return "ok"
    if record["error"] and record["error"].startswith("gradient off"):
        return "WRONG gradient"
    return f"failed ({record['error']})"


def with_ratios(records) -> list[dict]:
    """Each record with `vs_forward` (median / forward-solve median) and `vs_best_peer`
    (median / fastest correct peer's median), per problem and device."""
    rows = []
    for group in _group(records).values():
        base = fastest([r for r in group if r["sensealg"] == FORWARD_SOLVE])
        peer = fastest([r for r in group if r["is_peer"]])
        for r in group:
            m = r["median_s"]
            rows.append(
                {
                    **r,
                    "vs_forward": m / base["median_s"] if m and base else None,
                    "vs_best_peer": m / peer["median_s"] if m and peer else None,
                }
            )
    return rows


def best(records, *, kind: str) -> dict | None:
    """The fastest correct record of `kind` ("sciad", "peer")."""
    return fastest([r for r in records if r["kind"] == kind])


def is_auto_pick(record) -> bool:
    """Whether `record` is the combination `sensealg="auto"` runs on its problem (its `auto_pick`, the
    label `sciad_bench.harness.auto_pick` gives; records without one mark none)."""
    return record["kind"] == "sciad" and record["label"] == record.get("auto_pick")


def ordered(records) -> list[dict]:
    """`records` by median time, fastest first, those without one (wrong or failed) last."""
    return sorted(records, key=lambda r: (r["median_s"] is None, r["median_s"] or 0.0))


def _fmt(x, spec):
    return "–" if x is None else format(x, spec)


def markdown_table(records, skipped=()) -> str:
    """One row per record, sorted by problem, device and median time; the fastest correct sciad
    combination per problem in bold and auto's pick (`is_auto_pick`) marked, as a sentence under the
    table says; skipped combinations listed below."""
    lines = [
        "| problem | combination | device | median (ms) | × forward solve | × best peer | compile (s) | rel. error "
        "| status |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    picks = {}
    for (problem, device), group in _group(with_ratios(records)).items():
        winner = best(group, kind="sciad")
        for r in group:
            if r.get("auto_pick"):
                picks[problem] = r["auto_pick"]
        for r in ordered(group):
            label = r["label"] + (" (peer)" if r["is_peer"] else "")
            if winner is not None and r["label"] == winner["label"] and r["kind"] == "sciad":
                label = f"**{label}**"
            if is_auto_pick(r):
                label += " ← auto's pick"
            lines.append(
                f"| {problem} | {label} | {device} | {_fmt(r['median_s'] and 1e3 * r['median_s'], '.3g')} | "
                f"{_fmt(r['vs_forward'], '.3g')} | {_fmt(r['vs_best_peer'], '.3g')} | "
                f"{_fmt(r['compile_time'], '.2f')} | {_fmt(r['rel_error'], '.1e')} | {status(r).replace('|', '/')} |"
            )
    lines += [
        "",
        "**Bold**: the fastest sciad combination whose gradient passed the check (relative error to a "
        "float64 reference, `DiscreteAdjoint` at rtol = atol = 1e-10, within the check's tolerance; peers "
        "and the forward solve do not compete). Median: of the timed repeats (all of them in records.json); "
        "a WRONG or failed combination is not timed.",
    ]
    if picks:
        timed = {r["problem"] for r in records if is_auto_pick(r)}
        lines += [
            "",
            '← auto\'s pick: what `sensealg="auto"` runs on the problem (`sciad.select_sensealg`)'
            + "".join(
                f"; on {problem} {pick} is not among the combinations timed"
                for problem, pick in picks.items()
                if problem not in timed
            )
            + ".",
        ]
    if skipped:
        lines += ["", "Skipped: " + "; ".join(skipped) + "."]
    return "\n".join(lines) + "\n"


def seconds(x) -> str:
    """A time in seconds to three significant figures, "–" where there is none."""
    return "–" if x is None else f"{x:.3g}"


def write_result(result: dict, out, name: str, figure: Callable, markdown: Callable) -> str:
    """records.json, NAME.png (`figure(result, path)`) and table.md (`markdown(result)`) of a benchmark's `result`
    in the folder `out`; the table."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "records.json").write_text(json.dumps(result, indent=1, default=float))
    figure(result, out / f"{name}.png")
    table = markdown(result)
    (out / "table.md").write_text(table)
    return table
