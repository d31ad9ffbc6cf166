"""GPUs: gradients on a GPU equal the CPU's, ensembles shard over every GPU, and
`sciad bench gpu-crossover` times the CPU and the GPU in one run (tests marked `gpu`, skipped
where JAX sees none); the crossover plan's sizes and device choice are checked everywhere."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import sciad
from helpers import SENSEALGS, slow_except
from sciad.problems import lotka_volterra

pytest.importorskip("matplotlib", reason="the benchmark product: pip install 'sciad[bench]'")
from sciad_bench import experiments  # noqa: E402


def lv_gradient(sensealg, device):
    """∂loss/∂p of Lotka–Volterra computed on `device`."""
    bench = lotka_volterra()
    p = jax.device_put(jnp.asarray(bench.problem.p), device)
    with jax.default_device(device):
        return np.asarray(jax.jit(jax.grad(lambda p: bench.objective(p, sensealg)))(p))


@pytest.mark.gpu
@pytest.mark.parametrize("name", slow_except(list(SENSEALGS), fast={"InterpolatingAdjoint"}))
def test_gradient_on_a_gpu_equals_the_cpus(name):
    alg = SENSEALGS[name]()
    np.testing.assert_allclose(
        lv_gradient(alg, jax.devices("gpu")[0]), lv_gradient(alg, jax.devices("cpu")[0]), rtol=1e-9
    )


@pytest.mark.gpu
def test_ensemble_shards_over_every_gpu():
    gpus = jax.devices("gpu")
    bench = lotka_volterra()
    ps = bench.problem.p * np.linspace(0.9, 1.1, 2 * len(gpus))[:, None]
    mesh = jax.make_mesh((len(gpus),), ("batch",), axis_types=(AxisType.Auto,), devices=gpus)

    def loss(ps, mesh):
        return sciad.ensemble(bench.problem, ps=ps, saveat=bench.saveat, mesh=mesh).us.sum()

    on_gpus = jax.jit(jax.grad(lambda ps: loss(ps, mesh)))(ps)
    with jax.default_device(jax.devices("cpu")[0]):
        on_cpu = jax.jit(jax.grad(lambda ps: loss(ps, None)))(ps)
    assert {d.platform for d in on_gpus.sharding.device_set} == {"gpu"}
    np.testing.assert_allclose(on_gpus, on_cpu, rtol=1e-9)


@pytest.mark.gpu
def test_gpu_crossover_times_cpu_and_gpu_in_one_run(tmp_path):
    records = experiments.run_experiment(
        "gpu-crossover", quick=True, repeats=1, engines=["jax-reverse"], out=tmp_path, verbose=False
    )
    timed = {(r["size"], r["label"], r["device"].split(":")[0]) for r in records if r["ok"] and r["times"]}
    for size, label, _ in list(timed):
        assert {(size, label, "cpu"), (size, label, "gpu")} <= timed
    assert (tmp_path / "gpu-crossover.png").stat().st_size > 0


def test_crossover_plan_reaches_10000_hidden_units():
    plan, _ = experiments.PLANS["gpu-crossover"](["jax-reverse"], False)
    assert max(bench.size for bench, _ in plan) >= 5 * 10_000 + 4
    quick, _ = experiments.PLANS["gpu-crossover"](["jax-reverse"], True)
    assert max(bench.size for bench, _ in quick) < 5 * 1000


def test_crossover_takes_the_cpu_and_a_gpu_where_there_is_one(monkeypatch):
    cpu = jax.devices("cpu")[0]
    real = jax.devices
    assert experiments.devices_for("gpu-crossover")[0] == cpu
    standin = object()  # a GPU for the device choice, on a machine without one
    monkeypatch.setattr(jax, "devices", lambda backend=None: [standin] if backend == "gpu" else real(backend))
    assert experiments.devices_for("gpu-crossover") == [cpu, standin]
    assert experiments.devices_for("lotka-volterra") == [real()[0]]
