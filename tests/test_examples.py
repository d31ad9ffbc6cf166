"""The worked examples in examples/ run at a tiny size and give sensible results."""

import importlib.util
import pathlib

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"

pytest.importorskip("matplotlib")


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_spiral_training_lowers_the_loss(tmp_path):
    pytest.importorskip("optax")
    result = load("spiral_training").main(iterations=80, hidden=8, print_every=40, out_dir=tmp_path)
    losses = result["losses"]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.2 * losses[0]
    assert (tmp_path / "spiral_loss.png").stat().st_size > 0
    assert (tmp_path / "spiral_fit.png").stat().st_size > 0


def test_parameter_fit_recovers_the_parameters_with_either_engine(tmp_path):
    result = load("parameter_fit").main(backends=("jax-forward", "finite-differences"), out_dir=tmp_path)
    (p_ad, iterations, _, _), (p_fd, _, _, _) = result["fits"].values()
    np.testing.assert_allclose(p_ad, result["p_true"], rtol=0.05)
    np.testing.assert_allclose(p_fd, p_ad, rtol=1e-5)
    assert iterations < 50
    assert (tmp_path / "lotka_volterra_fit.png").stat().st_size > 0


def test_sensitivities_match_finite_differences(tmp_path):
    result = load("sensitivity_analysis").main(points=21, out_dir=tmp_path)
    assert result["sensitivities"].shape == (21, 2, 4)
    assert result["rel_error"] < 1e-6
    assert (tmp_path / "lotka_volterra_sensitivities.png").stat().st_size > 0


@pytest.mark.slow
def test_ensemble_gradients_match_plain_vmap(tmp_path):
    result = load("ensemble").main(members=8, out_dir=tmp_path)
    grads = result["sensitivities"]
    assert grads.shape == (8, 4) and np.all(np.isfinite(grads)) and np.ptp(grads[:, 0]) > 0
    assert result["vmap_difference"] < 1e-10
    low, median, high = (result["bands"][q] for q in (0.05, 0.5, 0.95))
    assert median.shape == (101, 2) and np.all(low <= median) and np.all(median <= high)
    assert (tmp_path / "ensemble.png").stat().st_size > 0
