"""select_sensealg: heuristic picks, autotuning, caching, errors."""

import jax
import numpy as np
import pytest

import sciad


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


def test_few_parameters_get_forward_mode(lv):
    choice = sciad.select_sensealg(lv, saveat=TS)
    assert isinstance(choice.sensealg, sciad.ForwardSensitivity)
    report = choice.report()
    assert "states: 2" in report and "forward mode" in report


def test_many_parameters_get_an_adjoint():
    rng = np.random.default_rng(0)
    prob = sciad.ODEProblem(linear_many_params, rng.normal(size=12), (0.0, 1.0), 0.1 * rng.normal(size=144))
    # 6 steps over 5 save points: restarts would dominate a continuous adjoint.
    dense_saves = sciad.select_sensealg(prob, saveat=np.linspace(0, 1, 5))
    assert isinstance(dense_saves.sensealg, sciad.DiscreteAdjoint) and "per save point" in dense_saves.report()
    sparse_saves = sciad.select_sensealg(prob, saveat=[1.0])
    assert isinstance(sparse_saves.sensealg, sciad.BacksolveAdjoint)
    assert sparse_saves.sensealg.vjp.name == "jax-reverse"
    stiff = sciad.select_sensealg(prob, saveat=[1.0], solver="kvaerno5")
    assert isinstance(stiff.sensealg, sciad.InterpolatingAdjoint) and "stiff" in stiff.report()


def test_memory_budget_turns_on_checkpointing():
    rng = np.random.default_rng(1)
    prob = sciad.ODEProblem(linear_many_params, rng.normal(size=12), (0.0, 1.0), 0.1 * rng.normal(size=144))
    choice = sciad.select_sensealg(prob, saveat=[1.0], memory_budget=10)
    assert isinstance(choice.sensealg, sciad.InterpolatingAdjoint) and choice.sensealg.checkpointing


def test_auto_in_solve_matches_discrete_adjoint(lv):
    def loss(p, sensealg):
        return sciad.solve(lv, p=p, saveat=TS, sensealg=sensealg).us.sum()

    auto = jax.grad(loss)(lv.p, "auto")
    ref = jax.grad(loss)(lv.p, sciad.DiscreteAdjoint())
    np.testing.assert_allclose(auto, ref, rtol=1e-3)  # continuous vs discrete gradient at rtol = 1e-6


def test_autotune_picks_a_correct_candidate_and_caches(lv, tmp_path):
    short = sciad.ODEProblem(lotka_volterra, np.ones(2), (0.0, 1.0), lv.p)
    choice = sciad.select_sensealg(short, saveat=[0.5, 1.0], autotune=True, budget=2.0, cache_dir=tmp_path)
    assert choice.autotuned
    timed = [c for c in choice.candidates if "median_s" in c]
    assert len(timed) >= 5
    best = min((c for c in timed if c["ok"] is True), key=lambda c: c["median_s"])
    assert best["name"] == sciad.select.describe(choice.sensealg)
    assert list(tmp_path.glob("*.json"))
    sciad.select._CACHE.clear()  # the disk cache answers now
    again = sciad.select_sensealg(short, saveat=[0.5, 1.0], autotune=True, budget=2.0, cache_dir=tmp_path)
    assert sciad.select.describe(again.sensealg) == best["name"]


def test_autotune_budget_too_small(lv):
    with pytest.raises(ValueError, match="budget"):
        sciad.select_sensealg(lv, saveat=TS, autotune=True, budget=1e-3)


def test_autotune_rejects_non_scalar_loss(lv):
    with pytest.raises(ValueError, match="scalar"):
        sciad.select_sensealg(lv, saveat=[1.0], autotune=True, loss=lambda us: us, budget=1.0)


def test_select_rejects_bad_problem():
    with pytest.raises(TypeError, match="ODEProblem"):
        sciad.select_sensealg("not a problem", saveat=TS)
