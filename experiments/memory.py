"""Memory of the compiled gradient: InterpolatingAdjoint with and without checkpointing.

Lotka–Volterra (p = (1.5, 1, 3, 1), u0 = (1, 1)), saved every 1.0 on
[0, T], loss = sum of the saved states, Tsit5 at rtol = atol = 1e-6, float64.
For each horizon T the gradient wrt p is compiled with `jax.jit` and XLA's
memory analysis reports the buffers it allocates (temp, arguments, outputs).

The non-checkpointed adjoint stores the dense interpolation of the whole
forward solve: its buffers are sized by `max_steps` (XLA needs static
shapes), so memory grows with the step budget a horizon needs. The
checkpointed one stores u at the saveat times only and re-solves one
interval at a time (at most `interval_max_steps` steps each), so its temp
memory does not depend on the horizon. Here `max_steps` is set to the
horizon's real step count (rounded up), the least that solves it.

    python experiments/memory.py
"""

import jax
import jax.numpy as jnp
import numpy as np

import sciad
import sciad.ad as ad
from sciad.adjoints import InterpolatingAdjoint

jax.config.update("jax_enable_x64", True)


def lotka_volterra(u, p, t):
    xp = ad.namespace(u, p)
    x, y = u[0], u[1]
    return xp.stack([p[0] * x - p[1] * x * y, -p[2] * y + p[3] * x * y])


def measure(horizon: float, sensealg, max_steps: int):
    prob = sciad.ODEProblem(lotka_volterra, np.array([1.0, 1.0]), (0.0, horizon), np.array([1.5, 1.0, 3.0, 1.0]))
    saveat = np.arange(0.0, horizon + 0.5, 1.0)

    def loss(p):
        return jnp.sum(sciad.solve(prob, p=p, saveat=saveat, sensealg=sensealg, max_steps=max_steps).us)

    compiled = jax.jit(jax.grad(loss)).lower(prob.p).compile()
    grad = compiled(prob.p)
    stats = compiled.memory_analysis()
    return stats, grad


def main():
    mib = 2.0**-20
    print(f"{'T':>6} {'steps':>7} {'max_steps':>9} {'sensealg':<28} {'temp MiB':>9} {'args+out KiB':>12}  gradient")
    for horizon in (100.0, 300.0, 1000.0):
        prob = sciad.ODEProblem(lotka_volterra, np.array([1.0, 1.0]), (0.0, horizon), np.array([1.5, 1.0, 3.0, 1.0]))
        steps = int(sciad.solve(prob, max_steps=10**6).stats["steps"])
        max_steps = int(np.ceil(steps * 1.05 / 100) * 100)
        for name, sensealg in (
            ("Interpolating", InterpolatingAdjoint()),
            ("Interpolating(checkpointing)", InterpolatingAdjoint(checkpointing=True)),
        ):
            stats, grad = measure(horizon, sensealg, max_steps)
            io = (stats.argument_size_in_bytes + stats.output_size_in_bytes) / 1024
            print(
                f"{horizon:6.0f} {steps:7d} {max_steps:9d} {name:<28} {stats.temp_size_in_bytes * mib:9.3f} "
                f"{io:12.3f}  {np.array2string(np.asarray(grad), precision=4)}"
            )
    print("with max_steps = 100000 (buffers sized by the budget, not the horizon):")
    for name, sensealg in (
        ("Interpolating", InterpolatingAdjoint()),
        ("Interpolating(checkpointing)", InterpolatingAdjoint(checkpointing=True)),
    ):
        stats, _ = measure(1000.0, sensealg, 100_000)
        print(f"{1000:6d} {'':7} {100_000:9d} {name:<28} {stats.temp_size_in_bytes * mib:9.3f}")


if __name__ == "__main__":
    main()
