"""select_sensealg: heuristic picks (from trace-time facts, under jit), autotuning (equinox models,
the budget over the whole call, ties within noise), caching, errors; the sensealg registry's names
round-trip every option."""

import dataclasses
import inspect
import json
import subprocess
import sys
import time
from pathlib import Path

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from helpers import central_differences
from sciad.adjoints import SENSEALGS, describe, engine_option, parse


def lotka_volterra(u, p, t):
    xp = sciad.ad.namespace(u, p)
    return xp.stack([p[0] * u[0] - p[1] * u[0] * u[1], -p[2] * u[1] + p[3] * u[0] * u[1]])


def linear_many_params(u, p, t):
    """u' = -u + tanh(W u): n = 12 states, m = 144 parameters."""
    xp = sciad.ad.namespace(u, p)
    return -u + xp.tanh(xp.reshape(p, (12, 12)) @ u)


@pytest.fixture
def lv():
    return sciad.ODEProblem(lotka_volterra, np.ones(2), (0.0, 10.0), np.array([1.5, 1.0, 3.0, 1.0]))


TS = np.linspace(0.0, 10.0, 11)
PROGRAMS = Path(__file__).parent / "programs"


def test_few_parameters_get_forward_mode(lv):
    choice = sciad.select_sensealg(lv, saveat=TS)  # n = 2 ≤ m = 4: through the solver's steps
    assert isinstance(choice.sensealg, sciad.ForwardDiffSensitivity)
    report = choice.report()
    assert "states: 2" in report and "forward mode" in report
    many_states = sciad.ODEProblem(lambda u, p, t: -p[0] * u + p[1], np.ones(6), (0.0, 1.0), np.array([1.0, 0.5]))
    assert isinstance(sciad.select_sensealg(many_states, saveat=TS / 10).sensealg, sciad.ForwardSensitivity)
    stiff = sciad.select_sensealg(many_states, saveat=TS / 10, solver="kvaerno5")
    assert isinstance(stiff.sensealg, sciad.ForwardDiffSensitivity) and "implicit solver" in stiff.report()


def test_many_parameters_get_an_adjoint():
    """m = 12n: the store-all DiscreteAdjoint while the stored steps fit in memory, at any number of save
    points and with any solver; past that, DiscreteAdjoint for dense saves and a continuous adjoint otherwise."""
    rng = np.random.default_rng(0)
    prob = sciad.ODEProblem(linear_many_params, rng.normal(size=12), (0.0, 1.0), 0.1 * rng.normal(size=144))
    for saveat, solver in (([1.0], "tsit5"), (np.linspace(0, 1, 5), "tsit5"), ([1.0], "kvaerno5")):
        stored = sciad.select_sensealg(prob, saveat=saveat, solver=solver)
        assert isinstance(stored.sensealg, sciad.DiscreteAdjoint) and "no re-solve" in stored.report()
    # A user's max_steps changes nothing: the stored steps are capped, the cost follows the steps taken.
    for max_steps in (100_000, 1_000_000):
        assert sciad.select_sensealg(prob, saveat=[1.0], max_steps=max_steps).sensealg == stored.sensealg
    # Past the memory (many states): DiscreteAdjoint for dense saves, a continuous adjoint otherwise.
    feat = dataclasses.replace(
        sciad.select.features(prob, [1.0]), stored_steps_bytes=2 * sciad.adjoints._discrete.STORE_ALL_BYTES
    )
    dense_saves = sciad.select.heuristic(dataclasses.replace(feat, save_points=5))
    assert isinstance(dense_saves.sensealg, sciad.DiscreteAdjoint) and "per save point" in dense_saves.reason
    sparse_saves = sciad.select.heuristic(feat)
    assert isinstance(sparse_saves.sensealg, sciad.BacksolveAdjoint)
    assert sparse_saves.sensealg.vjp.name == "jax-reverse"
    stiff = sciad.select.heuristic(dataclasses.replace(feat, implicit_solver=True))
    assert isinstance(stiff.sensealg, sciad.InterpolatingAdjoint) and "stiff" in stiff.reason
    many_states = dataclasses.replace(feat, states=512, parameters=30, save_points=2, stored_steps_bytes=0)
    assert sciad.select.heuristic(many_states).rule == "explicit"  # m ≪ n: BacksolveAdjoint beats it


