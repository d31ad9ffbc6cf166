"""A batch of trajectories under `jax.vmap`: what each sensealg's gradient costs against diffrax, and
against the same batch written as one state.

A neural ODE u' = MLP(u) (equinox, 2 -> width -> width -> 2, tanh, float32) from `batch` initial
states, Tsit5 at rtol 1e-3, atol 1e-6, over (0, 1.5); the loss is the batch's mean of |u(t1)|², its
gradient taken with respect to the MLP's parameters. Each sciad sensealg (and "auto") is timed

- vmapped: `jax.vmap` of one trajectory's solve over the initial states (p shared), and
- as one state: one solve of the (batch, 2) state, the MLP vmapped inside f,

with diffrax's RecursiveCheckpointAdjoint and BacksolveAdjoint vmapped alike as peers. Every gradient
is compiled first and then timed in rounds, the cases interleaved within a round; the table gives the
median of the rounds, each vmapped sensealg's ratio to diffrax's fastest vmapped adjoint and to its
own one-state time.

    python experiments/vmap_batch.py [--batch 32] [--width 64] [--rounds 15] [--sensealgs auto,DiscreteAdjoint]
"""

import argparse
import os
import time

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import sciad

SENSEALGS = ["auto", "DiscreteAdjoint", "GaussAdjoint", "InterpolatingAdjoint", "QuadratureAdjoint",
             "BacksolveAdjoint", "InterpolatingAdjoint(checkpointing=True)"]
T1, RTOL, ATOL = 1.5, 1e-3, 1e-6


def problem(batch: int, width: int):
    """(the MLP, the initial states (batch, 2)), float32."""
    mlp = eqx.nn.MLP(2, 2, width, 2, activation=jnp.tanh, key=jax.random.PRNGKey(0))
    mlp = jax.tree.map(lambda x: x * 0.5 if eqx.is_array(x) else x, mlp)
    u0s = jax.random.normal(jax.random.PRNGKey(1), (batch, 2), jnp.float32)
    return mlp, u0s


def sciad_gradients(sensealg: str, u0s):
    """(vmapped, one-state): two jitted gradients of the loss in the MLP by `sensealg`."""
    sensealg_ = sensealg if sensealg == "auto" else sciad.adjoints.parse(sensealg)

    def one(model, u0):
        prob = sciad.ODEProblem(lambda u, p, t: p(u), u0, (0.0, T1), model)
        return sciad.solve(prob, u0=u0, p=model, saveat=jnp.array([T1]), solver="tsit5", rtol=RTOL, atol=ATOL,
                           sensealg=sensealg_).us[-1]

    def batched(model, u0s):
        prob = sciad.ODEProblem(lambda u, p, t: jax.vmap(p)(u), u0s, (0.0, T1), model)
        return sciad.solve(prob, u0=u0s, p=model, saveat=jnp.array([T1]), solver="tsit5", rtol=RTOL, atol=ATOL,
                           sensealg=sensealg_).us[-1]

    def vmapped_loss(model):
        return jnp.mean(jnp.sum(jax.vmap(lambda u0: one(model, u0))(u0s) ** 2, axis=-1))

    def one_state_loss(model):
        return jnp.mean(jnp.sum(batched(model, u0s) ** 2, axis=-1))

    return eqx.filter_jit(eqx.filter_grad(vmapped_loss)), eqx.filter_jit(eqx.filter_grad(one_state_loss))


def diffrax_gradient(adjoint, u0s):
    """diffrax's gradient of the same loss, vmapped over the initial states."""

    def one(model, u0):
        sol = dfx.diffeqsolve(dfx.ODETerm(lambda t, u, p: p(u)), dfx.Tsit5(), 0.0, T1, None, u0, args=model,
                              stepsize_controller=dfx.PIDController(rtol=RTOL, atol=ATOL), adjoint=adjoint,
                              max_steps=4096)
        return sol.ys[-1]

    def loss(model):
        return jnp.mean(jnp.sum(jax.vmap(lambda u0: one(model, u0))(u0s) ** 2, axis=-1))

    return eqx.filter_jit(eqx.filter_grad(loss))


def timed(fn, model) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(model))
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sensealgs", default=",".join(SENSEALGS),
                        help="comma-separated, as sciad.adjoints.parse reads them (split on '),' or ',' outside parentheses)")
    args = parser.parse_args()
    names = _split(args.sensealgs)
    mlp, u0s = problem(args.batch, args.width)

    cases = {"diffrax RecursiveCheckpointAdjoint": diffrax_gradient(dfx.RecursiveCheckpointAdjoint(), u0s),
             "diffrax BacksolveAdjoint": diffrax_gradient(dfx.BacksolveAdjoint(), u0s)}
    for name in names:
        vmapped, one_state = sciad_gradients(name, u0s)
        cases[f"{name} vmap"], cases[f"{name} one state"] = vmapped, one_state
    reference = jax.tree.leaves(eqx.filter(cases["diffrax RecursiveCheckpointAdjoint"](mlp), eqx.is_array))
    errors = {}
    for label, fn in cases.items():  # compile, and check against diffrax's
        got = jax.tree.leaves(eqx.filter(fn(mlp), eqx.is_array))
        errors[label] = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in zip(got, reference))
    times = {label: [] for label in cases}
    for _ in range(args.rounds):
        for label, fn in cases.items():
            times[label].append(timed(fn, mlp))
    median = {label: float(np.median(ts)) for label, ts in times.items()}
    fastest = min(median["diffrax RecursiveCheckpointAdjoint"], median["diffrax BacksolveAdjoint"])

    print(f"batch {args.batch}, width {args.width}, float32, Tsit5 rtol {RTOL}; median of {args.rounds} rounds; "
          f"load {os.getloadavg()[0]:.2f}; jax {jax.__version__}, {jax.devices()[0].platform}")
    print(f"{'case':48s} {'ms':>8s} {'/diffrax':>9s} {'/one state':>11s} {'rel. err':>9s}")
    for label in cases:
        own = label.replace(" vmap", " one state")
        vs_own = f"{median[label] / median[own]:11.2f}" if label.endswith(" vmap") else f"{'':11s}"
        print(f"{label:48s} {median[label] * 1e3:8.2f} {median[label] / fastest:9.2f} {vs_own} {errors[label]:9.1e}")


def _split(text: str) -> list[str]:
    names, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            names.append(current.strip())
            current = ""
        else:
            current += ch
    return names + ([current.strip()] if current.strip() else [])


if __name__ == "__main__":
    main()
