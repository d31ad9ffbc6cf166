"""The first gradient's wait (trace, lower, compile, run) at max_steps 4,096 and 100,000.

For every sensealg in `sciad.adjoints.ODE_SENSEALGS` (and the checkpointing variants of the
interpolating ones), "auto" and diffrax's `RecursiveCheckpointAdjoint` as the peer, each
(sensealg, problem, max_steps) runs in a fresh process with a new vector field, timing
`jax.jit(jax.grad(loss))(p)` to its first result, split into trace + lower, XLA compile and
run. Problems: a neural ODE (2 states, an MLP of width 64 on u³, tspan (0, 10), 30 saves) and
Lotka–Volterra (tspan (0, 10), 30 saves), Tsit5 at rtol = atol = 1e-6. The table gives the
seconds at each max_steps, their ratio (target: at most 1.1) and auto's time over diffrax's
(target: at most 0.7). Processes run one after another; the machine's load is printed.

    python experiments/first_gradient_max_steps.py [--problems node,lv] [--only NAME,...] [--repeats N]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

MAX_STEPS = (4096, 100_000)
PEER = "diffrax-RCA"

CHILD = r"""
import json, sys, time
import jax
jax.config.update("jax_enable_x64", True)
import diffrax as dfx
import jax.numpy as jnp
import numpy as np
import sciad

problem, sensealg, max_steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
ts = np.linspace(0.0, 10.0, 30)
if problem == "node":
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    sizes = [(2, 64), (64, 64), (64, 2)]
    p = [{"w": jax.random.normal(k, s) / np.sqrt(s[0]), "b": jnp.zeros(s[1])} for k, s in zip(keys, sizes)]
    p[-1]["w"] = p[-1]["w"] * 0.1

    def f(u, p, t):
        h = u**3
        for i, layer in enumerate(p):
            h = h @ layer["w"] + layer["b"]
            h = jnp.tanh(h) if i < len(p) - 1 else h
        return h - 0.1 * u

    u0 = np.array([2.0, 0.0])
else:
    def f(u, p, t):
        return jnp.stack([p[0] * u[0] - p[1] * u[0] * u[1], -p[2] * u[1] + p[3] * u[0] * u[1]])

    p = jnp.asarray([1.5, 1.0, 3.0, 1.0])
    u0 = np.array([1.0, 1.0])

if sensealg == "diffrax-RCA":
    def loss(p):
        sol = dfx.diffeqsolve(dfx.ODETerm(lambda t, u, p: f(u, p, t)), dfx.Tsit5(), 0.0, 10.0, None, jnp.asarray(u0),
                              args=p, saveat=dfx.SaveAt(ts=ts), max_steps=max_steps,
                              stepsize_controller=dfx.PIDController(rtol=1e-6, atol=1e-6),
                              adjoint=dfx.RecursiveCheckpointAdjoint())
        return jnp.sum(sol.ys**2)
else:
    prob = sciad.ODEProblem(f, u0, (0.0, 10.0), p)

    def loss(p):
        return jnp.sum(sciad.solve(prob, p=p, saveat=ts, sensealg=sensealg, max_steps=max_steps,
                                   solver="tsit5").us ** 2)

start = time.perf_counter()
lowered = jax.jit(jax.grad(loss)).lower(p)
lowered_at = time.perf_counter()
compiled = lowered.compile()
compiled_at = time.perf_counter()
g = jax.block_until_ready(compiled(p))
done = time.perf_counter()
text = lowered.as_text()
print(json.dumps({"lower": lowered_at - start, "compile": compiled_at - lowered_at, "run": done - compiled_at,
                  "total": done - start, "hlo_chars": len(text),
                  "grad": float(sum(jnp.sum(x) for x in jax.tree.leaves(g)))}))
"""


def sensealgs() -> list[str]:
    from sciad.adjoints import ODE_SENSEALGS

    names = list(ODE_SENSEALGS)
    names += ["InterpolatingAdjoint(checkpointing=True)", "GaussAdjoint(checkpointing=True)"]
    return ["auto", *names, PEER]


def measure(problem: str, sensealg: str, max_steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS", "cpu")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, problem, sensealg, str(max_steps)], capture_output=True, text=True, env=env
    )
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default="node,lv")
    parser.add_argument("--only", default=None, help="comma-separated sensealg names (default: all)")
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes per cell (median taken)")
    args = parser.parse_args()
    names = sensealgs() if args.only is None else args.only.split(",")
    print(f"load: {os.getloadavg()}", flush=True)
    for problem in args.problems.split(","):
        print(f"\n{problem}: seconds to the first jax.jit(jax.grad) result (compile = XLA's; HLO = lowered chars)")
        header = (
            f"{'sensealg':42} {'4,096':>7} {'100,000':>8} {'ratio':>6} {'compile 4k':>10} {'compile 100k':>12} "
            f"{'HLO 4k':>8} {'HLO 100k':>9} {'vs RCA 4k':>9} {'vs RCA 100k':>11}"
        )
        print(header)
        rows = {}
        for name in names + ([PEER] if PEER not in names else []):
            cells = []
            for max_steps in MAX_STEPS:
                runs = [measure(problem, name, max_steps) for _ in range(args.repeats)]
                if any("error" in r for r in runs):
                    cells.append(next(r for r in runs if "error" in r))
                    continue
                cells.append({key: statistics.median(r[key] for r in runs) for key in runs[0]})
            rows[name] = cells
        peer = rows[PEER]
        for name, cells in rows.items():
            if any("error" in c for c in cells):
                print(f"{name:42} {next(c for c in cells if 'error' in c)['error'][:100]}")
                continue
            a, b = cells
            vs = (
                f"{a['total'] / peer[0]['total']:9.2f} {b['total'] / peer[1]['total']:11.2f}"
                if "error" not in peer[0] and "error" not in peer[1]
                else ""
            )
            print(
                f"{name:42} {a['total']:7.2f} {b['total']:8.2f} {b['total'] / a['total']:6.2f} {a['compile']:10.2f} "
                f"{b['compile']:12.2f} {a['hlo_chars']:8d} {b['hlo_chars']:9d} {vs}",
                flush=True,
            )
    print(f"\nload: {os.getloadavg()}")


if __name__ == "__main__":
    main()
