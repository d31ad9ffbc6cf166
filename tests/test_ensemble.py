"""`sciad.ensemble`: batches of u0, p and save times, sharded over 8 simulated CPU devices in a
child process (JAX reads XLA_FLAGS when it starts), against the unsharded batch, plain
`jax.vmap` and single solves; and its errors at the call."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from helpers import SENSEALGS
from sciad.adjoints import describe
from sciad.problems import lotka_volterra

DEVICES = 8

CHILD = Path(__file__).parent / "programs" / "ensemble_sharded.py"


def run_child(*cases: str) -> dict:
    """Run CHILD on `cases` with DEVICES simulated CPU devices; its results."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={DEVICES}"
    proc = subprocess.run(
        [sys.executable, str(CHILD), *cases],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "XLA_FLAGS": flags.strip(), "JAX_PLATFORMS": "cpu"},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"child failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert out["devices"] == DEVICES
    return out


@pytest.mark.slow
def test_sharded_ensembles_match_unsharded_vmap_and_single_solves():
    out = run_child("recipes", "pytree", "sde")
    assert out["sde"]["rel"] < 1e-12 and out["sde"]["us"]["devices"] == DEVICES  # Brownian paths sharded
    recipes = out["recipes"]
    assert recipes["rel"] < 1e-12 and recipes["norm"] > 0  # helper sharded = unsharded
    assert recipes["us"] == {"devices": DEVICES, "spec": "P('batch',)"}
    assert recipes["vmap"] < 1e-12 and recipes["vmap_grads"]["devices"] == DEVICES  # plain jax.vmap, sharded input
    assert recipes["shard_map"] < 1e-12  # per-device loops
    assert recipes["member"] < 1e-12  # = one member's own gradient
    tree = out["pytree"]
    assert tree["rel"] < 1e-12 and tree["shape"] == [12, 11]  # 12 members padded to 16 and back
    assert tree["ts"] == 0 and tree["member"] < 1e-12  # each member's own grid and solution
    assert all(np.all(np.isfinite(v)) and np.any(np.asarray(v) != 0) for v in tree["p_grad"].values())


@pytest.mark.slow
def test_every_sensealg_sharded_equals_unsharded_and_per_device_loops():
    cases = {name: describe(make()) for name, make in SENSEALGS.items()}  # as the child parses them
    out = run_child(*cases.values())
    for name, case in cases.items():
        assert out[case]["rel"] < 1e-12, name
        assert out[case]["norm"] > 0, name
        assert out[case]["us"] == {"devices": DEVICES, "spec": "P('batch',)"}, name
        assert out[case]["shard_map"] < 1e-12, name


@pytest.fixture(scope="module")
def lv():
    return lotka_volterra().problem


def test_ensemble_of_brownian_paths():
    """An SDE ensemble over keys: each member the solve of its own path; the gradient the members' sum."""
    prob = sciad.SDEProblem(lambda u, p, t: -p[0] * u, lambda u, p, t: p[1] * u, np.ones(2), (0.0, 1.0), np.ones(2))
    keys, p = jax.random.split(jax.random.key(0), 3), jnp.array([0.5, 0.3])

    def member(p, key):
        return sciad.solve(prob, key=key, p=p, dt0=0.05, saveat=[0.5, 1.0]).us

    def total(p):
        us = sciad.ensemble(prob, keys=keys, p=p, dt0=0.05, saveat=[0.5, 1.0]).us
        return jnp.sum(us), us

    # the ensemble's solutions and gradient from one compiled program (an eager ensemble compiles one per operation)
    (_, us), grad = jax.jit(jax.value_and_grad(total, has_aux=True))(p)
    solve = jax.jit(member)  # each member's own solve, one program
    np.testing.assert_array_equal(us, np.stack([solve(p, k) for k in keys]))
    member_grad = jax.jit(jax.grad(lambda p, k: jnp.sum(member(p, k))))  # each member's own, one program
    np.testing.assert_allclose(grad, sum(member_grad(p, k) for k in keys), rtol=1e-12)
    with pytest.raises(ValueError, match="keys= batches the Brownian paths of an SDEProblem"):
        sciad.ensemble(lotka_volterra().problem, keys=keys)


