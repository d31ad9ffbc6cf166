"""The benchmark suite (`sciad bench suite`) and the targets it checks.

Problems: the paper's two (Lotka–Volterra, the spiral neural ODE), a long-horizon
neural ODE (`hamiltonian_node`: 400 parameters, two save points), the stiff
Oregonator and Brusselator PDE (Kvaerno5) and a many-parameter model with dense
data (`gene_circuit`: 130 parameters, 50 save points). On each: `sensealg="auto"`,
diffrax's adjoints and (full mode) every sensealg × JAX-traced engine, gradients
checked before timing (`harness.run`); the time to the first gradient (trace +
compile + first call) and XLA's peak buffer memory are reported apart from the
median time per gradient. Each problem (quick: `QUICK_SETTINGS_PROBLEMS`) is also
timed at a user's settings (`user_settings`: `max_steps=100000`, tolerances 100×
tighter), auto and diffrax's adjoints only, as rows of their own and in a table
of auto's ratio to diffrax's fastest adjoint by setting.

Targets, from the ratios of this one run, at each problem's own settings:

- speed: "auto" ≤ 1.0× the fastest diffrax adjoint's median, ≤ 0.5× on the
  long-horizon and stiff problems;
- time to the first gradient: "auto" ≤ 1.0× diffrax `RecursiveCheckpointAdjoint`'s;
- memory: the checkpointed adjoints' (`CHECKPOINTED`) peak flat in the horizon (≤ `FLAT_GROWTH`×
  from the shortest to a 10× longer horizon of the long-horizon neural ODE).

The gradients' relative tolerance is 100 × rtol, at least `GRADIENT_TOLERANCE`.
"""

import dataclasses
import importlib.util
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import sciad
import sciad.ad as ad
from sciad import get_solver
from sciad.adjoints import describe, engine_option, parse, step_controller
from sciad.problems import (
    Benchmark,
    brusselator_pde,
    gene_circuit,
    hamiltonian_node,
    lotka_volterra,
    oregonator,
    spiral_data,
    spiral_node,
)
from sciad.select import heuristic
from sciad.timing import fastest, relative_error
from sciad_bench import claims, harness, plots, selection, tables
from sciad_bench.events import bouncing_ball
from sciad_bench.experiments import _sensealg_matrix
from sciad_bench.harness import Combination, sciad_combination
from sciad_bench.peers import diffrax_peer, diffsol_peer

PAPER, LONG_HORIZON, STIFF, DENSE = "paper", "long horizon", "stiff", "many parameters, dense data"
# The gradient check's relative tolerance: 100 × rtol (the harness's), but not below this. A gradient
# within 1e-5 is right for any use, and the discrete gradients of the problems solved at rtol = 1e-8
# (many oscillations) are 1e-6 to 4e-6 from the tight reference.
GRADIENT_TOLERANCE = 1e-5
SPEED_TARGET = {PAPER: 1.0, LONG_HORIZON: 0.5, STIFF: 0.5, DENSE: 1.0}  # auto / fastest diffrax adjoint
FIRST_GRADIENT_PEER = "diffrax RecursiveCheckpointAdjoint"
FLAT_GROWTH = 1.5  # peak memory at the longest horizon / at the shortest, for "flat"
AUTO = "auto →"
PEERS = ("RecursiveCheckpointAdjoint", "ForwardMode", "BacksolveAdjoint", "DirectAdjoint")
# The checkpointed sensealgs, whose memory should not grow: DiscreteAdjoint by default stores every
# step while max_steps steps fit in 256 MiB (speed for memory), so it is swept with a fixed number.
CHECKPOINTED = (claims.PAPER_SENSEALG, "GaussAdjoint(checkpointing=True)", "DiscreteAdjoint(stored_steps=64)")
SWEEP_HORIZONS = {True: (100.0, 1000.0), False: (100.0, 300.0, 1000.0)}  # by quick
# Timed rounds per problem and tier of calls (`harness.run`: fast, slow), and the seconds after which
# they stop (None: all of them), by quick.
ROUNDS = {True: (20, 4.0), False: (10, None)}
MEMORY_FIGURE = "suite-memory.png"
USER_MAX_STEPS = 100_000  # a user's max_steps (the problems' own: 4,096 to 100,000)
# Tolerances of the tighter setting: the problem's / this (float64), / 10 in float32, whose precision
# ends near 1e-7 (the spiral: 1e-5 → 1e-6).
TIGHTER = 100
# The problems timed at `user_settings` in quick mode: the paper's two, a few ms per gradient, whose
# auto picks differ (forward mode; DiscreteAdjoint keeping every step, sized by max_steps).
QUICK_SETTINGS_PROBLEMS = ("lotka-volterra", "spiral-node")


def problems(quick: bool) -> list[tuple[str, Benchmark]]:
    """(class, benchmark) for every problem of the suite, the same in both modes. The Brusselator PDE
    is 6×6 (72 states): ForwardSensitivity, auto's pick there, takes tens of seconds per gradient
    with Kvaerno5 already, and a 16×16 grid would take a full run hours."""
    return [
        (PAPER, lotka_volterra()),
        (PAPER, spiral_node()),
        (LONG_HORIZON, hamiltonian_node()),
        (STIFF, oregonator()),
        (STIFF, brusselator_pde(6)),
        (DENSE, gene_circuit()),
    ]


def _exponent(x: float) -> str:
    return f"{x:.0e}".replace("e-0", "e-")


def user_settings(bench: Benchmark) -> list[tuple[str, Benchmark]]:
    """(setting, benchmark) for `bench` at `USER_MAX_STEPS` (unless its own max_steps are those already)
    and at rtol, atol `TIGHTER`× smaller (10× in float32), named "NAME (SETTING)", e.g.
    "lotka-volterra (max_steps=100000)", "lotka-volterra (rtol=1e-8, atol=1e-8)"."""
    factor = TIGHTER if np.asarray(bench.problem.p).dtype.itemsize >= 8 else 10
    rtol, atol = bench.rtol / factor, bench.atol / factor
    settings = (
        [] if bench.max_steps == USER_MAX_STEPS else [(f"max_steps={USER_MAX_STEPS}", dict(max_steps=USER_MAX_STEPS))]
    )
    settings.append((f"rtol={_exponent(rtol)}, atol={_exponent(atol)}", dict(rtol=rtol, atol=atol)))  # pyright: ignore[reportArgumentType]  # inferred too narrow
    return [
        (label, dataclasses.replace(bench, name=f"{bench.name} ({label})", **changes)) for label, changes in settings
    ]


def auto_combination(bench: Benchmark) -> Combination:
    """`sensealg="auto"` in `bench.objective`, labelled with what it picks here: `auto → Name / engine`."""
    pick = heuristic(selection.features(bench)).sensealg
    option = engine_option(pick)
    return Combination(
        f"{AUTO} {describe(pick, engine=False)}",
        getattr(pick, option).name if option else None,
        lambda bench: jax.jit(jax.grad(lambda p: bench.objective(p, "auto"))),
    )


def combinations(bench: Benchmark, category: str, engines, *, quick: bool) -> list[Combination]:
    """ "auto", in full mode every sensealg × engine but auto's own pick (with an implicit solver, no
    BacksolveAdjoint and ForwardSensitivity with jax-forward only), and `diffrax_adjoints`."""
    implicit = selection.features(bench).implicit_solver
    auto = auto_combination(bench)
    combos = [auto]
    if not quick:
        matrix, _ = _sensealg_matrix(engines, quick=False)
        combos += [
            c
            for c in matrix
            if sensealg_name(c) != sensealg_name(auto)
            and not (
                implicit
                and (
                    c.sensealg == "BacksolveAdjoint"
                    or (c.sensealg == "ForwardSensitivity" and c.engine != "jax-forward")
                )
            )
        ]
    return combos + diffrax_adjoints(bench, category, quick=quick)


def diffrax_adjoints(bench: Benchmark, category: str, *, quick: bool) -> list[Combination]:
    """diffrax's adjoints: BacksolveAdjoint only with an explicit solver, and in quick mode only on
    the long-horizon problem; quick: not DirectAdjoint."""
    backsolve = not selection.features(bench).implicit_solver and (not quick or category == LONG_HORIZON)
    return [
        diffrax_peer(a)
        for a in PEERS
        if (backsolve or a != "BacksolveAdjoint") and not (quick and a == "DirectAdjoint")
    ]


def plan(engines, *, quick: bool) -> list[tuple[str, str | None, Benchmark, list[Combination]]]:
    """(class, setting, benchmark, combinations) for every problem at its own settings (setting None,
    `combinations`), then at each of its `user_settings` with auto and `diffrax_adjoints` only
    (quick: the `QUICK_SETTINGS_PROBLEMS` only)."""
    own = [
        (category, None, bench, combinations(bench, category, engines, quick=quick))
        for category, bench in problems(quick)
    ]
    varied = [
        (category, setting, variant, [auto_combination(variant), *diffrax_adjoints(variant, category, quick=quick)])
        for category, _, bench, _ in own
        if not quick or bench.name in QUICK_SETTINGS_PROBLEMS
        for setting, variant in user_settings(bench)
    ]
    return own + varied  # pyright: ignore[reportReturnType]  # inferred too narrow


