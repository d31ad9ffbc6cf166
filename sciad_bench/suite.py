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
import json
import math
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import sciad
import sciad.ad as ad
from sciad.adjoints import describe, engine_option, parse
from sciad.select import heuristic
from sciad.problems import (
    Benchmark,
    brusselator_pde,
    gene_circuit,
    hamiltonian_node,
    lotka_volterra,
    oregonator,
    spiral_node,
)
from sciad.timing import fastest

from sciad_bench import claims, harness, plots, selection, tables
from sciad_bench.experiments import _sensealg_matrix
from sciad_bench.harness import Combination, sciad_combination
from sciad_bench.peers import diffrax_peer

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
    return [(PAPER, lotka_volterra()), (PAPER, spiral_node()), (LONG_HORIZON, hamiltonian_node()),
            (STIFF, oregonator()), (STIFF, brusselator_pde(6)), (DENSE, gene_circuit())]


def _exponent(x: float) -> str:
    return f"{x:.0e}".replace("e-0", "e-")


def user_settings(bench: Benchmark) -> list[tuple[str, Benchmark]]:
    """(setting, benchmark) for `bench` at `USER_MAX_STEPS` (unless its own max_steps are those already)
    and at rtol, atol `TIGHTER`× smaller (10× in float32), named "NAME (SETTING)", e.g.
    "lotka-volterra (max_steps=100000)", "lotka-volterra (rtol=1e-8, atol=1e-8)"."""
    factor = TIGHTER if np.asarray(bench.problem.p).dtype.itemsize >= 8 else 10
    rtol, atol = bench.rtol / factor, bench.atol / factor
    settings = [] if bench.max_steps == USER_MAX_STEPS else [
        (f"max_steps={USER_MAX_STEPS}", dict(max_steps=USER_MAX_STEPS))]
    settings.append((f"rtol={_exponent(rtol)}, atol={_exponent(atol)}", dict(rtol=rtol, atol=atol)))
    return [(label, dataclasses.replace(bench, name=f"{bench.name} ({label})", **changes))
            for label, changes in settings]


def auto_combination(bench: Benchmark) -> Combination:
    """`sensealg="auto"` in `bench.objective`, labelled with what it picks here: `auto → Name / engine`."""
    pick = heuristic(selection.features(bench)).sensealg
    option = engine_option(pick)
    return Combination(f"{AUTO} {describe(pick, engine=False)}", getattr(pick, option).name if option else None,
                       lambda bench: jax.jit(jax.grad(lambda p: bench.objective(p, "auto"))))


def combinations(bench: Benchmark, category: str, engines, *, quick: bool) -> list[Combination]:
    """"auto", in full mode every sensealg × engine but auto's own pick (with an implicit solver, no
    BacksolveAdjoint and ForwardSensitivity with jax-forward only), and `diffrax_adjoints`."""
    implicit = selection.features(bench).implicit_solver
    auto = auto_combination(bench)
    combos = [auto]
    if not quick:
        matrix, _ = _sensealg_matrix(engines, quick=False)
        combos += [c for c in matrix if sensealg_name(c) != sensealg_name(auto) and not (implicit and (
            c.sensealg == "BacksolveAdjoint" or (c.sensealg == "ForwardSensitivity" and c.engine != "jax-forward")))]
    return combos + diffrax_adjoints(bench, category, quick=quick)


def diffrax_adjoints(bench: Benchmark, category: str, *, quick: bool) -> list[Combination]:
    """diffrax's adjoints: BacksolveAdjoint only with an explicit solver, and in quick mode only on
    the long-horizon problem; quick: not DirectAdjoint."""
    backsolve = not selection.features(bench).implicit_solver and (not quick or category == LONG_HORIZON)
    return [diffrax_peer(a) for a in PEERS if (backsolve or a != "BacksolveAdjoint")
            and not (quick and a == "DirectAdjoint")]


