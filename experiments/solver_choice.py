"""`solver="auto"`'s calibration: on a corpus of stiff and non-stiff problems, the chosen solver's
forward time against the faster of Tsit5 and Rodas5P at the user's rtol (atol = rtol).

Each case's two solves are jit-compiled, then timed in alternating rounds (so that drifts in the
machine's load hit both alike) and the medians compared; a solve past `--max-steps` steps counts as
infinitely slow. Times are this process's CPU time (`time.process_time`), which other processes on
a shared machine disturb far less than wall time. The calibration set's times fixed
`sciad._solver_choice`'s constants; the held-out set was first timed with them fixed. Prints one
markdown table per set (S: `Stiffness.steps`; bar: `stiff_steps`), with the load average.

    python experiments/solver_choice.py [--rounds 7] [--set calibration|held-out|both]
"""

import argparse
import os
import re
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import sciad  # noqa: E402
from sciad._solver_choice import auto_solver  # noqa: E402
from sciad.problems import brusselator, brusselator_pde, lotka_volterra, oregonator, spiral_node  # noqa: E402

RTOLS = (1e-3, 1e-6, 1e-9)


def van_der_pol(mu, t1):
    f = lambda u, p, t: jnp.stack([u[1], p[0] * (1 - u[0] ** 2) * u[1] - u[0]])  # noqa: E731
    return sciad.ODEProblem(f, np.array([2.0, 0.0]), (0.0, t1), np.array([float(mu)]))


def robertson(t1):
    def f(u, p, t):
        k1, k2, k3 = p
        return jnp.stack([-k1 * u[0] + k3 * u[1] * u[2], k1 * u[0] - k3 * u[1] * u[2] - k2 * u[1] ** 2, k2 * u[1] ** 2])

    return sciad.ODEProblem(f, np.array([1.0, 0.0, 0.0]), (0.0, t1), np.array([0.04, 3e7, 1e4]))


def hires():
    def f(y, p, t):
        r = p[0] * y[5] * y[7]
        return jnp.stack(
            [
                -1.71 * y[0] + 0.43 * y[1] + 8.32 * y[2] + 0.0007,
                1.71 * y[0] - 8.75 * y[1],
                -10.03 * y[2] + 0.43 * y[3] + 0.035 * y[4],
                8.32 * y[1] + 1.71 * y[2] - 1.12 * y[3],
                -1.745 * y[4] + 0.43 * y[5] + 0.43 * y[6],
                -r + 0.69 * y[3] + 1.71 * y[4] - 0.43 * y[5] + 0.69 * y[6],
                r - 1.81 * y[6],
                -r + 1.81 * y[6],
            ]
        )

    return sciad.ODEProblem(f, np.array([1.0, 0, 0, 0, 0, 0, 0, 0.0057]), (0.0, 321.8122), np.array([280.0]))


def oscillator(omega, damping, t1):
    """u'' + 2 damping u' + ω² u = 0 as a first-order system: eigenvalues −damping ± i√(ω² − damping²)."""
    f = lambda u, p, t: jnp.stack([p[0] * u[1], -p[0] * u[0] - 2 * p[1] * u[1]])  # noqa: E731
    return sciad.ODEProblem(f, np.array([1.0, 0.0]), (0.0, t1), np.array([float(omega), float(damping)]))


def linear(ratio, t1):
    """u' = A u with A's eigenvalues −1 and −ratio, A not normal (a rotated diagonal)."""
    q = np.array([[1.0, 1.0], [0.0, 1.0]])
    a = q @ np.diag([-1.0, -float(ratio)]) @ np.linalg.inv(q)
    f = lambda u, p, t: p @ u + jnp.stack([jnp.sin(t), 0.0 * t])  # noqa: E731
    return sciad.ODEProblem(f, np.array([1.0, 1.0]), (0.0, t1), a)