def skipped_combinations(engines, *, quick: bool) -> list[str]:
    skipped = [
        f"{e} ({'not chosen' if ad.BACKENDS[e].traced else 'host engine: a host round trip per product'})"
        for e in ad.available()
        if e not in engines
    ]
    skipped.append("BacksolveAdjoint, sciad's and diffrax's, on the stiff problems (unstable backwards)")
    skipped.append(
        "ForwardSensitivity on the stiff problems with engines other than jax-forward (tens of "
        "seconds per gradient with any engine)"
    )
    skipped.append(
        f"every sensealg but auto's pick at a user's settings (max_steps={USER_MAX_STEPS}, "
        "tighter tolerances: what they change is auto against diffrax)"
    )
    if quick:
        skipped.append(
            "every sensealg but auto's pick, diffrax DirectAdjoint (RecursiveCheckpointAdjoint's "
            "slower forward-mode-capable variant) and diffrax BacksolveAdjoint but on the long-horizon "
            "problem (quick mode)"
        )
        skipped.append(f"a user's settings but on {', '.join(QUICK_SETTINGS_PROBLEMS)} (quick mode)")
    return skipped


def sensealg_name(combo: Combination) -> str | None:
    """The sciad sensealg of `combo` as `describe` writes it with its engine (auto: its pick); None for
    peers and baselines."""
    if combo.kind != "sciad":
        return None
    text = combo.sensealg.removeprefix(f"{AUTO} ")
    return describe(parse(text, **({engine_option(text): combo.engine} if combo.engine else {})))  # pyright: ignore[reportCallIssue]  # inferred too narrow


def run_problem(
    bench: Benchmark, category: str, combos, *, repeats: int, budget: float | None, progress, setting: str | None = None
) -> list[dict]:
    """`harness.run` records (gradients checked to `GRADIENT_TOLERANCE` at least) with the problem's
    class, its `setting` (None: its own) and max_steps, rtol, atol, the sensealg's `name`
    (`sensealg_name`) and auto's heuristic `rule`."""
    names = {c.label: sensealg_name(c) for c in combos}
    records = harness.run(
        bench,
        combos,
        repeats=repeats,
        budget=budget,
        progress=progress,
        tolerance=max(100 * bench.rtol, GRADIENT_TOLERANCE),
    )
    rule = heuristic(selection.features(bench)).rule
    for r in records:
        r["class"], r["name"] = category, names.get(r["label"])
        r.update(setting=setting, max_steps=bench.max_steps, rtol=bench.rtol, atol=bench.atol)
        r["rule"] = rule if r["sensealg"].startswith(AUTO) else None
    return records


def horizon_benchmark(horizon: float) -> Benchmark:
    """The long-horizon neural ODE (`hamiltonian_node`: two save points) on [0, horizon], `max_steps`
    the least that solves it (its step count + 5%, rounded up to 100), as a user would set it:
    XLA's buffers are sized by it."""
    bench = hamiltonian_node(t1=horizon)
    steps = int(
        sciad.solve(bench.problem, saveat=bench.saveat, rtol=bench.rtol, atol=bench.atol, max_steps=10**7).stats[
            "steps"
        ]
    )
    return dataclasses.replace(bench, name=f"{bench.name}-T{horizon:g}", max_steps=100 * math.ceil(1.05 * steps / 100))


def memory_sweep(horizons, combos: list[Combination], progress=None) -> list[dict]:
    """Peak memory (`peak_bytes`, compiled, not run) of each combination's gradient at each horizon."""
    rows = []
    for horizon in horizons:
        bench = horizon_benchmark(horizon)
        p = jnp.asarray(bench.problem.p)
        for combo in combos:
            if progress is not None:
                progress.step(f"memory: {combo.label} at T = {horizon:g} (compiling)")
            rows.append(
                {
                    "label": combo.label,
                    "sensealg": combo.sensealg,
                    "horizon": float(horizon),
                    "max_steps": bench.max_steps,
                    "peak_bytes": harness.peak_bytes(harness.compiled(combo.build(bench), p)),
                }
            )
    return rows


def sweep_combinations(quick: bool) -> list[Combination]:
    """The `CHECKPOINTED` adjoints; full mode adds, for comparison, BacksolveAdjoint (nothing stored),
    the uncheckpointed InterpolatingAdjoint, DiscreteAdjoint with its default storage and diffrax's
    RecursiveCheckpointAdjoint."""
    combos = [sciad_combination(s, "jax-reverse" if engine_option(s) else None) for s in CHECKPOINTED]
    if not quick:
        combos += [sciad_combination(s, "jax-reverse") for s in ("BacksolveAdjoint", "InterpolatingAdjoint")]
        combos += [sciad_combination("DiscreteAdjoint"), diffrax_peer("RecursiveCheckpointAdjoint")]
    return combos


def _auto(group):
    return next((r for r in group if r["sensealg"].startswith(AUTO)), None)


def _better(group, key: str, peer: dict) -> str:
    """The correct sciad combination other than auto with the least `key` (seconds), against `peer`'s."""
    auto = _auto(group)
    others = [r for r in group if r["kind"] == "sciad" and r is not auto and r["ok"] and r[key] is not None]
    if not others:
        return "no other sciad sensealg measured (quick mode)"
    best = min(others, key=lambda r: r[key])
    if auto and auto["ok"] and auto[key] is not None and auto[key] <= best[key]:
        return "no other sciad sensealg measured does better"
    return f"best sciad combination measured: {best['label']} at {best[key] / peer[key]:.2f}× ({best[key]:.3g} s)"


def _target(target, problem, bound, ratio, measured, why) -> dict:
    met = ratio is not None and ratio <= bound
    miss = "" if met else ("not measurable" if ratio is None else f"missed by {ratio / bound:.2f}×")
    return {
        "target": target,
        "problem": problem,
        "bound": bound,
        "ratio": ratio,
        "met": met,
        "measured": measured,
        "note": "" if met else f"{miss}; {why}",
    }


def auto_against_diffrax(group) -> tuple[dict | None, dict | None, float | None]:
    """auto's record, the fastest correct diffrax adjoint's, and auto's median / that one's (None
    unless both have one) among the records of one problem."""
    auto, peer = _auto(group), fastest([r for r in group if r["is_peer"]])
    return auto, peer, auto["median_s"] / peer["median_s"] if auto and auto["median_s"] and peer else None


def speed_targets(records) -> list[dict]:
    """auto's median / the fastest diffrax adjoint's, per problem, against `SPEED_TARGET`."""
    out = []
    for problem, group in _by_problem(records).items():
        auto, peer, ratio = auto_against_diffrax(group)
        bound = SPEED_TARGET[group[0]["class"]]
        measured = (
            f"{auto['label']} {1e3 * auto['median_s']:.3g} ms vs {peer['label']} {1e3 * peer['median_s']:.3g} ms"  # pyright: ignore[reportOptionalSubscript]  # found where the ratio is
            if ratio is not None
            else f"auto: {tables.status(auto) if auto else 'absent'}"
        )
        why = (
            f"auto's pick by rule `{auto['rule'] if auto else '–'}`; {_better(group, 'median_s', peer)}"
            if peer
            else "no diffrax adjoint gave a correct gradient"
        )
        out.append(_target("auto ≤ fastest diffrax adjoint", problem, bound, ratio, measured, why))
    return out


def first_gradient_targets(records) -> list[dict]:
    """auto's time to the first gradient / diffrax RecursiveCheckpointAdjoint's, per problem (≤ 1)."""
    out = []
    for problem, group in _by_problem(records).items():
        auto = _auto(group)
        peer = next((r for r in group if r["sensealg"] == FIRST_GRADIENT_PEER and r["ok"]), None)
        ratio = auto["compile_time"] / peer["compile_time"] if auto and auto["ok"] and peer else None
        measured = (
            f"{auto['compile_time']:.1f} s vs {peer['compile_time']:.1f} s"  # pyright: ignore[reportOptionalSubscript]  # found where the ratio is
            if ratio is not None
            else "auto or RecursiveCheckpointAdjoint gave no correct gradient"
        )
        why = _better(group, "compile_time", peer) if peer else "no correct RecursiveCheckpointAdjoint gradient"
        out.append(
            _target("auto's time to first gradient ≤ RecursiveCheckpointAdjoint's", problem, 1.0, ratio, measured, why)
        )
    return out


def memory_targets(sweep: list[dict]) -> list[dict]:
    """Peak memory at the longest horizon / at the shortest for each checkpointed sensealg (≤ FLAT_GROWTH)."""
    out = []
    for label in dict.fromkeys(r["label"] for r in sweep if r["sensealg"] in CHECKPOINTED):
        rows = sorted((r for r in sweep if r["label"] == label), key=lambda r: r["horizon"])
        short, long = rows[0], rows[-1]
        growth = long["peak_bytes"] / short["peak_bytes"] if short["peak_bytes"] and long["peak_bytes"] else None
        span = long["horizon"] / short["horizon"]
        measured = (
            "memory analysis unavailable"
            if growth is None
            else f"{short['peak_bytes'] / 2**20:.3g} → {long['peak_bytes'] / 2**20:.3g} MiB from T = "
            f"{short['horizon']:g} to {long['horizon']:g} (∝ T^{math.log(growth) / math.log(span):.2f})"
        )
        why = f"max_steps grows {long['max_steps'] / short['max_steps']:.1f}×: buffers sized by max_steps"
        out.append(
            _target(
                f"peak memory flat in the horizon (≤ {FLAT_GROWTH}× over {span:g}×)",
                label,
                FLAT_GROWTH,
                growth,
                measured,
                why,
            )
        )
    return out


