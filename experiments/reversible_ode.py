"""ReversibleAdjoint on ODEs against the memory-bound sensealgs: the suite's long-horizon neural ODE.

`hamiltonian_node` (the suite's long-horizon problem, two saves, Tsit5, max_steps sized to each horizon as
the suite sizes it) at horizons T = 100 and 1000. For each sensealg: XLA's buffers of the compiled gradient
(temporaries, arguments and outputs; compiled, not run), their growth from T = 100 to 1000, the gradient's
relative difference from DiscreteAdjoint's (ReversibleAdjoint differentiates its own reversible solution,
close to Tsit5's) or the error it raised, and, with `--time`, the warm gradient at T = 100 in interleaved
rounds in this process (medians) and its ratio to DiscreteAdjoint's.

    PYTHONPATH=. python experiments/reversible_ode.py [--time] [--rounds 20]
"""

import argparse
import functools
import os

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from sciad.adjoints import parse  # noqa: E402
from sciad.timing import interleaved  # noqa: E402
from sciad_bench.harness import peak_bytes  # noqa: E402
from sciad_bench.suite import horizon_benchmark  # noqa: E402

SENSEALGS = (
    "DiscreteAdjoint()",
    "DiscreteAdjoint(stored_steps=64)",
    "InterpolatingAdjoint(checkpointing=True)",
    "GaussAdjoint(checkpointing=True)",
    "ReversibleAdjoint()",
    "ReversibleAdjoint(coupling=0.99)",
)
HORIZONS = (100.0, 1000.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", action="store_true", help="time the warm gradients at the shortest horizon")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"load averages before: {os.getloadavg()}")
    rows, calls = {}, {}
    for horizon in HORIZONS:
        bench = horizon_benchmark(horizon)
        p = jnp.asarray(bench.inputs)
        reference = None
        for name in SENSEALGS:
            alg = parse(name)
            grad = jax.jit(jax.grad(lambda p, alg=alg, bench=bench: bench.objective(p, alg))).lower(p).compile()
            try:
                value = np.asarray(grad(p))
            except Exception as error:  # a sensealg's refusal at run time (ReversibleAdjoint's checks)
                rows[name, horizon] = (peak_bytes(grad), str(error).split(": ")[-1][:70], bench.max_steps)
                continue
            reference = value if reference is None else reference
            difference = float(np.max(np.abs(value - reference)) / np.max(np.abs(reference)))
            rows[name, horizon] = (peak_bytes(grad), difference, bench.max_steps)
            if args.time and horizon == HORIZONS[0]:
                calls[name] = functools.partial(grad, p)
    print(f"\n{'sensealg':42} {'T':>6} {'max_steps':>9} {'MiB':>8} {'growth':>7} {'vs Discrete':>11}")
    for name in SENSEALGS:
        for horizon in HORIZONS:
            size, difference, max_steps = rows[name, horizon]
            growth = size / rows[name, HORIZONS[0]][0]
            verdict = f"{difference:11.2e}" if isinstance(difference, float) else f"raised: {difference}"
            print(f"{name:42} {horizon:6g} {max_steps:9} {size / 2**20:8.2f} {growth:7.2f} {verdict}")
    if calls:
        times = dict(zip(calls, interleaved(list(calls.values()), rounds=args.rounds)))
        base = float(np.median(times[SENSEALGS[0]]))
        print(f"\nwarm gradient at T = {HORIZONS[0]:g} (medians of {args.rounds} interleaved rounds)")
        for name, t in times.items():
            print(f"{name:42} {1e3 * float(np.median(t)):9.2f} ms {float(np.median(t)) / base:6.2f}x")
    print(f"load averages after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