CALIBRATION = {
    "van-der-pol μ=10, t≤20": van_der_pol(10, 20.0),
    "van-der-pol μ=100, t≤10": van_der_pol(100, 10.0),
    "van-der-pol μ=1000, t≤1": van_der_pol(1000, 1.0),
    "robertson t≤100": robertson(100.0),
    "brusselator-pde 32 states": brusselator_pde(4).problem,
    "brusselator-pde 128 states": brusselator_pde(8).problem,
    "brusselator-pde 288 states": brusselator_pde(12).problem,
    "lotka-volterra": lotka_volterra().problem,
    "spiral neural ODE (float32)": spiral_node().problem,
    "oscillator ω=1000, t≤1": oscillator(1000, 0, 1.0),
    "linear, stiffness ratio 1e3, t≤10": linear(1e3, 10.0),
    "oregonator t≤30": oregonator().problem,
}
HELD_OUT = {
    "van-der-pol μ=30, t≤10": van_der_pol(30, 10.0),
    "van-der-pol μ=300, t≤3": van_der_pol(300, 3.0),
    "brusselator-pde 72 states": brusselator_pde(6).problem,
    "brusselator-pde 200 states": brusselator_pde(10).problem,
    "brusselator (grid units) 128 states": brusselator(8).problem,
    "oscillator ω=300, t≤3": oscillator(300, 0, 3.0),
    "damped oscillator ω=500, ζ=1, t≤10": oscillator(500, 1.0, 10.0),
    "linear, stiffness ratio 30, t≤10": linear(30, 10.0),
    "linear, stiffness ratio 1e5, t≤1": linear(1e5, 1.0),
    "hires": hires(),
}


def timed(prob, solver, rtol, max_steps):
    """A jit-compiled forward solve of `prob` by `solver`, returning a function that times one run."""
    ts = np.linspace(*prob.tspan, 11)
    run = jax.jit(
        lambda u0, p: (
            sciad.solve(
                prob,
                u0=u0,
                p=p,
                saveat=ts,
                solver=solver,
                rtol=rtol,
                atol=rtol,
                max_steps=max_steps,
                sensealg=sciad.DiscreteAdjoint(),
            ).us
        )
    )
    try:
        jax.block_until_ready(run(prob.u0, prob.p))
    except Exception:  # past max_steps
        return None

    def once():
        start = time.process_time()
        jax.block_until_ready(run(prob.u0, prob.p))
        return time.process_time() - start

    return once


def row(name, prob, rtol, rounds, max_steps):
    pick = auto_solver(prob, prob.u0, prob.p, prob.tspan, rtol=rtol, atol=rtol)
    runs = {s: timed(prob, s, rtol, max_steps) for s in ("tsit5", "rodas5p")}
    times = {s: [] for s in runs}
    for _ in range(rounds):
        for s, once in runs.items():
            if once is not None:
                times[s].append(once())
    median = {s: statistics.median(t) if t else float("inf") for s, t in times.items()}
    best = min(median.values())
    ratio = 1.0 if best == float("inf") else median[pick.name] / best
    steps, bar = (re.search(rf"{what} (\S+)", pick.reason).group(1) for what in ("needs about", "stiff beyond"))
    return (
        f"| {name} | {rtol:g} | {steps} / {bar} | {_ms(median['tsit5'])} | "
        f"{_ms(median['rodas5p'])} | {pick.name} | {ratio:.2f} | {'ok' if ratio <= 1.3 else 'MISS'} |"
    ), ratio


def _ms(t):
    return "past max_steps" if t == float("inf") else f"{1e3 * t:.2f}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--set", choices=["calibration", "held-out", "both"], default="both")
    args = parser.parse_args()
    sets = {"calibration": CALIBRATION, "held-out": HELD_OUT}
    for title, corpus in sets.items():
        if args.set not in (title, "both"):
            continue
        print(f"\n## {title} (load average before: {os.getloadavg()[0]:.1f})\n")
        print("| problem | rtol | S / bar | Tsit5 CPU ms | Rodas5P CPU ms | chosen | chosen / fastest | ≤ 1.3 |")
        print("|---|---|---|---|---|---|---|---|")
        ratios = []
        for name, prob in corpus.items():
            for rtol in RTOLS:
                line, ratio = row(name, prob, rtol, args.rounds, args.max_steps)
                ratios.append(ratio)
                print(line, flush=True)
        print(
            f"\n{sum(r <= 1.3 for r in ratios)} of {len(ratios)} within 1.3x; load average after: "
            f"{os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
