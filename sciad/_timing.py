"""Timing alternatives against each other: compile and check each, then one loop of interleaved
rounds of the correct ones, and the fastest correct one, with the ties within noise.

    rows = compare([lambda: functools.partial(grad_a, p), lambda: functools.partial(grad_b, p)],
                   reference=lambda: functools.partial(grad_ref, p), tolerance=1e-4, rounds=10)
    best = fastest([{"name": n, **r} for n, r in zip("ab", rows)], prefer="b")  # "b" if it ties
"""

import functools
import math
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import jax
import numpy as np

from sciad._errors import summary

# Seconds of a warm call from which `compare` times a call in rounds of its own, after the faster ones:
# the Lotka–Volterra gradients of the JAX-traced engines take 1 to 15 ms, the host engines' and
# torchdiffeq's 0.5 to 7 s, and a JAX call right after a torch one is slowed ×10 (0.7 → 7 ms) while
# torch's threads spin.
SLOW_CALL = 0.1

Build = Callable[[], Callable[[], Any]]


def compare(
    candidates: Sequence[Build],
    reference: Build,
    *,
    tolerance: float,
    rounds: int,
    budget: float | None = None,
    deadline: float | None = None,
    slow_call: float | None = SLOW_CALL,
    baselines: Collection[int] = (),
    on_compile: Callable[[int], None] | None = None,
    on_round: Callable[[str, int], None] | None = None,
) -> list[dict]:
    """Compile each candidate, check its output against the reference's, then time the correct ones
    against each other: one dict per candidate, in their order.

    A candidate is a build: called with no arguments it returns the call to time (with no arguments,
    e.g. a `functools.partial` of a jitted gradient). `reference` is a build too, or one of
    `candidates` (the same object: compiled once, timed as a candidate); its first output is the
    right answer, computed with no timing of its own when it is not a candidate.

    Compilation: the first candidate, then the reference, then the others in their order; each
    build and first call timed together (`compile_s`; `on_compile(i)` before candidate i). With
    `deadline` (a `time.perf_counter()` value) a compilation that would start past it is skipped
    (`ok`: "not measured: budget"), the first's never; a candidate that raises is reported
    (`ok`: "failed: <error>"), the reference raises.

    Check: `rel_error`, the relative error in the max norm, `relative_error(output, reference)`;
    `ok` is whether it is at most `tolerance`. The candidates at `baselines` compute something
    else (the loss alone, for scale): `ok` when their output is finite. Without the reference
    (skipped past `deadline`) `ok` is "unchecked: budget" and they are timed all the same.

    Timing, of all but the wrong ones (`ok` False): one warm-up round, then the calls under
    `slow_call` seconds in interleaved rounds (`interleaved`), then the slower ones in rounds of
    their own (None: all together, no warm-up); each set `rounds` rounds at most, at least one,
    fewer past `budget` seconds of its rounds or past `deadline` (`on_round(tier, i)`: tier
    "fast" or "slow"). `times_s` (seconds per call; [] for those not timed), `median_s` and
    `spread`, the interquartile range over the median (None from one round).
    """
    rows: list[dict[str, Any]] = [{"times_s": []} for _ in candidates]
    calls, outs, ref = _compile(candidates, reference, rows, deadline, on_compile)
    for i, out in outs.items():
        if i in baselines:
            rows[i]["ok"] = all(bool(np.all(np.isfinite(np.asarray(x)))) for x in jax.tree.leaves(out))
        elif ref is None:
            rows[i]["ok"] = "unchecked: budget"
        else:
            rows[i]["rel_error"] = relative_error(out, ref)
            rows[i]["ok"] = rows[i]["rel_error"] <= tolerance
    runnable = [i for i in sorted(calls) if rows[i]["ok"] is not False]
    tiers = {"fast": runnable}
    if slow_call is not None:
        warm = interleaved([calls[i] for i in runnable], rounds=1)
        tiers = {
            "fast": [i for i, (t,) in zip(runnable, warm) if t < slow_call],
            "slow": [i for i, (t,) in zip(runnable, warm) if t >= slow_call],
        }
    for tier, members in tiers.items():
        if not members:
            continue
        limit = budget
        if deadline is not None:
            limit = min(math.inf if budget is None else budget, deadline - time.perf_counter())
        times = interleaved(
            [calls[i] for i in members],
            rounds=rounds,
            budget=limit,
            on_round=None if on_round is None else functools.partial(on_round, tier),
        )
        for i, t in zip(members, times):
            q25, _, q75 = quartiles(t)
            median = float(np.median(t))
            rows[i].update(times_s=t, median_s=median, spread=(q75 - q25) / median if len(t) > 1 else None)
    return rows


def _compile(
    candidates: Sequence[Build],
    reference: Build,
    rows: list[dict],
    deadline: float | None,
    on_compile: Callable[[int], None] | None,
) -> tuple[dict, dict, Any]:
    """`compare`'s compilations, in its order, with `compile_s` and the `ok` of those not compiled written
    into `rows`: (candidate index → call, candidate index → first output, the reference's output or None)."""
    if not candidates:
        return {}, {}, None
    at = next((i for i, build in enumerate(candidates) if build is reference), None)
    order = (
        [(0, candidates[0])]
        + ([] if at == 0 else [(at, reference)])
        + [(i, build) for i, build in enumerate(candidates) if i not in (0, at)]
    )
    calls, outs, ref = {}, {}, None
    for k, (i, build) in enumerate(order):
        if deadline is not None and k > 0 and time.perf_counter() > deadline:
            if i is not None:
                rows[i]["ok"] = "not measured: budget"
            continue
        if i is not None and on_compile is not None:
            on_compile(i)
        try:
            (call, out), compile_s = timed(lambda: _first_call(build))
        except Exception as e:  # a candidate that cannot run here is reported, not fatal (the reference is)
            if build is reference:
                raise
            said, kind = summary(e), type(e).__name__
            rows[i]["ok"] = f"failed: {said if said.startswith(kind) else f'{kind}: {said}'}"[:300]  # pyright: ignore[reportArgumentType, reportCallIssue]  # i: a candidate's (the reference raises)
            continue
        if build is reference:
            ref = out
        if i is not None:
            rows[i]["compile_s"] = compile_s
            calls[i], outs[i] = call, out
    return calls, outs, ref


def relative_error(out, reference) -> float:
    """The relative error of `out` in the max norm: the largest |out − reference| over the entries
    of all their array leaves, over the largest |reference| (the absolute error where the reference
    is all zero); inf where the leaves' number or shapes differ or `out` is not finite."""
    outs = [np.asarray(x, np.float64) for x in jax.tree.leaves(out)]
    refs = [np.asarray(x, np.float64) for x in jax.tree.leaves(reference)]
    if len(outs) != len(refs) or any(a.shape != b.shape for a, b in zip(outs, refs)):
        return math.inf
    if not all(np.all(np.isfinite(a)) for a in outs):
        return math.inf
    scale = max((float(np.max(np.abs(b), initial=0.0)) for b in refs), default=0.0) or 1.0
    return max((float(np.max(np.abs(a - b), initial=0.0)) for a, b in zip(outs, refs)), default=0.0) / scale


def _first_call(build: Build) -> tuple[Callable[[], Any], Any]:
    """(the call `build` returns, its first output)."""
    call = build()
    return call, call()


def interleaved(
    fns: Sequence[Callable[[], Any]],
    *,
    rounds: int,
    budget: float | None = None,
    on_round: Callable[[int], None] | None = None,
) -> list[list[float]]:
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
