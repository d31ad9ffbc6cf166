"""`sciad.ensemble`: batches of u0, p and save times, sharded over 8 simulated CPU devices in a
child process (JAX reads XLA_FLAGS when it starts), against the unsharded batch, plain
`jax.vmap` and single solves; and its errors at the call."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import sciad
from sciad.adjoints import SENSEALGS
from sciad.problems import lotka_volterra

DEVICES = 8

CHILD = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import sciad

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_disable_most_optimizations", True)  # same programs, faster compiles
    mesh = jax.make_mesh((jax.device_count(),), ("batch",), axis_types=(AxisType.Auto,))
    bench = sciad.problems.lotka_volterra()
    ps = bench.problem.p * np.linspace(0.9, 1.1, 16)[:, None]          # 16 members, (16, 4)
    out = {"devices": jax.device_count()}

    def rel(a, b):
        return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))) / np.max(np.abs(np.asarray(y))))
                   for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

    def spread(x):
        return {"devices": len(x.sharding.device_set), "spec": str(x.sharding.spec)}

    def gradients(sensealg, mesh):
        def loss(ps):
            sols = sciad.ensemble(bench.problem, ps=ps, saveat=bench.saveat, mesh=mesh, sensealg=sensealg)
            return jax.vmap(bench.loss)(sols.us).sum(), sols.us
        (_, us), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(ps)
        return us, g

    def per_device_gradients(sensealg):  # one batched loop per device: shard_map around an unsharded ensemble
        losses = jax.shard_map(
            lambda ps: jax.vmap(bench.loss)(sciad.ensemble(bench.problem, ps=ps, saveat=bench.saveat,
                                                           sensealg=sensealg).us),
            mesh=mesh, in_specs=P("batch"), out_specs=P("batch"), check_vma=False)
        return jax.jit(jax.grad(lambda ps: losses(ps).sum()))(ps)

    def sensealg_case(name):
        alg = sciad.adjoints.parse(name)
        us, sharded = gradients(alg, mesh)
        _, unsharded = gradients(alg, None)
        try:
            per_device = rel(per_device_gradients(alg), unsharded)
        except ValueError as e:
            per_device = str(e).splitlines()[0]
        return {"rel": rel(sharded, unsharded), "us": spread(us), "norm": float(np.linalg.norm(unsharded)),
                "shard_map": per_device}, unsharded

    def recipes_case():
        # ForwardDiffSensitivity with the helper, per device, in plain vmap over a sharded batch, and alone
        result, unsharded = sensealg_case("ForwardDiffSensitivity")
        alg = sciad.ForwardDiffSensitivity()
        plain = jax.jit(jax.vmap(jax.grad(lambda p: bench.objective(p, alg))))
        g = plain(jax.device_put(ps, NamedSharding(mesh, P("batch"))))
        one = jax.jit(jax.grad(lambda p: bench.objective(p, alg)))(ps[5])
        return {**result, "vmap": rel(g, unsharded), "vmap_grads": spread(g), "member": rel(unsharded[5], one)}

    def pytree_case():
        # dict states, shared dict parameters, one save grid per member, 12 members padded to 16
        # (ForwardSensitivity here; the slow test runs every sensealg)
        def f(u, p, t):
            x, y = u["prey"], u["predator"]
            return {"prey": p["prey"][0] * x - p["prey"][1] * x * y,
                    "predator": -p["predator"][0] * y + p["predator"][1] * x * y}
        prob = sciad.ODEProblem(f, {"prey": 1.0, "predator": 1.0}, (0.0, 5.0),
                                {"prey": np.array([1.5, 1.0]), "predator": np.array([3.0, 1.0])})
        u0s = {"prey": np.linspace(0.8, 1.2, 12), "predator": np.linspace(1.2, 0.8, 12)}
        saveats = np.linspace(0.0, 1.0, 11) * np.linspace(2.5, 5.0, 12)[:, None]      # (12, 11)

        def loss(u0s, p, mesh):
            sols = sciad.ensemble(prob, u0s=u0s, p=p, saveats=saveats, mesh=mesh, sensealg="ForwardSensitivity")
            return jnp.sum(sols.us["prey"] ** 2 + sols.us["predator"])
        sharded = jax.jit(jax.grad(lambda u0s, p: loss(u0s, p, mesh), argnums=(0, 1)))(u0s, prob.p)
        unsharded = jax.jit(jax.grad(lambda u0s, p: loss(u0s, p, None), argnums=(0, 1)))(u0s, prob.p)
        sols = jax.jit(lambda: sciad.ensemble(prob, u0s=u0s, saveats=saveats, mesh=mesh))()
        one = sciad.solve(prob, u0={"prey": u0s["prey"][7], "predator": u0s["predator"][7]}, saveat=saveats[7])
        return {"rel": rel(sharded, unsharded), "shape": list(sols.us["prey"].shape),
                "ts": rel(sols.ts, saveats), "member": rel(jax.tree.map(lambda x: x[7], sols.us), one.us),
                "p_grad": {k: np.asarray(v).tolist() for k, v in unsharded[1].items()}}

    for case in sys.argv[1:]:
        out[case] = {"recipes": recipes_case, "pytree": pytree_case}.get(case, lambda: sensealg_case(case)[0])()
    print("RESULT " + json.dumps(out))
""")


