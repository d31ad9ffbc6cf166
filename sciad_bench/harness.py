"""Time gradients of a `Benchmark` over sensealg × engine combinations and peers.

Every combination's gradient is checked against a tight-tolerance reference
(float64, `DiscreteAdjoint` at rtol = atol = 1e-10) before it is timed; one
outside `tolerance` is marked `ok = False` and never counts as a win. The
correct ones are timed together in interleaved rounds, so machine noise hits
them alike; calls of `SLOW_CALL` seconds or more (host engines, torch peers)
in rounds of their own, after the fast ones, so that a fast call never follows
one that leaves torch's threads spinning and fast calls get many rounds cheaply.
"""

import dataclasses
import sys
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

import sciad
from sciad.adjoints import SENSEALGS, describe, engine_option, parse
from sciad.errors import summary
from sciad.problems import Benchmark
from sciad.timing import interleaved, timed

REFERENCE_TOLERANCE = 1e-10
# The sensealgs benchmarked, as `sciad.adjoints.describe` names them without their engine.
VARIANTS = (*SENSEALGS, describe(sciad.InterpolatingAdjoint(checkpointing=True), engine=False))
FORWARD_SOLVE = "forward solve (no gradient)"
# Seconds of a warm-up call from which a call is timed with the slow ones: the Lotka–Volterra gradients
# of the JAX-traced engines take 1 to 15 ms, the host engines' and torchdiffeq's 0.5 to 7 s, and a JAX
# call right after a torch one is slowed ×10 (0.7 → 7 ms) while torch's threads spin.
SLOW_CALL = 0.1


@dataclasses.dataclass(frozen=True)
class Combination:
    """One way to compute the gradient: `build(bench)` returns `grad(p) -> array`
    (compiled on its first call); `kind` is "sciad", "peer" or "baseline"."""

    sensealg: str
    engine: str | None
    build: Callable
    kind: str = "sciad"

    @property
    def label(self) -> str:
        return self.sensealg if self.engine is None else f"{self.sensealg} / {self.engine}"


def sciad_combination(sensealg: str, engine: str | None = None) -> Combination:
    """`sensealg` (a name `sciad.adjoints.parse` reads, without engine) with `engine` (a `sciad.ad`
    name, exactly for the sensealgs that take one)."""
    option = engine_option(sensealg)
    if (engine is None) == (option is not None):
        raise ValueError(f"{sensealg} {'needs' if engine is None else 'takes no'} engine")
    alg = parse(sensealg, **({option: engine} if option else {}))
    return Combination(describe(alg, engine=False), engine,
                       lambda bench: jax.jit(jax.grad(lambda p: bench.objective(p, alg))))


def forward_solve() -> Combination:
    """The loss without a gradient: the baseline for the ratios."""
    return Combination(FORWARD_SOLVE, None, lambda bench: jax.jit(bench.objective), kind="baseline")


def reference_gradient(bench: Benchmark) -> np.ndarray:
    """∂loss/∂p in float64 by `DiscreteAdjoint` at rtol = atol = 1e-10."""
    tight = dataclasses.replace(bench, rtol=REFERENCE_TOLERANCE, atol=REFERENCE_TOLERANCE)
    p = np.asarray(bench.problem.p, np.float64)
    return np.asarray(jax.jit(jax.grad(lambda p: tight.objective(p, sciad.DiscreteAdjoint())))(p))


class Progress:
    """A one-line progress bar on stderr: `[#####     ] 12/40 label`."""

    def __init__(self, total: int, width: int = 30, stream=None):
        self.total, self.done, self.width = max(total, 1), 0, width
        self.stream = stream or sys.stderr

    def show(self, label: str) -> None:
        filled = int(self.width * self.done / self.total)
        line = f"\r[{'#' * filled}{' ' * (self.width - filled)}] {self.done}/{self.total} {label}"
        self.stream.write(f"{line[:110]:<110}")
        self.stream.flush()

    def step(self, label: str) -> None:
        self.done += 1
        self.show(label)

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def device_name(device) -> str:
    kind = device.device_kind
    return device.platform if kind == device.platform else f"{device.platform}:{kind}"


def _relative_error(g, ref: np.ndarray) -> float:
    g = np.asarray(g, np.float64).ravel()
    if g.shape != ref.shape or not np.all(np.isfinite(g)):
        return float("inf")
    return float(np.linalg.norm(g - ref) / np.linalg.norm(ref))


