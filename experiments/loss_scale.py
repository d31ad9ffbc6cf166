"""The continuous adjoints with and without the cotangent's normalisation, side by side (issue 31).

Each continuous adjoint solves its linear backward system for w / max|w| and scales back, so its
error control holds relative to λ's own size. This times that against the old rule (λ held to the
user's atol: `normalised` replaced by the identity while the old variant traces) on the committed
benchmark problems, in one process, interleaved (`sciad.timing.interleaved`), and gives each
gradient's error against a tight DiscreteAdjoint reference at the loss's own scale and at 1e-6 of
it. Writes `results/loss-scale/table.md` and `records.json`.

    python experiments/loss_scale.py [--rounds 20] [--problems lotka-volterra spiral-node ...]
"""

import argparse
import contextlib
import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

import sciad
import sciad.adjoints._continuous as continuous
from sciad.problems import PROBLEMS
from sciad.timing import interleaved, relative_error

SENSEALGS = {
    "GaussAdjoint": sciad.GaussAdjoint,
    "InterpolatingAdjoint": sciad.InterpolatingAdjoint,
    "BacksolveAdjoint": sciad.BacksolveAdjoint,
}
SMALL = 1e-6  # the loss scaled down: a mean over many points, small units


@contextlib.contextmanager
def old_rule():
    """While tracing: λ solved for the cotangent itself (its error held to the user's atol)."""
    normalised = continuous.normalised
    continuous.normalised = lambda w: (jnp.ones((), w.dtype), w)
    try:
        yield
    finally:
        continuous.normalised = normalised


def gradient(bench, sensealg, scale: float, old: bool):
    """A compiled call of ∂(scale × loss)/∂p ÷ scale, traced under the rule asked for."""
    grad = jax.jit(jax.grad(lambda p: scale * bench.objective(p, sensealg)))
    with old_rule() if old else contextlib.nullcontext():
        jax.block_until_ready(grad(bench.problem.p))  # traced and compiled here
    return lambda: grad(bench.problem.p) / scale


def main() -> None:
    jax.config.update("jax_enable_x64", True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--problems",
        nargs="+",
        default=["lotka-volterra", "spiral-node", "oregonator", "brusselator", "hamiltonian-node"],
    )
    parser.add_argument("--out", default="results/loss-scale")
    args = parser.parse_args()
    rows = []
    for problem in args.problems:
        bench = PROBLEMS[problem]()
        tight = dataclasses.replace(bench, rtol=1e-10, atol=1e-10)
        reference = np.asarray(
            jax.jit(jax.grad(lambda p: tight.objective(p, sciad.DiscreteAdjoint())))(bench.problem.p)
        )
        implicit = bench.solver.startswith("kvaerno")
        for name, make in SENSEALGS.items():
            if implicit and name == "BacksolveAdjoint":
                continue
            print(f"{problem}: {name}", flush=True)
            calls = {
                (old, scale): gradient(bench, make(), scale, old) for old in (False, True) for scale in (1.0, SMALL)
            }
            errors = {key: relative_error(call(), reference) for key, call in calls.items()}
            new_times, old_times = interleaved([calls[False, 1.0], calls[True, 1.0]], rounds=args.rounds)
            rows.append(
                {
                    "problem": problem,
                    "sensealg": name,
                    "new_s": float(np.median(new_times)),
                    "old_s": float(np.median(old_times)),
                    "new_times_s": new_times,
                    "old_times_s": old_times,
                    "error_new": errors[False, 1.0],
                    "error_old": errors[True, 1.0],
                    "error_new_small": errors[False, SMALL],
                    "error_old_small": errors[True, SMALL],
                }
            )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "records.json").write_text(json.dumps(rows, indent=1))
    lines = [
        "| problem | sensealg | new / old time | error (new) | error (old) | "
        f"error × {SMALL:g} (new) | error × {SMALL:g} (old) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['problem']} | {r['sensealg']} | {r['new_s'] / r['old_s']:.2f} | {r['error_new']:.1e} | "
        f"{r['error_old']:.1e} | {r['error_new_small']:.1e} | {r['error_old_small']:.1e} |"
        for r in rows
    ]
    lines.append(
        f"\nTimes: medians of {args.rounds} interleaved rounds at the loss's own scale. Errors: relative "
        "to DiscreteAdjoint at rtol = atol = 1e-10, of the gradient at the loss's scale and of the "
        f"gradient of the loss × {SMALL:g} (divided back)."
    )
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
