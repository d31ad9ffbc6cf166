"""Figures: violin plots of per-repeat times on a log axis (the paper's Figures 2 and 3),
and median time against problem size for the sweeps."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

COLORS = {"sciad": "tab:blue", "peer": "tab:orange", "baseline": "tab:gray"}


def violin_plot(records, path, title: str) -> None:
    """One panel per problem, one horizontal violin per combination (times in seconds, log axis),
    sciad in blue, peers in orange, the forward solve in gray; wrong or failed combinations listed without data."""
    order = {"baseline": 0, "sciad": 1, "peer": 2}
    problems = {}
    for r in sorted(records, key=lambda r: (order[r["kind"]], r["label"])):
        problems.setdefault(r["problem"], []).append(r)
    heights = [len(group) for group in problems.values()]
    fig, axes = plt.subplots(len(problems), 1, figsize=(9, 1.0 + 0.32 * sum(heights) + 0.6 * (len(problems) - 1)),
                             height_ratios=heights, squeeze=False)
    for ax, (problem, group) in zip(axes[:, 0], problems.items()):
        _violins(ax, group)
        ax.set_title(title if len(problems) == 1 else f"{title}: {problem}")
    axes[-1, 0].set_xlabel("time per gradient (s, log scale)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _violins(ax, records) -> None:
    for i, r in enumerate(records):
        times = np.asarray(r["times"])
        if r["ok"] and times.size >= 2 and np.ptp(times) > 0:
            parts = ax.violinplot(np.log10(times), positions=[i], orientation="horizontal", showmedians=True, widths=0.8)
            for body in parts["bodies"]:
                body.set_facecolor(COLORS[r["kind"]])
                body.set_alpha(0.6)
            for name in ("cmedians", "cmins", "cmaxes", "cbars"):
                parts[name].set_color(COLORS[r["kind"]])
        elif r["ok"] and times.size:
            ax.plot(np.log10(times), [i] * times.size, "o", color=COLORS[r["kind"]])
    ax.set_yticks(range(len(records)))
    ax.set_yticklabels([r["label"] + ("" if r["ok"] else "  ✗ " + ("wrong gradient" if r["error"] and r["error"].startswith("gradient off") else "failed"))
                        for r in records], fontsize=8)
    ticks = ax.get_xticks()
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"$10^{{{t:g}}}$" for t in ticks])
    ax.grid(axis="x", alpha=0.3)


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
    fig, ax = plt.subplots(figsize=(9, 6))
    for key, points in sorted(lines.items()):
        points.sort()
        ax.plot([x for x, _, _ in points], [y for _, y, _ in points], "--" if points[0][2] else "-", marker="o",
                label=key)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
