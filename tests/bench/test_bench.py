"""The benchmark harness on a tiny configuration: checks before timing, wrong gradients
marked, outputs written (JSON, figure, tables), claims evaluated, the command line."""

import io
import json
import time

import numpy as np
import pytest

import sciad
from sciad._cli import main
from sciad.problems import lotka_volterra

pytest.importorskip("matplotlib", reason="the benchmark product: pip install 'sciad[bench]'")
from sciad_bench import claims, experiments, harness, tables  # noqa: E402
from sciad_bench.harness import Combination, sciad_combination  # noqa: E402
from sciad_bench.peers import torchdiffeq_peer  # noqa: E402


def wrong_gradient() -> Combination:
    return Combination("always zero", None, lambda bench: lambda p: np.zeros_like(p))


@pytest.mark.slow
def test_harness_writes_records_figure_and_tables(tmp_path):
    pytest.importorskip("torchdiffeq")
    bench = lotka_volterra()
    combos = [sciad_combination("ForwardDiffSensitivity"), torchdiffeq_peer(adjoint=False), wrong_gradient()]
    stream = io.StringIO()
    records = harness.run(bench, combos, repeats=2, progress=harness.Progress(4, stream=stream))
    assert "4/4" in stream.getvalue()
    by_label = {r["label"]: r for r in records}
    assert set(by_label) == {
        harness.FORWARD_SOLVE,
        "ForwardDiffSensitivity",
        "torchdiffeq odeint / torch",
        "always zero",
    }
    good = by_label["ForwardDiffSensitivity"]
    assert good["ok"] and len(good["times"]) == 2 and good["compile_time"] > 0 and good["rel_error"] < 1e-4
    assert by_label["torchdiffeq odeint / torch"]["is_peer"] and by_label["torchdiffeq odeint / torch"]["ok"]
    wrong = by_label["always zero"]
    assert not wrong["ok"] and wrong["times"] == [] and "gradient off" in wrong["error"]
    assert good["median_s"] == np.median(good["times"]) and wrong["median_s"] is None

    out = tmp_path / "lotka-volterra"
    table = experiments.write_outputs("lotka-volterra", records, ["something (quick mode)"], out, quick=True)
    saved = json.loads((out / "records.json").read_text())
    assert saved["experiment"] == "lotka-volterra" and len(saved["records"]) == 4
    assert {"sensealg", "engine", "device", "times", "compile_time", "rel_error", "ok", "is_peer"} <= set(
        saved["records"][0]
    )
    assert (out / "lotka-volterra.png").stat().st_size > 0
    assert "WRONG gradient" in table and "**ForwardDiffSensitivity**" in table and "something (quick mode)" in table
    assert "| lotka-volterra |" in (out / "claims.md").read_text()


def record(label, sensealg, engine, size, seconds, kind="sciad", ok=True, device="cpu"):
    return {
        "problem": "p",
        "size": size,
        "sensealg": sensealg,
        "engine": engine,
        "label": label,
        "kind": kind,
        "is_peer": kind == "peer",
        "device": device,
        "times": [seconds] * 3 if ok else [],
        "median_s": seconds if ok else None,
        "compile_time": 1.0,
        "rel_error": 0.0 if ok else 1.0,
        "ok": ok,
        "error": None if ok else "gradient off: relative error 1.00e+00 > 1e-04",
    }


def test_wrong_gradients_never_win():
    paper = claims.PAPER_SENSEALG
    lv = [
        record("a", paper, "enzyme", 6, 0.01),
        record("b", paper, "torch", 6, 1.0),
        record("c", paper, "jax-reverse", 6, 1e-6, ok=False),
    ]
    assert tables.best(lv, kind="sciad")["engine"] == "enzyme"
    verdict, measured = claims.compiled_vs_tape(lv)
    assert verdict == "agree" and "×100" in measured


