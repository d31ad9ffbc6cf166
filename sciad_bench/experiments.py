"""The four experiments (`sciad bench NAME`): which problems, which combinations, where the outputs go."""

import json
import pathlib
import time

import jax

import sciad.ad as ad
from sciad.adjoints import engine_option
from sciad.problems import brusselator, brusselator_pde, lotka_volterra, oregonator, spiral_node
from sciad_bench import claims, harness, plots, tables
from sciad_bench.harness import VARIANTS, sciad_combination
from sciad_bench.peers import diffrax_peer, peers


def _sensealg_matrix(engines, *, quick: bool):
    """Every sensealg × engine plus the engine-free sensealgs; quick: the paper's checkpointed
    InterpolatingAdjoint with the JAX-traced engines and one tape engine (the first of `claims.TAPE`
    here, for the compiled-against-tape claim), ForwardSensitivity with jax-forward only."""
    tape = [e for e in claims.TAPE if e in engines][:1]
    combos, skipped = [], []
    for sensealg in (v for v in VARIANTS if engine_option(v)):
        chosen = engines
        if quick and sensealg == claims.PAPER_SENSEALG:
            chosen = [e for e in engines if ad.BACKENDS[e].traced or e in tape]
        elif quick:
            chosen = [e for e in engines if sensealg == "ForwardSensitivity" and e == "jax-forward"]
        combos += [sciad_combination(sensealg, e) for e in chosen]
        if len(chosen) < len(engines):
            rest = ", ".join(e for e in engines if e not in chosen)
            why = (
                f"quick mode: host engines take seconds per gradient; {tape[0]} stands for the tape engines"
                if tape and sensealg == claims.PAPER_SENSEALG
                else "quick mode"
            )
            skipped.append(f"{sensealg} {f'with {rest} ' if chosen else ''}({why})")
    combos += [sciad_combination(v) for v in VARIANTS if not engine_option(v)]
    return combos, skipped


HOST_ENGINES = ("torch", "autograd", "finite-differences")  # reached through host callbacks
HOST_FORWARD_LIMIT = 50


def paper_plan(make_bench):
    """Lotka–Volterra and the spiral: every combination and every peer."""

    def plan(engines, quick):
        bench = make_bench()
        combos, skipped = _sensealg_matrix(engines, quick=quick)
        if bench.size > HOST_FORWARD_LIMIT:
            combos = [c for c in combos if not (c.sensealg == "ForwardSensitivity" and c.engine in HOST_ENGINES)]
            skipped.append(
                f"ForwardSensitivity with {', '.join(HOST_ENGINES)} above {HOST_FORWARD_LIMIT} "
                "states+parameters (one host callback per sensitivity column per step)"
            )
        peer_combos, peer_skipped = peers(quick=quick)
        return [(bench, combos + peer_combos)], skipped + peer_skipped

    return plan


FORWARD_LIMIT = 1500  # states+parameters: n+m sensitivity columns of n states need quadratic memory
FINITE_DIFFERENCES_LIMIT = 300  # a finite-difference VJP costs one f evaluation per state


def scaling_plan(engines, quick):
    """Brusselator n×n: forward sensitivities against adjoints, and each engine's VJP cost, as size grows."""
    grid = (2, 5) if quick else (2, 3, 5, 8, 12, 20, 32, 50, 70)
    vjp_engines = [e for e in engines if e in ("jax-reverse", "torch")] if quick else engines
    plan = []
    for bench in map(brusselator, grid):
        combos = [sciad_combination("DiscreteAdjoint")]
        if bench.size <= FORWARD_LIMIT:
            combos += [
                sciad_combination("ForwardDiffSensitivity"),
                sciad_combination("ForwardSensitivity", "jax-forward"),
            ]
        combos += [
            sciad_combination(claims.PAPER_SENSEALG, e)
            for e in vjp_engines
            if not (e == "finite-differences" and bench.size > FINITE_DIFFERENCES_LIMIT)
            and not (e == "jax-forward" and bench.size > FORWARD_LIMIT)
        ]
        if not quick:
            combos += [sciad_combination(s, "jax-reverse") for s in ("BacksolveAdjoint", "QuadratureAdjoint")]
        plan.append((bench, combos))
    skipped = [
        "peers (the sweep compares sciad's own sensealgs)",
        f"ForwardSensitivity and ForwardDiffSensitivity above {FORWARD_LIMIT} states+parameters (quadratic memory)",
        f"finite-differences VJPs above {FINITE_DIFFERENCES_LIMIT} states+parameters",
        f"jax-forward VJPs above {FORWARD_LIMIT} states+parameters (n + m pushforwards per product)",
    ]
    if quick:
        skipped.append("engines other than jax-reverse and torch, BacksolveAdjoint, QuadratureAdjoint (quick mode)")
    return plan, skipped


def gpu_crossover_plan(engines, quick):
    """The spiral at growing hidden size, on every JAX device present."""
    hidden = (50, 500) if quick else (50, 200, 1000, 2500, 5000, 7500, 10000)
    vjp = [e for e in engines if e in ("jax-reverse", "enzyme", "torch")]
    plan = [
        (
            spiral_node(h),
            [sciad_combination(claims.PAPER_SENSEALG, e) for e in vjp] + [sciad_combination("DiscreteAdjoint")],
        )
        for h in hidden
    ]
    return plan, [f"engines other than {', '.join(vjp)} (the crossover compares devices, not engines)"]