def test_report_names_the_rule_and_when_autotuned_the_measured_alternatives(lv):
    heuristic = sciad.select_sensealg(lv, saveat=TS)
    assert heuristic.heuristic_pick.rule == "few-parameters"
    assert "(heuristic rule `few-parameters`)" in heuristic.report().splitlines()[0]
    rows = [
        {
            "name": "DiscreteAdjoint",
            "reason": "discretise-then-optimise",
            "median_s": 0.002,
            "compile_s": 1.0,
            "rel_error": 0.0,
            "ok": True,
        },
        {
            "name": "BacksolveAdjoint(jax-reverse)",
            "reason": "backsolve",
            "median_s": 0.003,
            "compile_s": 2.0,
            "rel_error": 1e-7,
            "ok": True,
        },
    ]
    tuned = sciad.Choice(sciad.DiscreteAdjoint(), heuristic.features, rows, autotuned=True).report()
    assert tuned.splitlines()[0] == (
        "chosen: DiscreteAdjoint (autotuned: the fastest correct of 2 measured; "
        "heuristic rule `few-parameters` would pick ForwardDiffSensitivity)"
    )
    assert "| BacksolveAdjoint(jax-reverse) | backsolve | 0.003 | – | 2 | 1e-07 | True |" in tuned


def timed_row(name, times, ok=True):
    """A candidate's row as `sciad.select.measure` writes it."""
    q25, median, q75 = sciad.timing.quartiles(times)
    return {"name": name, "reason": "r", "ok": ok, "times_s": times, "median_s": median, "spread": (q75 - q25) / median}


def test_ties_within_noise_go_to_the_heuristic_pick(lv):
    """Interquartile ranges that overlap the fastest's are a tie, settled for the heuristic's pick;
    apart, the fastest wins whatever the pick; a wrong or unmeasured row never ties."""
    pick = "ForwardDiffSensitivity"  # the heuristic's pick for lv
    fast = timed_row("DiscreteAdjoint", [1.0, 1.1, 1.2, 1.3, 1.4])  # quartiles 1.1, 1.2, 1.3
    near = timed_row(pick, [1.2, 1.25, 1.3, 1.35, 1.4])  # lower quartile 1.25 ≤ 1.3: a tie
    far = timed_row(pick, [1.35, 1.4, 1.45, 1.5, 1.55])  # lower quartile 1.4 > 1.3: slower
    wrong = timed_row("BacksolveAdjoint(jax-reverse)", [0.5] * 5, ok=False)
    skipped = {"name": "GaussAdjoint(jax-reverse)", "reason": "r", "ok": "not measured: budget", "times_s": []}
    assert sciad.timing.ties([fast, near, wrong, skipped]) == [fast, near]
    assert sciad.timing.fastest([fast, near, wrong, skipped]) is fast
    assert sciad.timing.fastest([fast, near, wrong, skipped], prefer=pick) is near
    assert sciad.timing.ties([fast, far]) == [fast] and sciad.timing.fastest([fast, far], prefer=pick) is fast
    assert sciad.timing.ties([wrong, skipped]) == [] and sciad.timing.fastest([wrong, skipped]) is None

    feat = sciad.select_sensealg(lv, saveat=TS).features
    tie = sciad.Choice(sciad.ForwardDiffSensitivity(), feat, [fast, near, wrong, skipped], autotuned=True)
    assert tie.report().splitlines()[0] == (
        "chosen: ForwardDiffSensitivity (autotuned: tie (within noise) among DiscreteAdjoint, ForwardDiffSensitivity "
        "of 3 measured, the heuristic's pick taken; heuristic rule `few-parameters` would pick ForwardDiffSensitivity)"
    )
    assert "| DiscreteAdjoint | r | 1.2 | 0.167 | – | – | True |" in tie.report()  # IQR 0.2 over the median 1.2
    assert "| GaussAdjoint(jax-reverse) | r | – | – | – | – | not measured: budget |" in tie.report()
    apart = sciad.Choice(sciad.DiscreteAdjoint(), feat, [fast, far], autotuned=True).report()
    assert "(autotuned: the fastest correct of 2 measured;" in apart


