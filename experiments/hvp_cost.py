"""Cost of one Hessian-vector product against one gradient, for every sensealg.

Lotka–Volterra and the spiral neural ODE (the paper's set-ups, `sciad.problems`);
for each sensealg (JAX engines), a `jax.jit`-compiled gradient wrt p and a
forward-over-reverse HVP `jax.jvp(jax.grad(L), (p,), (v,))`, timed in one
process, repeats interleaved; the table gives the median times and their ratio.

    python experiments/hvp_cost.py [--repeats 20] [--out results/hvp-cost]
"""

import argparse
import json
import pathlib

import jax
import numpy as np

from sciad.adjoints import parse
from sciad.problems import lotka_volterra, spiral_node
from sciad.timing import fastest, interleaved, timed
from sciad_bench.harness import VARIANTS

jax.config.update("jax_enable_x64", True)

HVP_AGREEMENT = 1e-3  # relative, against DiscreteAdjoint's HVP (continuous adjoints differ by O(rtol))
TARGET = 4.0  # the target for the best sensealg: HVP ≤ 4 × gradient


def sensealgs():
    """(name, sensealg) for every benchmarked sensealg with its default (JAX) engine."""
    for name in VARIANTS:
        yield name, parse(name)


def main(repeats: int, out: pathlib.Path):
    rows = []
    for bench in (lotka_volterra(), spiral_node()):
        p = bench.problem.p
        v = np.random.default_rng(0).normal(size=p.shape).astype(p.dtype)
        fns = {}
        for name, alg in sensealgs():
            grad = jax.jit(jax.grad(lambda p, alg=alg: bench.objective(p, alg)))
            hvp = jax.jit(lambda p, v, grad=grad: jax.jvp(grad, (p,), (v,))[1])
            fns[(name, "gradient")] = lambda grad=grad: grad(p)
            fns[(name, "hvp")] = lambda hvp=hvp: hvp(p, v)
        for key, fn in fns.items():
            print(f"{bench.name} {key[0]} {key[1]}: compiled in {timed(fn)[1]:.1f} s", flush=True)
        times = dict(zip(fns, interleaved(list(fns.values()), rounds=repeats)))
        reference = np.asarray(fns[("DiscreteAdjoint", "hvp")]())
        for name, _ in sensealgs():
            g, h = np.median(times[(name, "gradient")]), np.median(times[(name, "hvp")])
            error = float(np.linalg.norm(np.asarray(fns[(name, "hvp")]()) - reference) / np.linalg.norm(reference))
            rows.append(
                {
                    "problem": bench.name,
                    "sensealg": name,
                    "median_s": g,
                    "hvp_s": h,
                    "ratio": h / g,
                    "hvp_rel_error": error,
                    "ok": error < HVP_AGREEMENT,
                }
            )
    lines = [
        "| problem | sensealg | gradient (ms) | HVP (ms) | HVP / gradient | HVP vs DiscreteAdjoint's |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['problem']} | {r['sensealg']} | {1e3 * r['median_s']:.2f} | "
            f"{1e3 * r['hvp_s']:.2f} | {r['ratio']:.2f} | {r['hvp_rel_error']:.1e} |"
        )
    lines.append("")
    for problem in dict.fromkeys(r["problem"] for r in rows):
        group = [r for r in rows if r["problem"] == problem]
        grad = fastest(group)
        hvp = fastest([{**r, "median_s": r["hvp_s"]} for r in group])
        ratio = hvp["median_s"] / grad["median_s"]
        lines.append(
            f"- {problem}: fastest HVP ({hvp['sensealg']}) / fastest gradient ({grad['sensealg']}) = "
            f"{ratio:.2f} (target ≤ {TARGET}: {'MET' if ratio <= TARGET else 'MISSED'})"
        )
    table = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "records.json").write_text(
        json.dumps({"repeats": repeats, "device": jax.devices()[0].device_kind, "rows": rows}, indent=1)
    )
    (out / "table.md").write_text(f"# HVP / gradient cost\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/hvp-cost"))
    args = parser.parse_args()
    main(args.repeats, args.out)
