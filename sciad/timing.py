"""Timing alternatives against each other: one loop of interleaved rounds, and the fastest correct one.

    times = interleaved([lambda: grad_a(p), lambda: grad_b(p)], rounds=10)
    rows = [{"name": "a", "ok": True, "median_s": np.median(times[0])}, ...]
    best = fastest(rows)
"""

import time
from typing import Any, Callable, Sequence

import jax


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


def fastest(rows: Sequence[dict]) -> dict | None:
    """The row with the least `median_s` among those with `ok is True` (a checked result) and a
    `median_s`; None if there is none."""
    correct = [r for r in rows if r.get("ok") is True and r.get("median_s") is not None]
    return min(correct, key=lambda r: r["median_s"]) if correct else None