def mlp_problem(activation=jnp.tanh):
    """u' = MLP(u): n = 2 states, m = 42 parameters in an equinox model with a function leaf."""
    mlp = eqx.nn.MLP(2, 2, 8, 1, activation=activation, key=jax.random.key(0))
    return sciad.ODEProblem(lambda u, p, t: p(u), np.ones(2), (0.0, 1.0), mlp)


@pytest.mark.slow  # the default run autotunes in test_autotune_budget_bounds_the_whole_call
def test_autotune_an_equinox_model(monkeypatch, tmp_path):
    """p with a non-array leaf (the activation): gradients over its array leaves checked against the
    DiscreteAdjoint reference, timed, the choice cached; the cache key tells activations apart."""
    prob = mlp_problem()
    few = [(sciad.BacksolveAdjoint(), "backsolve"), (sciad.DiscreteAdjoint(), "discretise-then-optimise")]
    monkeypatch.setattr(sciad._select, "candidates", lambda feat: few)
    choice = sciad.select_sensealg(prob, saveat=[0.5, 1.0], autotune=True, budget=60.0, cache_dir=tmp_path)
    discrete, backsolve = choice.candidates  # the heuristic's pick (stored-steps) first
    assert discrete["name"] == "DiscreteAdjoint" and discrete["rel_error"] == 0.0
    assert backsolve["ok"] is True and backsolve["rel_error"] > 0  # continuous against discrete
    assert all(len(c["times_s"]) >= 1 and c["median_s"] > 0 for c in choice.candidates)
    assert choice.name in ("DiscreteAdjoint", "BacksolveAdjoint(jax-reverse)")
    again = sciad.select_sensealg(prob, saveat=[0.5, 1.0], autotune=True, budget=60.0, cache_dir=tmp_path)
    assert again.candidates == choice.candidates and again.features == choice.features  # answered from disk
    key = sciad._select._key
    args = (np.array([0.5, 1.0]), sum, "tsit5", {}, 60.0)
    assert key(prob, *args) == key(mlp_problem(), *args) != key(mlp_problem(jax.nn.relu), *args)


def test_autotune_budget_bounds_the_whole_call(lv):
    """Compiling all of lv's candidates takes far longer than the budget: the call ends within the
    budget plus the compilation under way at the deadline, a warm-up and one timed round; the heuristic's pick
    is always measured, the rest skipped once the budget is spent."""
    for budget in (3.0, 1e-3):
        start = time.perf_counter()
        choice = sciad.select_sensealg(lv, saveat=TS, autotune=True, budget=budget)
        wall = time.perf_counter() - start
        measured = [c for c in choice.candidates if "compile_s" in c]
        one_round = sum(c["times_s"][0] for c in measured if c["times_s"])
        assert wall < budget + max(c["compile_s"] for c in measured) + 2 * one_round + 1.0
        assert choice.candidates[0]["name"] == "ForwardDiffSensitivity" == measured[0]["name"]
        assert "median_s" in choice.candidates[0]
        assert any(c["ok"] == "not measured: budget" for c in choice.candidates)
    # 1e-3 s: the pick alone, before the reference could be compiled
    assert measured == choice.candidates[:1] and choice.candidates[0]["ok"] == "unchecked: budget"
    assert choice.name == "ForwardDiffSensitivity"
    assert "the heuristic's pick alone measured, unchecked" in choice.report().splitlines()[0]


def test_autotune_cache_in_an_older_layout_is_a_miss(lv, tmp_path):
    """A cached choice whose features are an older sciad's dict (spaced keys) is measured again and rewritten."""
    choice = sciad.select_sensealg(lv, saveat=TS, autotune=True, budget=1e-3, cache_dir=tmp_path)
    [path] = tmp_path.glob("*.json")
    entry = json.loads(path.read_text())
    assert entry["features"] == dataclasses.asdict(choice.features)
    path.write_text(json.dumps({**entry, "features": {"states": 2, "parameters": 4, "implicit solver": False}}))
    again = sciad.select_sensealg(lv, saveat=TS, autotune=True, budget=1e-3, cache_dir=tmp_path)
    assert again.features == choice.features
    assert json.loads(path.read_text())["features"] == dataclasses.asdict(choice.features)


