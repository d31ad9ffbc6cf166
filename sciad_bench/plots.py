"""Figures: violin plots of per-repeat times on a log axis (the paper's Figures 2 and 3),
and median time against problem size for the sweeps."""

import math
from collections.abc import Collection

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import mlab, ticker  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from sciad_bench.tables import best, is_auto_pick, ordered  # noqa: E402

COLORS = {"sciad": "tab:blue", "peer": "tab:orange", "baseline": "tab:gray"}
KINDS = {"sciad": "sciad", "peer": "peer", "baseline": "forward solve (no gradient)"}  # the legend's labels
WHISKERS = (5, 95)  # the percentiles of a combination's per-repeat times its violin and whiskers span
AUTO_EDGE = "black"  # the outline of auto's pick
FAILED = "tab:red"


def violin_plot(records, path, title: str):
    """One panel per problem, one horizontal violin per combination in the table's order (fastest on
    top), times on a log axis, saved to `path`; returns the (closed) figure.

    Each violin and its whiskers span the `WHISKERS` percentiles of the per-repeat times (the times
    themselves stay in records.json), its bar the median, labelled with the median and the count n.
    Colours by kind (sciad, peer, forward solve); auto's pick (`tables.is_auto_pick`) outlined and
    labelled, the fastest correct sciad combination (the table's bold row) labelled in bold; those
    whose gradient failed the check, or that raised, are listed last in red, untimed. The legend and
    the axis label say so."""
    problems = {}
    for r in records:
        problems.setdefault(r["problem"], []).append(r)
    heights = [len(group) for group in problems.values()]
    fig, axes = plt.subplots(
        len(problems),
        1,
        figsize=(10, 2.6 + 0.34 * sum(heights) + 0.6 * (len(problems) - 1)),
        height_ratios=heights,
        squeeze=False,
        layout="constrained",
    )
    for ax, (problem, group) in zip(axes[:, 0], problems.items()):
        _violins(ax, ordered(group))
        ax.set_title(title if len(problems) == 1 else f"{title}: {problem}")
    handles = [
        Patch(color=COLORS[k], alpha=0.6, label=label)
        for k, label in KINDS.items()
        if any(r["kind"] == k and r["ok"] for r in records)
    ]
    if any(is_auto_pick(r) for r in records):
        handles.append(
            Patch(facecolor="white", edgecolor=AUTO_EDGE, linewidth=2, label='auto\'s pick (what sensealg="auto" runs)')
        )
    fig.legend(handles=handles, loc="outside upper center", ncol=len(handles), fontsize=8, frameon=False)
    low, high = WHISKERS
    axes[-1, 0].set_xlabel("time per gradient (log scale)")
    fig.supxlabel(
        f"Violin and whiskers: {low}th–{high}th percentile of the n timed repeats (every time is in "
        "records.json); bar: median.\nBold: the fastest sciad combination whose gradient passed the "
        "check. ✗ in red: failed the check or raised, not timed.",
        fontsize=8,
    )
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


def _density(x, coords):
    return mlab.GaussianKDE(x, "scott").evaluate(coords)


def violin_stats(times) -> dict:
    """A violin of `times` for a log axis: `min` and `max` (its ends and whiskers) the `WHISKERS`
    percentiles, `median`, the density of log10(times) at `coords` between them (`vals`; None
    when the times are all alike)."""
    times = np.asarray(times, float)
    low, high = np.percentile(times, WHISKERS)
    stats = {
        "min": low,
        "max": high,
        "median": float(np.median(times)),
        "mean": float(np.mean(times)),
        "coords": np.geomspace(low, high, 100),
        "vals": None,
    }
    if times.size >= 2 and high > low:
        stats["vals"] = _density(np.log10(times), np.log10(stats["coords"]))
    return stats


def _violins(ax, records) -> None:
    """Row i for records[i], from the top; the density of each estimated on log10 of its times."""
    winner = best(records, kind="sciad")
    ends = []
    for i, r in enumerate(records):
        times = np.asarray(r["times"])
        if not r["ok"]:
            error = r["error"] or "not finite"
            why = (
                f"failed the gradient check ({error.removeprefix('gradient off: ')})"
                if error.startswith("gradient off")
                else f"raised {error if len(error) <= 60 else error[:59] + '…'}"
            )
            ax.text(
                0.01,
                i,
                f"✗ {why}: not timed",
                transform=ax.get_yaxis_transform(),
                color=FAILED,
                fontsize=8,
                va="center",
            )
            continue
        if not times.size:
            continue
        stats = violin_stats(times)
        color = COLORS[r["kind"]]
        if stats["vals"] is not None:
            parts = ax.violin([stats], positions=[i], orientation="horizontal", widths=0.8, showmedians=True)
            for body in parts["bodies"]:
                body.set_facecolor(color)
                body.set_alpha(0.6)
                if is_auto_pick(r):
                    body.set_edgecolor(AUTO_EDGE)
                    body.set_linewidth(2)
            for name in ("cmedians", "cmins", "cmaxes", "cbars"):
                parts[name].set_color(color)
        else:
            ax.plot(
                [stats["median"]],
                [i],
                "o",
                color=color,
                markeredgecolor=AUTO_EDGE if is_auto_pick(r) else color,
                markeredgewidth=2,
            )
        ax.text(
            stats["max"] * 1.1, i, f"{_seconds(stats['median'])}  n={times.size}", fontsize=7, va="center", color="0.25"
        )
        ends.append((stats["min"], stats["max"]))
    ax.set_yticks(range(len(records)))
    ax.set_yticklabels([_row_label(r, r is winner) for r in records], fontsize=8)
    for tick, r in zip(ax.get_yticklabels(), records):
        tick.set_fontweight("bold" if r is winner else "normal")
        tick.set_color("black" if r["ok"] else FAILED)
    ax.set_ylim(len(records) - 0.5, -0.5)
    ax.set_xscale("log")
    if ends:  # room on the right for the labels, none for the times beyond the whiskers
        low, high = min(lo for lo, _ in ends), max(hi for _, hi in ends)
        span = max(high / low, 10.0)
        ax.set_xlim(low / span**0.04, high * span**0.2)
    low, high = ax.get_xlim()
    ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5) if math.log10(high / low) <= 3 else (1,)))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(_seconds))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.grid(axis="x", alpha=0.3)