def plan(engines, *, quick: bool) -> list[tuple[str, str | None, Benchmark, list[Combination]]]:
    """(class, setting, benchmark, combinations) for every problem at its own settings (setting None,
    `combinations`), then at each of its `user_settings` with auto and `diffrax_adjoints` only
    (quick: the `QUICK_SETTINGS_PROBLEMS` only)."""
    own = [(category, None, bench, combinations(bench, category, engines, quick=quick))
           for category, bench in problems(quick)]
    varied = [(category, setting, variant,
               [auto_combination(variant), *diffrax_adjoints(variant, category, quick=quick)])
              for category, _, bench, _ in own if not quick or bench.name in QUICK_SETTINGS_PROBLEMS
              for setting, variant in user_settings(bench)]
    return own + varied


def skipped_combinations(engines, *, quick: bool) -> list[str]:
    skipped = [f"{e} ({'not chosen' if ad.BACKENDS[e].traced else 'host engine: a host round trip per product'})"
               for e in ad.available() if e not in engines]
    skipped.append("BacksolveAdjoint, sciad's and diffrax's, on the stiff problems (unstable backwards)")
    skipped.append("ForwardSensitivity on the stiff problems with engines other than jax-forward (tens of "
                   "seconds per gradient with any engine)")
    skipped.append(f"every sensealg but auto's pick at a user's settings (max_steps={USER_MAX_STEPS}, "
                   "tighter tolerances: what they change is auto against diffrax)")
    if quick:
        skipped.append("every sensealg but auto's pick, diffrax DirectAdjoint (RecursiveCheckpointAdjoint's "
                       "slower forward-mode-capable variant) and diffrax BacksolveAdjoint but on the long-horizon "
                       "problem (quick mode)")
        skipped.append(f"a user's settings but on {', '.join(QUICK_SETTINGS_PROBLEMS)} (quick mode)")
    return skipped


def sensealg_name(combo: Combination) -> str | None:
    """The sciad sensealg of `combo` as `describe` writes it with its engine (auto: its pick); None for
    peers and baselines."""
    if combo.kind != "sciad":
        return None
    text = combo.sensealg.removeprefix(f"{AUTO} ")
    return describe(parse(text, **({engine_option(text): combo.engine} if combo.engine else {})))


def run_problem(bench: Benchmark, category: str, combos, *, repeats: int, budget: float | None,
                progress, setting: str | None = None) -> list[dict]:
    """`harness.run` records (gradients checked to `GRADIENT_TOLERANCE` at least) with the problem's
    class, its `setting` (None: its own) and max_steps, rtol, atol, the sensealg's `name`
    (`sensealg_name`) and auto's heuristic `rule`."""
    names = {c.label: sensealg_name(c) for c in combos}
    records = harness.run(bench, combos, repeats=repeats, budget=budget, progress=progress,
                          tolerance=max(100 * bench.rtol, GRADIENT_TOLERANCE))
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
    steps = int(sciad.solve(bench.problem, saveat=bench.saveat, rtol=bench.rtol, atol=bench.atol,
                            max_steps=10**7).stats["steps"])
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
            rows.append({"label": combo.label, "sensealg": combo.sensealg, "horizon": float(horizon),
                         "max_steps": bench.max_steps,
                         "peak_bytes": harness.peak_bytes(harness.compiled(combo.build(bench), p))})
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
    return {"target": target, "problem": problem, "bound": bound, "ratio": ratio, "met": met,
            "measured": measured, "note": "" if met else f"{miss}; {why}"}


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
        measured = (f"{auto['label']} {1e3 * auto['median_s']:.3g} ms vs {peer['label']} "
                    f"{1e3 * peer['median_s']:.3g} ms" if ratio is not None
                    else f"auto: {tables.status(auto) if auto else 'absent'}")
        why = (f"auto's pick by rule `{auto['rule'] if auto else '–'}`; {_better(group, 'median_s', peer)}"
               if peer else "no diffrax adjoint gave a correct gradient")
        out.append(_target("auto ≤ fastest diffrax adjoint", problem, bound, ratio, measured, why))
    return out


