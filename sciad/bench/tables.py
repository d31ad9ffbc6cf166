"""Markdown tables of benchmark records: median time and its ratios to the forward solve and the best peer."""

import numpy as np

from sciad.bench.harness import FORWARD_SOLVE


def median(record) -> float | None:
    return float(np.median(record["times"])) if record["times"] else None


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
    """Each record with `median`, `vs_forward` (median / forward-solve median) and
    `vs_best_peer` (median / fastest correct peer's median), per problem and device."""
    rows = []
    for group in _group(records).values():
        base = [median(r) for r in group if r["sensealg"] == FORWARD_SOLVE and r["ok"] and r["times"]]
        peer = [median(r) for r in group if r["is_peer"] and r["ok"] and r["times"]]
        for r in group:
            m = median(r)
            rows.append({**r, "median": m,
                         "vs_forward": m / base[0] if m and base else None,
                         "vs_best_peer": m / min(peer) if m and peer else None})
    return rows


def best(records, *, kind: str) -> dict | None:
    """The fastest correct record of `kind` ("sciad", "peer")."""
    ok = [r for r in with_ratios(records) if r["kind"] == kind and r["ok"] and r["median"]]
    return min(ok, key=lambda r: r["median"]) if ok else None


def _fmt(x, spec):
    return "–" if x is None else format(x, spec)


def markdown_table(records, skipped=()) -> str:
    """One row per record, sorted by problem, device and median time; the fastest correct
    sciad combination per problem in bold; skipped combinations listed below."""
    lines = ["| problem | combination | device | median (ms) | × forward solve | × best peer | compile (s) | rel. error | status |",
             "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for (problem, device), group in _group(with_ratios(records)).items():
        winner = best(group, kind="sciad")
        for r in sorted(group, key=lambda r: (r["median"] is None, r["median"] or 0.0)):
            label = r["label"] + (" (peer)" if r["is_peer"] else "")
            if winner is not None and r is not None and r["label"] == winner["label"] and r["kind"] == "sciad":
                label = f"**{label}**"
            lines.append(
                f"| {problem} | {label} | {device} | {_fmt(r['median'] and 1e3 * r['median'], '.3g')} | "
                f"{_fmt(r['vs_forward'], '.3g')} | {_fmt(r['vs_best_peer'], '.3g')} | "
                f"{_fmt(r['compile_time'], '.2f')} | {_fmt(r['rel_error'], '.1e')} | {status(r).replace('|', '/')} |")
    if skipped:
        lines += ["", "Skipped: " + "; ".join(skipped) + "."]
    return "\n".join(lines) + "\n"
