"""Time gradients of a `Benchmark` over sensealg × engine combinations and peers.

Every combination's gradient is checked against a tight-tolerance reference
(float64, `DiscreteAdjoint` at rtol = atol = 1e-10) before it is timed; one
whose relative error (in the max norm) is over `tolerance` is marked
`ok = False` and never counts as a win. The correct ones are timed together in
interleaved rounds, so machine noise hits them alike; calls of `SLOW_CALL`
seconds or more (host engines, torch peers) in rounds of their own, after the
fast ones, so that a fast call never follows one that leaves torch's threads
spinning and fast calls get many rounds cheaply. Checking and timing are
`sciad.timing.compare`'s, as for autotuning.
"""

import dataclasses
import functools
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import sciad
from sciad.adjoints import ODE_SENSEALGS, describe, engine_option, parse
from sciad.problems import Benchmark
from sciad.timing import SLOW_CALL, compare

REFERENCE_TOLERANCE = 1e-10
# The sensealgs benchmarked, as `sciad.adjoints.describe` names them without their engine.
# ReversibleAdjoint, whose ODE solves are McCallum & Foster's reversible method and not the solver's own, is
# measured beside the memory-bound sensealgs by experiments/reversible_ode.py.
VARIANTS = (
    *(name for name in ODE_SENSEALGS if name != "ReversibleAdjoint"),
    describe(sciad.InterpolatingAdjoint(checkpointing=True), engine=False),
)
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
    """`sensealg` (a name `sciad.adjoints.parse` reads, without engine) with `engine` (a `sciad.ad`
    name, exactly for the sensealgs that take one)."""
    option = engine_option(sensealg)
    if (engine is None) == (option is not None):
        raise ValueError(f"{sensealg} {'needs' if engine is None else 'takes no'} engine")
    alg = parse(sensealg, **({option: engine} if option else {}))
    return Combination(
        describe(alg, engine=False), engine, lambda bench: jax.jit(jax.grad(lambda p: bench.objective(p, alg)))
    )


def auto_pick(bench: Benchmark) -> str:
    """The label of the combination `sensealg="auto"` runs on `bench` (`sciad.select_sensealg`'s choice),
    as `sciad_combination` labels it."""
    alg = sciad.select_sensealg(
        bench.problem,
        saveat=bench.saveat,
        solver=bench.solver,
        rtol=bench.rtol,
        atol=bench.atol,
        max_steps=bench.max_steps,
    ).sensealg
    option = engine_option(alg)
    return Combination(describe(alg, engine=False), getattr(alg, option).name if option else None, None).label  # pyright: ignore[reportArgumentType]  # a label's parts; a sensealg serves


def forward_solve() -> Combination:
    """The loss without a gradient: the baseline for the ratios."""
    return Combination(FORWARD_SOLVE, None, lambda bench: jax.jit(bench.objective), kind="baseline")


def reference_gradient(bench: Benchmark) -> np.ndarray:
    """∂loss/∂p in float64 by `DiscreteAdjoint` at rtol = atol = 1e-10."""
    tight = dataclasses.replace(bench, rtol=REFERENCE_TOLERANCE, atol=REFERENCE_TOLERANCE)
    p = np.asarray(bench.inputs, np.float64)
    return np.asarray(jax.jit(jax.grad(lambda p: tight.objective(p, sciad.DiscreteAdjoint())))(p))  # pyright: ignore[reportArgumentType]  # a label's parts; a sensealg serves


class Progress:
    """Progress on stderr (or `stream`) through `total` counted stages. On a terminal, one bar redrawn
    in place: `[#####     ] 12/40 label, detail`. Elsewhere (a file, a pipe, CI's log) one line per
    stage, `[12/40] label`: each `step`, and each `show` whose label differs from the last line's
    (its `detail`, e.g. the round being timed, stays off the log)."""

    def __init__(self, total: int, width: int = 30, stream=None):
        self.total, self.done, self.width = max(total, 1), 0, width
        self.stream = stream or sys.stderr
        self.live = getattr(self.stream, "isatty", lambda: False)()
        self.last = None

    def show(self, label: str, detail: str = "") -> None:
        """Say what is under way now, without counting a stage."""
        if self.live:
            filled = int(self.width * self.done / self.total)
            line = f"\r[{'#' * filled}{' ' * (self.width - filled)}] {self.done}/{self.total} {label}"
            self.stream.write(f"{(line + (f', {detail}' if detail else ''))[:110]:<110}")
        elif label != self.last:
            self.stream.write(f"[{self.done}/{self.total}] {label}\n")
        self.last = label
        self.stream.flush()

    def step(self, label: str) -> None:
        """Count the stage `label` begins (or ends) and say so."""
        self.done += 1
        self.last = None
        self.show(label)

    def close(self) -> None:
        """End the bar's line (a terminal's)."""
        if self.live:
            self.stream.write("\n")
            self.stream.flush()