def test_heuristic_thresholds_are_an_argument():
    feat = sciad.select.Features(
        states=2,
        parameters=20,
        dtype="float64",
        implicit_solver=False,
        save_points=30,
        rtol=1e-6,
        atol=1e-6,
        interpolation_bytes=0,
        stored_steps_bytes=2 * sciad.adjoints._discrete.STORE_ALL_BYTES,
        memory_budget=None,
        device="cpu",
    )
    assert sciad.select.heuristic(feat).rule == "dense-saves"
    assert set(sciad.select.RULES) >= {sciad.select.heuristic(feat).rule}
    wide = dataclasses.replace(sciad.select.THRESHOLDS, forward_mode_parameters=32)
    assert sciad.select.heuristic(feat, wide).rule == "few-parameters"
    sparse = dataclasses.replace(sciad.select.THRESHOLDS, dense_saves=50)
    pick = sciad.select.heuristic(feat, sparse)
    assert pick.rule == "explicit" and isinstance(pick.sensealg, sciad.BacksolveAdjoint)


def test_memory_budget_turns_on_checkpointing():
    rng = np.random.default_rng(1)
    prob = sciad.ODEProblem(linear_many_params, rng.normal(size=12), (0.0, 1.0), 0.1 * rng.normal(size=144))
    choice = sciad.select_sensealg(prob, saveat=[1.0], memory_budget=10)
    assert isinstance(choice.sensealg, sciad.InterpolatingAdjoint) and choice.sensealg.checkpointing


def test_auto_in_solve_matches_finite_differences(lv):
    def loss(p, sensealg):
        return sciad.solve(lv, p=p, saveat=TS, sensealg=sensealg).us.sum()

    auto = jax.jit(jax.grad(loss), static_argnums=1)(lv.p, "auto")
    # central differences of the solve at rtol = 1e-6: a reference independent of every sensealg
    np.testing.assert_allclose(auto, central_differences(jax.jit(lambda p: loss(p, None)), lv.p), rtol=1e-3)


@pytest.mark.slow
def test_autotune_picks_a_correct_candidate_and_caches(lv, tmp_path):
    short = sciad.ODEProblem(lotka_volterra, np.ones(2), (0.0, 1.0), lv.p)
    choice = sciad.select_sensealg(short, saveat=[0.5, 1.0], autotune=True, budget=300.0, cache_dir=tmp_path)
    assert choice.autotuned
    timed = [c for c in choice.candidates if "median_s" in c]
    assert len(timed) >= 5 and not any(c["ok"] == "not measured: budget" for c in choice.candidates)
    assert sciad.timing.fastest(timed, prefer="ForwardDiffSensitivity")["name"] == choice.name
    assert list(tmp_path.glob("*.json"))
    again = sciad.select_sensealg(short, saveat=[0.5, 1.0], autotune=True, budget=300.0, cache_dir=tmp_path)
    assert again.name == choice.name
    assert again.candidates == choice.candidates  # answered from disk, not measured again
    other = sciad.select_sensealg(
        short, saveat=[0.5, 1.0], autotune=True, budget=300.0, cache_dir=tmp_path, memory_budget=10
    )  # another budget: another key, measured again
    assert len(list(tmp_path.glob("*.json"))) == 2
    assert not any("InterpolatingAdjoint(jax-reverse)" == c["name"] for c in other.candidates)


def test_autotune_budget_must_be_positive(lv):
    for budget in (0.0, -1.0):
        with pytest.raises(ValueError, match="budget must be a positive"):
            sciad.select_sensealg(lv, saveat=TS, autotune=True, budget=budget)


def test_autotune_rejects_non_scalar_loss(lv):
    with pytest.raises(ValueError, match="scalar"):
        sciad.select_sensealg(lv, saveat=[1.0], autotune=True, loss=lambda us: us, budget=1.0)