def compiled(fn: Callable, *args) -> Callable:
    """`fn` compiled ahead of time for `args` when it is jitted (a `jax.stages.Compiled`, whose memory
    `peak_bytes` reads without compiling again), else `fn`."""
    return fn.lower(*args).compile() if hasattr(fn, "lower") else fn


def peak_bytes(fn: Callable) -> int | None:
    """XLA's buffers of a `compiled` function: temporaries, arguments and outputs (aliased ones once);
    None for a function not compiled by XLA, or where the backend does not say."""
    stats = fn.memory_analysis() if hasattr(fn, "memory_analysis") else None
    if stats is None:
        return None
    return int(stats.temp_size_in_bytes + stats.argument_size_in_bytes + stats.output_size_in_bytes
               - stats.alias_size_in_bytes)


def _first_call(fn: Callable, p) -> tuple[Callable, object]:
    """(`fn` `compiled` for p, fn(p))."""
    fn = compiled(fn, p)
    return fn, fn(p)


def check_combination(combo: Combination, bench: Benchmark, reference: np.ndarray, *, device,
                      tolerance: float) -> tuple[dict, Callable | None]:
    """A record with the time to the first gradient (trace, compile, first call), the gradient check
    and XLA's `peak_bytes`, and the call to time (None when the combination failed or gave a wrong
    gradient: it is not timed)."""
    record = {"problem": bench.name, "size": bench.size, "sensealg": combo.sensealg, "engine": combo.engine,
              "label": combo.label, "kind": combo.kind, "is_peer": combo.kind == "peer",
              "device": device_name(device), "times": [], "median_s": None, "compile_time": None,
              "rel_error": None, "ok": False, "error": None, "peak_bytes": None}
    p = jax.device_put(jnp.asarray(bench.problem.p), device)
    try:
        with jax.default_device(device):
            (fn, out), record["compile_time"] = timed(lambda: _first_call(combo.build(bench), p))
        if combo.kind == "baseline":
            record["ok"] = bool(np.isfinite(np.asarray(out)))
        else:
            record["rel_error"] = _relative_error(out, reference)
            record["ok"] = record["rel_error"] <= tolerance
        if not record["ok"]:
            record["error"] = f"gradient off: relative error {record['rel_error']:.2e} > {tolerance:.0e}"
            return record, None
    except Exception as e:  # a combination that cannot run is reported, not fatal
        record["error"] = f"{type(e).__name__}: {summary(e)[:300]}"
        return record, None
    record["peak_bytes"] = peak_bytes(fn)
    return record, lambda: fn(p)


def run(bench: Benchmark, combinations: list[Combination], *, repeats: int = 10, budget: float | None = None,
        devices=None, tolerance: float | None = None, progress: Progress | None = None) -> list[dict]:
    """Records for `combinations` (plus the forward-solve baseline) on each of `devices` (default: JAX's first).

    Each is compiled and its gradient checked (`tolerance` on the relative error, default 100 × the
    benchmark's rtol); the correct ones are then called once more (warm-up) and timed together,
    the calls under `SLOW_CALL` seconds first, then the others: `repeats` interleaved rounds each, or
    fewer past `budget` seconds each (`sciad.timing.interleaved`).
    """
    devices = devices or [jax.devices()[0]]
    tolerance = 100 * bench.rtol if tolerance is None else tolerance
    combinations = [forward_solve(), *combinations]
    own = progress is None
    progress = progress or Progress(len(combinations) * len(devices))
    reference = reference_gradient(bench)
    records = []
    for device in devices:
        timed_calls = []
        for combo in combinations:
            progress.show(f"{bench.name}: {combo.label} (compiling)")
            record, call = check_combination(combo, bench, reference, device=device, tolerance=tolerance)
            records.append(record)
            if call is not None:
                timed_calls.append((record, call))
            progress.step(f"{bench.name}: {combo.label}")
        with jax.default_device(device):
            warm = interleaved([call for _, call in timed_calls], rounds=1)  # warm-up
            for speed in ("fast", "slow"):
                tier = [rc for rc, (t,) in zip(timed_calls, warm) if (t >= SLOW_CALL) == (speed == "slow")]
                if not tier:
                    continue
                limit = f"/{repeats}" if budget is None else f" (up to {budget:g} s)"
                times = interleaved([call for _, call in tier], rounds=repeats, budget=budget, on_round=lambda i: (
                    progress.show(f"{bench.name}: timing {speed} calls, round {i + 1}{limit}")))
                for (record, _), t in zip(tier, times):
                    record["times"], record["median_s"] = t, float(np.median(t))
    if own:
        progress.close()
    return records