def test_claims_table_verdicts():
    scaling = [
        record("f", "ForwardDiffSensitivity", None, 11, 0.001),
        record("a", "DiscreteAdjoint", None, 11, 0.002),
        record("f", "ForwardDiffSensitivity", None, 500, 0.1),
        record("a", "DiscreteAdjoint", None, 500, 0.01),
    ]
    spiral = [
        record("r", claims.PAPER_SENSEALG, "jax-reverse", 254, 0.002),
        record("t", claims.PAPER_SENSEALG, "torch", 254, 0.2),
    ]
    gpu = [
        record("r", "DiscreteAdjoint", None, 254, 0.002),
        record("r", "DiscreteAdjoint", None, 254, 0.02, device="gpu"),
        record("r", "DiscreteAdjoint", None, 50004, 2.0),
        record("r", "DiscreteAdjoint", None, 50004, 0.2, device="gpu"),
    ]
    table = claims.claims_table({"scaling": scaling, "spiral-node": spiral, "gpu-crossover": gpu})
    rows = table.splitlines()[2:]
    assert "not measurable here" in rows[0]
    assert "| scaling | agree |" in rows[1]
    assert "| spiral-node | agree |" in rows[2]
    assert "| gpu-crossover | agree |" in rows[3] and "50004" in rows[3]


def test_combination_needs_an_engine_exactly_when_the_sensealg_takes_one():
    with pytest.raises(ValueError, match="needs engine"):
        sciad_combination("InterpolatingAdjoint")
    with pytest.raises(ValueError, match="takes no engine"):
        sciad_combination("DiscreteAdjoint", "torch")


def test_matrix_covers_every_registered_sensealg():
    engines = ["jax-reverse", "jax-forward"]
    ((bench, combos),) = experiments.PLANS["lotka-volterra"](engines, False)[0]
    names = {c.sensealg.partition("(")[0] for c in combos if c.kind == "sciad"}
    # every ODE sensealg but ReversibleAdjoint (its own reversible method: experiments/reversible_ode.py)
    assert names == set(sciad.adjoints.ODE_SENSEALGS) - {"ReversibleAdjoint"}
    alg = sciad.adjoints.parse(claims.PAPER_SENSEALG)
    assert isinstance(alg, sciad.InterpolatingAdjoint) and alg.checkpointing


def test_quick_plans_restrict_foreign_engines_and_say_so():
    engines = ["jax-reverse", "jax-forward", "torch", "autograd", "finite-differences"]
    [(bench, combos)], skipped = experiments.PLANS["lotka-volterra"](engines, True)
    torch_combos = [c.sensealg for c in combos if c.engine == "torch" and c.kind == "sciad"]
    assert torch_combos == [claims.PAPER_SENSEALG]  # the tape engine of the compiled-against-tape claim
    assert not any(c.engine in ("autograd", "finite-differences") for c in combos)
    assert (
        f"{claims.PAPER_SENSEALG} with autograd, finite-differences (quick mode: host engines take seconds "
        "per gradient; torch stands for the tape engines)"
    ) in skipped
    assert "torchdiffeq odeint_adjoint / torch" not in [c.label for c in combos]


def test_fast_calls_are_timed_in_rounds_apart_from_slow_ones(monkeypatch):
    """After the first call and one warm-up round of all, the calls under `SLOW_CALL` s get their
    rounds, then the slower ones theirs: a fast call never follows a slow one there."""
    bench = lotka_volterra()
    reference = np.ones(4)
    monkeypatch.setattr(harness, "reference_gradient", lambda bench: reference)
    calls = []

    def combination(name, seconds):
        def grad(p):
            calls.append(name)
            time.sleep(seconds)
            return reference

        return Combination(name, None, lambda bench: grad)

    records = harness.run(
        bench,
        [combination("slow", harness.SLOW_CALL), combination("fast", 0.0)],
        repeats=3,
        progress=harness.Progress(3, stream=io.StringIO()),
    )
    assert calls == ["slow", "fast"] * 2 + ["fast"] * 3 + ["slow"] * 3
    assert [len(r["times"]) for r in records] == [3, 3, 3]  # the forward solve is timed with the fast calls


