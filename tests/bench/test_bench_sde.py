"""`sciad bench sde`: its problems' Stratonovich forms, the hand-written schemes its checks rest on, torchsde on a
given path, and (slow) the quick benchmark end to end. No timing assertions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("matplotlib", reason="the benchmark product: pip install 'sciad[bench]'")
from sciad_bench import sde  # noqa: E402


@pytest.mark.parametrize("make", [lambda: sde.neural_sde(3, 4, 10), lambda: sde.lotka_volterra(4, 40)])
def test_stratonovich_forms_subtract_half_g_times_its_diagonal_derivative(make):
    """Each problem's written-out Stratonovich drift is drift − ½ g ∘ diag(∂g/∂u), ∂g/∂u by `jax.jacfwd`."""
    b = make()
    p = jnp.asarray(b.p)
    for u in (jnp.asarray(b.u0) + 0.1, jnp.asarray(b.u0) * 0.7):
        jacobian = jax.jacfwd(lambda u: b.diffusion(u, p, 0.0))(u)
        want = b.drift(u, p, 0.0) - 0.5 * b.diffusion(u, p, 0.0) * jnp.diag(jacobian)
        np.testing.assert_allclose(b.stratonovich_drift(u, p, 0.0), want, rtol=1e-12, atol=1e-14)


def test_schemes_converge_to_one_another_on_one_path():
    """On the same increments, Itô Euler and Heun / reversible Heun on the Stratonovich form approach one solution
    as the steps shrink (the increments of a fine grid summed for the coarse ones)."""
    b = sde.neural_sde(3, 8, 1024)
    fine = sde.predrawn(b)

    def losses(steps):
        coarse = sde.neural_sde(3, 8, steps)
        dws = fine.reshape(8, steps, 1024 // steps, 3).sum(2)
        return {
            s: float(sde.scan_loss(coarse, s, jnp.asarray(b.p), dws, jnp.asarray(coarse.grid))) for s in sde.SCHEMES
        }

    coarse, finer = losses(32), losses(1024)
    spread = lambda values: max(values.values()) - min(values.values())  # noqa: E731
    assert spread(finer) < spread(coarse) / 4


def test_torchsde_on_the_floors_increments_gives_the_floors_gradient():
    """torchsde's gradients on a Brownian motion returning the floor's increments agree with the hand-written scan of
    the same scheme: backpropagation through Euler and reversible Heun's adjoint exactly, the Itô adjoint SDE within
    its discretisation error."""
    pytest.importorskip("torchsde")
    import torch

    b = sde.neural_sde(3, 4, 20)
    dws = sde.predrawn(b)
    bm = sde._increments_brownian(torch.as_tensor(np.asarray(dws).transpose(1, 0, 2).copy()), b.t0, b.dt)
    references = sde._References(b)
    for name, (scheme, adjoint, _, _) in sde.TORCHSDE.items():
        gradient = sde.torchsde_gradient(b, name)(bm)
        reference = references(scheme, dws, b.grid)
        error = np.max(np.abs(gradient - reference)) / np.max(np.abs(reference))
        assert error < (sde.EXACT if not adjoint or scheme == "reversible_heun" else sde.CONTINUOUS), (name, error)


@pytest.mark.slow
def test_sde_benchmark_checks_then_times(tmp_path):
    """`sciad bench sde --quick`: the floor, diffrax's adjoints and torchsde agree with the same-path references and
    are timed; diffrax's BacksolveAdjoint refuses Itô Euler (recorded); no gradient is wrong; sciad's rows are
    timed or say why not; records, table and figure written."""
    result = sde.run_sde(quick=True, repeats=1, out=tmp_path, verbose=False)
    records = result["records"]
    assert {r["problem"] for r in records} == {"neural SDE", "stochastic Lotka–Volterra"}
    assert all(r["ok"] is not False for r in records), [
        (r["name"], r["rel_error"]) for r in records if r["ok"] is False
    ]
    for r in records:
        if r["kind"] == "peer" and r["name"] != "diffrax Euler BacksolveAdjoint":
            assert r["ok"] is True and r["median_s"], (r["problem"], r["name"], r["ok"])
        if r["kind"] == "floor":
            assert r["ok"] is True and r["rel_error"] == 0.0 and r["temp_bytes"]
    refused = [r for r in records if r["name"] == "diffrax Euler BacksolveAdjoint"]
    assert refused and all("Stratonovich" in r["ok"] for r in refused)
    if result["sciad_sdes"]:
        assert any(r["kind"] == "sciad" and r["ok"] is True for r in records)
    assert {p.name for p in tmp_path.iterdir()} >= {"records.json", "sde.png", "table.md"}
    table = (tmp_path / "table.md").read_text()
    assert "Targets: " in table and "× scan" in table and "Memory against the number of steps" in table
    assert {r["steps"] for r in result["memory"]} == set(sde.MEMORY_STEPS[True])