def first_gradient_targets(records) -> list[dict]:
    """auto's time to the first gradient / diffrax RecursiveCheckpointAdjoint's, per problem (≤ 1)."""
    out = []
    for problem, group in _by_problem(records).items():
        auto = _auto(group)
        peer = next((r for r in group if r["sensealg"] == FIRST_GRADIENT_PEER and r["ok"]), None)
        ratio = auto["compile_time"] / peer["compile_time"] if auto and auto["ok"] and peer else None
        measured = (f"{auto['compile_time']:.1f} s vs {peer['compile_time']:.1f} s" if ratio is not None
                    else "auto or RecursiveCheckpointAdjoint gave no correct gradient")
        why = _better(group, "compile_time", peer) if peer else "no correct RecursiveCheckpointAdjoint gradient"
        out.append(_target("auto's time to first gradient ≤ RecursiveCheckpointAdjoint's", problem, 1.0, ratio,
                           measured, why))
    return out


def memory_targets(sweep: list[dict]) -> list[dict]:
    """Peak memory at the longest horizon / at the shortest for each checkpointed sensealg (≤ FLAT_GROWTH)."""
    out = []
    for label in dict.fromkeys(r["label"] for r in sweep if r["sensealg"] in CHECKPOINTED):
        rows = sorted((r for r in sweep if r["label"] == label), key=lambda r: r["horizon"])
        short, long = rows[0], rows[-1]
        growth = long["peak_bytes"] / short["peak_bytes"] if short["peak_bytes"] and long["peak_bytes"] else None
        span = long["horizon"] / short["horizon"]
        measured = ("memory analysis unavailable" if growth is None else
                    f"{short['peak_bytes'] / 2**20:.3g} → {long['peak_bytes'] / 2**20:.3g} MiB from T = "
                    f"{short['horizon']:g} to {long['horizon']:g} (∝ T^{math.log(growth) / math.log(span):.2f})")
        why = f"max_steps grows {long['max_steps'] / short['max_steps']:.1f}×: buffers sized by max_steps"
        out.append(_target(f"peak memory flat in the horizon (≤ {FLAT_GROWTH}× over {span:g}×)", label,
                           FLAT_GROWTH, growth, measured, why))
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
        lines.append(f"| {t['target']} | {t['problem']} | ≤ {t['bound']:g} | {ratio} | "
                     f"{'met' if t['met'] else '**missed**'} | {t['measured']} | {t['note']} |")
    met = sum(t["met"] for t in targets)
    return "\n".join(lines) + f"\n\n{met} of {len(targets)} targets met.\n"


def settings_table(records) -> str:
    """auto against diffrax's fastest adjoint for each problem timed at `user_settings`, at its own
    settings and at each of those."""
    def own_name(r):
        return r["problem"].removesuffix(f" ({r['setting']})") if r["setting"] else r["problem"]

    varied = {own_name(r) for r in records if r["setting"]}
    lines = ["| problem | max_steps | rtol | atol | auto | auto (ms) | fastest diffrax adjoint (ms) | auto / diffrax |",
             "|---|---:|---:|---:|---|---:|---|---:|"]
    for group in _by_problem(records).values():
        first = group[0]
        if own_name(first) not in varied:
            continue
        auto, peer, ratio = auto_against_diffrax(group)
        auto_ms = "–" if ratio is None else f"{1e3 * auto['median_s']:.3g}"
        fastest_peer = "–" if peer is None else f"{peer['label']} {1e3 * peer['median_s']:.3g}"
        lines.append(f"| {own_name(first)} | {first['max_steps']} | {first['rtol']:g} | {first['atol']:g} | "
                     f"{auto['label'] if auto else '–'} | {auto_ms} | {fastest_peer} | "
                     f"{'–' if ratio is None else format(ratio, '.2f')} |")
    return "\n".join(lines) + "\n"


