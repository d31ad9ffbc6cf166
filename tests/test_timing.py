"""sciad.timing.compare: compile, check against the reference (relative error in the max norm), then
time the correct ones (fast and slow tiers, budget and deadline); plain Python calls stand for
compiled gradients."""

import math
import time

import numpy as np
import pytest

from sciad._timing import compare, relative_error

RIGHT = np.array([1.0, -2.0, 4.0])


def candidate(log, name, out=RIGHT, seconds=0.0, build_seconds=0.0):
    """A build whose build and calls are logged in `log` ("build a", "a") and take the seconds given."""

    def build():
        log.append(f"build {name}")
        time.sleep(build_seconds)

        def call():
            log.append(name)
            time.sleep(seconds)
            return out

        return call

    return build


def test_relative_error_is_in_the_max_norm():
    assert relative_error(RIGHT, RIGHT) == 0.0
    assert relative_error(RIGHT + [0.0, 0.0, 0.4], RIGHT) == pytest.approx(0.1)  # 0.4 / max |ref| = 4
    assert relative_error({"a": RIGHT, "b": np.ones(2)}, {"a": RIGHT, "b": np.zeros(2)}) == 0.25  # over all leaves
    assert relative_error(np.array([0.0, 1e-3]), np.zeros(2)) == 1e-3  # absolute where the reference is zero
    assert relative_error(np.array([np.nan, 0.0, 0.0]), RIGHT) == math.inf
    assert relative_error(RIGHT[:2], RIGHT) == math.inf and relative_error([RIGHT, RIGHT], RIGHT) == math.inf


def test_a_wrong_candidate_is_reported_and_not_timed():
    log = []
    reference = candidate(log, "ref")
    builds = [
        candidate(log, "right"),
        candidate(log, "wrong", out=RIGHT * 1.01),
        candidate(log, "close", RIGHT * 1.0001),
        candidate(log, "nan", out=RIGHT * np.nan),
        candidate(log, "loss", out=np.float64(3.0)),
    ]

    def failing():
        raise ValueError("no engine here\nValueError: cannot run")

    rows = compare([*builds, failing], reference, tolerance=1e-3, rounds=3, baselines=[4])
    right, wrong, close, nan, loss, failed = rows
    assert right["ok"] is True and right["rel_error"] == 0.0 and close["ok"] is True
    assert wrong["ok"] is False and wrong["rel_error"] == pytest.approx(0.01) and nan["ok"] is False
    assert loss["ok"] is True and "rel_error" not in loss  # a baseline: finite is all it is checked for
    assert failed["ok"] == "failed: ValueError: cannot run" and "compile_s" not in failed
    assert [len(r["times_s"]) for r in rows] == [3, 0, 3, 0, 3, 0]
    assert "median_s" not in wrong and "median_s" not in failed and right["compile_s"] > 0
    # first calls: the first candidate, the reference, the rest; then a warm-up and 3 rounds of the correct
    assert log[:4] == ["build right", "right", "build ref", "ref"] and log.count("ref") == 1
    assert log.count("wrong") == 1 and log.count("right") == 1 + 1 + 3
    with pytest.raises(ValueError, match="no engine"):
        compare(builds, failing, tolerance=1e-3, rounds=1)


def test_a_candidate_that_is_the_reference_is_compiled_once_second():
    log = []
    builds = [candidate(log, "a"), candidate(log, "b"), candidate(log, "ref")]
    rows = compare(builds, builds[2], tolerance=0.0, rounds=1, slow_call=None)
    assert log[:6] == ["build a", "a", "build ref", "ref", "build b", "b"] and log.count("build ref") == 1
    assert [r["ok"] for r in rows] == [True] * 3 and all(len(r["times_s"]) == 1 for r in rows)
    assert rows[0]["spread"] is None  # from one round


def test_a_deadline_skips_later_compilations_but_never_the_first():
    log = []
    builds = [candidate(log, "pick", build_seconds=0.05), candidate(log, "other"), candidate(log, "late")]
    rows = compare(builds, candidate(log, "ref"), tolerance=1e-3, rounds=50, deadline=time.perf_counter() - 1.0)
    assert [r["ok"] for r in rows] == ["unchecked: budget", "not measured: budget", "not measured: budget"]
    assert "build ref" not in log and "build other" not in log
    assert len(rows[0]["times_s"]) == 1 and rows[0]["median_s"] > 0  # one round, past the deadline

    log.clear()
    start = time.perf_counter()
    builds = [candidate(log, "pick"), candidate(log, "slow build", build_seconds=0.3), candidate(log, "late")]
    rows = compare(builds, candidate(log, "ref"), tolerance=1e-3, rounds=10**6, deadline=start + 0.2)
    assert [r["ok"] for r in rows] == [True, True, "not measured: budget"]  # compiled before the deadline, checked
    assert time.perf_counter() - start < 1.0 and all(len(r["times_s"]) >= 1 for r in rows[:2])


def test_budget_bounds_the_rounds_of_each_tier():
    log = []
    builds = [candidate(log, "a", seconds=0.01), candidate(log, "b", seconds=0.01)]
    rows = compare(builds, candidate(log, "ref"), tolerance=0.0, rounds=1000, budget=0.2)
    assert all(2 <= len(r["times_s"]) <= 20 for r in rows)
    q25, median, q75 = np.percentile(rows[0]["times_s"], [25, 50, 75])
    assert rows[0]["median_s"] == median and rows[0]["spread"] == pytest.approx((q75 - q25) / median)


def test_slow_calls_are_timed_in_rounds_of_their_own_after_the_fast_ones():
    log, rounds = [], []
    builds = [candidate(log, "slow", seconds=0.05), candidate(log, "fast")]
    rows = compare(
        builds,
        candidate(log, "ref"),
        tolerance=0.0,
        rounds=2,
        slow_call=0.05,
        on_compile=lambda i: log.append(f"compile {i}"),
        on_round=lambda tier, i: rounds.append((tier, i)),
    )
    calls = [x for x in log if x in ("slow", "fast")]
    assert calls == ["slow", "fast"] + ["slow", "fast"] + ["fast"] * 2 + ["slow"] * 2  # first calls, warm-up, tiers
    assert rounds == [("fast", 0), ("fast", 1), ("slow", 0), ("slow", 1)]
    assert log.index("compile 0") < log.index("build slow") and log.index("compile 1") < log.index("build fast")
    assert [len(r["times_s"]) for r in rows] == [2, 2]
