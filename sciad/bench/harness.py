"""Time gradients of a `Benchmark` over sensealg × engine combinations and peers.

Every combination's gradient is checked against a tight-tolerance reference
(float64, `DiscreteAdjoint` at rtol = atol = 1e-10) before it is timed; one
outside `tolerance` is marked `ok = False` and never counts as a win.
"""

import dataclasses
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

import sciad
from sciad.problems import Benchmark

REFERENCE_TOLERANCE = 1e-10

# Sensealgs by the labels used in records; the ones that take an engine get it as their only argument.
SENSEALGS: dict[str, Callable] = {
    "ForwardSensitivity": lambda e: sciad.ForwardSensitivity(jvp=e),
    "BacksolveAdjoint": lambda e: sciad.BacksolveAdjoint(vjp=e),
    "InterpolatingAdjoint": lambda e: sciad.InterpolatingAdjoint(vjp=e),
    "InterpolatingAdjoint(checkpointing)": lambda e: sciad.InterpolatingAdjoint(vjp=e, checkpointing=True),
    "QuadratureAdjoint": lambda e: sciad.QuadratureAdjoint(vjp=e),
    "ForwardDiffSensitivity": lambda e: sciad.ForwardDiffSensitivity(),
    "DiscreteAdjoint": lambda e: sciad.DiscreteAdjoint(),
}
TAKES_ENGINE = ("ForwardSensitivity", "BacksolveAdjoint", "InterpolatingAdjoint",
                "InterpolatingAdjoint(checkpointing)", "QuadratureAdjoint")
FORWARD_SOLVE = "forward solve (no gradient)"


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
    """`sensealg` (a key of `SENSEALGS`) with `engine` (a `sciad.ad` name, for those in `TAKES_ENGINE`)."""
    if (engine is None) == (sensealg in TAKES_ENGINE):
        raise ValueError(f"{sensealg} {'needs' if engine is None else 'takes no'} engine")

    def build(bench: Benchmark):
        alg = SENSEALGS[sensealg](engine)
        return jax.jit(jax.grad(lambda p: bench.objective(p, alg)))

    return Combination(sensealg, engine, build)


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


def _block(x):
    return jax.block_until_ready(x) if isinstance(x, jax.Array) else x


def _relative_error(g, ref: np.ndarray) -> float:
    g = np.asarray(g, np.float64).ravel()
    if g.shape != ref.shape or not np.all(np.isfinite(g)):
        return float("inf")
    return float(np.linalg.norm(g - ref) / np.linalg.norm(ref))


def time_combination(combo: Combination, bench: Benchmark, reference: np.ndarray, *, repeats: int,
                     device, tolerance: float, progress: Progress) -> dict:
    """One record: compile time (first call), the gradient check, then `repeats` timed calls after a warm-up.

    A combination that fails (raises) or gives a wrong gradient is not timed further.
    """
    record = {"problem": bench.name, "size": bench.size, "sensealg": combo.sensealg, "engine": combo.engine,
              "label": combo.label, "kind": combo.kind, "is_peer": combo.kind == "peer",
              "device": device_name(device), "times": [], "compile_time": None, "rel_error": None,
              "ok": False, "error": None}
    p = jax.device_put(jnp.asarray(bench.problem.p), device)
    try:
        with jax.default_device(device):
            fn = combo.build(bench)
            start = time.perf_counter()
            out = _block(fn(p))
            record["compile_time"] = time.perf_counter() - start
            if combo.kind == "baseline":
                record["ok"] = bool(np.isfinite(np.asarray(out)))
            else:
                record["rel_error"] = _relative_error(out, reference)
                record["ok"] = record["rel_error"] <= tolerance
            if not record["ok"]:
                record["error"] = f"gradient off: relative error {record['rel_error']:.2e} > {tolerance:.0e}"
                return record
            _block(fn(p))  # warm-up
            for i in range(repeats):
                progress.show(f"{combo.label} ({i + 1}/{repeats})")
                start = time.perf_counter()
                _block(fn(p))
                record["times"].append(time.perf_counter() - start)
    except Exception as e:  # a combination that cannot run is reported, not fatal
        record["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        record["ok"] = False
    return record


def run(bench: Benchmark, combinations: list[Combination], *, repeats: int = 10, devices=None,
        tolerance: float | None = None, progress: Progress | None = None) -> list[dict]:
    """Records for `combinations` (plus the forward-solve baseline) on each of `devices` (default: JAX's first).

    `tolerance` on the gradient's relative error defaults to 100 × the benchmark's rtol.
    """
    devices = devices or [jax.devices()[0]]
    tolerance = 100 * bench.rtol if tolerance is None else tolerance
    combinations = [forward_solve(), *combinations]
    own = progress is None
    progress = progress or Progress(len(combinations) * len(devices))
    reference = reference_gradient(bench)
    records = []
    for device in devices:
        for combo in combinations:
            progress.show(f"{bench.name}: {combo.label} (compiling)")
            records.append(time_combination(combo, bench, reference, repeats=repeats, device=device,
                                            tolerance=tolerance, progress=progress))
            progress.step(f"{bench.name}: {combo.label}")
    if own:
        progress.close()
    return records