def test_failing_and_wrong_combinations_are_recorded_not_timed(monkeypatch):
    """The records of `sciad.timing.compare`'s rows: an error named, no times, the keys the tables read."""
    bench = lotka_volterra()
    monkeypatch.setattr(harness, "reference_gradient", lambda bench: np.ones(4))

    def broken(bench):
        raise TypeError("no such engine")

    right = Combination("right", None, lambda bench: lambda p: np.ones(4))
    records = harness.run(
        bench,
        [wrong_gradient(), Combination("broken", None, broken), right],
        repeats=2,
        progress=harness.Progress(4, stream=io.StringIO()),
    )
    baseline, wrong, failed, good = records
    assert baseline["label"] == harness.FORWARD_SOLVE and baseline["ok"] and baseline["rel_error"] is None
    assert wrong["error"] == "gradient off: relative error 1.00e+00 > 1e-04" and wrong["rel_error"] == 1.0
    assert failed["error"] == "TypeError: no such engine" and failed["compile_time"] is None
    assert [r["ok"] for r in records] == [True, False, False, True] and good["rel_error"] == 0.0
    assert [len(r["times"]) for r in records] == [2, 0, 0, 2] and wrong["median_s"] is None is failed["median_s"]
    assert set(good) == {
        "problem",
        "size",
        "sensealg",
        "engine",
        "label",
        "kind",
        "is_peer",
        "device",
        "times",
        "median_s",
        "compile_time",
        "rel_error",
        "ok",
        "error",
        "peak_bytes",
        "temp_bytes",
    }


def test_cli_rejects_unknown_benchmark_and_engine(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "nope"])
    with pytest.raises(SystemExit):
        main(["bench", "lotka-volterra", "--engines", "nope", "--out", str(tmp_path)])
    assert "unknown engines" in capsys.readouterr().err


def test_ensemble_bench_checks_times_and_writes_outputs(tmp_path, capsys, monkeypatch):
    from sciad_bench import ensemble

    records = ensemble.run_ensemble(quick=True, repeats=2, out=tmp_path, benches=[lotka_volterra()], batches=(4,))
    assert [(r["method"], r["devices"]) for r in records] == [("loop", 1), ("vmap", 1)]
    assert all(r["ok"] and r["rel_error"] < 1e-8 and len(r["times"]) == 2 for r in records)
    assert records[1]["grads_per_s"] == 4 / records[1]["median_s"]
    assert json.loads((tmp_path / "records.json").read_text())["records"][0]["batch"] == 4
    assert "| lotka-volterra (ForwardDiffSensitivity) | 4 |" in (tmp_path / "table.md").read_text()  # auto's pick
    assert (tmp_path / "ensemble.png").stat().st_size > 0
    assert "gradients per second" in capsys.readouterr().out
    monkeypatch.setenv("XLA_FLAGS", "")  # restored afterwards: simulate_cpu_devices edits it
    with pytest.raises(ValueError, match="already started with 1 CPU devices|JAX runs on gpu"):
        ensemble.simulate_cpu_devices(8)
    with pytest.raises(SystemExit):
        main(["bench", "lotka-volterra", "--devices", "2"])
    assert "--devices applies to sciad bench ensemble only" in capsys.readouterr().err


