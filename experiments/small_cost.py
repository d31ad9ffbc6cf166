"""Where sciad's small-problem gradient spends its time: Lotka–Volterra, `sensealg="auto"` (issue 41).

The suite's Lotka–Volterra (2 states, 4 parameters, t ≤ 10, 101 saves, Tsit5 at rtol = atol = 1e-6,
float64). Printed, each timed in interleaved rounds of one call in this process (medians):

- the forward solve alone (the loss, no gradient) against the gradient, diffrax's fastest adjoint
  (ForwardMode) and diffsol-jax (Tsit45) beside them, and a jitted call that does nothing (the
  dispatch floor);
- accepted steps and µs per step; the gradient's and the forward solve's program: jaxpr equations
  (nested ones counted), StableHLO lines, while loops, conds (case, if), host callbacks;
- the fixed cost per call and the cost per step, from a least-squares line through the times at
  t1 = 2.5, 5, 10, 20 (101 saves each), against a bare `lax.fori_loop` RK4 under `jax.jacfwd` at
  the same step counts (the floor for a stepping loop in XLA);
- 101 saves against 2 (t = 0, 10), and the gradient with `EQX_ON_ERROR=nan` (no host callbacks for
  equinox's checks), in a child process beside one with the default, both timed alike.

    PYTHONPATH=. python experiments/small_cost.py [--rounds 200]   # from the repository root
"""

import argparse
import dataclasses
import functools
import json
import os
import subprocess
import sys

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import sciad  # noqa: E402
from sciad.problems import lotka_volterra  # noqa: E402
from sciad.problems._lotka_volterra import lotka_volterra_rhs  # noqa: E402
from sciad.timing import interleaved  # noqa: E402

HORIZONS = (2.5, 5.0, 10.0, 20.0)


def bench_at(t1: float, saves: int = 101):
    bench = lotka_volterra()
    prob = dataclasses.replace(bench.problem, tspan=(0.0, t1))
    return dataclasses.replace(bench, problem=prob, saveat=np.linspace(0.0, t1, saves))


def program(fn, p) -> dict:
    """jaxpr equations, StableHLO lines, while loops, conds and host callbacks of jitted `fn` at `p`."""
    from sciad_bench.suite import program_size

    traced = fn.trace(p)
    return program_size(traced, traced.lower())


def rk4_gradient(steps: int, t1: float = 10.0):
    """∂/∂p Σ u(t1) of a fixed-step RK4 in a bare `lax.fori_loop`, by `jax.jacfwd`."""
    dt = t1 / steps

    def loss(p):
        def step(i, u):
            t = i * dt
            k1 = lotka_volterra_rhs(u, p, t)
            k2 = lotka_volterra_rhs(u + dt / 2 * k1, p, t + dt / 2)
            k3 = lotka_volterra_rhs(u + dt / 2 * k2, p, t + dt / 2)
            k4 = lotka_volterra_rhs(u + dt * k3, p, t + dt)
            return u + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)

        return jnp.sum(jax.lax.fori_loop(0, steps, step, jnp.array([1.0, 1.0])))

    return jax.jit(jax.jacfwd(loss))


def medians(calls: dict, rounds: int) -> dict:
    """Median seconds per call of each of `calls` (name -> no-argument call), timed in interleaved rounds."""
    for call in calls.values():
        jax.block_until_ready(call())
    times = interleaved(list(calls.values()), rounds=rounds)
    return {name: float(np.median(t)) for name, t in zip(calls, times)}


def fit(steps, seconds) -> tuple[float, float]:
    """(fixed seconds, seconds per step) of the least-squares line through (steps, seconds)."""
    slope, intercept = np.polyfit(np.asarray(steps, float), np.asarray(seconds, float), 1)
    return float(intercept), float(slope)


