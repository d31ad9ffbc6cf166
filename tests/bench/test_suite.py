"""The benchmark suite on a tiny configuration (outputs written, targets printed), its target
verdicts on made-up records, and the heuristic's calibration recovering known thresholds."""

import json

import pytest

from sciad._auto import THRESHOLDS, Features, Thresholds
from sciad.problems import lotka_volterra, oregonator

pytest.importorskip("matplotlib", reason="the benchmark product: pip install 'sciad[bench]'")
from sciad_bench import selection, suite  # noqa: E402
from sciad_bench.harness import sciad_combination  # noqa: E402
from sciad_bench.peers import diffrax_peer  # noqa: E402


@pytest.mark.slow
def test_tiny_suite_writes_json_table_plot_and_prints_targets(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(suite, "problems", lambda quick: [(suite.PAPER, lotka_volterra())])
    monkeypatch.setattr(
        suite,
        "combinations",
        lambda bench, category, engines, quick: [
            suite.auto_combination(bench),
            diffrax_peer("RecursiveCheckpointAdjoint"),
        ],
    )
    monkeypatch.setattr(suite, "sweep_combinations", lambda quick: [sciad_combination("ForwardDiffSensitivity")])
    monkeypatch.setattr(suite, "QUICK_SETTINGS_PROBLEMS", ())
    monkeypatch.setitem(suite.SWEEP_HORIZONS, True, (3.0, 30.0))
    result = suite.run_suite(quick=True, repeats=1, out=tmp_path, families=[suite.PROBLEMS])
    printed = capsys.readouterr().out
    saved = json.loads((tmp_path / "suite.json").read_text())
    assert saved["quick"] and {r["label"] for r in saved["records"]} == {
        "forward solve (no gradient)",
        "auto → ForwardDiffSensitivity",
        "diffrax RecursiveCheckpointAdjoint / jax",
    }
    auto = next(r for r in saved["records"] if r["label"].startswith("auto"))
    assert auto["ok"] and auto["name"] == "ForwardDiffSensitivity" and auto["peak_bytes"] > 0
    assert [r["horizon"] for r in saved["memory"]] == [3.0, 30.0]
    assert saved["memory"][1]["max_steps"] > saved["memory"][0]["max_steps"]
    # speed and first gradient (the memory target is for checkpointed adjoints only)
    assert [t["target"][:9] for t in result["targets"]] == ["auto ≤ fa", "auto's ti"] and saved["selection"] is None
    assert suite.class_figures(saved["records"]) == {suite.PAPER: "suite-paper.png"}
    assert all((tmp_path / f).stat().st_size > 0 for f in ("suite-paper.png", suite.MEMORY_FIGURE))
    table = (tmp_path / "table.md").read_text()
    assert "## Targets" in printed and "targets met." in printed and table in printed
    assert "auto ≤ fastest diffrax adjoint" in table and "| ForwardDiffSensitivity | 30 |" in table


def test_combinations_per_mode_and_solver():
    engines = ["jax-reverse", "jax-forward"]
    lv, stiff = lotka_volterra(), oregonator()
    quick = [c.label for c in suite.combinations(lv, suite.PAPER, engines, quick=True)]
    assert quick == [
        "auto → ForwardDiffSensitivity",
        "diffrax RecursiveCheckpointAdjoint / jax",
        "diffrax ForwardMode / jax",
    ]
    assert "diffrax BacksolveAdjoint / jax" in [
        c.label for c in suite.combinations(lv, suite.LONG_HORIZON, engines, quick=True)
    ]
    full = [c.label for c in suite.combinations(lv, suite.PAPER, engines, quick=False)]
    assert "ForwardDiffSensitivity" not in full  # auto's own pick, not twice
    assert {
        "ForwardSensitivity / jax-forward",
        "DiscreteAdjoint",
        "diffrax DirectAdjoint / jax",
        "diffrax BacksolveAdjoint / jax",
    } <= set(full)
    implicit = [c.label for c in suite.combinations(stiff, suite.STIFF, engines, quick=False)]
    assert not any("Backsolve" in label or label == "ForwardSensitivity / jax-reverse" for label in implicit)
    assert {suite.sensealg_name(c) for c in suite.combinations(stiff, suite.STIFF, engines, quick=True)} == {
        "ForwardDiffSensitivity",
        None,
    }


def test_plan_times_each_problem_also_at_a_users_settings():
    engines = ["jax-reverse", "jax-forward"]
    full = {
        bench.name: (setting, bench, [c.label for c in combos])
        for _, setting, bench, combos in suite.plan(engines, quick=False)
    }
    own = [name for name, (setting, _, _) in full.items() if setting is None]
    assert own == [bench.name for _, bench in suite.problems(False)]
    setting, bench, labels = full["lotka-volterra (max_steps=100000)"]
    assert setting == "max_steps=100000" and bench.max_steps == 100_000 and (bench.rtol, bench.atol) == (1e-6, 1e-6)
    assert labels == [
        "auto → ForwardDiffSensitivity",
        "diffrax RecursiveCheckpointAdjoint / jax",
        "diffrax ForwardMode / jax",
        "diffrax BacksolveAdjoint / jax",
        "diffrax DirectAdjoint / jax",
    ]
    setting, bench, labels = full["gene-circuit-10 (rtol=1e-10, atol=1e-10)"]
    assert (bench.rtol, bench.atol, bench.max_steps) == (1e-10, 1e-10, 4096) and labels[0].startswith(suite.AUTO)
    assert full["spiral-node (rtol=1e-6, atol=1e-6)"][1].rtol == pytest.approx(1e-6)  # float32: 10× tighter
    assert "oregonator (max_steps=100000)" not in full and "oregonator (rtol=1e-8, atol=1e-8)" in full  # its own
    assert not any("Backsolve" in label for label in full["brusselator-pde-6 (rtol=1e-8, atol=1e-8)"][2])
    quick = [(setting, bench.name) for _, setting, bench, _ in suite.plan(engines, quick=True) if setting]
    assert {name.partition(" (")[0] for _, name in quick} == set(suite.QUICK_SETTINGS_PROBLEMS)
    assert len(quick) == 2 * len(suite.QUICK_SETTINGS_PROBLEMS)


def test_settings_table_compares_auto_with_diffrax_per_setting():
    def timed(problem, label, seconds, setting=None, max_steps=4096, kind="sciad"):
        return {
            **record(problem, label, seconds, kind=kind),
            "setting": setting,
            "max_steps": max_steps,
            "rtol": 1e-6,
            "atol": 1e-6,
        }

    records = [
        timed("lv", "auto → DiscreteAdjoint", 0.001),
        timed("lv", "diffrax ForwardMode", 0.002, kind="peer"),
        timed("lv (max_steps=100000)", "auto → DiscreteAdjoint", 0.003, "max_steps=100000", 100_000),
        timed("lv (max_steps=100000)", "diffrax ForwardMode", 0.002, "max_steps=100000", 100_000, kind="peer"),
        timed("other", "auto → DiscreteAdjoint", 0.001),
    ]  # no other settings: not in the table
    rows = suite.settings_table(records).splitlines()[2:]
    assert rows == [
        "| lv | 4096 | 1e-06 | 1e-06 | auto → DiscreteAdjoint | 1 | diffrax ForwardMode 2 | 0.50 |",
        "| lv | 100000 | 1e-06 | 1e-06 | auto → DiscreteAdjoint | 3 | diffrax ForwardMode 2 | 1.50 |",
    ]


def record(problem, label, seconds, compile_s=1.0, kind="sciad", category=suite.PAPER, ok=True):
    return {
        "problem": problem,
        "label": label,
        "sensealg": label,
        "kind": kind,
        "is_peer": kind == "peer",
        "class": category,
        "median_s": seconds if ok else None,
        "compile_time": compile_s,
        "ok": ok,
        "rule": "dense-saves" if label.startswith("auto") else None,
        "error": None if ok else "gradient off: relative error 1.00e+00 > 1e-04",
    }


def test_speed_and_first_gradient_targets_say_by_how_much_they_miss():
    records = [
        record("a", "auto → DiscreteAdjoint", 1.0, compile_s=3.0),
        record("a", "BacksolveAdjoint / jax-reverse", 0.4),
        record("a", suite.FIRST_GRADIENT_PEER, 2.0, compile_s=2.0, kind="peer"),
        record("a", "diffrax ForwardMode", 0.8, kind="peer"),
        record("b", "auto → BacksolveAdjoint / jax-reverse", 0.4, category=suite.STIFF),
        record("b", suite.FIRST_GRADIENT_PEER, 1.0, compile_s=2.0, kind="peer", category=suite.STIFF),
        record("c", "auto → DiscreteAdjoint", None, ok=False),
        record("c", suite.FIRST_GRADIENT_PEER, 1.0, kind="peer"),
    ]
    speed = {t["problem"]: t for t in suite.speed_targets(records)}
    assert speed["a"]["ratio"] == pytest.approx(1.25) and not speed["a"]["met"]
    assert speed["a"]["note"] == (
        "missed by 1.25×; auto's pick by rule `dense-saves`; best sciad combination "
        "measured: BacksolveAdjoint / jax-reverse at 0.50× (0.4 s)"
    )
    assert speed["b"]["bound"] == 0.5 and speed["b"]["met"] and speed["b"]["note"] == ""
    assert (
        not speed["c"]["met"]
        and "WRONG" in speed["c"]["measured"]
        and speed["c"]["note"]
        == ("not measurable; auto's pick by rule `dense-saves`; no other sciad sensealg measured (quick mode)")
    )
    first = {t["problem"]: t for t in suite.first_gradient_targets(records)}
    assert first["a"]["ratio"] == pytest.approx(1.5) and first["a"]["note"] == (
        "missed by 1.50×; best sciad combination measured: BacksolveAdjoint / jax-reverse at 0.50× (1 s)"
    )
    assert first["b"]["met"] and not first["c"]["met"]
    assert "2 of 6 targets met" in suite.targets_table(list(speed.values()) + list(first.values()))


def test_memory_target_is_flat_growth_over_the_horizon():
    def row(sensealg, horizon, mib):
        return {
            "label": sensealg,
            "sensealg": sensealg,
            "horizon": horizon,
            "max_steps": int(10 * horizon),
            "peak_bytes": int(mib * 2**20),
        }

    interpolating, gauss, discrete = suite.CHECKPOINTED
    sweep = [
        row(discrete, 100.0, 1.0),
        row(discrete, 1000.0, 1.1),
        row(gauss, 100.0, 1.0),
        row(gauss, 1000.0, 1.2),
        row(interpolating, 100.0, 1.0),
        row(interpolating, 1000.0, 3.2),
        row("InterpolatingAdjoint", 100.0, 1.0),
        row("InterpolatingAdjoint", 1000.0, 10.0),
    ]
    targets = {t["problem"]: t for t in suite.memory_targets(sweep)}
    assert set(targets) == set(suite.CHECKPOINTED)  # the uncheckpointed adjoint is context, not a target
    assert targets[discrete]["met"] and targets[discrete]["ratio"] == pytest.approx(1.1, rel=1e-3)
    grows = targets[interpolating]
    assert not grows["met"] and grows["ratio"] == pytest.approx(3.2, rel=1e-3)
    assert "T^0.51" in grows["measured"] and "missed by 2.13×" in grows["note"]
    assert "max_steps grows 10.0×" in grows["note"]


def fake_case(name, m, n, saves, winner, implicit=False, stored_steps_bytes=2**40):
    """Features of a problem and times where `winner` is twice as fast as every other pick (by default
    with too many steps to store them all: `dense-saves` decides for DiscreteAdjoint)."""
    feat = Features(
        states=n,
        parameters=m,
        dtype="float64",
        implicit_solver=implicit,
        save_points=saves,
        rtol=1e-6,
        atol=1e-6,
        interpolation_bytes=0,
        stored_steps_bytes=stored_steps_bytes,
        memory_budget=None,
        device="cpu",
    )
    names = (
        "ForwardSensitivity(jax-forward, seminorm=True)",
        "ForwardDiffSensitivity",
        "DiscreteAdjoint",
        "BacksolveAdjoint(jax-reverse)",
        "InterpolatingAdjoint(jax-reverse)",
    )
    return {"case": name, "features": feat, "times": {k: 1.0 if k == winner else 2.0 for k in names}}


def test_calibration_recovers_known_thresholds():
    """Forward mode wins up to m = 12 but not at 30 (→ 16); DiscreteAdjoint wins from 25 saves, not
    at 12 (→ 20), with m ≥ 20n but not at 6n (→ 8, nearer the committed 4 than 16 is)."""
    fwd, disc, back = (
        "ForwardSensitivity(jax-forward, seminorm=True)",
        "DiscreteAdjoint",
        "BacksolveAdjoint(jax-reverse)",
    )
    cases = [
        fake_case("f2", 2, 4, 3, fwd),
        fake_case("f12", 12, 16, 3, fwd),
        fake_case("b30", 30, 4, 3, back),
        fake_case("s12", 100, 4, 12, back),
        fake_case("s25", 100, 4, 25, disc),
        fake_case("m6n", 24, 4, 40, back),
        fake_case("m20n", 80, 4, 40, disc),
    ]
    fitted = selection.calibrate(cases)
    assert fitted == Thresholds(forward_mode_parameters=16, dense_saves=20, parameters_per_state=8)
    assert selection.score(cases, fitted) == 1.0 and selection.score(cases, THRESHOLDS) > 1.0


def test_out_of_sample_scores_each_set_apart():
    fwd, disc = "ForwardSensitivity(jax-forward, seminorm=True)", "DiscreteAdjoint"
    cases = [
        fake_case("brusselator-2", 3, 8, 5, fwd),
        fake_case("gene-circuit-10", 130, 10, 50, disc),
        fake_case("hamiltonian-node-400", 400, 2, 2, disc, stored_steps_bytes=2**20),
        fake_case("lotka-volterra", 4, 2, 101, disc),
    ]
    result = selection.out_of_sample(cases)
    sets = result["sets"]
    assert [r["case"] for r in sets["held out"]["rows"]] == ["hamiltonian-node-400"]
    assert sets["held out"]["rows"][0]["committed rule"] == "stored-steps"
    assert [r["case"] for r in sets["paper"]["rows"]] == ["lotka-volterra"]
    assert sets["calibration"]["fitted"] == 1.0 and sets["held out"]["fitted"] == 1.0
    assert sets["paper"]["committed"] == 2.0  # forward mode picked for m = 4; DiscreteAdjoint measured fastest
    table = selection.out_of_sample_table(result)
    assert "| paper | lotka-volterra | DiscreteAdjoint | ForwardDiffSensitivity (few-parameters) | 2.00 |" in table
    with pytest.raises(ValueError, match="at least one case"):
        selection.calibrate([])


def test_cases_from_records_keep_correct_sciad_times_by_name():
    records = [
        {"problem": "a", "name": "DiscreteAdjoint", "ok": True, "median_s": 2.0},
        {"problem": "a", "name": "BacksolveAdjoint(jax-reverse)", "ok": False, "median_s": None},
        {"problem": "a", "name": None, "ok": True, "median_s": 1.0},  # a peer
        {"problem": "b", "name": "DiscreteAdjoint", "ok": True, "median_s": 5.0},
    ]
    [case] = selection.cases_from_records(records, {"a": {"states": 2}})
    assert case == {"case": "a", "features": {"states": 2}, "times": {"DiscreteAdjoint": 2.0}}


@pytest.mark.slow
def test_families_large_nonstiff_and_first_gradient_write_tables_figures_and_targets(tmp_path, monkeypatch):
    monkeypatch.setitem(suite.LARGE_STATES, True, (20,))
    monkeypatch.setattr(suite, "LARGE_MAX_STEPS", (4096,))
    monkeypatch.setattr(
        suite,
        "first_gradient_cases",
        lambda: [
            suite.benchmark_case(lotka_volterra()),
            suite.bouncing_ball_case(True),
            suite.bouncing_ball_case(False),
        ],
    )
    result = suite.run_suite(quick=True, repeats=1, out=tmp_path, families=[suite.LARGE_NONSTIFF, suite.FIRST_GRADIENT])
    assert "records" not in result  # the problems family did not run
    for family in (suite.LARGE_NONSTIFF, suite.FIRST_GRADIENT):
        assert all((tmp_path / f).stat().st_size > 0 for f in suite.family_outputs(family))
        assert len(result[family]["load"]) == 2
    large = result[suite.LARGE_NONSTIFF]
    assert {r["label"] for r in large["records"]} >= {
        "GaussAdjoint / jax-reverse",
        "InterpolatingAdjoint / jax-reverse",
        "DiscreteAdjoint",
        suite.RCA,
        "diffrax BacksolveAdjoint / jax",
    }
    assert all(r["ok"] and r["temp_bytes"] is not None for r in large["records"])
    assert [t["target"] for t in large["targets"]][:2] == [
        "stored GaussAdjoint ≤ 2× diffrax's fastest",
        "stored GaussAdjoint ≤ 4× RCA's temporaries",
    ]
    assert (
        len(large["targets"]) == 5
        and "| large-nonstiff-20 | auto → " in (tmp_path / "suite-large-nonstiff.md").read_text()
    )
    first = result[suite.FIRST_GRADIENT]
    assert [(r["problem"], r["side"]) for r in first["records"]] == [
        (p, s) for p in ("lotka-volterra", "bouncing-ball", "bouncing-ball (no events)") for s in suite.SIDES
    ]
    assert all(
        r["ok"] and set(r["stages_s"]) == set(suite.STAGES) and r["equations"] > 0 and r["hlo_lines"] > 0
        for r in first["records"]
    )
    assert first["records"][0]["label"] == "auto → ForwardDiffSensitivity" and first["cache"] == []
    assert [t["target"][:15] for t in first["targets"]] == [
        "first gradient ",
        "first gradient ",
        '"auto": events ',
        "diffrax Recursi",
        "first gradient ",
    ]
    assert "| bouncing-ball | auto |" in (tmp_path / "suite-first-gradient.md").read_text()


def test_first_gradient_targets_compare_auto_with_rca_and_events_with_none():
    def rec(problem, side, total, without=None, ok=True):
        stages = {"trace": total / 2, "lower": 0.0, "compile": total / 2, "run": 0.0}
        return {
            "problem": problem,
            "side": side,
            "stages_s": stages,
            "total_s": total,
            "ok": ok,
            "rel_error": 0.0,
            "without": without,
        }

    auto, rca = suite.SIDES
    records = [
        rec("ball", auto, 3.0, "ball (none)"),
        rec("ball", rca, 6.0, "ball (none)"),
        rec("ball (none)", auto, 1.0),
        rec("ball (none)", rca, 2.0),
        rec("lv", auto, 1.0, ok=False),
        rec("lv", rca, 1.0),
    ]
    targets = suite.first_gradient_family_targets(records)
    assert [(t["problem"], t["ratio"], t["met"]) for t in targets] == [
        ("ball", 0.5, True),
        ("ball", 3.0, False),
        ("ball", 3.0, False),
        ("ball (none)", 0.5, True),
        ("lv", None, False),
    ]
    assert targets[1]["note"] == "missed by 1.50×; trace 1.50 vs 0.50 s; lower 0.00 vs 0.00 s; compile 1.50 vs 0.50 s"


def test_equations_count_nested_jaxprs_and_unknown_families_are_refused():
    import jax
    import jax.numpy as jnp

    flat = suite._equations(jax.make_jaxpr(lambda x: jnp.sin(x) * 2)(1.0))
    nested = suite._equations(jax.make_jaxpr(lambda x: jax.lax.cond(x > 0, jnp.sin, jnp.cos, x))(1.0))
    assert flat == 2 and nested >= 4  # gt, cond and one equation in each branch
    with pytest.raises(ValueError, match="not the suite's"):
        suite.run_suite(families=["large-stiff"])
