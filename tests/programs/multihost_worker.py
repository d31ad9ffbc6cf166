"""One process of `tests/test_multihost.py`: joins a 2-process JAX cluster on loopback (gloo
collectives, 2 simulated CPU devices each: XLA_FLAGS), checks the collectives with an all-gather
before any sciad code runs, then computes sharded `sciad.ensemble` gradients over the 4-device
mesh of both processes and saves them gathered.

    python tests/programs/multihost_worker.py PORT PROCESS_ID DIR CASE...

DIR/ps.npy holds the members' parameters, (B, 4), B a multiple of 4. A CASE is a sensealg (each
process passes its half of the members, a global array sharded over the mesh) or "padded-" and a
sensealg (the first B - 2 members, the same NumPy array on both processes, padded to B by
`ensemble`). Writes DIR/CASE-PROCESS_ID.npy, the whole gradient. Exit status 3: the cluster or
its collectives failed (the environment's).
"""

import sys

import jax
import numpy as np


def gradients(ps, sensealg, mesh=None):
    """The gradient of the members' summed losses: Lotka–Volterra (`sciad.problems`) on t ∈ [0, 1],
    saved at 0, 0.1, …, 1 — few steps, as every step of a sharded loop is a collective."""
    import sciad  # here, not above: the cluster starts before any sciad code

    bench = sciad.problems.lotka_volterra()
    prob = sciad.ODEProblem(bench.problem.f, bench.problem.u0, (0.0, 1.0), bench.problem.p)

    def loss(ps):
        sols = sciad.ensemble(prob, ps=ps, saveat=np.linspace(0.0, 1.0, 11), mesh=mesh, sensealg=sensealg)
        return jax.vmap(bench.loss)(sols.us).sum()

    return jax.jit(jax.grad(loss))(ps)


def main(port: str, process_id: str, out: str, *cases: str):
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_disable_most_optimizations", True)  # same programs, faster compiles
    try:
        from jax.experimental import multihost_utils

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{port}",
            num_processes=2,
            process_id=int(process_id),
            initialization_timeout=60,
        )
        gathered = multihost_utils.process_allgather(np.array([jax.process_index()])).ravel().tolist()
        assert gathered == [0, 1], f"an all-gather of the process indices gave {gathered}"
    except Exception as e:
        print(f"collectives unavailable: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(3)

    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((jax.device_count(),), ("batch",), axis_types=(AxisType.Auto,))  # both processes' devices
    ps = np.load(f"{out}/ps.npy")
    local = np.split(ps, jax.process_count())[jax.process_index()]  # this process's members
    global_ps = jax.make_array_from_process_local_data(NamedSharding(mesh, P("batch")), local)
    for case in cases:
        sensealg = case.removeprefix("padded-")
        grads = gradients(global_ps if sensealg == case else ps[:-2], sensealg, mesh)
        assert not grads.is_fully_addressable, f"{case}: the gradient lives on this process's devices only"
        np.save(f"{out}/{case}-{process_id}.npy", multihost_utils.process_allgather(grads, tiled=True))


if __name__ == "__main__":
    main(*sys.argv[1:])
