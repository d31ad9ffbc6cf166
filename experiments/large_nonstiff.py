"""Stored continuous adjoints on a large non-stiff problem: does their cost follow the steps taken?

u' = −p ⊙ u + 0.3 sin t (1 + u / (1 + u²)), n states and n parameters, Tsit5 at rtol = atol = 1e-6, saved at
t = 0.5 and 1 (a handful of steps), gradient of Σ u(1)² in p, float64. Each gradient is compiled with
`jax.jit`, checked against DiscreteAdjoint, then timed in interleaved rounds in one process
(`sciad.timing.interleaved`); XLA's memory analysis gives the temporaries each program allocates. diffrax's
RecursiveCheckpointAdjoint and BacksolveAdjoint on the same solve run beside them.

    python experiments/large_nonstiff.py [--states 2000 20000] [--rounds 15] [--max-steps 4096]
"""

import argparse

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np

import sciad
from sciad.timing import interleaved

jax.config.update("jax_enable_x64", True)

RTOL = ATOL = 1e-6
SAVEAT = np.array([0.5, 1.0])


def rhs(u, p, t):
    return -p * u + 0.3 * jnp.sin(t) * (1 + u / (1 + u**2))


def problem(n: int):
    rng = np.random.default_rng(0)
    return sciad.ODEProblem(rhs, rng.uniform(0.5, 1.5, n), (0.0, 1.0), rng.uniform(0.5, 2.0, n))


def sciad_loss(prob, sensealg, max_steps):
    def loss(p):
        us = sciad.solve(prob, p=p, saveat=SAVEAT, sensealg=sensealg, rtol=RTOL, atol=ATOL, max_steps=max_steps).us
        return jnp.sum(us[-1] ** 2)

    return loss


def diffrax_loss(prob, adjoint, max_steps):
    solver = sciad.get_solver("tsit5")

    def loss(p):
        sol = dfx.diffeqsolve(dfx.ODETerm(lambda t, u, p: rhs(u, p, t)), solver, 0.0, 1.0, None, prob.u0, p,
                              saveat=dfx.SaveAt(ts=SAVEAT), stepsize_controller=sciad.step_controller(solver, RTOL, ATOL),
                              max_steps=max_steps, adjoint=adjoint)
        return jnp.sum(sol.ys[-1] ** 2)

    return loss


def temporaries(compiled) -> int:
    return int(compiled.memory_analysis().temp_size_in_bytes)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--max-steps", type=int, default=4096)
    args = parser.parse_args(argv)
    for n in args.states:
        prob = problem(n)
        losses = {
            "GaussAdjoint": sciad_loss(prob, sciad.GaussAdjoint(), args.max_steps),
            "InterpolatingAdjoint": sciad_loss(prob, sciad.InterpolatingAdjoint(), args.max_steps),
            "auto": sciad_loss(prob, "auto", args.max_steps),
            "DiscreteAdjoint": sciad_loss(prob, sciad.DiscreteAdjoint(), args.max_steps),
            "diffrax RCA": diffrax_loss(prob, dfx.RecursiveCheckpointAdjoint(), args.max_steps),
            "diffrax Backsolve": diffrax_loss(prob, dfx.BacksolveAdjoint(), args.max_steps),
        }
        compiled = {name: jax.jit(jax.grad(loss)).lower(prob.p).compile() for name, loss in losses.items()}
        reference = np.asarray(compiled["DiscreteAdjoint"](prob.p))
        for name, fn in compiled.items():
            error = np.max(np.abs(np.asarray(fn(prob.p)) - reference)) / np.max(np.abs(reference))
            assert error < 1e-3, f"{name}: gradient {error:.1e} off DiscreteAdjoint's"
        names = list(compiled)
        times = interleaved([lambda f=compiled[k]: jax.block_until_ready(f(prob.p)) for k in names],
                            rounds=args.rounds)
        medians = {k: float(np.median(t)) for k, t in zip(names, times)}
        fastest_diffrax = min(medians["diffrax RCA"], medians["diffrax Backsolve"])
        rca_temp = temporaries(compiled["diffrax RCA"])
        print(f"\nn = {n}, max_steps = {args.max_steps}")
        print(f"{'':22s} {'median ms':>10s} {'/ diffrax best':>15s} {'temp MiB':>9s} {'/ RCA temp':>11s}")
        for k in names:
            temp = temporaries(compiled[k])
            print(f"{k:22s} {1e3 * medians[k]:10.2f} {medians[k] / fastest_diffrax:15.2f} {temp / 2**20:9.1f} "
                  f"{temp / max(rca_temp, 1):11.2f}")


if __name__ == "__main__":
    main()