def test_reproduce_copies_every_figure_and_table_into_the_paper(tmp_path, monkeypatch):
    """`sciad reproduce`'s copying, with each benchmark replaced by one that writes its outputs' names."""
    from sciad_bench import reproduce, suite

    def touch(folder, *names):
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            (folder / name).write_text(name)

    monkeypatch.setattr(
        reproduce,
        "run_experiment",
        lambda name, quick, repeats, out: touch(out, f"{name}.png", "table.md", "records.json", "claims.md"),
    )
    monkeypatch.setattr(reproduce, "run_selection", lambda quick, out: touch(out, "table.md", "selection.json"))
    for name in ("losses", "events", "large-stiff", "dae", "sde", "dde"):
        monkeypatch.setattr(
            reproduce,
            f"run_{name.replace('-', '_')}",
            lambda quick, repeats, out, name=name: touch(out, f"{name}.png", "table.md", "records.json"),
        )
    records = [{"class": suite.PAPER}, {"class": suite.STIFF}]

    def run_suite(quick, repeats, out):
        touch(
            out,
            *suite.class_figures(records).values(),
            suite.MEMORY_FIGURE,
            "table.md",
            "suite.json",
            *suite.family_outputs(suite.LARGE_NONSTIFF),
            *suite.family_outputs(suite.FIRST_GRADIENT),
            *suite.family_outputs(suite.SMALL),
        )
        return {"records": records}

    monkeypatch.setattr(reproduce, "run_suite", run_suite)
    reproduce.reproduce(results=tmp_path / "results", paper=tmp_path / "paper", quick=True)
    figures = {p.name for p in (tmp_path / "paper" / "figures").iterdir()}
    assert figures == {f"{name}.png" for name in experiments.PLANS} | {
        "suite-paper.png",
        "suite-stiff.png",
        "suite-memory.png",
        "losses.png",
        "events.png",
        "large-stiff.png",
        "dae.png",
        "sde.png",
        "dde.png",
        "suite-large-nonstiff.png",
        "suite-first-gradient.png",
        "suite-small.png",
    }
    tables_written = {p.name for p in (tmp_path / "paper" / "tables").iterdir()}
    assert {
        "claims.md",
        "selection.md",
        "suite.md",
        "suite.json",
        "losses.md",
        "losses.json",
        "events.md",
        "events.json",
        "large-stiff.md",
        "large-stiff.json",
        "dae.md",
        "dae.json",
        "sde.md",
        "sde.json",
        "dde.md",
        "dde.json",
        "suite-large-nonstiff.md",
        "suite-first-gradient.json",
    } <= tables_written


@pytest.mark.slow
def test_losses_benchmark_checks_then_times(tmp_path):
    """`sciad bench losses --quick`: every sciad gradient agrees with the tight reference and is timed; diffrax's
    BacksolveAdjoint cannot differentiate the final time; table, figure and records written."""
    from sciad_bench.losses import run_losses

    records = run_losses(quick=True, repeats=1, out=tmp_path, verbose=False)
    assert {r["problem"] for r in records} == {"control-cost", "time-of-flight"}
    assert all(r["ok"] and r["median_s"] for r in records if r["kind"] == "sciad")
    backsolve = next(r for r in records if r["problem"] == "time-of-flight" and "BacksolveAdjoint" in r["label"])
    assert not backsolve["ok"]
    assert {p.name for p in tmp_path.iterdir()} >= {"records.json", "losses.png", "table.md"}
    assert "diffrax / auto" in (tmp_path / "table.md").read_text()
    steady = json.loads((tmp_path / "records.json").read_text())["steady_state"]
    assert steady and all(r["ok"] is True and r["sciad_s"] for r in steady)


@pytest.mark.slow
def test_events_benchmark_checks_then_times(tmp_path):
    """`sciad bench events --quick`: every gradient, sciad's and diffrax's loops of solves, agrees with the tight
    reference and is timed (a diffrax loop written wrong, e.g. a bounce that stops the next flight at once, fails
    here); table, figure and records written."""
    from sciad_bench.events import run_events

    records = run_events(quick=True, repeats=1, out=tmp_path, verbose=False)
    assert {r["problem"] for r in records} == {
        "multi-dose",
        "bouncing ball",
        "integrate-and-fire",
        "landing",
        "spike times",
    }
    bad = [
        (r["problem"], r["label"], r["error"], r["median_s"])
        for r in records
        if r["kind"] in ("sciad", "peer") and not (r["ok"] and r["median_s"])
    ]
    assert not bad, bad
    assert {p.name for p in tmp_path.iterdir()} >= {"records.json", "events.png", "table.md"}


