"""A batch of trajectories under `jax.vmap`: what each sensealg's gradient costs against diffrax, and
against the same batch written as one state.

Three problems (`--problem`), float32, Tsit5 at rtol 1e-3, atol 1e-6, the gradient taken with respect
to an equinox MLP's parameters (2 -> width -> width -> 2, tanh):

- `node`: a neural ODE u' = MLP(u) from `batch` initial states over (0, 1.5); the loss is the
  batch's mean of |u(t1)|².
- `node100`: diffrax's neural ODE example: u' = MLP(u) (softplus, tanh last) from `batch` initial
  states u0 over (0, 10), saved at 100 times tᵢ; the loss is the mean squared distance to
  0.5 u0[0] (cos tᵢ, sin tᵢ).
- `cnf`: an FFJORD-style continuous normalising flow over `batch` samples x of a two-moons-like
  density: the state (z, Δ) with z' = MLP([z, t])[:2] and Δ' = -tr ∂z'/∂z (exact, 2 × 2), from
  (x, 0) over (0, 1); the loss is the mean negative log-likelihood -log N(z(1); 0, I) - Δ(1).

Each sciad sensealg (and "auto") is timed

- vmapped: `jax.vmap` of one trajectory's solve over the initial states (p shared), and
- as one state: one solve of the (batch, 2) state, the MLP vmapped inside f,

with diffrax's RecursiveCheckpointAdjoint and BacksolveAdjoint vmapped alike as peers. Every gradient
is compiled first and then timed in rounds, the cases interleaved within a round; the table gives the
median of the rounds, each vmapped sensealg's ratio to diffrax's fastest vmapped adjoint and to its
own one-state time.

    python experiments/vmap_batch.py [--problem node|node100|cnf] [--batch N] [--width 64] [--rounds 15]
    [--sensealgs auto,DiscreteAdjoint] [--diffrax RecursiveCheckpointAdjoint,BacksolveAdjoint]
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

SENSEALGS = [
    "auto",
    "DiscreteAdjoint",
    "GaussAdjoint",
    "InterpolatingAdjoint",
    "QuadratureAdjoint",
    "BacksolveAdjoint",
    "InterpolatingAdjoint(checkpointing=True)",
]
RTOL, ATOL = 1e-3, 1e-6


class Problem(eqx.Module):
    """A batched problem: `rate(model, u, t)` for one member, the end time `t1`, the number of save
    times (`saves`, evenly spaced on (0, t1], or t1 alone) and the member's loss `loss(us, u0)` of
    its saved states us (saves, n) (the batch's is their mean)."""

    rate: object = eqx.field(static=True)
    loss: object = eqx.field(static=True)
    t1: float = eqx.field(static=True)
    saves: int = eqx.field(static=True, default=1)

    @property
    def ts(self):
        return jnp.linspace(0.0, self.t1, self.saves, dtype=jnp.float32) if self.saves > 1 else jnp.array([self.t1])


def node_rate(model, u, t):
    return model(u)


def node_loss(us, u0):
    return jnp.sum(us[-1] ** 2)


def spiral_loss(us, u0):
    ts = jnp.linspace(0.0, 10.0, us.shape[0], dtype=us.dtype)
    return jnp.mean((us - 0.5 * u0[0] * jnp.stack([jnp.cos(ts), jnp.sin(ts)], axis=-1)) ** 2)


def cnf_rate(model, y, t):
    """(z', Δ') = (MLP([z, t]), -tr ∂z'/∂z) for y = (z, Δ)."""

    def velocity(z):
        return model(jnp.concatenate([z, jnp.reshape(t, (1,)).astype(z.dtype)]))

    z = y[:2]
    return jnp.concatenate([velocity(z), -jnp.trace(jax.jacfwd(velocity)(z))[None]])


def cnf_loss(ys, y0):
    z, delta = ys[-1, :2], ys[-1, 2]
    return 0.5 * jnp.sum(z**2) + jnp.log(2 * jnp.pi) - delta


def problem(name: str, batch: int, width: int):
    """(`Problem`, the MLP, the initial states (batch, n)), float32."""
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    if name == "node":
        mlp = eqx.nn.MLP(2, 2, width, 2, activation=jnp.tanh, key=keys[0])
        mlp = jax.tree.map(lambda x: x * 0.5 if eqx.is_array(x) else x, mlp)
        return Problem(node_rate, node_loss, 1.5), mlp, jax.random.normal(keys[1], (batch, 2), jnp.float32)
    if name == "node100":
        mlp = eqx.nn.MLP(2, 2, width, 2, activation=jax.nn.softplus, final_activation=jnp.tanh, key=keys[0])
        u0s = jax.random.uniform(keys[1], (batch, 2), jnp.float32, -0.6, 1.0)
        return Problem(node_rate, spiral_loss, 10.0, 100), mlp, u0s
    mlp = eqx.nn.MLP(3, 2, width, 2, activation=jnp.tanh, key=keys[0])
    angle = jax.random.uniform(keys[1], (batch,), jnp.float32, 0.0, jnp.pi)
    upper = jnp.arange(batch) % 2 == 0  # two interleaved half circles
    x = jnp.stack(
        [jnp.where(upper, jnp.cos(angle), 1 - jnp.cos(angle)), jnp.where(upper, jnp.sin(angle), 0.5 - jnp.sin(angle))],
        axis=1,
    )
    x = x + 0.1 * jax.random.normal(keys[2], x.shape, jnp.float32)
    return Problem(cnf_rate, cnf_loss, 1.0), mlp, jnp.concatenate([x, jnp.zeros((batch, 1), jnp.float32)], axis=1)


def sciad_gradients(prob: Problem, sensealg: str, u0s):
    """(vmapped, one-state): two jitted gradients of the loss in the MLP by `sensealg`."""
    sensealg_ = sensealg if sensealg == "auto" else sciad.adjoints.parse(sensealg)
    saveat = prob.ts

    def one(model, u0):
        ode = sciad.ODEProblem(lambda u, p, t: prob.rate(p, u, t), u0, (0.0, prob.t1), model)
        return sciad.solve(
            ode, u0=u0, p=model, saveat=saveat, solver="tsit5", rtol=RTOL, atol=ATOL, sensealg=sensealg_
        ).us

    def batched(model, u0s):
        ode = sciad.ODEProblem(lambda u, p, t: jax.vmap(lambda u: prob.rate(p, u, t))(u), u0s, (0.0, prob.t1), model)
        return sciad.solve(
            ode, u0=u0s, p=model, saveat=saveat, solver="tsit5", rtol=RTOL, atol=ATOL, sensealg=sensealg_
        ).us

    def vmapped_loss(model):
        return jnp.mean(jax.vmap(lambda u0: prob.loss(one(model, u0), u0))(u0s))

    def one_state_loss(model):
        return jnp.mean(jax.vmap(prob.loss, in_axes=(1, 0))(batched(model, u0s), u0s))

    return eqx.filter_jit(eqx.filter_grad(vmapped_loss)), eqx.filter_jit(eqx.filter_grad(one_state_loss))


def diffrax_gradient(prob: Problem, adjoint, u0s):
    """diffrax's gradient of the same loss, vmapped over the initial states."""

    def one(model, u0):
        sol = dfx.diffeqsolve(
            dfx.ODETerm(lambda t, u, p: prob.rate(p, u, t)),
            dfx.Tsit5(),
            0.0,
            prob.t1,
            None,
            u0,
            args=model,
            saveat=dfx.SaveAt(ts=prob.ts),
            stepsize_controller=dfx.PIDController(rtol=RTOL, atol=ATOL),
            adjoint=adjoint,
            max_steps=4096,
        )
        return sol.ys

    def loss(model):
        return jnp.mean(jax.vmap(lambda u0: prob.loss(one(model, u0), u0))(u0s))

    return eqx.filter_jit(eqx.filter_grad(loss))


def timed(fn, model) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(model))
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", choices=("node", "node100", "cnf"), default="node")
    parser.add_argument("--batch", type=int, default=None, help="members (default: 32, 64 for cnf)")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--diffrax",
        default="RecursiveCheckpointAdjoint,BacksolveAdjoint",
        help="comma-separated diffrax adjoints (the first is the reference for the errors)",
    )
    parser.add_argument(
        "--sensealgs",
        default=",".join(SENSEALGS),
        help="comma-separated, as sciad.adjoints.parse reads them (split on '),' or ',' outside parentheses)",
    )
    args = parser.parse_args()
    names = _split(args.sensealgs)
    batch = args.batch or {"node": 32, "node100": 32, "cnf": 64}[args.problem]
    prob, mlp, u0s = problem(args.problem, batch, args.width)

    cases = {f"diffrax {peer}": diffrax_gradient(prob, getattr(dfx, peer)(), u0s) for peer in args.diffrax.split(",")}
    for name in names:
        vmapped, one_state = sciad_gradients(prob, name, u0s)
        cases[f"{name} vmap"], cases[f"{name} one state"] = vmapped, one_state
    reference = jax.tree.leaves(eqx.filter(next(iter(cases.values()))(mlp), eqx.is_array))
    errors = {}
    for label, fn in cases.items():  # compile, and check against diffrax's
        got = jax.tree.leaves(eqx.filter(fn(mlp), eqx.is_array))
        errors[label] = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in zip(got, reference))
    times = {label: [] for label in cases}
    for _ in range(args.rounds):
        for label, fn in cases.items():
            times[label].append(timed(fn, mlp))
    median = {label: float(np.median(ts)) for label, ts in times.items()}
    fastest = min(median[f"diffrax {peer}"] for peer in args.diffrax.split(","))

    print(
        f"{args.problem}: batch {batch}, width {args.width}, float32, Tsit5 rtol {RTOL}; "
        f"median of {args.rounds} rounds; "
        f"load {os.getloadavg()[0]:.2f}; jax {jax.__version__}, {jax.devices()[0].platform}"
    )
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