def _by_problem(records) -> dict[str, list[dict]]:
    groups = {}
    for r in records:
        groups.setdefault(r["problem"], []).append(r)
    return groups


def targets_table(targets: list[dict]) -> str:
    lines = ["| target | problem | bound | ratio | verdict | measured | note |", "|---|---|---:|---:|---|---|---|"]
    for t in targets:
        ratio = "–" if t["ratio"] is None else f"{t['ratio']:.2f}"
        lines.append(
            f"| {t['target']} | {t['problem']} | ≤ {t['bound']:g} | {ratio} | "
            f"{'met' if t['met'] else '**missed**'} | {t['measured']} | {t['note']} |"
        )
    met = sum(t["met"] for t in targets)
    return "\n".join(lines) + f"\n\n{met} of {len(targets)} targets met.\n"


def settings_table(records) -> str:
    """auto against diffrax's fastest adjoint for each problem timed at `user_settings`, at its own
    settings and at each of those."""

    def own_name(r):
        return r["problem"].removesuffix(f" ({r['setting']})") if r["setting"] else r["problem"]

    varied = {own_name(r) for r in records if r["setting"]}
    lines = [
        "| problem | max_steps | rtol | atol | auto | auto (ms) | fastest diffrax adjoint (ms) | auto / diffrax |",
        "|---|---:|---:|---:|---|---:|---|---:|",
    ]
    for group in _by_problem(records).values():
        first = group[0]
        if own_name(first) not in varied:
            continue
        auto, peer, ratio = auto_against_diffrax(group)
        auto_ms = "–" if ratio is None else f"{1e3 * auto['median_s']:.3g}"  # pyright: ignore[reportOptionalSubscript]  # found where the ratio is
        fastest_peer = "–" if peer is None else f"{peer['label']} {1e3 * peer['median_s']:.3g}"
        lines.append(
            f"| {own_name(first)} | {first['max_steps']} | {first['rtol']:g} | {first['atol']:g} | "
            f"{auto['label'] if auto else '–'} | {auto_ms} | {fastest_peer} | "
            f"{'–' if ratio is None else format(ratio, '.2f')} |"
        )
    return "\n".join(lines) + "\n"


def resources_table(records) -> str:
    """Time to the first gradient and peak memory of each checked combination, apart from the run time."""
    lines = ["| problem | combination | time to first gradient (s) | peak memory (MiB) |", "|---|---|---:|---:|"]
    for r in sorted(
        (r for r in records if r["ok"] and r["kind"] != "baseline"), key=lambda r: (r["problem"], r["compile_time"])
    ):
        memory = "–" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.3g}"
        lines.append(f"| {r['problem']} | {r['label']} | {r['compile_time']:.2f} | {memory} |")
    return "\n".join(lines) + "\n"


def sweep_table(sweep: list[dict]) -> str:
    lines = ["| combination | horizon T | max_steps | peak memory (MiB) |", "|---|---:|---:|---:|"]
    lines += [
        f"| {r['label']} | {r['horizon']:g} | {r['max_steps']} | "
        f"{'–' if r['peak_bytes'] is None else format(r['peak_bytes'] / 2**20, '.3g')} |"
        for r in sweep
    ]
    return "\n".join(lines) + "\n"


def class_figures(records) -> dict[str, str]:
    """The figure `write_outputs` draws for each problem class in `records`: {class: "suite-CLASS.png"}."""
    return {c: f"suite-{c.split(',')[0].replace(' ', '-')}.png" for c in dict.fromkeys(r["class"] for r in records)}


def write_outputs(result: dict, out: pathlib.Path) -> str:
    """suite.json, the `class_figures` (one panel per problem), `MEMORY_FIGURE` and table.md under `out`;
    returns the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "suite.json").write_text(json.dumps(result, indent=1, default=str))
    mode, device = " (quick)" if result["quick"] else "", result["records"][0]["device"]
    for category, name in class_figures(result["records"]).items():
        plots.violin_plot(
            [r for r in result["records"] if r["class"] == category],
            out / name,
            f"suite{mode}, {category}: gradient time, {device}",
        )
    plots.memory_plot(
        result["memory"],
        out / MEMORY_FIGURE,
        f"suite{mode}: peak memory of the gradient, long-horizon neural ODE, {device}",
    )
    parts = [
        f"# suite{mode}\n",
        tables.markdown_table(result["records"], result["skipped"]),
        f"## auto against diffrax's adjoints at a user's settings (max_steps={USER_MAX_STEPS}, tighter tolerances)\n",
        settings_table(result["records"]),
        "## Time to first gradient and peak memory\n",
        resources_table(result["records"]),
        "## Peak memory against the horizon (the long-horizon neural ODE, two save points)\n",
        sweep_table(result["memory"]),
        "## Targets\n",
        targets_table(result["targets"]),
    ]
    if result["selection"] is not None:
        parts += ["## Selection out of sample\n", selection.out_of_sample_table(result["selection"])]
    md = "\n".join(parts)
    (out / "table.md").write_text(md)
    return md


def run_suite(*, quick: bool = False, repeats: int | None = None, engines=None, out=None, families=None) -> dict:
    """Run the suite's `families` (default `FAMILIES`) into `out` (default results/suite), print their
    tables and targets, and return what was written: "problems" (the `plan`: `problems`, each with its
    `combinations` and at `user_settings`; the memory sweep; `write_outputs`), and "large-nonstiff" and
    "first-gradient" (`run_large_nonstiff`, `run_first_gradient`; `write_family`), under their names.
    `engines`: the JAX-traced `sciad.ad` engines (default: all installed); `repeats`: timed rounds per
    problem and tier of calls (default and time limit: `ROUNDS`; first gradient: repeats per side)."""
    traced = [e for e in ad.available() if ad.BACKENDS[e].traced]
    engines = traced if engines is None else list(engines)
    wrong = [e for e in engines if e not in traced]
    if wrong:
        raise ValueError(f"engines {wrong} are not installed JAX-traced engines; choose from {', '.join(traced)}")
    families = FAMILIES if families is None else tuple(families)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"families {unknown} are not the suite's; choose from {', '.join(FAMILIES)}")
    if repeats is not None and repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    rounds, budget = ROUNDS[quick]
    out = pathlib.Path(out or "results/suite")
    start = time.perf_counter()
    problems_plan = plan(engines, quick=quick) if PROBLEMS in families else []
    horizons, sweep_combos = SWEEP_HORIZONS[quick], sweep_combinations(quick) if PROBLEMS in families else []
    progress = harness.Progress(
        sum(len(c) + 1 for *_, c in problems_plan)
        + len(horizons) * len(sweep_combos)
        + (LARGE_NONSTIFF in families)
        * sum(len(large_nonstiff_combinations(b)) + 1 for b in large_nonstiff_plan(quick))
        + (FIRST_GRADIENT in families) * len(first_gradient_cases())
        + (SMALL in families) * small_progress_steps(quick)
    )
    result = {"suite": "sciad bench suite", "quick": quick, "families": list(families)}
    if PROBLEMS in families:
        records = []
        for category, setting, bench, combos in problems_plan:
            records += run_problem(
                bench, category, combos, repeats=repeats or rounds, budget=budget, progress=progress, setting=setting
            )
        sweep = memory_sweep(horizons, sweep_combos, progress)
        own = [r for r in records if r["setting"] is None]
        targets = speed_targets(own) + first_gradient_targets(own) + memory_targets(sweep)
        held = (
            None
            if quick
            else selection.out_of_sample(
                selection.cases_from_records(
                    records,
                    {
                        bench.name: selection.features(bench)
                        for _, setting, bench, _ in problems_plan
                        if setting is None
                    },
                )
            )
        )
        result.update(
            skipped=skipped_combinations(engines, quick=quick),
            records=records,
            memory=sweep,
            targets=targets,
            selection=held,
        )
    for family, run in ((LARGE_NONSTIFF, run_large_nonstiff), (FIRST_GRADIENT, run_first_gradient), (SMALL, run_small)):
        if family in families:
            result[family] = run(quick=quick, repeats=repeats, progress=progress)
    progress.close()
    result["seconds"] = time.perf_counter() - start
    if PROBLEMS in families:
        print(write_outputs(result, out))
    for family in (LARGE_NONSTIFF, FIRST_GRADIENT, SMALL):
        if family in families:
            print(write_family(result[family], out))
    print(f"suite ({', '.join(families)}): {result['seconds']:.0f} s -> {out}/", file=sys.stderr)
    return result


# The family "large non-stiff" (`run_large_nonstiff`): do the stored adjoints cost what the solve takes?

LARGE_NONSTIFF, FIRST_GRADIENT = "large-nonstiff", "first-gradient"
LARGE_STATES = {True: (2000,), False: (2000, 20_000)}  # by quick
LARGE_MAX_STEPS = (4096, USER_MAX_STEPS)  # the default and a user's
STORED = ("GaussAdjoint", "InterpolatingAdjoint")  # the stored continuous adjoints (jax-reverse)
# Targets: a stored adjoint ≤ 2× diffrax's fastest and ≤ 4× RCA's XLA temporaries; auto ≤ 1×.
STORED_SPEED, STORED_MEMORY, LARGE_AUTO_SPEED = 2.0, 4.0, 1.0
RCA = "diffrax RecursiveCheckpointAdjoint / jax"


def large_rhs(u, p, t):
    """u' = −p ⊙ u + 0.3 sin t (1 + u/(1 + u²)): n states, n parameters, a handful of Tsit5 steps on [0, 1]."""
    xp = ad.namespace(u, p)
    return -p * u + 0.3 * xp.sin(t) * (1 + u / (1 + u**2))