@pytest.mark.slow
def test_large_stiff_benchmark_checks_then_times(tmp_path):
    """`sciad bench large-stiff` on one 12 × 12 grid (288 states: "auto" takes the sparse Newton): every method
    agrees with SciPy's BDF (forward) and with InterpolatingAdjoint (gradient), and is timed."""
    from sciad_bench.large_stiff import run_large_stiff

    records = run_large_stiff(repeats=1, out=tmp_path, verbose=False, grids=(12,))
    assert {r["what"] for r in records} == {"forward", "gradient"}
    assert all(r["ok"] is True and r["median_s"] for r in records), [(r["name"], r.get("ok")) for r in records]
    assert {p.name for p in tmp_path.iterdir()} >= {"records.json", "large-stiff.png", "table.md"}
    assert "its median / sciad auto's" in (tmp_path / "table.md").read_text()


def test_idas_gradients_of_robertson_agree_with_sciads():
    """Robertson as a DAE: IDAS's gradient by forward sensitivities and by adjoint sensitivities (one integrator
    per save interval) agree with sciad's ForwardDiffSensitivity and DiscreteAdjoint at 1e-5 (max norm)."""
    pytest.importorskip("casadi")
    from sciad_bench import dae

    b = dae.robertson()
    ours = {s: np.asarray(dae.sciad_gradient(b, s)()) for s in ("ForwardDiffSensitivity", "DiscreteAdjoint")}
    np.testing.assert_allclose(ours["DiscreteAdjoint"], ours["ForwardDiffSensitivity"], rtol=1e-8)
    for mode in ("forward", "adjoint per interval"):  # relative to the gradient's largest entry, as the benchmark
        assert sciad.timing.relative_error(dae.idas_gradient(b, mode)(), ours["ForwardDiffSensitivity"]) < 1e-5, mode
    np.testing.assert_allclose(dae.idas_forward(b)(), np.asarray(dae.sciad_forward(b)()), rtol=1e-5, atol=1e-10)


@pytest.mark.slow
def test_dae_benchmark_checks_then_times(tmp_path):
    """`sciad bench dae --quick`: Robertson and reaction–diffusion at 100 states; every sciad gradient and IDAS's
    forward and adjoint (per interval) sensitivities agree with the tight reference and are timed (IDAS's adjoint
    over the output grid is recorded, failing with CasADi 3.8.2); table, figure and records written."""
    pytest.importorskip("casadi")
    from sciad_bench.dae import IDAS, run_dae

    records = run_dae(quick=True, repeats=1, out=tmp_path, verbose=False)
    assert {(r["problem"], r["states"]) for r in records} == {("Robertson", 3), ("reaction-diffusion", 100)}
    grid = f"{IDAS} adjoint (output grid)"
    assert all(r["ok"] is True and r["median_s"] for r in records if r["name"] != grid), [
        (r["problem"], r["name"], r.get("ok")) for r in records
    ]
    assert {p.name for p in tmp_path.iterdir()} >= {"records.json", "dae.png", "table.md"}
    assert "/ IDAS" in (tmp_path / "table.md").read_text()


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_writes_one_line_per_stage_off_a_terminal():
    """To a file or a pipe: a line per step and per new kind of work, no carriage returns, no rounds;
    on a terminal: the bar redrawn in place with them."""

    def report(stream):
        progress = harness.Progress(2, stream=stream)
        progress.step("lv: a (compiling)")
        progress.step("lv: b (compiling)")
        for i in range(200):
            progress.show("lv: timing the calls < 0.1 s", f"round {i + 1}")
        progress.show("lv: timing the calls ≥ 0.1 s", "round 1")
        progress.close()
        return stream.getvalue()

    assert report(io.StringIO()).splitlines(keepends=True) == [
        "[1/2] lv: a (compiling)\n",
        "[2/2] lv: b (compiling)\n",
        "[2/2] lv: timing the calls < 0.1 s\n",
        "[2/2] lv: timing the calls ≥ 0.1 s\n",
    ]
    live = report(Terminal())
    assert live.count("\r") == 203 and live.count("\n") == 1 and "round 200" in live and "#" * 30 in live


