"""Gradient speed of every sensealg against sciad's forward solve and diffrax's built-in adjoints.

Two problems, as in the paper's Appendix B:

* Lotka–Volterra: p = (1.5, 1, 3, 1), u0 = (1, 1), t in [0, 10], loss = sum
  of both states at t = 0, 0.1, ..., 10; Tsit5, rtol = atol = 1e-6, float64.
* Spiral neural ODE: u' = NN(u³), NN = Dense(2→50, tanh) → Dense(50→2),
  float32, u0 = (2, 0), t in [0, 1.5], 30 points, loss = sum of squared
  errors to the true spiral u' = (u³)ᵀ A, A = [[-0.1, 2], [-2, -0.1]].

Every timed function is a `jax.jit`-compiled gradient wrt p, built as
`sciad bench` builds its combinations and diffrax peers (the forward solve:
the loss). All are measured in ONE run, repeats interleaved
(round-robin) so drift hits them alike; the table gives the median time,
its ratio to sciad's forward solve and to diffrax's best built-in adjoint,
and the time to the first gradient (trace + compile + one call).

    python experiments/adjoint_speed.py [--repeats 50]
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import sciad.ad as ad
from sciad.problems import lotka_volterra, spiral_node
from sciad.timing import interleaved, timed
from sciad_bench.harness import forward_solve, sciad_combination
from sciad_bench.peers import diffrax_peer

jax.config.update("jax_enable_x64", True)

ADJOINTS = (
    "BacksolveAdjoint",
    "BacksolveAdjoint(seminorm=True)",
    "InterpolatingAdjoint",
    "InterpolatingAdjoint(checkpointing=True)",
    "QuadratureAdjoint",
    "GaussAdjoint",
)


def combinations(enzyme: bool):
    """The forward solve, every sensealg (JAX engines), and diffrax's three built-in adjoints."""
    combos = [
        forward_solve(),
        sciad_combination("ForwardDiffSensitivity"),
        sciad_combination("ForwardSensitivity", "jax-forward"),
        sciad_combination("DiscreteAdjoint"),
    ]
    combos += [sciad_combination(a, e) for e in ("jax-reverse", *(("enzyme",) if enzyme else ())) for a in ADJOINTS]
    return combos + [diffrax_peer(a) for a in ("RecursiveCheckpointAdjoint", "BacksolveAdjoint", "ForwardMode")]


def time_all(fns, p, repeats):
    """Seconds to the first call and median seconds per call of each fn(p), `repeats` interleaved rounds."""
    first = {name: timed(lambda fn=fn: fn(p))[1] for name, fn in fns.items()}
    times = interleaved([lambda fn=fn: fn(p) for fn in fns.values()], rounds=repeats)
    return first, {name: float(np.median(t)) for name, t in zip(fns, times)}


def report(title, fns, first, median, targets):
    forward = median["forward solve (no gradient)"]
    builtin = {k: v for k, v in median.items() if k.startswith("diffrax")}
    best_builtin = min(builtin.values())
    print(f"\n## {title}\n")
    print(f"| {'method':<50} | {'median ms':>9} | {'× forward':>9} | {'× best diffrax':>14} | {'first grad s':>12} |")
    print(f"|{'-' * 52}|{'-' * 11}|{'-' * 11}|{'-' * 16}|{'-' * 14}|")
    for name in fns:
        print(
            f"| {name:<50} | {median[name] * 1e3:9.3f} | {median[name] / forward:9.2f} | "
            f"{median[name] / best_builtin:14.2f} | {first[name]:12.2f} |"
        )
    for line in targets(median, forward, best_builtin):
        print(line)


def lv_targets(median, forward, best_builtin):
    sciad_grads = {
        k: v for k, v in median.items() if not k.startswith("diffrax") and k != "forward solve (no gradient)"
    }
    best = min(sciad_grads, key=sciad_grads.get)
    r1, r2 = sciad_grads[best] / forward, sciad_grads[best] / best_builtin
    return [
        f"\nbest sciad gradient: {best}",
        f"target ≤ 2.5× forward solve:          {r1:.2f}×  {'MET' if r1 <= 2.5 else 'MISSED'}",
        f"target ≤ 0.8× diffrax's best built-in: {r2:.2f}×  {'MET' if r2 <= 0.8 else 'MISSED'}",
    ]


def spiral_targets(median, forward, best_builtin):
    rca = median["diffrax RecursiveCheckpointAdjoint / jax"]
    lines = []
    for name in (
        "InterpolatingAdjoint / jax-reverse",
        "InterpolatingAdjoint(checkpointing=True) / jax-reverse",
        "QuadratureAdjoint / jax-reverse",
    ):
        r = median[name] / rca
        lines.append(
            f"target {name} ≤ 0.5× diffrax RecursiveCheckpointAdjoint: {r:.2f}×  {'MET' if r <= 0.5 else 'MISSED'}"
        )
    return ["", *lines]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--no-enzyme", action="store_true")
    args = parser.parse_args()
    enzyme = not args.no_enzyme and "enzyme" in ad.available()
    print(f"jax {jax.__version__}, device {jax.devices()[0].device_kind}, repeats {args.repeats} (interleaved)")
    cases = (
        ("Lotka–Volterra (float64)", lotka_volterra(), lv_targets),
        ("spiral neural ODE (float32)", spiral_node(hidden=50), spiral_targets),
    )
    for title, bench, targets in cases:
        fns = {combo.label: combo.build(bench) for combo in combinations(enzyme)}
        first, median = time_all(fns, jnp.asarray(bench.problem.p), args.repeats)
        report(title, fns, first, median, targets)


if __name__ == "__main__":
    main()
