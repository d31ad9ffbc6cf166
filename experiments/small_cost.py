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
- 101 saves against 2 (t = 0, 10), forward and gradient, and diffrax's forward solve alone;
- what the program's host callbacks cost: a jitted call behind 13 equinox checks that pass (a check's
  callback sits in a cond and runs only when it fails).

    PYTHONPATH=. python experiments/small_cost.py [--rounds 200]   # from the repository root
"""

import argparse
import dataclasses
import functools
import os

import jax

jax.config.update("jax_enable_x64", True)
import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import sciad  # noqa: E402
from sciad.problems import lotka_volterra  # noqa: E402
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
    dt, rhs = t1 / steps, lotka_volterra().problem.f

    def loss(p):
        def step(i, u):
            t = i * dt
            k1 = rhs(u, p, t)
            k2 = rhs(u + dt / 2 * k1, p, t + dt / 2)
            k3 = rhs(u + dt / 2 * k2, p, t + dt / 2)
            k4 = rhs(u + dt * k3, p, t + dt)
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


def with_checks(n: int):
    """A jitted x ↦ 2x behind `n` `equinox.error_if` checks that pass."""

    def f(x):
        for i in range(n):
            x = eqx.error_if(x, x[0] > 1e9 + i, f"check {i}")
        return 2 * x

    return jax.jit(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    import diffrax as dfx

    from sciad_bench.peers import _diffrax_objective, diffrax_peer, diffsol_peer

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
        "sciad forward solve, 2 saves": functools.partial(jax.jit(lambda p: two.objective(p)), p),
        "diffrax forward solve (Tsit5, loss only)": functools.partial(
            jax.jit(_diffrax_objective(bench, dfx.RecursiveCheckpointAdjoint())), p
        ),
        "diffrax ForwardMode gradient": functools.partial(diffrax_peer("ForwardMode").build(bench), p),
        "diffsol-jax tsit45 gradient": functools.partial(diffsol_peer("tsit45").build(bench), p),
        f"bare fori_loop RK4, jacfwd, {steps} steps": functools.partial(rk4, p),
    }
    # The fixed cost and the cost per step: a line through the times at several horizons, timed with the
    # calls above (t1 = 10 is the problem itself: those calls).
    series, counts = {"grad": [], "forward": [], "rk4": []}, []
    for t1 in HORIZONS:
        b = bench_at(t1)
        stats = sciad.solve(b.problem, saveat=b.saveat, rtol=b.rtol, atol=b.atol).stats
        n = int(stats["accepted_steps"]) + int(stats["rejected_steps"])
        counts.append(n)
        if t1 == bench.problem.tspan[1]:
            series["grad"].append('sciad gradient ("auto")')
            series["forward"].append("sciad forward solve (loss only)")
            series["rk4"].append(f"bare fori_loop RK4, jacfwd, {steps} steps")
            continue
        for kind, fn in (
            ("grad", jax.jit(jax.grad(lambda p, b=b: b.objective(p)))),
            ("forward", jax.jit(lambda p, b=b: b.objective(p))),
            ("rk4", rk4_gradient(n, t1)),
        ):
            series[kind].append(f"{kind} t1={t1:g}")
            calls[series[kind][-1]] = functools.partial(fn, p)
    times = medians(calls, args.rounds)

    print(f"\nLotka–Volterra, auto → {sciad.select_sensealg(bench.problem, saveat=bench.saveat).sensealg}")
    print(f"steps {steps}: {accepted} accepted, {rejected} rejected")
    print(f"{'call':44} {'median µs':>10} {'µs / step':>10}")
    for name, t in list(times.items())[:9]:
        print(f"{name:44} {1e6 * t:10.1f} {1e6 * t / steps:10.3f}")
    ratio = times['sciad gradient ("auto")'] / times["sciad forward solve (loss only)"]
    print(f"gradient / forward solve: {ratio:.2f}")

    print(f"\nhorizons t1 = {HORIZONS}: steps {counts} (101 saves each)")
    print(f"{'line through the times':28} {'fixed µs':>9} {'µs / step':>10}")
    for kind in ("grad", "forward", "rk4"):
        fixed, per_step = fit(counts, [times[name] for name in series[kind]])
        print(f"{kind:28} {1e6 * fixed:9.1f} {1e6 * per_step:10.3f}")

    print(f"\n{'program':28} {'jaxpr eqns':>10} {'HLO lines':>10} {'while':>6} {'conds':>6} {'callbacks':>9}")
    for name, fn in (("sciad gradient", grad), ("sciad forward solve", forward), ("bare RK4 jacfwd", rk4)):
        s = program(fn, p)
        print(f"{name:28} {s['equations']:10} {s['hlo_lines']:10} {s['loops']:6} {s['conds']:6} {s['callbacks']:9}")

    # Host callbacks: equinox's checks (`error_if`) call the host only when they fail; what 13 of them cost.
    checks = {n: functools.partial(with_checks(n), p) for n in (0, 13)}
    t = medians(checks, 10 * args.rounds)
    print(f"\njitted call with 0 / 13 equinox checks that pass: {1e6 * t[0]:.1f} / {1e6 * t[13]:.1f} µs")
    print(f"load averages after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