def test_table_says_what_bold_and_autos_pick_mean():
    group = [
        {**r, "problem": "lotka-volterra", "auto_pick": "b / jax-reverse"}
        for r in (
            record("a", "A", None, 6, 0.002),
            record("b / jax-reverse", "b", "jax-reverse", 6, 0.003),
            record("w", "W", None, 6, None, ok=False),
            record("peer", "P", None, 6, 0.001, kind="peer"),
        )
    ]
    table = tables.markdown_table(group)
    assert "| **a** |" in table and "| b / jax-reverse ← auto's pick |" in table and "| w |" in table
    assert "**Bold**: the fastest sciad combination whose gradient passed the check" in table
    assert '← auto\'s pick: what `sensealg="auto"` runs on the problem' in table and "not among" not in table
    elsewhere = tables.markdown_table([{**r, "auto_pick": "GaussAdjoint"} for r in group])
    assert "← auto's pick |" not in elsewhere
    assert "on lotka-volterra GaussAdjoint is not among the combinations timed" in elsewhere
    assert "auto's pick" not in tables.markdown_table([record("a", "A", None, 6, 0.002)])  # no pick recorded


def test_autos_pick_is_timed_by_the_main_job():
    [(bench, combos)], _ = experiments.PLANS["lotka-volterra"](["jax-reverse", "jax-forward"], True)
    assert harness.auto_pick(bench) in [c.label for c in combos if c.kind == "sciad"]


def test_violin_plot_marks_autos_pick_the_winner_and_the_wrong(tmp_path):
    """Whiskers at the 5th and 95th percentiles (a loaded maximum off the axis), auto's pick outlined and
    named, the fastest correct sciad combination in bold, a wrong gradient in red; the legend and the
    captions say so."""
    from sciad_bench import plots

    loaded = [0.001] * 40 + [0.0012] * 59 + [0.5]  # one call slowed 500× by the machine
    group = [
        {**r, "problem": "p", "auto_pick": "pick"}
        for r in (
            {**record("fast", "A", None, 6, 0.001), "times": loaded},
            record("pick", "B", None, 6, 0.002),
            record("peer", "P", None, 6, 0.0005, kind="peer"),
            record("wrong", "W", None, 6, None, ok=False),
        )
    ]
    fig = plots.violin_plot(group, tmp_path / "p.png", "p")
    assert (tmp_path / "p.png").stat().st_size > 0
    [ax] = fig.axes
    ticks = {t.get_text(): t for t in ax.get_yticklabels()}
    assert list(ticks) == ["peer", "fast  (fastest sciad)", "pick  (auto's pick)", "wrong  ✗"]
    assert ticks["fast  (fastest sciad)"].get_fontweight() == "bold" and ticks["peer"].get_fontweight() == "normal"
    assert ticks["wrong  ✗"].get_color() == plots.FAILED
    assert any("failed the gradient check" in t.get_text() for t in ax.texts)
    assert 'auto\'s pick (what sensealg="auto" runs)' in [t.get_text() for t in fig.legends[0].get_texts()]
    assert "5th–95th percentile" in fig.get_supxlabel() and "Bold: the fastest sciad combination" in fig.get_supxlabel()
    stats = plots.violin_stats(loaded)
    assert stats["min"] == np.percentile(loaded, 5) and stats["max"] == np.percentile(loaded, 95) < 0.002
    assert ax.get_xlim()[1] < 0.1  # the loaded call is left out of the axis (it stays in records.json)