STIFF_PEERS = ("RecursiveCheckpointAdjoint", "ForwardMode", "DirectAdjoint")


def stiff_plan(engines, quick):
    """The Oregonator and the Brusselator PDE with Kvaerno5: every sensealg × JAX-traced engine
    (quick: jax-reverse, jax-forward for ForwardSensitivity) and diffrax's adjoints, in one run."""
    traced = [e for e in engines if ad.BACKENDS[e].traced]
    combos, skipped = _sensealg_matrix(traced, quick=False)
    if quick:
        keep = {"ForwardSensitivity": "jax-forward"}
        combos = [c for c in combos if c.engine in (None, keep.get(c.sensealg, "jax-reverse"))]
        skipped.append("engines other than jax-reverse (jax-forward for ForwardSensitivity) (quick mode)")
    combos += [diffrax_peer(a) for a in STIFF_PEERS]
    skipped += [
        f"{e} (host engine: one callback per product inside every Newton iteration)" for e in engines if e not in traced
    ]
    skipped.append(
        "diffrax BacksolveAdjoint, torchdiffeq and jax.experimental.ode (unstable backwards "
        "or explicit solvers on stiff problems)"
    )
    benches = [oregonator(), brusselator_pde(6 if quick else 16)]
    return [(bench, combos) for bench in benches], skipped


# Timed rounds per tier of calls (`harness.run`: fast, slow) and the seconds after which they stop
# (None: all of them), by quick: in quick mode Lotka–Volterra's fast calls (1 to 15 ms) get 100 to 200
# rounds, its slow ones (0.5 to 2 s) two or three.
ROUNDS = {True: (500, 6.0), False: (10, None)}

PLANS = {
    "lotka-volterra": paper_plan(lotka_volterra),
    "spiral-node": paper_plan(spiral_node),
    "scaling": scaling_plan,
    "gpu-crossover": gpu_crossover_plan,
    "stiff": stiff_plan,
}


def devices_for(name: str) -> list:
    """gpu-crossover: every JAX device kind present (CPU always, GPU where one exists); others: JAX's default."""
    if name != "gpu-crossover":
        return [jax.devices()[0]]
    found = [jax.devices("cpu")[0]]
    try:
        found.append(jax.devices("gpu")[0])
    except RuntimeError:
        pass
    return found


def load_results(root: pathlib.Path) -> dict[str, list[dict]]:
    """Records of every experiment saved under `root`/NAME/records.json."""
    out = {}
    for path in sorted(pathlib.Path(root).glob("*/records.json")):
        data = json.loads(path.read_text())
        out[data["experiment"]] = data["records"]
    return out


def write_outputs(name: str, records: list[dict], skipped: list[str], out: pathlib.Path, *, quick: bool) -> str:
    """records.json, the figure, table.md and claims.md (over every experiment under out's parent); returns the
    table."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "records.json").write_text(
        json.dumps({"experiment": name, "quick": quick, "skipped": skipped, "records": records}, indent=1)
    )
    title = f"{name}{' (quick)' if quick else ''}: gradient time, {records[0]['device']}"
    if name in ("lotka-volterra", "spiral-node", "stiff"):
        plots.violin_plot(records, out / f"{name}.png", title)
    else:
        xlabel = "states + parameters" + (" (5·hidden + 4)" if name == "gpu-crossover" else " (2n² + 3)")
        plots.size_plot(records, out / f"{name}.png", title, xlabel=xlabel)
    table = tables.markdown_table(records, skipped)
    (out / "table.md").write_text(f"# {name}{' (quick)' if quick else ''}\n\n{table}")
    results = load_results(out.parent)
    results[name] = records
    (out / "claims.md").write_text(
        "# The paper's Appendix B claims against this run\n\n" + claims.claims_table(results)
    )
    return table


def run_experiment(
    name: str, *, quick: bool = False, repeats: int | None = None, engines=None, out=None, verbose: bool = True
) -> list[dict]:
    """Run experiment `name` (one of `PLANS`), write its outputs to `out` (default results/NAME)
    and print the summary table and the claims table. `engines` restricts the `sciad.ad` engines."""
    if name not in PLANS:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {', '.join(PLANS)}")
    installed = ad.available()
    if engines is None:
        engines = installed
    unknown = [e for e in engines if e not in ad.BACKENDS]
    if unknown:
        raise ValueError(f"unknown engines {unknown}; choose from {', '.join(ad.BACKENDS)}")
    skipped = [f"{e} (not installed)" for e in engines if e not in installed]
    engines = [e for e in engines if e in installed]
    rounds, budget = ROUNDS[quick]
    repeats = repeats or rounds
    out = pathlib.Path(out or pathlib.Path("results") / name)
    plan, plan_skipped = PLANS[name](engines, quick)
    skipped += plan_skipped
    devices = devices_for(name)
    progress = harness.Progress(sum(len(c) + 1 for _, c in plan) * len(devices))
    start = time.perf_counter()
    records = []
    for bench, combos in plan:
        pick = harness.auto_pick(bench)
        records += [
            {**r, "auto_pick": pick}
            for r in harness.run(bench, combos, repeats=repeats, budget=budget, devices=devices, progress=progress)
        ]
    progress.close()
    table = write_outputs(name, records, skipped, out, quick=quick)
    if verbose:
        print(table)
        print((out / "claims.md").read_text())
        print(f"{name}: {len(records)} records in {time.perf_counter() - start:.0f} s -> {out}/")
    return records
