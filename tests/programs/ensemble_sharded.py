"""The child process of tests/test_ensemble.py: sharded `sciad.ensemble` gradients on the simulated CPU
devices its XLA_FLAGS give it (JAX reads them when it starts), against the unsharded batch, plain
`jax.vmap` and single solves.

    python tests/programs/ensemble_sharded.py CASE...

A CASE is "recipes", "pytree", "sde" or a sensealg as `sciad.adjoints.parse` reads it. Prints one line: RESULT
and a JSON object of the device count and each case's results.
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import sciad

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_disable_most_optimizations", True)  # same programs, faster compiles
mesh = jax.make_mesh((jax.device_count(),), ("batch",), axis_types=(AxisType.Auto,))
bench = sciad.problems.lotka_volterra()
ps = bench.problem.p * np.linspace(0.9, 1.1, 16)[:, None]  # 16 members, (16, 4)


def rel(a, b):
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))) / np.max(np.abs(np.asarray(y))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


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
        lambda ps: jax.vmap(bench.loss)(
            sciad.ensemble(bench.problem, ps=ps, saveat=bench.saveat, sensealg=sensealg).us
        ),
        mesh=mesh,
        in_specs=P("batch"),
        out_specs=P("batch"),
        check_vma=False,
    )
    return jax.jit(jax.grad(lambda ps: losses(ps).sum()))(ps)


def sensealg_case(name):
    alg = sciad.adjoints.parse(name)
    us, sharded = gradients(alg, mesh)
    _, unsharded = gradients(alg, None)
    try:
        per_device = rel(per_device_gradients(alg), unsharded)
    except ValueError as e:
        per_device = str(e).splitlines()[0]
    return {
        "rel": rel(sharded, unsharded),
        "us": spread(us),
        "norm": float(np.linalg.norm(unsharded)),
        "shard_map": per_device,
    }, unsharded


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
        return {
            "prey": p["prey"][0] * x - p["prey"][1] * x * y,
            "predator": -p["predator"][0] * y + p["predator"][1] * x * y,
        }

    prob = sciad.ODEProblem(
        f, {"prey": 1.0, "predator": 1.0}, (0.0, 5.0), {"prey": np.array([1.5, 1.0]), "predator": np.array([3.0, 1.0])}
    )
    u0s = {"prey": np.linspace(0.8, 1.2, 12), "predator": np.linspace(1.2, 0.8, 12)}
    saveats = np.linspace(0.0, 1.0, 11) * np.linspace(2.5, 5.0, 12)[:, None]  # (12, 11)

    def loss(u0s, p, mesh):
        sols = sciad.ensemble(prob, u0s=u0s, p=p, saveats=saveats, mesh=mesh, sensealg="ForwardSensitivity")
        return jnp.sum(sols.us["prey"] ** 2 + sols.us["predator"])

    sharded = jax.jit(jax.grad(lambda u0s, p: loss(u0s, p, mesh), argnums=(0, 1)))(u0s, prob.p)
    unsharded = jax.jit(jax.grad(lambda u0s, p: loss(u0s, p, None), argnums=(0, 1)))(u0s, prob.p)
    sols = jax.jit(lambda: sciad.ensemble(prob, u0s=u0s, saveats=saveats, mesh=mesh))()
    one = sciad.solve(prob, u0={"prey": u0s["prey"][7], "predator": u0s["predator"][7]}, saveat=saveats[7])
    return {
        "rel": rel(sharded, unsharded),
        "shape": list(sols.us["prey"].shape),
        "ts": rel(sols.ts, saveats),
        "member": rel(jax.tree.map(lambda x: x[7], sols.us), one.us),
        "p_grad": {k: np.asarray(v).tolist() for k, v in unsharded[1].items()},
    }


def sde_case():
    """An SDE ensemble over 12 Brownian paths (padded to 16), sharded: its gradient against the unsharded one."""
    prob = sciad.SDEProblem(lambda u, p, t: -p[0] * u, lambda u, p, t: p[1] * u, np.ones(2), (0.0, 1.0), np.ones(2))
    keys = jax.random.split(jax.random.key(0), 12)

    def loss(p, mesh):
        return jnp.sum(sciad.ensemble(prob, keys=keys, p=p, dt0=0.05, saveat=[0.5, 1.0], mesh=mesh).us ** 2)

    p = jnp.array([0.5, 0.3])
    sharded = jax.jit(jax.grad(lambda p: loss(p, mesh)))(p)
    sols = jax.jit(lambda: sciad.ensemble(prob, keys=keys, p=p, dt0=0.05, saveat=[0.5, 1.0], mesh=mesh))()
    return {"rel": rel(sharded, jax.jit(jax.grad(lambda p: loss(p, None)))(p)), "us": spread(sols.us)}


def main(cases):
    out = {"devices": jax.device_count()}
    for case in cases:
        named = {"recipes": recipes_case, "pytree": pytree_case, "sde": sde_case}
        out[case] = named.get(case, lambda: sensealg_case(case)[0])()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