def final_squares(us):
    """Σ u(T)²: the squares of the last saved state."""
    return ad.namespace(us).sum(us[-1] ** 2)


def large_nonstiff(states: int, max_steps: int = 4096) -> Benchmark:
    """`large_rhs` with `states` states (u0 ~ U(0.5, 1.5), p ~ U(0.5, 2), seed 0), float64, Tsit5 at
    rtol = atol = 1e-6, saved at t = 0.5 and 1, loss `final_squares`; named "large-nonstiff-N", with
    " (max_steps=M)" where max_steps is not the default."""
    rng = np.random.default_rng(0)
    prob = sciad.ODEProblem(large_rhs, rng.uniform(0.5, 1.5, states), (0.0, 1.0), rng.uniform(0.5, 2.0, states))
    name = f"large-nonstiff-{states}" + ("" if max_steps == 4096 else f" (max_steps={max_steps})")
    return Benchmark(name, prob, np.array([0.5, 1.0]), final_squares, max_steps=max_steps)


def large_nonstiff_combinations(bench: Benchmark) -> list[Combination]:
    """The stored GaussAdjoint and InterpolatingAdjoint, DiscreteAdjoint, "auto", diffrax's
    RecursiveCheckpointAdjoint and BacksolveAdjoint."""
    return [
        *(sciad_combination(s, "jax-reverse") for s in STORED),
        sciad_combination("DiscreteAdjoint"),
        auto_combination(bench),
        diffrax_peer("RecursiveCheckpointAdjoint"),
        diffrax_peer("BacksolveAdjoint"),
    ]


def large_nonstiff_plan(quick: bool) -> list[Benchmark]:
    return [large_nonstiff(n, m) for m in LARGE_MAX_STEPS for n in LARGE_STATES[quick]]


def with_large_ratios(records) -> list[dict]:
    """Each record with `vs_fastest_diffrax` (median / the fastest correct diffrax adjoint's) and
    `vs_rca_temp` (XLA temporaries / diffrax RecursiveCheckpointAdjoint's), per problem."""
    rows = []
    for group in _by_problem(records).values():
        peer = fastest([r for r in group if r["is_peer"]])
        rca = next((r for r in group if r["label"] == RCA and r["temp_bytes"]), None)
        for r in group:
            rows.append(
                {
                    **r,
                    "vs_fastest_diffrax": r["median_s"] / peer["median_s"] if r["median_s"] and peer else None,
                    "vs_rca_temp": r["temp_bytes"] / rca["temp_bytes"] if r["temp_bytes"] is not None and rca else None,
                }
            )
    return rows


def large_nonstiff_targets(records) -> list[dict]:
    """Per problem: each `STORED` adjoint ≤ `STORED_SPEED`× diffrax's fastest and ≤ `STORED_MEMORY`× RCA's
    temporaries; auto ≤ `LARGE_AUTO_SPEED`×."""
    out = []
    for r in with_large_ratios(records):
        stored = r["sensealg"] in STORED
        if stored or r["sensealg"].startswith(AUTO):
            measured = (
                f"{1e3 * r['median_s']:.3g} ms, {r['temp_bytes'] / 2**20:.3g} MiB" if r["ok"] else tables.status(r)
            )
            name = "stored " + r["sensealg"] if stored else "auto"
            out.append(
                _target(
                    f"{name} ≤ {STORED_SPEED if stored else LARGE_AUTO_SPEED:g}× diffrax's fastest",
                    r["problem"],
                    STORED_SPEED if stored else LARGE_AUTO_SPEED,
                    r["vs_fastest_diffrax"],
                    measured,
                    "a stored adjoint is to keep up with diffrax's own",
                )
            )
            if stored:
                out.append(
                    _target(
                        f"stored {r['sensealg']} ≤ {STORED_MEMORY:g}× RCA's temporaries",
                        r["problem"],
                        STORED_MEMORY,
                        r["vs_rca_temp"],
                        measured,
                        "a stored adjoint is to keep up with diffrax's own",
                    )
                )
    return out


