"""The suite's "small" family: diffsol-jax as a peer, the family's plan, its target verdicts and tables on
made-up records, and a tiny run (Lotka–Volterra, three sides) writing its table, JSON and figure."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from sciad.problems import lotka_volterra

pytest.importorskip("matplotlib", reason="the benchmark product: pip install 'sciad[bench]'")
from sciad_bench import harness, suite  # noqa: E402
from sciad_bench.peers import diffrax_peer, diffsol_peer  # noqa: E402


def test_diffsol_peer_gradient_matches_the_reference_and_needs_t0_zero():
    pytest.importorskip("diffsol_jax")
    bench = lotka_volterra()
    grad = diffsol_peer("tsit45").build(bench)(jnp.asarray(bench.inputs))
    reference = harness.reference_gradient(bench)
    assert np.max(np.abs(grad - reference)) / np.max(np.abs(reference)) < 100 * bench.rtol
    prob = bench.problem
    late = suite.dataclasses.replace(bench, problem=suite.dataclasses.replace(prob, tspan=(1.0, 10.0)))
    with pytest.raises(ValueError, match="from t = 0"):
        diffsol_peer("tsit45").build(late)


def test_small_plan_per_problem():
    lv, rober = suite.small_cases()
    assert (lv.bench.name, rober.bench.name) == ("lotka-volterra", "robertson")
    assert (rober.bench.solver, rober.bench.rtol, rober.bench.atol) == ("auto", 1e-8, 1e-10)
    labels = [c.label for c in suite.small_combinations(lv)]
    assert labels[0] == "auto → ForwardDiffSensitivity" and labels[-1] == "diffsol-jax tsit45"
    assert "ForwardDiffSensitivity" not in labels  # auto's own pick, not twice
    assert {"DiscreteAdjoint", "BacksolveAdjoint / jax-reverse", "diffrax BacksolveAdjoint / jax"} <= set(labels)
    stiff = [c.label for c in suite.small_combinations(rober)]
    assert stiff[-1] == "diffsol-jax bdf" and not any("Backsolve" in label for label in stiff)
    assert "diffrax RecursiveCheckpointAdjoint (kvaerno5) / jax" in stiff
    assert [suite.small_side(rober, s, "ForwardMode").label for s in suite.SMALL_SIDES] == [
        "auto",
        "diffrax ForwardMode (kvaerno5) / jax",
        "diffsol-jax bdf",
    ]
    assert diffrax_peer("ForwardMode").label == "diffrax ForwardMode / jax"


def _warm(problem, label, ms, kind="sciad", ok=True):
    return {
        "problem": problem,
        "label": label,
        "sensealg": label.split(" / ")[0],
        "kind": kind,
        "is_peer": kind == "peer",
        "median_s": ms / 1e3 if ok else None,
        "times": [ms / 1e3],
        "compile_time": 1.0,
        "rel_error": 1e-7,
        "ok": ok,
        "error": None if ok else "gradient off",
        "rule": "few-parameters",
    }


def _first(problem, side, label, total):
    stages = dict.fromkeys(suite.SMALL_STAGES, total / len(suite.SMALL_STAGES))
    return {
        "problem": problem,
        "side": side,
        "label": label,
        "stages_s": stages,
        "total_s": total,
        "process_s": total + 3,
        "again_s": total / 2,
        "repeats": [stages],
        "equations": 10,
        "hlo_lines": 12,
        "loops": 0,
        "conds": 0,
        "callbacks": 0,
        "rel_error": 1e-7,
        "ok": True,
    }


def test_small_targets_and_tables_compare_auto_with_diffsol():
    records = [
        _warm("lv", "auto → ForwardDiffSensitivity", 0.3),
        _warm("lv", "DiscreteAdjoint", 0.2),
        _warm("lv", "diffrax ForwardMode / jax", 0.4, kind="peer"),
        _warm("lv", "diffrax RecursiveCheckpointAdjoint / jax", 0.8, kind="peer"),
        _warm("lv", "diffsol-jax tsit45", 0.1, kind="peer"),
        _warm("rober", "auto → ForwardDiffSensitivity", 1.0),
        _warm("rober", "diffsol-jax bdf", 1.0, kind="peer", ok=False),
    ]
    first = [
        _first("lv", "auto", "auto → ForwardDiffSensitivity", 0.6),
        _first("lv", "diffrax", "diffrax ForwardMode / jax", 0.9),
        _first("lv", suite.DIFFSOL, "diffsol-jax tsit45", 0.3),
    ]
    targets = suite.small_targets(records, first)
    assert [(t["problem"], t["target"][:14], t["ratio"], t["met"]) for t in targets] == [
        ("lv", "warm gradient ", pytest.approx(3.0), False),
        ("lv", "first gradient", pytest.approx(2.0), True),
        ("rober", "warm gradient ", None, False),
    ]
    assert "best sciad combination measured: DiscreteAdjoint at 2.00×" in targets[0]["note"]
    table = suite.small_table(records)
    assert "| lv | **auto → ForwardDiffSensitivity** | 0.3 | 3.00 | 0.75 |" in table
    assert "| lv | diffsol-jax tsit45 (peer) | 0.1 | 1.00 | 0.25 |" in table
    assert "| lv | auto → ForwardDiffSensitivity | 0.12 | 0.12 | 0.12 | 0.12 | 0.12 | 0.6 | 2.00 | 0.3 | 3.6 |" in (
        suite.small_first_table(first)
    )


@pytest.mark.slow
def test_small_family_writes_table_json_figure_and_targets(tmp_path, monkeypatch):
    pytest.importorskip("diffsol_jax")
    cases = suite.small_cases()[:1]  # Lotka–Volterra (a fresh process finds it by name among them all)
    monkeypatch.setattr(suite, "small_cases", lambda: cases)
    monkeypatch.setattr(
        suite,
        "small_combinations",
        lambda case: [
            suite.auto_combination(case.bench),
            diffrax_peer("ForwardMode"),
            diffsol_peer(case.diffsol_method),
        ],
    )
    result = suite.run_suite(quick=True, repeats=2, out=tmp_path, families=[suite.SMALL])
    small = result[suite.SMALL]
    assert [r["label"] for r in small["records"]] == [
        "forward solve (no gradient)",
        "auto → ForwardDiffSensitivity",
        "diffrax ForwardMode / jax",
        "diffsol-jax tsit45",
    ]
    assert all(r["ok"] and len(r["times"]) == 2 for r in small["records"])
    assert [(r["side"], r["label"]) for r in small["first"]] == [
        ("auto", "auto → ForwardDiffSensitivity"),
        ("diffrax", "diffrax ForwardMode / jax"),
        ("diffsol-jax", "diffsol-jax tsit45"),
    ]
    assert all(r["ok"] and set(r["stages_s"]) == set(suite.SMALL_STAGES) and r["equations"] > 0 for r in small["first"])
    assert [t["target"] for t in small["targets"]] == [
        "warm gradient ≤ 1.5× diffsol-jax's",
        "first gradient ≤ 3× diffsol-jax's",
    ]
    assert all((tmp_path / f).stat().st_size > 0 for f in suite.family_outputs(suite.SMALL))
    saved = json.loads((tmp_path / "suite-small.json").read_text())
    assert saved["family"] == suite.SMALL and len(saved["load"]) == 2
    assert "## Targets" in (tmp_path / "suite-small.md").read_text()
