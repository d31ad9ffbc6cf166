"""`sciad bench dae`'s problems (sciad_bench.dae, sciad_bench.battery): the SPMe battery's consistent initial
state and physical discharge, sciad against IDAS on it at a small grid, and the plan at the large
reaction–diffusion sizes."""

import jax.numpy as jnp
import numpy as np
import pytest

import sciad

pytest.importorskip("casadi")

from sciad_bench import battery, dae  # noqa: E402

SMALL = dict(shells=8, cells=6)  # 55 states: the dense path, seconds to compile


@pytest.fixture(scope="module")
def small():
    return dae.battery(**SMALL)


@pytest.mark.slow
def test_spme_closed_form_algebraic_states_solve_its_algebraic_equations():
    """`SPMe.consistent` (closed form) zeroes the algebraic residuals, in JAX and in CasADi alike, and sciad's
    consistent initialisation (Newton from zeros) finds the same states."""
    import casadi as ca

    model = battery.SPMe(**SMALL)
    theta = jnp.asarray(battery.THETA)
    z = model.consistent(jnp.asarray(model.x0), theta, battery.namespace("jax"))
    rates, alg = model.equations(jnp.asarray(model.x0), z, theta, battery.namespace("jax"))
    assert float(jnp.max(jnp.abs(alg))) < 1e-12
    assert z.size == model.states - model.differential == 3 * SMALL["cells"] + 3
    xp = battery.namespace("casadi")
    ode, alg_ca = model.equations(ca.DM(model.x0), ca.DM(np.asarray(z)), ca.DM(battery.THETA), xp)
    np.testing.assert_allclose(np.asarray(ode).ravel(), rates, rtol=1e-12, atol=1e-18)
    np.testing.assert_allclose(np.asarray(alg_ca).ravel(), alg, atol=1e-12)
    np.testing.assert_allclose(
        np.asarray(model.consistent(ca.DM(model.x0), ca.DM(battery.THETA), xp)).ravel(), z, rtol=1e-12
    )
    b = dae.battery(**SMALL)
    sol = sciad.solve(b.problem, saveat=np.array([0.0, 1.0]), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(sol.us[0], b.u0_consistent, rtol=1e-9, atol=1e-12)
    eta_n, eta_p, V = (float(v) for v in z[-3:])
    assert 3.9 < V < 4.1 and 0 < eta_n < 0.2 and -0.1 < eta_p < 0  # discharge: anodic negative, cathodic positive


def test_spme_discharge_is_physical(small):
    """1C from rest: the voltage falls monotonically within 3.2-4.1 V; every concentration stays in range and
    the electrolyte's lithium is conserved (∫ ε c dx)."""
    us = np.asarray(dae.sciad_forward(small)())
    model = battery.SPMe(**SMALL)
    V = us[:, -1]
    assert np.all(np.diff(V) < 0) and 3.2 < V[-1] < V[0] < 4.1, V
    s, c = us[:, : 2 * model.shells], us[:, 2 * model.shells : model.differential]
    assert np.all((s > 0.05) & (s < 0.95)) and np.all((c > 0.2) & (c < 3))
    width, eps, *_ = model._cells()
    np.testing.assert_allclose(c @ (eps * width), np.sum(eps * width), rtol=1e-6)


@pytest.mark.slow
def test_spme_sciad_agrees_with_idas(small):
    """Forward (saved states) and the gradient in θ: sciad DiscreteAdjoint, and ForwardDiffSensitivity from the
    consistent u0, against IDAS's forward sensitivities and its adjoint (per interval), at 1e-4 (max norm)."""
    ida = dae.idas_forward(small)()
    ours = np.asarray(dae.sciad_forward(small)())
    assert sciad.timing.relative_error(ours, ida) < 1e-4
    grads = {
        s: np.asarray(dae.sciad_gradient(small, s, initialization=i)())
        for s, i in (("DiscreteAdjoint", None), ("ForwardDiffSensitivity", "none"))
    }
    np.testing.assert_allclose(grads["DiscreteAdjoint"], grads["ForwardDiffSensitivity"], rtol=1e-8)
    assert np.all(grads["DiscreteAdjoint"] != 0)
    for mode in ("forward", "adjoint per interval"):
        assert sciad.timing.relative_error(dae.idas_gradient(small, mode)(), grads["DiscreteAdjoint"]) < 1e-4, mode


@pytest.mark.slow
def test_spme_gauss_adjoint_agrees_with_idas(small):
    g = np.asarray(dae.sciad_gradient(small, "GaussAdjoint")())
    assert sciad.timing.relative_error(dae.idas_gradient(small, "forward")(), g) < 1e-4


def test_large_reaction_diffusion_plans_name_what_they_skip():
    """At 20,000 states every sciad call runs but GaussAdjoint, which is recorded as skipped with its reason (not
    dropped); at 5,000 states it runs."""

    def plan(n):
        prob = sciad.ODEProblem(lambda u, p, t: -u, np.zeros(2 * n), (0.0, 1.0), np.ones(3), mass_matrix=np.ones(2 * n))
        return dae.gradient_plan(
            dae.DAEBench(
                "reaction-diffusion",
                n,
                prob,
                np.ones(1),
                None,
                1e-6,
                1e-8,
                None,
                None,
                None,
                None,
                None,
                np.zeros(2 * n),
            )
        )

    large, medium = plan(10_000), plan(2_500)
    assert large["sciad GaussAdjoint"].startswith("skipped beyond") and callable(medium["sciad GaussAdjoint"])
    assert all(callable(build) for name, build in large.items() if name != "sciad GaussAdjoint")
    assert dae.SIZES[False][-3:] == (500, 2500, 10_000) and dae.SIZES[True] == (50,)
    row = {
        "problem": "reaction-diffusion",
        "states": 20_000,
        "what": "gradient",
        "name": "sciad GaussAdjoint",
        "ok": large["sciad GaussAdjoint"],
        "median_s": None,
    }
    assert "skipped beyond" in dae.markdown([row])


@pytest.mark.slow
def test_dae_benchmark_with_the_battery_writes_its_discharge(tmp_path, monkeypatch):
    """The battery in a quick run (a small grid): every gradient but IDAS's output-grid adjoint checked and timed,
    its voltage curve by both solvers in records.json and dae-battery.png."""
    import json

    make = dae.battery
    monkeypatch.setattr(dae, "battery", lambda: make(**SMALL))
    records = dae.run_dae(quick=True, repeats=1, out=tmp_path, verbose=False, sizes=(10,), with_battery=True)
    mine = [r for r in records if r["problem"] == "SPMe battery"]
    assert mine and all(r["ok"] is True for r in mine if r["name"] != f"{dae.IDAS} adjoint (output grid)")
    curve = json.loads((tmp_path / "records.json").read_text())["battery_voltage"]
    np.testing.assert_allclose(curve["sciad"], curve["IDAS"], rtol=1e-4)
    assert (tmp_path / "dae-battery.png").exists()