def run_child(*cases: str) -> dict:
    """Run CHILD's `cases` on DEVICES simulated CPU devices; its results."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={DEVICES}"
    proc = subprocess.run([sys.executable, "-c", CHILD, *cases], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "XLA_FLAGS": flags.strip(), "JAX_PLATFORMS": "cpu"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"child failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert out["devices"] == DEVICES
    return out


@pytest.mark.slow
def test_sharded_ensembles_match_unsharded_vmap_and_single_solves():
    out = run_child("recipes", "pytree")
    recipes = out["recipes"]
    assert recipes["rel"] < 1e-12 and recipes["norm"] > 0            # helper sharded = unsharded
    assert recipes["us"] == {"devices": DEVICES, "spec": "P('batch',)"}
    assert recipes["vmap"] < 1e-12 and recipes["vmap_grads"]["devices"] == DEVICES  # plain jax.vmap, sharded input
    assert recipes["shard_map"] < 1e-12                                # per-device loops
    assert recipes["member"] < 1e-12                                   # = one member's own gradient
    tree = out["pytree"]
    assert tree["rel"] < 1e-12 and tree["shape"] == [12, 11]           # 12 members padded to 16 and back
    assert tree["ts"] == 0 and tree["member"] < 1e-12                  # each member's own grid and solution
    assert all(np.all(np.isfinite(v)) and np.any(np.asarray(v) != 0) for v in tree["p_grad"].values())


@pytest.mark.slow
def test_every_sensealg_sharded_equals_unsharded_and_per_device_loops_all_but_one():
    out = run_child(*SENSEALGS)
    for name in SENSEALGS:
        assert out[name]["rel"] < 1e-12, name
        assert out[name]["norm"] > 0, name
        assert out[name]["us"] == {"devices": DEVICES, "spec": "P('batch',)"}, name
        if name == "DiscreteAdjoint":  # equinox's checkpointed loops inside shard_map (README); update it on a fix
            assert "Closure-converted function" in out[name]["shard_map"]
        else:
            assert out[name]["shard_map"] < 1e-12, name


@pytest.fixture(scope="module")
def lv():
    return lotka_volterra().problem


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
    mlps = eqx.filter_vmap(make)(jax.random.split(jax.random.key(1), 3))   # weights (3, ...), one activation
    ts = np.linspace(0.0, 1.0, 5)
    sols = sciad.ensemble(prob, ps=mlps, saveat=ts)
    one = sciad.solve(prob, p=jax.tree.map(lambda x: x[1] if eqx.is_array(x) else x, mlps), saveat=ts)
    assert sols.us.shape == (3, 5, 2) and sols.stats["steps"].shape == (3,)
    np.testing.assert_allclose(sols.us[1], one.us, rtol=1e-12)