def test_ensemble_needs_a_batch_and_one_value_per_argument(lv):
    with pytest.raises(ValueError, match="at least one batched argument"):
        sciad.ensemble(lv, saveat=[0.0, 1.0])
    with pytest.raises(ValueError, match="both ps .* and p "):
        sciad.ensemble(lv, ps=np.ones((3, 4)), p=np.ones(4))
    with pytest.raises(ValueError, match="dense=True"):
        sciad.ensemble(lv, ps=np.ones((3, 4)), dense=True)


def test_ensemble_names_the_leaf_without_a_member_axis(lv):
    with pytest.raises(ValueError, match=r"u0s has shape \(2,\); .* shape \(B, 2\)"):
        sciad.ensemble(lv, u0s=np.ones(2))
    with pytest.raises(ValueError, match=r"saveats has shape \(5,\); .* shape \(B, T\)"):
        sciad.ensemble(lv, ps=np.ones((3, 4)), saveats=np.linspace(0, 1, 5))
    with pytest.raises(ValueError, match="different numbers of members .* u0s: 2, ps: 3"):
        sciad.ensemble(lv, u0s=np.ones((2, 2)), ps=np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"u0s has structure .* pass u0's PyTree"):
        sciad.ensemble(lv, u0s={"x": np.ones((2, 2))})
    dict_prob = sciad.ODEProblem(lambda u, p, t: {"x": -u["x"], "v": u["v"]}, {"x": 1.0, "v": 0.0}, (0.0, 1.0))
    with pytest.raises(TypeError, match=r"u0s\['v'\] is a float"):
        sciad.ensemble(dict_prob, u0s={"x": np.ones(3), "v": 0.0})
    with pytest.raises(ValueError, match=r"the leaves of u0s .* u0s\['v'\]: 2, u0s\['x'\]: 3"):
        sciad.ensemble(dict_prob, u0s={"x": np.ones(3), "v": np.ones(2)})


def test_ensemble_asks_for_a_mesh_with_auto_axes(lv):
    with pytest.raises(ValueError, match=r"not of type Auto .* axis_types=\(jax.sharding.AxisType.Auto,\) \* 1"):
        sciad.ensemble(lv, ps=np.ones((3, 4)), mesh=jax.make_mesh((1,), ("batch",)))
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
        sciad.ensemble(lv, ps=np.ones((3, 4)), mesh=jax.devices())


def test_ensemble_of_equinox_models_keeps_their_static_leaves():
    import equinox as eqx
    import jax.numpy as jnp

    def make(key):
        return eqx.nn.MLP(2, 2, 4, 1, activation=jnp.tanh, key=key, dtype=jnp.float64)

    prob = sciad.ODEProblem(lambda u, mlp, t: mlp(u), np.array([1.0, 0.0]), (0.0, 1.0), make(jax.random.key(0)))
    mlps = eqx.filter_vmap(make)(jax.random.split(jax.random.key(1), 3))  # weights (3, ...), one activation
    ts = np.linspace(0.0, 1.0, 5)
    # each one compiled program, the activation static (eagerly, the MLPs compile a small program per operation)
    sols = eqx.filter_jit(lambda mlps: sciad.ensemble(prob, ps=mlps, saveat=ts))(mlps)
    one = eqx.filter_jit(lambda mlp: sciad.solve(prob, p=mlp, saveat=ts))(
        jax.tree.map(lambda x: x[1] if eqx.is_array(x) else x, mlps)
    )
    assert sols.us.shape == (3, 5, 2) and sols.stats["steps"].shape == (3,)
    np.testing.assert_allclose(sols.us[1], one.us, rtol=1e-12)