def resources_table(records) -> str:
    """Time to the first gradient and peak memory of each checked combination, apart from the run time."""
    lines = ["| problem | combination | time to first gradient (s) | peak memory (MiB) |", "|---|---|---:|---:|"]
    for r in sorted((r for r in records if r["ok"] and r["kind"] != "baseline"),
                    key=lambda r: (r["problem"], r["compile_time"])):
        memory = "–" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.3g}"
        lines.append(f"| {r['problem']} | {r['label']} | {r['compile_time']:.2f} | {memory} |")
    return "\n".join(lines) + "\n"


def sweep_table(sweep: list[dict]) -> str:
    lines = ["| combination | horizon T | max_steps | peak memory (MiB) |", "|---|---:|---:|---:|"]
    lines += [f"| {r['label']} | {r['horizon']:g} | {r['max_steps']} | "
              f"{'–' if r['peak_bytes'] is None else format(r['peak_bytes'] / 2**20, '.3g')} |" for r in sweep]
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
        plots.violin_plot([r for r in result["records"] if r["class"] == category], out / name,
                          f"suite{mode}, {category}: gradient time, {device}")
    plots.memory_plot(result["memory"], out / MEMORY_FIGURE,
                      f"suite{mode}: peak memory of the gradient, long-horizon neural ODE, {device}")
    parts = [f"# suite{mode}\n",
             tables.markdown_table(result["records"], result["skipped"]),
             f"## auto against diffrax's adjoints at a user's settings (max_steps={USER_MAX_STEPS}, tighter "
             "tolerances)\n", settings_table(result["records"]),
             "## Time to first gradient and peak memory\n", resources_table(result["records"]),
             "## Peak memory against the horizon (the long-horizon neural ODE, two save points)\n",
             sweep_table(result["memory"]),
             "## Targets\n", targets_table(result["targets"])]
    if result["selection"] is not None:
        parts += ["## Selection out of sample\n", selection.out_of_sample_table(result["selection"])]
    md = "\n".join(parts)
    (out / "table.md").write_text(md)
    return md


def run_suite(*, quick: bool = False, repeats: int | None = None, engines=None, out=None) -> dict:
    """Run the suite (the `plan`: `problems`, each with its `combinations` and at `user_settings`; the
    memory sweep), write `write_outputs` to `out` (default results/suite), print the tables and the
    targets, and return what was written. `engines`: the JAX-traced `sciad.ad` engines (default: all
    installed); `repeats`: timed rounds per problem and tier of calls (default and time limit: `ROUNDS`)."""
    traced = [e for e in ad.available() if ad.BACKENDS[e].traced]
    engines = traced if engines is None else list(engines)
    wrong = [e for e in engines if e not in traced]
    if wrong:
        raise ValueError(f"engines {wrong} are not installed JAX-traced engines; choose from {', '.join(traced)}")
    if repeats is not None and repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    rounds, budget = ROUNDS[quick]
    repeats = repeats or rounds
    out = pathlib.Path(out or "results/suite")
    start = time.perf_counter()
    problems_plan = plan(engines, quick=quick)
    horizons, sweep_combos = SWEEP_HORIZONS[quick], sweep_combinations(quick)
    progress = harness.Progress(sum(len(c) + 1 for *_, c in problems_plan) + len(horizons) * len(sweep_combos))
    records = []
    for category, setting, bench, combos in problems_plan:
        records += run_problem(bench, category, combos, repeats=repeats, budget=budget, progress=progress,
                               setting=setting)
    sweep = memory_sweep(horizons, sweep_combos, progress)
    progress.close()
    own = [r for r in records if r["setting"] is None]
    targets = speed_targets(own) + first_gradient_targets(own) + memory_targets(sweep)
    held = None if quick else selection.out_of_sample(selection.cases_from_records(records, {
        bench.name: selection.features(bench) for _, setting, bench, _ in problems_plan if setting is None}))
    result = {"suite": "sciad bench suite", "quick": quick, "skipped": skipped_combinations(engines, quick=quick),
              "records": records, "memory": sweep, "targets": targets, "selection": held,
              "seconds": time.perf_counter() - start}
    print(write_outputs(result, out))
    print(f"suite: {len(records)} records in {result['seconds']:.0f} s -> {out}/", file=sys.stderr)
    return result