def _row_label(record, fastest: bool) -> str:
    marks = (["auto's pick"] if is_auto_pick(record) else []) + (["fastest sciad"] if fastest else [])
    return record["label"] + (f"  ({', '.join(marks)})" if marks else "") + ("" if record["ok"] else "  ✗")


def _seconds(x: float, _pos=None) -> str:
    """A time axis' tick label: 0.002 → "2 ms", 5.0 → "5 s"."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if x >= scale * (1 - 1e-9):
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} s"


def size_plot(records, path, title: str, *, xlabel="states + parameters") -> None:
    """Median time against problem size per combination (and device), log–log; correct results only."""
    lines = {}
    for r in records:
        m = r["median_s"]
        if r["ok"] and m is not None:
            key = r["label"] + (f" [{r['device']}]" if len({x["device"] for x in records}) > 1 else "")
            lines.setdefault(key, []).append((r["size"], m, r["kind"] == "baseline"))
    _log_log(lines, path, title, xlabel, "median time per gradient (s)")


def memory_plot(sweep, path, title: str) -> None:
    """Peak memory (MiB) against the horizon per combination, log–log (rows of the suite's memory sweep)."""
    lines = {}
    for r in sweep:
        if r["peak_bytes"]:
            lines.setdefault(r["label"], []).append((r["horizon"], r["peak_bytes"] / 2**20, False))
    _log_log(lines, path, title, "horizon T", "peak memory (MiB)")


def _log_log(lines: dict, path, title: str, xlabel: str, ylabel: str) -> None:
    """One line per key of `lines` (lists of (x, y, dashed)), log–log, saved to `path`."""
    panels_log_log({title: lines}, path, None, xlabel, ylabel)


def panels_log_log(panels: dict, path, title: str | None, xlabel: str, ylabel: str) -> None:
    """Side by side, one log–log panel per key of `panels` (its title), one line per key of its `lines`
    (lists of (x, y) or (x, y, dashed)), saved to `path`."""
    fig, axes = plt.subplots(1, len(panels), figsize=(9 * len(panels) ** 0.8, 6), squeeze=False)
    for ax, (name, lines) in zip(axes[0], panels.items()):
        for key, points in sorted(lines.items()):
            points = sorted((*pt, False)[:3] for pt in points)
            ax.plot(
                [x for x, _, _ in points],
                [y for _, y, _ in points],
                "--" if points[0][2] else "-",
                marker="o",
                label=key,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(name)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bar_panels(
    panels: dict,
    path,
    title: str,
    xlabels: dict,
    *,
    log: bool | Collection[str] = False,
    reference: float | None = None,
):
    """Side by side, one panel of horizontal bars per key of `panels` (its title): a bar per
    (label, {segment: value}) row, from the top, its segments stacked in order, one colour per segment
    name (a kind of `COLORS`, else the next of matplotlib's cycle not among those), in a legend when there are several;
    `xlabels[title]` under each panel; `log`: log x axes (all, or the panels named);
    `reference`: a dashed line at that x."""
    rows = max(len(r) for r in panels.values())
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5 + 4 * len(panels), 1.5 + 0.28 * rows), squeeze=False, layout="constrained"
    )
    names = list(dict.fromkeys(name for r in panels.values() for _, segments in r for name in segments))
    taken = {to_hex(c) for c in COLORS.values()}  # the kinds' colours: a segment name gets another
    cycle = iter(c for c in plt.rcParams["axes.prop_cycle"].by_key()["color"] if to_hex(c) not in taken)
    colors = {name: COLORS.get(name) or next(cycle) for name in names}
    first = next(iter(panels.values()))  # a panel with its rows' labels: the next ones show them only if they differ
    for ax, (panel, panel_rows) in zip(axes[0], panels.items()):
        for i, (_, segments) in enumerate(panel_rows):
            left = 0.0
            for name, value in segments.items():
                if value is not None:
                    ax.barh(i, value, left=left or None, color=colors[name], alpha=0.75)
                    left += value
        labels = [label for label, _ in panel_rows]
        ax.set_yticks(range(len(panel_rows)))
        ax.set_yticklabels(labels if ax is axes[0, 0] or labels != [lb for lb, _ in first] else [], fontsize=7)
        ax.set_ylim(len(panel_rows) - 0.5, -0.5)
        if log is True or (log and panel in log):
            ax.set_xscale("log")
        if reference is not None:
            ax.axvline(reference, color="0.3", linestyle="--", linewidth=1)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel(xlabels[panel], fontsize=8)
        ax.grid(axis="x", alpha=0.3, which="both")
    if len(names) > 1:
        fig.legend(
            handles=[Patch(color=colors[n], alpha=0.75, label=KINDS.get(n, n)) for n in names],
            loc="outside lower center",
            ncol=len(names),
            fontsize=8,
            frameon=False,
        )
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)
