"""Timing alternatives against each other: one loop of interleaved rounds, and the fastest correct
one, with the ties within noise.

    times = interleaved([lambda: grad_a(p), lambda: grad_b(p)], rounds=10)
    rows = [{"name": "a", "ok": True, "median_s": np.median(times[0]), "times_s": times[0]}, ...]
    best = fastest(rows, prefer="b")  # "b" if it ties with the fastest
"""

import time
from typing import Any, Callable, Sequence

import jax
import numpy as np


def interleaved(fns: Sequence[Callable[[], Any]], *, rounds: int, budget: float | None = None,
                on_round: Callable[[int], None] | None = None) -> list[list[float]]:
    """Seconds per call of each of `fns` (called with no arguments and waited on), len(fns) lists.

    Each round calls every fn once in turn, so drifts in machine load hit all
    alike. Runs `rounds` rounds, or, with `budget`, stops after the first
    round that ends past `budget` seconds. `on_round(i)` is called before round i.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    times = [[] for _ in fns]
    deadline = None if budget is None else time.perf_counter() + budget
    for i in range(rounds):
        if on_round is not None:
            on_round(i)
        for fn, out in zip(fns, times):
            out.append(timed(fn)[1])
        if deadline is not None and time.perf_counter() > deadline:
            break
    return times


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """fn() waited on, and the seconds it took (the first call: trace, compile and run)."""
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - start


def quartiles(times: Sequence[float]) -> tuple[float, float, float]:
    """The lower quartile, median and upper quartile of `times` (at least one)."""
    q25, q50, q75 = np.percentile(times, [25, 50, 75])
    return float(q25), float(q50), float(q75)


def ties(rows: Sequence[dict]) -> list[dict]:
    """The correct rows (`ok is True`, with a `median_s`) that tie with the fastest, the fastest first:
    a row ties when its lower quartile is at most the fastest's upper quartile (their interquartile
    ranges overlap), a difference within noise. Quartiles are of `times_s`; a row without them counts
    as its `median_s` alone. [] if no row is correct."""
    correct = [r for r in rows if r.get("ok") is True and r.get("median_s") is not None]
    if not correct:
        return []

    def quartiles_of(r):
        return quartiles(r["times_s"]) if r.get("times_s") else (r["median_s"],) * 3

    best = min(correct, key=lambda r: r["median_s"])
    top = quartiles_of(best)[2]
    return [best] + [r for r in correct if r is not best and quartiles_of(r)[0] <= top]


def fastest(rows: Sequence[dict], prefer: str | None = None) -> dict | None:
    """The row with the least `median_s` among those with `ok is True` (a checked result) and a
    `median_s`, or the row named `prefer` when it `ties` with that one; None if no row is correct."""
    tied = ties(rows)
    return next((r for r in tied if prefer is not None and r.get("name") == prefer), tied[0] if tied else None)
