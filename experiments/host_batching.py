"""Host engines under `jax.vmap`: 64 Lotka–Volterra gradients against one.

`jax.jit(jax.vmap(jax.grad(L)))` over a batch of parameters (p ± 10 %,
`sciad.problems.lotka_volterra()`), with `InterpolatingAdjoint(vjp=engine)`
for torch and autograd (host callbacks) and jax-reverse (traced, the
reference). Under vmap each host callback receives the whole batch
(`differentiate_with`): torch evaluates it with `torch.func.vmap`, autograd
with a loop inside the one call. Timed side by side in one process
(`sciad.timing.interleaved`); the table gives the median time of one
gradient and of the batch, their ratio, the host evaluations of f per
gradient call (one per callback for torch; one per member and callback for a
loop) and the forward solve's steps (a batch steps until its slowest member
is done). Target (issue 12): 64 torch gradients in at most 10 × one.
Autograd's batch takes minutes per call (64 members one by one in every
callback): `--engines jax-reverse torch` for a quick run.

    python experiments/host_batching.py [--batch 64] [--rounds 3] [--engines jax-reverse torch autograd]
"""

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import sciad
from sciad.problems import lotka_volterra, lotka_volterra_rhs
from sciad.timing import interleaved, timed

jax.config.update("jax_enable_x64", True)

TARGET = 10.0  # batch of 64 torch gradients / one torch gradient
host_calls = [0]


def counted_rhs(u, p, t):
    """Lotka–Volterra's f, counting its evaluations on the host (not JAX's traces of it)."""
    if not isinstance(u, jax.core.Tracer):
        host_calls[0] += 1
    return lotka_volterra_rhs(u, p, t)


def main(batch: int, rounds: int, engines: list[str]):
    bench = lotka_volterra()
    bench = dataclasses.replace(
        bench, problem=sciad.ODEProblem(counted_rhs, bench.problem.u0, bench.problem.tspan, bench.problem.p)
    )
    p = jnp.asarray(bench.problem.p)
    ps = p * (1 + 0.1 * jax.random.uniform(jax.random.key(0), (batch, p.shape[0]), minval=-1, maxval=1))
    fns, counts = {}, {}
    for name in engines:
        grad = jax.grad(lambda p, name=name: bench.objective(p, sciad.InterpolatingAdjoint(vjp=name)))
        one, many = jax.jit(grad), jax.jit(jax.vmap(grad))
        fns[(name, 1)], fns[(name, batch)] = (lambda one=one: one(p)), (lambda many=many: many(ps))
    reference = jax.grad(lambda p: bench.objective(p, sciad.InterpolatingAdjoint(vjp="jax-reverse")))
    expected = {1: jax.jit(reference)(p), batch: jax.jit(jax.vmap(reference))(ps)}
    for (name, n), fn in fns.items():
        host_calls[0] = 0
        grads, seconds = timed(fn)
        counts[(name, n)] = host_calls[0]
        np.testing.assert_allclose(grads, expected[n], rtol=1e-8)
        print(f"{name} × {n}: compiled and ran in {seconds:.1f} s, equal to jax-reverse's", flush=True)
    steps = jax.jit(jax.vmap(lambda p: sciad.solve(bench.problem, p=p, saveat=bench.saveat).stats["steps"]))
    batch_steps, one_steps = np.asarray(steps(ps)), int(steps(p[None])[0])
    times = dict(zip(fns, interleaved(list(fns.values()), rounds=rounds)))

    print(
        f"\nLotka–Volterra, InterpolatingAdjoint(vjp=...); forward steps: one {one_steps}, batch of {batch} "
        f"{batch_steps.min()}–{batch_steps.max()} (the batch steps {batch_steps.max()} times); medians of {rounds}"
    )
    print(f"| engine | 1 gradient (ms) | {batch} gradients (ms) | ratio | host f calls: 1 | {batch} |")
    print("|---|---|---|---|---|---|")
    ratios = {}
    for name in engines:
        t1, tb = np.median(times[(name, 1)]), np.median(times[(name, batch)])
        ratios[name] = tb / t1
        print(
            f"| {name} | {1e3 * t1:.1f} | {1e3 * tb:.1f} | {ratios[name]:.1f} | "
            f"{counts[(name, 1)]} | {counts[(name, batch)]} |"
        )
    if "torch" in ratios and batch == 64:
        print(
            f"\ntarget: 64 torch gradients ≤ {TARGET:g} × one: {ratios['torch']:.1f} × "
            f"({'MET' if ratios['torch'] <= TARGET else 'MISSED'})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engines", nargs="+", default=["jax-reverse", "torch", "autograd"])
    args = parser.parse_args()
    main(args.batch, args.rounds, args.engines)