def device_name(device) -> str:
    kind = device.device_kind
    return device.platform if kind == device.platform else f"{device.platform}:{kind}"


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
    return int(
        stats.temp_size_in_bytes + stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
    )


def temp_bytes(fn: Callable) -> int | None:
    """XLA's temporaries of a `compiled` function (what the program allocates beyond its arguments and
    outputs); None where `peak_bytes` is None."""
    stats = fn.memory_analysis() if hasattr(fn, "memory_analysis") else None
    return None if stats is None else int(stats.temp_size_in_bytes)


def run(
    bench: Benchmark,
    combinations: list[Combination],
    *,
    repeats: int = 10,
    budget: float | None = None,
    devices=None,
    tolerance: float | None = None,
    progress: Progress | None = None,
) -> list[dict]:
    """Records for `combinations` (plus the forward-solve baseline) on each of `devices` (default: JAX's first).

    Each is compiled (`compile_time`: trace, compile, first call; XLA's `peak_bytes` of the correct
    ones) and its gradient checked (`rel_error`, relative in the max norm, within `tolerance`,
    default 100 × the benchmark's rtol; the baseline's loss finite); the correct ones are then
    called once more (warm-up) and timed together, the calls under `SLOW_CALL` seconds first, then
    the others: `repeats` interleaved rounds each, or fewer past `budget` seconds each
    (`sciad.timing.compare`).
    """
    devices = devices or [jax.devices()[0]]
    tolerance = 100 * bench.rtol if tolerance is None else tolerance
    combinations = [forward_solve(), *combinations]
    own = progress is None
    progress = progress or Progress(len(combinations) * len(devices))
    reference = reference_gradient(bench)
    records = []
    for device in devices:
        p = jax.device_put(jnp.asarray(bench.inputs), device)
        fns = {}

        def build(i, combo):
            def prepare():
                fns[i] = compiled(combo.build(bench), p)
                return functools.partial(fns[i], p)

            return prepare

        most = f"{repeats} rounds" if budget is None else f"≤ {repeats} rounds, ≤ {budget:g} s"
        with jax.default_device(device):
            rows = compare(
                [build(i, c) for i, c in enumerate(combinations)],
                lambda: lambda: reference,
                tolerance=tolerance,
                rounds=repeats,
                budget=budget,
                slow_call=SLOW_CALL,
                baselines=[0],
                on_compile=lambda i: progress.step(f"{bench.name}: {combinations[i].label} (compiling)"),
                on_round=lambda tier, i: progress.show(
                    f"{bench.name}: timing the calls {'<' if tier == 'fast' else '≥'} {SLOW_CALL:g} s ({most})",
                    f"round {i + 1}",
                ),
            )
        records += [
            _record(c, bench, device, row, tolerance, fns.get(i)) for i, (c, row) in enumerate(zip(combinations, rows))
        ]
    if own:
        progress.close()
    return records


def _record(combo: Combination, bench: Benchmark, device, row: dict, tolerance: float, fn) -> dict:
    """The benchmark's record of `combo` from its `sciad.timing.compare` row (`fn`: its compiled call)."""
    error = None
    if row["ok"] is False:
        error = (
            f"gradient off: relative error {row['rel_error']:.2e} > {tolerance:.0e}"
            if "rel_error" in row
            else "not finite"
        )
    elif row["ok"] is not True:
        error = row["ok"].removeprefix("failed: ")
    return {
        "problem": bench.name,
        "size": bench.size,
        "sensealg": combo.sensealg,
        "engine": combo.engine,
        "label": combo.label,
        "kind": combo.kind,
        "is_peer": combo.kind == "peer",
        "device": device_name(device),
        "times": row["times_s"],
        "median_s": row.get("median_s"),
        "compile_time": row.get("compile_s"),
        "rel_error": row.get("rel_error"),
        "ok": row["ok"] is True,
        "error": error,
        "peak_bytes": peak_bytes(fn) if row["ok"] is True else None,
        "temp_bytes": temp_bytes(fn) if row["ok"] is True else None,
    }