def child(rounds: int) -> None:
    """Print the gradient's median (this process's EQX_ON_ERROR) as JSON."""
    bench = lotka_volterra()
    p = jnp.asarray(bench.inputs)
    grad = jax.jit(jax.grad(lambda p: bench.objective(p)))
    print(json.dumps(medians({"grad": lambda: grad(p)}, rounds)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.rounds)
    from sciad_bench.peers import diffrax_peer, diffsol_peer

    print(f"load averages before: {os.getloadavg()}")
    bench = lotka_volterra()
    p = jnp.asarray(bench.inputs)
    sol = sciad.solve(bench.problem, saveat=bench.saveat, rtol=bench.rtol, atol=bench.atol)
    accepted, rejected = int(sol.stats["accepted_steps"]), int(sol.stats["rejected_steps"])
    steps = accepted + rejected  # each attempted step costs a step
    forward = jax.jit(lambda p: bench.objective(p))
    grad = jax.jit(jax.grad(lambda p: bench.objective(p)))
    two = bench_at(10.0, saves=2)
    noop = jax.jit(lambda p: p)
    rk4 = rk4_gradient(steps)
    calls = {
        "jitted no-op (dispatch floor)": functools.partial(noop, p),
        "sciad forward solve (loss only)": functools.partial(forward, p),
        'sciad gradient ("auto")': functools.partial(grad, p),
        'sciad gradient ("auto"), 2 saves': functools.partial(jax.jit(jax.grad(lambda p: two.objective(p))), p),
        "diffrax ForwardMode gradient": functools.partial(diffrax_peer("ForwardMode").build(bench), p),
        "diffsol-jax tsit45 gradient": functools.partial(diffsol_peer("tsit45").build(bench), p),
        f"bare fori_loop RK4, jacfwd, {steps} steps": functools.partial(rk4, p),
    }
    # The fixed cost and the cost per step: a line through the times at several horizons (all timed together).
    benches = [bench_at(t1) for t1 in HORIZONS]
    counts = []
    for b in benches:
        stats = sciad.solve(b.problem, saveat=b.saveat, rtol=b.rtol, atol=b.atol).stats
        n = int(stats["accepted_steps"]) + int(stats["rejected_steps"])
        counts.append(n)
        calls[f"grad {n}"] = functools.partial(jax.jit(jax.grad(lambda p, b=b: b.objective(p))), p)
        calls[f"forward {n}"] = functools.partial(jax.jit(lambda p, b=b: b.objective(p)), p)
        calls[f"rk4 {n}"] = functools.partial(rk4_gradient(n, b.problem.tspan[1]), p)
    times = medians(calls, args.rounds)

    print(f"\nLotka–Volterra, auto → {sciad.select_sensealg(bench.problem, saveat=bench.saveat).sensealg}")
    print(f"steps {steps}: {accepted} accepted, {rejected} rejected")
    print(f"{'call':44} {'median µs':>10} {'µs / step':>10}")
    for name, t in list(times.items())[:7]:
        print(f"{name:44} {1e6 * t:10.1f} {1e6 * t / steps:10.3f}")
    ratio = times['sciad gradient ("auto")'] / times["sciad forward solve (loss only)"]
    print(f"gradient / forward solve: {ratio:.2f}")

    print(f"\nhorizons t1 = {HORIZONS}: steps {counts} (101 saves each)")
    print(f"{'line through the times':28} {'fixed µs':>9} {'µs / step':>10}")
    for kind in ("grad", "forward", "rk4"):
        fixed, per_step = fit(counts, [times[f"{kind} {n}"] for n in counts])
        print(f"{kind:28} {1e6 * fixed:9.1f} {1e6 * per_step:10.3f}")

    print(f"\n{'program':28} {'jaxpr eqns':>10} {'HLO lines':>10} {'while':>6} {'conds':>6} {'callbacks':>9}")
    for name, fn in (("sciad gradient", grad), ("sciad forward solve", forward), ("bare RK4 jacfwd", rk4)):
        s = program(fn, p)
        print(f"{name:28} {s['equations']:10} {s['hlo_lines']:10} {s['loops']:6} {s['conds']:6} {s['callbacks']:9}")

    # Host callbacks: the same gradient in child processes, EQX_ON_ERROR unset and nan, alternating.
    children = {None: [], "nan": []}
    for i in range(3):
        for setting in (None, "nan") if i % 2 == 0 else ("nan", None):
            env = {k: v for k, v in os.environ.items() if k != "EQX_ON_ERROR"}
            env.update({} if setting is None else {"EQX_ON_ERROR": setting})
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--rounds", str(args.rounds)],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            ).stdout
            children[setting].append(json.loads(out.strip().splitlines()[-1])["grad"])
    print()
    for setting, ts in children.items():
        print(f"gradient, child processes, EQX_ON_ERROR={setting or 'unset'}: {1e6 * np.median(ts):.1f} µs (median, 3)")
    print(f"load averages after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
