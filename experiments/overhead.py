"""The cost of the `sciad.ad` layer over calling an engine directly.

A prepared `sciad.ad.gradient` against the engine's own gradient on a
100-dimensional scalar function: `JaxReverse` against `jax.jit(jax.grad(f))`,
`Torch` against `torch.autograd.grad` on a fresh leaf (`x.detach()
.requires_grad_()`, `f`, `grad`: what a torch user writes for a gradient at a
new point). The two variants of a pair are timed in alternating rounds of
`timeit`, so that drifts in machine load hit both alike; the table gives the
median and minimum time per call and the ratio layer / direct as the median
of the per-round ratios (the target is at most 1.05).

    python experiments/overhead.py [--rounds 101] [--seconds-per-round 0.02]
"""

import argparse
import statistics
import timeit

import jax
import numpy as np

import sciad.ad as ad

N = 100


def f(x):
    """A 100-dimensional scalar function, written once for every engine."""
    xp = ad.namespace(x)
    return xp.sum(xp.sin(x) * x) + xp.sum(x) ** 2 / 2


def jax_pair(x):
    layer = ad.prepare(ad.JaxReverse(), ad.gradient, f, x)
    direct = jax.jit(jax.grad(f))
    x = jax.numpy.asarray(x)
    return (lambda: layer(x).block_until_ready()), (lambda: direct(x).block_until_ready())


def torch_pair(x):
    import torch

    layer = ad.prepare(ad.Torch(), ad.gradient, f, x)
    x = torch.from_numpy(x)

    def direct():
        xr = x.detach().requires_grad_(True)
        return torch.autograd.grad(f(xr), xr)[0]

    return (lambda: layer(x)), direct


def time_pair(layer, direct, rounds, seconds):
    """Per-call times (seconds) of both, measured in alternating rounds."""
    np.testing.assert_allclose(np.asarray(layer()), np.asarray(direct()), rtol=1e-5)
    number = max(1, int(seconds / min(timeit.timeit(layer, number=20), timeit.timeit(direct, number=20)) * 20))
    times = {"layer": [], "direct": []}
    for i in range(rounds):
        order = ("layer", "direct") if i % 2 == 0 else ("direct", "layer")
        for name in order:
            fn = layer if name == "layer" else direct
            times[name].append(timeit.timeit(fn, number=number) / number)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=101)
    parser.add_argument("--seconds-per-round", type=float, default=0.02)
    args = parser.parse_args()

    x = np.linspace(-1.0, 1.0, N, dtype=np.float32)
    pairs = {"jax-reverse vs jax.jit(jax.grad)": jax_pair}
    if "torch" in ad.available():
        pairs["torch vs torch.autograd.grad"] = torch_pair

    header = (
        f"{'gradient, n = 100':34} {'layer µs':>9} {'direct µs':>9} {'min layer':>9} {'min direct':>10} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for label, make in pairs.items():
        times = time_pair(*make(x), args.rounds, args.seconds_per_round)
        ratio = statistics.median(a / b for a, b in zip(times["layer"], times["direct"]))
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        low = {k: min(v) * 1e6 for k, v in times.items()}
        print(
            f"{label:34} {med['layer']:9.2f} {med['direct']:9.2f} "
            f"{low['layer']:9.2f} {low['direct']:10.2f} {ratio:6.3f}"
        )


if __name__ == "__main__":
    main()