def test_select_rejects_bad_problem():
    with pytest.raises(TypeError, match="ODEProblem"):
        sciad.select_sensealg("not a problem", saveat=TS)


def test_memory_budget_changes_the_answer_for_the_same_problem(lv):
    rng = np.random.default_rng(1)
    prob = sciad.ODEProblem(linear_many_params, rng.normal(size=12), (0.0, 1.0), 0.1 * rng.normal(size=144))
    assert isinstance(sciad.select_sensealg(prob, saveat=[1.0]).sensealg, sciad.DiscreteAdjoint)
    assert sciad.select_sensealg(prob, saveat=[1.0], memory_budget=10).sensealg.checkpointing
    assert isinstance(sciad.select_sensealg(prob, saveat=[1.0]).sensealg, sciad.DiscreteAdjoint)


def test_heuristic_reads_sizes_of_pytrees_and_runs_on_tracers():
    u0 = {"x": np.zeros(3), "v": np.zeros(3)}
    p = (np.zeros((4, 5)), np.zeros(2), "static")
    feat = sciad._auto.features(u0, p, np.linspace(0, 1, 7), solver=dfx.Tsit5(), rtol=1e-6, atol=1e-6)
    assert (feat.states, feat.parameters, feat.save_points) == (6, 22, 7)
    assert feat.implicit_solver is False and feat.interpolation_bytes == 4096 * 8 * 6 * 8

    def pick(p, ts):
        choice = sciad._auto.auto_sensealg(u0, p, ts, solver=dfx.Kvaerno5(), rtol=1e-6, atol=1e-6)
        assert isinstance(choice.sensealg, sciad.InterpolatingAdjoint)  # decided while tracing
        return p

    jax.jit(pick)(np.zeros(20), np.linspace(0, 1, 2))


@pytest.mark.slow
def test_auto_under_jit_in_a_fresh_process_matches_discrete_adjoint():
    """No un-jitted call first: the choice is made while tracing."""
    out = subprocess.run(
        [sys.executable, str(PROGRAMS / "auto_under_jit.py")], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def every_option_changed(cls):
    """An instance of `cls` with every option away from its default."""
    changed = {
        "vjp": "jax-transpose",
        "jvp": "finite-differences",
        "checkpointing": True,
        "checkpoints": (0.25, 0.5),
        "interval_max_steps": 99,
        "on_instability": "warn",
        "drift_tolerance": 7.5,
        "seminorm": True,
        "stored_steps": 17,
        "coupling": 0.9,
    }
    names = set(inspect.signature(cls).parameters)  # a sensealg's options: its constructor's
    missing = names - set(changed)
    assert not missing, f"add a changed value for {cls.__name__}'s options {missing} to this test"
    return cls(**{k: v for k, v in changed.items() if k in names})


@pytest.mark.parametrize("name", list(SENSEALGS))
def test_names_round_trip_every_option(name):
    for sensealg in (SENSEALGS[name](), every_option_changed(SENSEALGS[name])):
        text = describe(sensealg)
        assert parse(text) == sensealg, text
        assert text.partition("(")[0] == name
    option = engine_option(SENSEALGS[name])
    if option:
        rebuilt = parse(describe(sensealg, engine=False), **{option: "jax-forward"})
        assert getattr(rebuilt, option).name == "jax-forward"
    assert describe(SENSEALGS[name]()) == describe(parse(name))


def test_names_keep_engine_settings_and_reject_unknown_options():
    s = sciad.InterpolatingAdjoint(sciad.ad.JaxReverse(jit=False), checkpointing=True)
    assert describe(s) == "InterpolatingAdjoint(jax-reverse(jit=False), checkpointing=True)"
    assert parse(describe(s)) == s
    with pytest.raises(ValueError, match="has no option bogus"):
        parse("InterpolatingAdjoint(bogus=1)")
    with pytest.raises(ValueError, match="unknown sensealg"):
        parse("AdjointOfTheFuture()")
    with pytest.raises(ValueError, match="in quotes"):
        parse("BacksolveAdjoint(on_instability=warn)")