def large_nonstiff_table(records) -> str:
    lines = [
        "| problem | combination | median (ms) | / diffrax's fastest | XLA temporaries (MiB) | / RCA's | "
        "first gradient (s) | rel. error | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in with_large_ratios(records):
        if r["kind"] == "baseline":
            continue
        temp = None if r["temp_bytes"] is None else r["temp_bytes"] / 2**20
        lines.append(
            f"| {r['problem']} | {r['label']}{' (peer)' if r['is_peer'] else ''} | "
            f"{tables.seconds(r['median_s'] and 1e3 * r['median_s'])} | "
            f"{_ratio(r['vs_fastest_diffrax'])} | {tables.seconds(temp)} | {_ratio(r['vs_rca_temp'])} | "
            f"{tables.seconds(r['compile_time'])} | "
            f"{'–' if r['rel_error'] is None else format(r['rel_error'], '.1e')} | {tables.status(r)} |"
        )
    return "\n".join(lines) + "\n"


def _ratio(x) -> str:
    return "–" if x is None else f"{x:.2f}"


def run_large_nonstiff(*, quick: bool, repeats: int | None = None, progress=None) -> dict:
    """The family's records (`run_problem` on each of `large_nonstiff_plan`: gradients checked against
    a float64 DiscreteAdjoint at rtol = 1e-10, then timed in interleaved rounds, with XLA's
    `temp_bytes`), its targets and the machine's load before and after."""
    benches = large_nonstiff_plan(quick)
    rounds, budget = ROUNDS[quick]
    load = [_load()]
    records = []
    for bench in benches:
        records += run_problem(
            bench,
            LARGE_NONSTIFF,
            large_nonstiff_combinations(bench),
            repeats=repeats or rounds,
            budget=budget,
            progress=progress,
        )
    load.append(_load())
    return {
        "family": LARGE_NONSTIFF,
        "quick": quick,
        "records": records,
        "targets": large_nonstiff_targets(records),
        "load": load,
    }


def _load() -> list[float]:
    """The machine's 1-, 5- and 15-minute load averages (`uptime`)."""
    return [round(x, 2) for x in os.getloadavg()]


# The family "first gradient" (`run_first_gradient`): how long a user waits after each edit.

STAGES = ("trace", "lower", "compile", "run")
SIDES = ('"auto"', "diffrax RecursiveCheckpointAdjoint")  # each case's gradient by sciad and by its peer
FIRST_GRADIENT_REPEATS = 3
FIRST_GRADIENT_TARGET = 0.7  # "auto" / diffrax RCA (aim 0.5)
EVENT_TARGET = 2.0  # an event solve's first gradient / the same solve's without events
CACHE_EXAMPLE = "lotka-volterra"  # the case `persistent_cache_example` runs in fresh processes


@dataclasses.dataclass(frozen=True)
class FirstGradientCase:
    """A gradient to wait for: `gradient(side)` (a `SIDES` entry) returns a fresh `jax.jit(jax.grad(loss))`
    of `inputs` (a PyTree), nothing shared with an earlier call (a new f, as after a user's edit);
    the two sides' gradients agree within `tolerance`. `without`: for an event solve, the name of
    the same solve's case without its events."""

    name: str
    inputs: Any
    gradient: Callable[[str], Callable]
    tolerance: float
    pick: Callable[[], str | None]
    without: str | None = None


def _fresh(bench: Benchmark) -> Benchmark:
    """`bench` with its problem made again around a new function calling its f."""
    f, prob = bench.problem.f, bench.problem
    return dataclasses.replace(bench, problem=sciad.ODEProblem(lambda u, p, t: f(u, p, t), prob.u0, prob.tspan, prob.p))


def benchmark_case(bench: Benchmark) -> FirstGradientCase:
    """A `Benchmark`'s objective by "auto" and by `diffrax_peer`'s RecursiveCheckpointAdjoint."""

    def gradient(side):
        fresh = _fresh(bench)
        if side == SIDES[0]:
            return jax.jit(jax.grad(lambda p: fresh.objective(p, "auto")))
        return diffrax_peer("RecursiveCheckpointAdjoint").build(fresh)

    return FirstGradientCase(
        bench.name,
        jnp.asarray(bench.inputs),
        gradient,
        max(100 * bench.rtol, GRADIENT_TOLERANCE),
        lambda: harness.auto_pick(bench),
    )


def mlp_node_case() -> FirstGradientCase:
    """A neural ODE u' = MLP(u) in float32 with an equinox MLP as p (2 → 48 tanh → 2, no final bias:
    240 parameters), u0 = (2, 0), t ≤ 1.5, 10 save points, squared error to the true spiral."""
    mlp = eqx.nn.MLP(2, 2, 48, 1, activation=jnp.tanh, use_final_bias=False, key=jax.random.key(0), dtype=jnp.float32)
    params, static = eqx.partition(mlp, eqx.is_array)
    u0, ts, tol = np.array([2.0, 0.0], np.float32), np.linspace(0.0, 1.5, 10), 1e-5
    data = jnp.asarray(spiral_data(u0, ts))

    def problem():
        return sciad.ODEProblem(lambda u, p, t: eqx.combine(p, static)(u), u0, (0.0, 1.5), params)

    def gradient(side):
        if side == SIDES[0]:
            prob = problem()

            def loss(p):
                return jnp.sum((sciad.solve(prob, p=p, saveat=ts, rtol=tol, atol=tol).us - data) ** 2)
        else:
            solver, term = get_solver("tsit5"), dfx.ODETerm(lambda t, u, p: eqx.combine(p, static)(u))

            def loss(p):
                sol = dfx.diffeqsolve(
                    term,
                    solver,
                    0.0,
                    1.5,
                    None,
                    jnp.asarray(u0),
                    args=p,
                    saveat=dfx.SaveAt(ts=jnp.asarray(ts, jnp.float32)),
                    stepsize_controller=step_controller(solver, tol, tol),
                    max_steps=4096,
                    adjoint=dfx.RecursiveCheckpointAdjoint(),
                )
                return jnp.sum((sol.ys - data) ** 2)  # pyright: ignore[reportOptionalOperand]  # saved: not None

        return jax.jit(jax.grad(loss))

    def pick():
        alg = sciad.select_sensealg(problem(), saveat=ts, rtol=tol, atol=tol).sensealg
        return describe(alg, engine=False)

    return FirstGradientCase("mlp-node-240", params, gradient, 100 * tol, pick)


def bouncing_ball_case(events: bool) -> FirstGradientCase:
    """`sciad_bench.events`' bouncing ball, (h(2)² + v(2)²) in (h0, e): with its event (a
    `ContinuousCallback` with a restitution affect, at most 4; diffrax: a loop of 4 solves, 3 stopped
    by an `Event`, as `sciad bench events` writes it), or the same solve without it (one solve)."""

    def gradient(side):
        case = bouncing_ball(3 if events else 0)  # its own functions, each repeat
        if side == SIDES[0]:
            return jax.jit(jax.grad(lambda x: case.objective(x)))
        return jax.jit(jax.grad(lambda x: case.diffrax_loss(x, dfx.RecursiveCheckpointAdjoint(), case.rtol, case.atol)))

    name = "bouncing-ball" + ("" if events else " (no events)")
    return FirstGradientCase(
        name,
        jnp.array([1.0, 0.9]),
        gradient,
        100 * bouncing_ball().rtol,
        lambda: None,
        without="bouncing-ball (no events)" if events else None,
    )


def first_gradient_cases() -> list[FirstGradientCase]:
    """Lotka–Volterra, the MLP neural ODE, the Oregonator (Kvaerno5), the suite's spiral and
    long-horizon neural ODEs, the bouncing ball with and without its event."""
    return [
        benchmark_case(lotka_volterra()),
        mlp_node_case(),
        benchmark_case(oregonator()),
        benchmark_case(spiral_node()),
        benchmark_case(hamiltonian_node()),
        bouncing_ball_case(True),
        bouncing_ball_case(False),
    ]


def stages(jitted, inputs) -> tuple[dict, Any, tuple]:
    """Seconds in each of `STAGES` of `jitted`'s first gradient at `inputs` (`jax.stages`: trace, lower,
    compile, the first call waited on), and `total`; its output; (its Traced, its Lowered)."""
    times, start = {}, time.perf_counter()
    traced = jitted.trace(inputs)
    times["trace"], start = time.perf_counter() - start, time.perf_counter()
    lowered = traced.lower()
    times["lower"], start = time.perf_counter() - start, time.perf_counter()
    compiled_fn = lowered.compile()
    times["compile"], start = time.perf_counter() - start, time.perf_counter()
    out = jax.block_until_ready(compiled_fn(inputs))
    times["run"] = time.perf_counter() - start
    times["total"] = sum(times[s] for s in STAGES)
    return times, out, (traced, lowered)


def _equations(jaxpr) -> int:
    """Equations in a jaxpr, those of the jaxprs in its equations' parameters included."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)

    def inner(value):
        if hasattr(value, "eqns") or hasattr(getattr(value, "jaxpr", None), "eqns"):
            return _equations(value)
        if isinstance(value, (tuple, list)):
            return sum(inner(v) for v in value)
        return 0

    return sum(1 + sum(inner(v) for v in eqn.params.values()) for eqn in jaxpr.eqns)


def program_size(traced, lowered) -> dict:
    """`equations`: of the traced jaxpr, nested ones included; of the lowered StableHLO: `hlo_lines`, `loops`
    (while), `conds` (case and if) and `callbacks` (custom calls to a host callback: equinox's checks,
    sciad's warnings)."""
    text = lowered.as_text()
    return {
        "equations": _equations(traced.jaxpr),
        "hlo_lines": len(text.splitlines()),
        "loops": text.count("stablehlo.while"),
        "conds": text.count("stablehlo.case") + text.count("stablehlo.if"),
        "callbacks": len(re.findall(r"custom_call @\w*callback", text)),
    }


def first_gradient(case: FirstGradientCase, repeats: int = FIRST_GRADIENT_REPEATS, progress=None) -> list[dict]:
    """One record per side of `case`: each stage's median over `repeats` fresh first gradients (the
    sides interleaved, their order alternating), `total_s` the median of the totals, every repeat's
    times, the program's size and, from the first repeat, the gradients' `rel_error` (auto's against
    the peer's; `ok` within the case's tolerance); auto's label names its pick where the case says."""
    runs, outs, sizes = {s: [] for s in SIDES}, {}, {}
    for i in range(repeats):
        for side in SIDES if i % 2 == 0 else SIDES[::-1]:
            if progress is not None:
                progress.show(f"first gradient: {case.name}", f"{side}, repeat {i + 1}/{repeats}")
            times, out, programs = stages(case.gradient(side), case.inputs)
            runs[side].append(times)
            if i == 0:
                outs[side], sizes[side] = out, program_size(*programs)
    error = relative_error(outs[SIDES[0]], outs[SIDES[1]])
    pick = case.pick()
    return [
        {
            "problem": case.name,
            "side": side,
            "label": (f"{AUTO} {pick}" if pick else "auto") if side == SIDES[0] else side,
            "stages_s": {s: float(np.median([t[s] for t in runs[side]])) for s in STAGES},
            "total_s": float(np.median([t["total"] for t in runs[side]])),
            "repeats": runs[side],
            **sizes[side],
            "rel_error": error,
            "ok": bool(error <= case.tolerance),
            "without": case.without,
        }
        for side in SIDES
    ]


def first_gradient_family_targets(records) -> list[dict]:
    """auto's first gradient / diffrax RCA's per case (≤ `FIRST_GRADIENT_TARGET`), and each event
    solve's / the same solve's without events, per side (≤ `EVENT_TARGET`)."""
    out, by = [], {(r["problem"], r["side"]): r for r in records}
    for problem in dict.fromkeys(r["problem"] for r in records):
        auto, peer = by[(problem, SIDES[0])], by[(problem, SIDES[1])]
        ratio = auto["total_s"] / peer["total_s"] if auto["ok"] else None
        why = _where(auto, peer) if auto["ok"] else f"gradients differ: relative error {auto['rel_error']:.1e}"
        out.append(
            _target(
                f"first gradient ≤ {FIRST_GRADIENT_TARGET:g}× diffrax RCA's",
                problem,
                FIRST_GRADIENT_TARGET,
                ratio,
                f"{auto['total_s']:.2f} s vs {peer['total_s']:.2f} s",
                why,
            )
        )
        if auto["without"]:
            for side in SIDES:
                with_, without = by[(problem, side)], by[(auto["without"], side)]
                out.append(
                    _target(
                        f"{side}: events ≤ {EVENT_TARGET:g}× without",
                        problem,
                        EVENT_TARGET,
                        with_["total_s"] / without["total_s"],
                        f"{with_['total_s']:.2f} s vs {without['total_s']:.2f} s",
                        _where(with_, without),
                    )
                )
    return out


def _where(slow: dict, fast: dict) -> str:
    """Where `slow`'s first gradient spends more than `fast`'s, stage by stage."""
    return "; ".join(
        f"{s} {slow['stages_s'][s]:.2f} vs {fast['stages_s'][s]:.2f} s"
        for s in STAGES
        if s != "run" or slow["stages_s"][s] > 0.05
    )


def first_gradient_table(records) -> str:
    lines = [
        "| problem | side | trace (s) | lower (s) | compile (s) | run (s) | total (s) | auto / RCA | "
        "jaxpr equations | StableHLO lines | loops / conds / callbacks | rel. error |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by = {(r["problem"], r["side"]): r for r in records}
    for r in records:
        peer = by[(r["problem"], SIDES[1])]
        ratio = f"**{r['total_s'] / peer['total_s']:.2f}**" if r["side"] == SIDES[0] else ""
        lines.append(
            f"| {r['problem']} | {r['label']} | "
            + " | ".join(f"{r['stages_s'][s]:.3g}" for s in STAGES)
            + f" | {r['total_s']:.3g} | {ratio} | {r['equations']} | {r['hlo_lines']} | "
            f"{r.get('loops', '–')} / {r.get('conds', '–')} / {r.get('callbacks', '–')} | "
            f"{r['rel_error']:.1e}{'' if r['ok'] else ' WRONG'} |"
        )
    return "\n".join(lines) + "\n"


def _cache_probe(name: str, side: str, cache_dir: str) -> dict:
    """`stages` of case `name`'s first gradient by `side` in this process, with JAX's persistent
    compilation cache at `cache_dir` (none if empty); run in a fresh process by `persistent_cache_example`."""
    if cache_dir:
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    case = next(c for c in first_gradient_cases() if c.name == name)
    return stages(case.gradient(side), case.inputs)[0]


def persistent_cache_example(name: str = CACHE_EXAMPLE, progress=None) -> list[dict]:
    """Case `name`'s first gradient, each side, in fresh processes: without the persistent cache, then with
    it empty (cold: written) and filled by that run (warm), with equinox's checks raising (`EQX_ON_ERROR`
    unset: host callbacks, which JAX does not cache) and as NaN (`EQX_ON_ERROR=nan`); `stages`, the
    process's wall time and the bytes the cache holds after it."""
    rows = []
    script = (
        "import json, sys, jax; jax.config.update('jax_enable_x64', True); "
        "from sciad_bench.suite import _cache_probe; print(json.dumps(_cache_probe(*sys.argv[1:])))"
    )
    with tempfile.TemporaryDirectory() as cache:
        for side in SIDES:
            runs = [("no cache", "", None)] + [
                (
                    f"cache {state}{'' if on_error is None else ', EQX_ON_ERROR=nan'}",
                    f"{cache}/{SIDES.index(side)}-{on_error}",
                    on_error,
                )
                for on_error in (None, "nan")
                for state in ("cold", "warm")
            ]
            for setting, folder, on_error in runs:
                if progress is not None:
                    progress.show(f"persistent cache: {name}", f"{side}, {setting}")
                env = {k: v for k, v in os.environ.items() if k != "EQX_ON_ERROR"}
                env.update({} if on_error is None else {"EQX_ON_ERROR": on_error})
                start = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-c", script, name, side, folder],
                    capture_output=True,
                    text=True,
                    check=True,
                    env=env,
                )
                rows.append(
                    {
                        "problem": name,
                        "side": side,
                        "setting": setting,
                        "process_s": time.perf_counter() - start,
                        "stages_s": json.loads(done.stdout.strip().splitlines()[-1]),
                        "cache_bytes": sum(f.stat().st_size for f in pathlib.Path(folder).rglob("*") if f.is_file())
                        if folder
                        else None,
                    }
                )
    return rows


def cache_table(rows) -> str:
    lines = [
        "| side | setting | trace (s) | lower (s) | compile (s) | run (s) | first gradient (s) | process (s) | "
        "cache (KiB) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['side']} | {r['setting']} | "
        + " | ".join(f"{r['stages_s'][s]:.3g}" for s in STAGES)
        + f" | {r['stages_s']['total']:.3g} | {r['process_s']:.3g} | "
        f"{'–' if r['cache_bytes'] is None else format(r['cache_bytes'] / 1024, '.0f')} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def run_first_gradient(*, quick: bool, repeats: int | None = None, progress=None) -> dict:
    """The family's records (`first_gradient` of each of `first_gradient_cases`, after one first gradient of
    each side of the first case, not recorded: a fresh process's first gradient is the
    `persistent_cache_example`'s "no cache"; quick: 1 repeat), its targets, the `persistent_cache_example`
    (full mode) and the machine's load before and after."""
    load, records, cases = [_load()], [], first_gradient_cases()
    for side in SIDES:  # the process's one-time work (JAX's caches of its own helpers), outside every case's times
        if progress is not None:
            progress.show("first gradient: warming up", side)
        stages(cases[0].gradient(side), cases[0].inputs)
    for case in cases:
        records += first_gradient(case, repeats or (1 if quick else FIRST_GRADIENT_REPEATS), progress)
        if progress is not None:
            progress.step(f"first gradient: {case.name}")
    cache = [] if quick else persistent_cache_example(progress=progress)
    load.append(_load())
    return {
        "family": FIRST_GRADIENT,
        "quick": quick,
        "records": records,
        "targets": first_gradient_family_targets(records),
        "cache": cache,
        "load": load,
    }


# The family "small" (`run_small`): the fixed cost of a solve, against a compiled native solver.

SMALL = "small"
DIFFSOL = "diffsol-jax"
SMALL_WARM_TARGET, SMALL_FIRST_TARGET = 1.5, 3.0  # "auto" / diffsol-jax, warm and first gradient
# Timed rounds (one call each, interleaved) and the seconds after which they stop, by quick: a call takes
# 0.1 to 80 ms, so many rounds are cheap and steady the medians of the fastest.
SMALL_ROUNDS = {True: (30, 5.0), False: (400, 60.0)}
SMALL_FIRST_REPEATS = {True: 1, False: 3}  # fresh processes per side and problem
SMALL_STAGES = ("build", *STAGES)  # build: the gradient function made (diffsol-jax compiles f by Cranelift)
SMALL_SIDES = ("auto", "diffrax", DIFFSOL)


def small_sides() -> tuple[str, ...]:
    """`SMALL_SIDES`, without diffsol-jax where it is not installed (its rows then missing, its targets unmeasured)."""
    return SMALL_SIDES if importlib.util.find_spec("diffsol_jax") else SMALL_SIDES[:2]


@dataclasses.dataclass(frozen=True)
class SmallCase:
    """A small problem: its benchmark, diffrax's solver for it (None: the benchmark's) and diffsol-jax's method."""

    bench: Benchmark
    diffrax_solver: str | None
    diffsol_method: str


def robertson_rhs(u, theta, t):
    """Robertson's kinetics in k = exp(θ): y1' = −k1 y1 + k3 y2 y3, y2' = k1 y1 − k3 y2 y3 − k2 y2², y3' = k2 y2²."""
    xp = ad.namespace(u, theta)
    k1, k2, k3 = xp.exp(theta[0]), xp.exp(theta[1]), xp.exp(theta[2])
    return xp.stack([-k1 * u[0] + k3 * u[1] * u[2], k1 * u[0] - k3 * u[1] * u[2] - k2 * u[1] ** 2, k2 * u[1] ** 2])


def robertson_loss(us):
    """Σ_t (y1 + 10⁴ y2 + y3): y2 (≤ 4e-5) weighted to count."""
    return ad.namespace(us).sum(us[:, 0] + 1e4 * us[:, 1] + us[:, 2])


def robertson() -> Benchmark:
    """Robertson's ODE (3 states), θ = log(k1, k2, k3) at (0.04, 3e7, 1e4), y(0) = (1, 0, 0), t ≤ 40, saved at
    0.4, 4 and 40 (as `sciad bench dae`'s DAE form), `robertson_loss`; rtol 1e-8, atol 1e-10, solver "auto"."""
    prob = sciad.ODEProblem(robertson_rhs, np.array([1.0, 0.0, 0.0]), (0.0, 40.0), np.log([0.04, 3e7, 1e4]))
    return Benchmark(
        "robertson", prob, np.array([0.4, 4.0, 40.0]), robertson_loss, rtol=1e-8, atol=1e-10, solver="auto"
    )


def small_cases() -> list[SmallCase]:
    """Lotka–Volterra (`sciad.problems.lotka_volterra`: 101 saves, Tsit5 at rtol 1e-6) against diffsol-jax's
    Tsit45, and `robertson` (solver "auto") against diffrax's Kvaerno5 and diffsol-jax's BDF."""
    return [SmallCase(lotka_volterra(), None, "tsit45"), SmallCase(robertson(), "kvaerno5", "bdf")]


def small_combinations(case: SmallCase) -> list[Combination]:
    """ "auto", every other sciad sensealg (engines jax-reverse, jax-forward; with an implicit solver no
    BacksolveAdjoint), diffrax's RecursiveCheckpointAdjoint, ForwardMode (and BacksolveAdjoint with an
    explicit solver) and diffsol-jax (where installed)."""
    implicit = selection.features(case.bench).implicit_solver
    auto = auto_combination(case.bench)
    engine = {"vjp": "jax-reverse", "jvp": "jax-forward"}
    sciad_ = [sciad_combination(v, engine[o] if (o := engine_option(v)) else None) for v in harness.VARIANTS]
    sciad_ = [
        c
        for c in sciad_
        if sensealg_name(c) != sensealg_name(auto) and not (implicit and c.sensealg == "BacksolveAdjoint")
    ]
    adjoints = PEERS[:2] if implicit else PEERS[:3]
    return [
        auto,
        *sciad_,
        *(diffrax_peer(a, case.diffrax_solver) for a in adjoints),
        *([diffsol_peer(case.diffsol_method)] if DIFFSOL in small_sides() else []),
    ]


def small_side(case: SmallCase, side: str, adjoint: str = "RecursiveCheckpointAdjoint") -> Combination:
    """The combination of `side` (a `SMALL_SIDES` entry) for the first gradient: "auto", diffrax's `adjoint`,
    diffsol-jax; made without `sciad.select`'s features, which would run code of the solve beforehand."""
    if side == "auto":
        return Combination("auto", None, lambda bench: jax.jit(jax.grad(lambda p: _fresh(bench).objective(p, "auto"))))
    if side == "diffrax":
        peer = diffrax_peer(adjoint, case.diffrax_solver)
        return dataclasses.replace(peer, build=lambda bench: peer.build(_fresh(bench)))
    return diffsol_peer(case.diffsol_method)


def _small_probe(problem: str, side: str, adjoint: str) -> dict:
    """The first gradient of `side` on `problem` in this (fresh) process, after JAX's backend is up: the
    seconds of each of `SMALL_STAGES` and `total`, the program's size (`program_size`) and the gradient;
    `again_s`: the seconds of a second first gradient in this process, of a new f (the process's one-time
    work done; diffsol-jax keeps the native code of an f whose DiffSL text it has compiled)."""
    if side == DIFFSOL:
        import diffsol_jax  # noqa: F401  (its import is not the first gradient's)
    case = next(c for c in small_cases() if c.bench.name == problem)
    inputs = jnp.asarray(case.bench.inputs)
    jax.block_until_ready(jax.jit(lambda x: x + 1)(inputs))
    runs = []
    for _ in range(2):
        start = time.perf_counter()
        jitted = small_side(case, side, adjoint).build(case.bench)
        build = time.perf_counter() - start
        times, out, programs = stages(jitted, inputs)
        runs.append(({"build": build, **times, "total": build + times["total"]}, out, programs))
    (times, out, programs), again = runs[0], runs[1][0]
    return {
        "stages_s": times,
        "again_s": again["total"],
        **program_size(*programs),
        "gradient": np.asarray(out).tolist(),
    }


def small_first_gradient(case: SmallCase, adjoint: str, reference, repeats: int, progress=None) -> list[dict]:
    """One record per `small_sides` entry: `_small_probe` in `repeats` fresh processes each (the sides
    interleaved, their order alternating), each stage's median, `total_s` the totals' median, `process_s`
    the processes' wall time (imports included), every repeat's stages, the program's size and the
    gradient's `rel_error` against `reference` (first repeat; `ok` within the suite's tolerance)."""
    script = (
        "import json, sys, jax; jax.config.update('jax_enable_x64', True); "
        "from sciad_bench.suite import _small_probe; print(json.dumps(_small_probe(*sys.argv[1:])))"
    )
    root = str(pathlib.Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    sides = small_sides()
    runs = {s: [] for s in sides}
    for i in range(repeats):
        for side in sides if i % 2 == 0 else sides[::-1]:
            if progress is not None:
                progress.show(f"first gradient: {case.bench.name}", f"{side}, fresh process {i + 1}/{repeats}")
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-c", script, case.bench.name, side, adjoint],
                capture_output=True,
                text=True,
                env=env,
            )
            if done.returncode != 0:
                raise RuntimeError(f"first gradient of {side} on {case.bench.name}: {done.stderr.strip()[-2000:]}")
            runs[side].append(
                {**json.loads(done.stdout.strip().splitlines()[-1]), "process_s": time.perf_counter() - start}
            )
        if progress is not None:
            progress.step(f"first gradient: {case.bench.name}, repeat {i + 1}")
    tolerance = max(100 * case.bench.rtol, GRADIENT_TOLERANCE)
    labels = {s: small_side(case, s, adjoint).label for s in sides} | {
        "auto": f"{AUTO} {harness.auto_pick(case.bench)}"
    }
    records = []
    for side in sides:
        first = runs[side][0]
        error = relative_error(np.asarray(first["gradient"]), reference)
        records.append(
            {
                "problem": case.bench.name,
                "side": side,
                "label": labels[side],
                "stages_s": {s: float(np.median([r["stages_s"][s] for r in runs[side]])) for s in SMALL_STAGES},
                "total_s": float(np.median([r["stages_s"]["total"] for r in runs[side]])),
                "process_s": float(np.median([r["process_s"] for r in runs[side]])),
                "again_s": float(np.median([r["again_s"] for r in runs[side]])),
                "repeats": [r["stages_s"] for r in runs[side]],
                **{k: first[k] for k in ("equations", "hlo_lines", "loops", "conds", "callbacks")},
                "rel_error": error,
                "ok": bool(error <= tolerance),
            }
        )
    return records


def _fastest_diffrax(group) -> dict | None:
    return fastest([r for r in group if r["kind"] == "peer" and r["label"].startswith("diffrax")])


def _diffsol(group) -> dict | None:
    return next((r for r in group if r["kind"] == "peer" and r["label"].startswith(DIFFSOL)), None)


def small_targets(records, first) -> list[dict]:
    """Per problem, auto's warm median / diffsol-jax's (≤ `SMALL_WARM_TARGET`) and auto's first gradient
    in a fresh process / diffsol-jax's (≤ `SMALL_FIRST_TARGET`)."""
    out = []
    for problem, group in _by_problem(records).items():
        auto, peer = _auto(group), _diffsol(group)
        if auto is not None and peer is not None and auto["ok"] and peer["ok"]:
            ratio = auto["median_s"] / peer["median_s"]
            measured = f"{1e3 * auto['median_s']:.3g} ms vs {1e3 * peer['median_s']:.3g} ms"
            why = f"auto's pick by rule `{auto['rule']}`; {_better(group, 'median_s', peer)}"
        else:
            ratio, why = None, "not both correct"
            measured = (
                f"auto: {tables.status(auto) if auto else 'absent'}; "
                f"{DIFFSOL}: {tables.status(peer) if peer else 'absent'}"
            )
        target = f"warm gradient ≤ {SMALL_WARM_TARGET:g}× {DIFFSOL}'s"
        out.append(_target(target, problem, SMALL_WARM_TARGET, ratio, measured, why))
        sides = {r["side"]: r for r in first if r["problem"] == problem}
        if "auto" in sides and DIFFSOL in sides:
            a, d = sides["auto"], sides[DIFFSOL]
            good = a["ok"] and d["ok"]
            out.append(
                _target(
                    f"first gradient ≤ {SMALL_FIRST_TARGET:g}× {DIFFSOL}'s",
                    problem,
                    SMALL_FIRST_TARGET,
                    a["total_s"] / d["total_s"] if good else None,
                    f"{a['total_s']:.2f} s vs {d['total_s']:.2f} s",
                    "; ".join(f"{s} {a['stages_s'][s]:.2f} vs {d['stages_s'][s]:.2f} s" for s in SMALL_STAGES)
                    if good
                    else f"gradients off: {a['rel_error']:.1e}, {d['rel_error']:.1e}",
                )
            )
    return out


def small_table(records) -> str:
    lines = [
        f"| problem | combination | median (ms) | / {DIFFSOL}'s | / diffrax's fastest | first call in process (s) | "
        "rel. error | status |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for group in _by_problem(records).values():
        peer, diffsol = _fastest_diffrax(group), _diffsol(group)
        for r in sorted(group, key=lambda r: (r["median_s"] is None, r["median_s"] or 0.0)):
            ok = r["median_s"] is not None
            label = f"**{r['label']}**" if r["sensealg"].startswith(AUTO) else r["label"]
            lines.append(
                f"| {r['problem']} | {label}{' (peer)' if r['is_peer'] else ''} | "
                f"{tables.seconds(ok and 1e3 * r['median_s'])} | "
                f"{_ratio(r['median_s'] / diffsol['median_s'] if ok and diffsol and diffsol['ok'] else None)} | "
                f"{_ratio(r['median_s'] / peer['median_s'] if ok and peer else None)} | "
                f"{tables.seconds(r['compile_time'])} | "
                f"{'–' if r['rel_error'] is None else format(r['rel_error'], '.1e')} | {tables.status(r)} |"
            )
    return "\n".join(lines) + "\n"


def small_first_table(first) -> str:
    lines = [
        "| problem | side | "
        + " | ".join(f"{s} (s)" for s in SMALL_STAGES)
        + f" | total (s) | / {DIFFSOL}'s | new f, same process (s) | process (s) | jaxpr equations | StableHLO lines | "
        "loops / conds / callbacks | rel. error |",
        "|---|---|" + "---:|" * (len(SMALL_STAGES) + 9),
    ]
    by = {(r["problem"], r["side"]): r for r in first}
    for r in first:
        peer = by.get((r["problem"], DIFFSOL))
        lines.append(
            f"| {r['problem']} | {r['label']} | "
            + " | ".join(f"{r['stages_s'][s]:.3g}" for s in SMALL_STAGES)
            + f" | {r['total_s']:.3g} | {_ratio(r['total_s'] / peer['total_s'] if peer else None)} | "
            f"{r['again_s']:.3g} | {r['process_s']:.3g} | {r['equations']} | {r['hlo_lines']} | "
            f"{r['loops']} / {r['conds']} / {r['callbacks']} | {r['rel_error']:.1e}{'' if r['ok'] else ' WRONG'} |"
        )
    return "\n".join(lines) + "\n"


def run_small(*, quick: bool, repeats: int | None = None, progress=None) -> dict:
    """The family's records: each of `small_cases` by `small_combinations` (`run_problem`: gradients checked
    against a float64 DiscreteAdjoint at rtol = 1e-10, then timed in interleaved rounds, `SMALL_ROUNDS`), then
    the first gradient of "auto", diffrax's fastest adjoint there and diffsol-jax in fresh processes
    (`small_first_gradient`, `SMALL_FIRST_REPEATS`); its targets and the machine's load before and after."""
    rounds, budget = SMALL_ROUNDS[quick]
    load, records, first = [_load()], [], []
    for case in small_cases():
        records += run_problem(
            case.bench, SMALL, small_combinations(case), repeats=repeats or rounds, budget=budget, progress=progress
        )
    for case in small_cases():
        peer = _fastest_diffrax([r for r in records if r["problem"] == case.bench.name])
        adjoint = peer["sensealg"].split()[1] if peer else "RecursiveCheckpointAdjoint"
        first += small_first_gradient(
            case, adjoint, harness.reference_gradient(case.bench), SMALL_FIRST_REPEATS[quick], progress
        )
    load.append(_load())
    return {
        "family": SMALL,
        "quick": quick,
        "records": records,
        "first": first,
        "targets": small_targets(records, first),
        "load": load,
    }


def small_progress_steps(quick: bool) -> int:
    """The stages `run_small` counts: each combination compiled, each problem timed, each first-gradient repeat."""
    return sum(len(small_combinations(c)) + 1 + SMALL_FIRST_REPEATS[quick] for c in small_cases())


def small_markdown(result) -> str:
    first_repeats = max(len(r["repeats"]) for r in result["first"])
    return "\n".join(
        [
            f"# suite: small problems{' (quick)' if result['quick'] else ''}\n",
            "Lotka–Volterra (2 states, 4 parameters, t ≤ 10, 101 saves, Σ u, Tsit5 at rtol = atol = 1e-6; "
            "diffsol-jax Tsit45) and Robertson (3 states, θ = log k, t ≤ 40, 3 saves, Σ (y1 + 10⁴ y2 + y3), "
            'rtol 1e-8, atol 1e-10, sciad\'s solver "auto"; diffrax Kvaerno5, diffsol-jax BDF), float64. '
            f"diffsol-jax {_version('diffsol-jax')}: a Rust solver in an XLA custom call, f compiled to native "
            "code by Cranelift, `jax.grad` by transposing its forward sensitivities. Each gradient checked against "
            "a float64 DiscreteAdjoint at rtol = 1e-10 before timing; warm: interleaved rounds of one call each "
            "in one process, medians; first gradient: in fresh processes (a new f each), after imports and one "
            "trivial jitted call, split into build (the gradient function made: diffsol-jax compiles f there), "
            f'trace, lower, compile and the first call; medians of {first_repeats}; "new f, same process": '
            "a second first gradient in that process, of a new f (diffsol-jax reuses the native code of a DiffSL "
            f"text it has compiled). The targets: auto "
            f"≤ {SMALL_WARM_TARGET:g}× diffsol-jax warm (aim: faster), ≤ {SMALL_FIRST_TARGET:g}× for the first "
            f"gradient. Machine: {_machine(result)}.\n",
            "## Warm gradient\n",
            small_table(result["records"]),
            "## First gradient (fresh processes)\n",
            small_first_table(result["first"]),
            "## Targets\n",
            targets_table(result["targets"]),
        ]
    )


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "(not installed)"


# The families together: `run_suite(families=...)`, `sciad bench suite --family NAME`.

PROBLEMS = "problems"
FAMILIES = (PROBLEMS, LARGE_NONSTIFF, FIRST_GRADIENT, SMALL)


def family_outputs(family: str) -> tuple[str, ...]:
    """The files `write_family` writes for `family` (copied to paper/tables and paper/figures)."""
    return tuple(f"suite-{family}.{ext}" for ext in ("md", "json", "png"))


def _machine(result) -> str:
    before, after = result["load"]
    return (
        f"{os.cpu_count()}-core {jax.devices()[0].platform.upper()}, load averages (1, 5, 15 min; `uptime`) "
        f"{', '.join(map(str, before))} before and {', '.join(map(str, after))} after"
    )


def large_nonstiff_markdown(result) -> str:
    return "\n".join(
        [
            f"# suite: large non-stiff{' (quick)' if result['quick'] else ''}\n",
            f"u' = −p ⊙ u + 0.3 sin t (1 + u/(1 + u²)), n states and n parameters, float64, Tsit5 at rtol = atol = "
            "1e-6, saved at t = 0.5 and 1 (a handful of steps), gradient of Σ u(1)² in p. Each gradient checked "
            "against a float64 DiscreteAdjoint at rtol = 1e-10, then timed in interleaved rounds in one process "
            "(medians); XLA's temporaries from `memory_analysis()` of the compiled gradient; first gradient: trace, "
            f"compile and first call. Machine: {_machine(result)}.\n",
            large_nonstiff_table(result["records"]),
            "## Targets\n",
            targets_table(result["targets"]),
        ]
    )


def first_gradient_markdown(result) -> str:
    parts = [
        f"# suite: first gradient{' (quick)' if result['quick'] else ''}\n",
        'Time to the first gradient of `sensealg="auto"` against diffrax\'s RecursiveCheckpointAdjoint with the '
        "same loss, split by `jax.stages`: trace (`jax.jit(f).trace`), lower, compile, first call. Fresh "
        f"functions each repeat (a new f, as after an edit), the two sides interleaved (their order alternating), "
        f"medians of {max(len(r['repeats']) for r in result['records'])}, after one unrecorded first gradient of "
        "each side in the process (a fresh process's first: the cache table's \"no cache\" row); the gradients' "
        "relative error (auto's against "
        "diffrax's) from the first repeat; each stage's median and the total's are taken apart (they need not add "
        "up); program sizes: equations of the traced jaxpr (nested ones included), and of the lowered StableHLO "
        "its lines, while loops, conds (case, if) and host callbacks (equinox's checks, sciad's warnings). "
        f"Machine: {_machine(result)}.\n",
        first_gradient_table(result["records"]),
        "## Targets\n",
        targets_table(result["targets"]),
    ]
    if result["cache"]:
        parts += [
            f"## JAX's persistent compilation cache ({CACHE_EXAMPLE}, fresh processes)\n",
            "`jax_compilation_cache_dir` set, `jax_persistent_cache_min_compile_time_secs` 0; each row its "
            "own process (`process`: its wall time, imports included); warm: the cold row's cache; cache: "
            "what it holds after the run. JAX does not write a program with host callbacks to the cache: "
            "equinox's `error_if` raising (`EQX_ON_ERROR` unset) is one, and so is sciad's warning "
            "(`warn_if`, e.g. of a chaotic gradient), which sciad leaves out with `EQX_ON_ERROR` nan or "
            "off, as equinox does its checks.\n",
            cache_table(result["cache"]),
        ]
    return "\n".join(parts)


def family_figure(result, path) -> None:
    """large non-stiff: time / diffrax's fastest and temporaries / RCA's per combination; first gradient:
    each side's stages stacked, per case; small: the warm time per combination (log) and each side's first
    gradient's stages stacked."""
    mode = " (quick)" if result["quick"] else ""
    if result["family"] == LARGE_NONSTIFF:
        rows = [r for r in with_large_ratios(result["records"]) if r["kind"] != "baseline"]
        time_panel, memory_panel = "time per gradient / diffrax's fastest", "XLA temporaries / diffrax RCA's"
        plots.bar_panels(
            {
                panel: [(f"{r['problem']}: {r['label']}", {r["kind"]: r[key]}) for r in rows]
                for panel, key in ((time_panel, "vs_fastest_diffrax"), (memory_panel, "vs_rca_temp"))
            },
            path,
            f"suite{mode}, large non-stiff (Tsit5, 2 save times)",
            {time_panel: "ratio (log scale)", memory_panel: "ratio (log scale)"},
            log=True,
            reference=1.0,
        )
    elif result["family"] == SMALL:
        warm, first = "warm: time per gradient", "first gradient, fresh process (median stages)"
        plots.bar_panels(
            {
                warm: [
                    (f"{r['problem']}: {r['label']}", {r["kind"]: 1e3 * r["median_s"]})
                    for r in result["records"]
                    if r["median_s"] is not None
                ],
                first: [(f"{r['problem']}: {r['label']}", r["stages_s"]) for r in result["first"]],
            },
            path,
            f"suite{mode}, small problems: sciad, diffrax and {DIFFSOL}",
            {warm: "ms (log scale)", first: "seconds"},
            log={warm},
        )
    else:
        panel = "time to the first gradient"
        plots.bar_panels(
            {panel: [(f"{r['problem']}: {r['label']}", r["stages_s"]) for r in result["records"]]},
            path,
            f"suite{mode}, first gradient: where the time goes (median of "
            f"{max(len(r['repeats']) for r in result['records'])})",
            {panel: "seconds"},
        )


def write_family(result, out: pathlib.Path) -> str:
    """`family_outputs` of a family's result under `out`; returns the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    table, data, figure = family_outputs(result["family"])
    (out / data).write_text(json.dumps(result, indent=1, default=str))
    markdown = {LARGE_NONSTIFF: large_nonstiff_markdown, FIRST_GRADIENT: first_gradient_markdown, SMALL: small_markdown}
    md = markdown[result["family"]](result)
    (out / table).write_text(md)
    family_figure(result, out / figure)
    return md
