"""diffrax's documented examples with only `adjoint=` changed: `sciad.diffrax_adjoint(...)` against
diffrax's own RecursiveCheckpointAdjoint (its default) and BacksolveAdjoint.

- `neural-ode`: diffrax's neural ODE example: an MLP (2 -> 64 -> 64 -> 2, softplus, tanh last) held by
  the `ODETerm`, a batch of 32 initial states under `jax.vmap`, 100 save times on (0, 10), Tsit5 with
  PIDController(rtol=1e-3, atol=1e-6), dt0 = ts[1] - ts[0], float32; the gradient of a mean squared
  error in the model (`eqx.filter_grad`), jitted.
- `cnf`: an FFJORD-style continuous normalising flow (diffrax's CNF example with the exact trace of a
  two-dimensional flow): the state (z, log-density change), an MLP (3 -> 64 -> 64 -> 2, tanh) of (z, t),
  64 samples under `jax.vmap`, Tsit5 with PIDController(rtol=1e-3, atol=1e-6) over (0, 1), float32; the
  gradient of the mean negative log-likelihood.
- `stiff`: diffrax's stiff ODE example: Robertson's kinetics by Kvaerno5 with
  PIDController(rtol=1e-8, atol=1e-8) over (0, 100), dt0 = 2e-4, float64; the gradient of the final
  state's sum in the three rates.

Each gradient is checked against RecursiveCheckpointAdjoint's (the relative error is printed) and
compiled, then timed in rounds, the adjoints interleaved within a round; the table gives the median
and the ratio to RecursiveCheckpointAdjoint. Writes paper/tables/diffrax-adjoint.md and .json.

    python experiments/diffrax_adjoint.py [--rounds 15] [--problems neural-ode,cnf,stiff]
"""

import argparse
import json
import os
import time

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import sciad  # noqa: E402

ADJOINTS = {
    "diffrax RecursiveCheckpointAdjoint": dfx.RecursiveCheckpointAdjoint(),
    "diffrax BacksolveAdjoint": dfx.BacksolveAdjoint(),
    'sciad.diffrax_adjoint("auto")': sciad.diffrax_adjoint("auto"),
    'sciad.diffrax_adjoint("GaussAdjoint")': sciad.diffrax_adjoint("GaussAdjoint"),
    'sciad.diffrax_adjoint("InterpolatingAdjoint")': sciad.diffrax_adjoint("InterpolatingAdjoint"),
}
REFERENCE = "diffrax RecursiveCheckpointAdjoint"


class Func(eqx.Module):
    mlp: eqx.nn.MLP

    def __call__(self, t, y, args):
        return self.mlp(y)


def neural_ode():
    """(loss(model, adjoint), model) of diffrax's neural ODE example."""
    key = jax.random.PRNGKey(0)
    model = Func(eqx.nn.MLP(2, 2, 64, 2, activation=jax.nn.softplus, final_activation=jax.nn.tanh, key=key))
    model = jax.tree.map(lambda x: x.astype(jnp.float32) if eqx.is_inexact_array(x) else x, model)
    ts = jnp.linspace(0.0, 10.0, 100, dtype=jnp.float32)
    y0s = jax.random.uniform(jax.random.PRNGKey(1), (32, 2), jnp.float32, -0.6, 1.0)
    targets = 0.5 * jnp.stack([jnp.cos(ts), jnp.sin(ts)], axis=-1)[None] * y0s[:, None, :1]

    def loss(model, adjoint):
        ys = jax.vmap(
            lambda y0: (
                dfx.diffeqsolve(
                    dfx.ODETerm(model),
                    dfx.Tsit5(),
                    ts[0],
                    ts[-1],
                    ts[1] - ts[0],
                    y0,
                    saveat=dfx.SaveAt(ts=ts),
                    stepsize_controller=dfx.PIDController(rtol=1e-3, atol=1e-6),
                    adjoint=adjoint,
                ).ys
            )
        )(y0s)
        return jnp.mean((ys - targets) ** 2)

    return loss, model


class Flow(eqx.Module):
    mlp: eqx.nn.MLP

    def __call__(self, t, y, args):
        z, _ = y
        field = lambda z: self.mlp(jnp.concatenate([z, t[None]]))  # noqa: E731
        dz = field(z)
        return dz, -jnp.trace(jax.jacfwd(field)(z))


def cnf():
    """(loss(model, adjoint), model) of an FFJORD-style CNF with the exact trace."""
    key = jax.random.PRNGKey(0)
    model = Flow(eqx.nn.MLP(3, 2, 64, 2, activation=jnp.tanh, key=key))
    model = jax.tree.map(lambda x: x.astype(jnp.float32) if eqx.is_inexact_array(x) else x, model)
    angle = jax.random.uniform(jax.random.PRNGKey(1), (64,), jnp.float32, 0.0, jnp.pi)
    xs = jnp.stack([jnp.cos(angle), jnp.sin(angle)], -1) + 0.1 * jax.random.normal(jax.random.PRNGKey(2), (64, 2))

    def loss(model, adjoint):
        def one(x):
            z, delta = dfx.diffeqsolve(
                dfx.ODETerm(model),
                dfx.Tsit5(),
                0.0,
                1.0,
                0.1,
                (x, jnp.float32(0.0)),
                stepsize_controller=dfx.PIDController(rtol=1e-3, atol=1e-6),
                adjoint=adjoint,
            ).ys
            return 0.5 * jnp.sum(z[-1] ** 2) + jnp.log(2 * jnp.pi) - delta[-1]

        return jnp.mean(jax.vmap(one)(xs))

    return loss, model


class Robertson(eqx.Module):
    def __call__(self, t, y, k):
        return jnp.stack(
            [-k[0] * y[0] + k[2] * y[1] * y[2], k[0] * y[0] - k[2] * y[1] * y[2] - k[1] * y[1] ** 2, k[1] * y[1] ** 2]
        )


def stiff():
    """(loss(k, adjoint), k) of diffrax's stiff ODE example."""
    y0 = jnp.array([1.0, 0.0, 0.0])

    def loss(k, adjoint):
        sol = dfx.diffeqsolve(
            dfx.ODETerm(Robertson()),
            dfx.Kvaerno5(),
            0.0,
            100.0,
            2e-4,
            y0,
            k,
            stepsize_controller=dfx.PIDController(rtol=1e-8, atol=1e-8),
            adjoint=adjoint,
        )
        return jnp.sum(sol.ys[-1] * jnp.array([1.0, 1e4, 1.0]))

    return loss, jnp.array([0.04, 3e7, 1e4])


PROBLEMS = {"neural-ode": neural_ode, "cnf": cnf, "stiff": stiff}


def _relative_error(a, b) -> float:
    a, b = (
        jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(eqx.filter(t, eqx.is_inexact_array))]) for t in (a, b)
    )
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def measure(name: str, rounds: int) -> list[dict]:
    loss, params = PROBLEMS[name]()
    grads = {
        label: eqx.filter_jit(eqx.filter_value_and_grad(lambda p, adjoint=adjoint: loss(p, adjoint)))
        for label, adjoint in ADJOINTS.items()
    }
    reference = None
    rows = {}
    for label, grad in grads.items():
        start = time.perf_counter()
        try:
            value, g = jax.block_until_ready(grad(params))
        except Exception as e:  # noqa: BLE001 (a peer that cannot differentiate this problem is reported, not fatal)
            print(f"  {label}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
            continue
        first = time.perf_counter() - start
        if reference is None:
            reference = (value, g)
        rows[label] = dict(
            problem=name,
            adjoint=label,
            first_call_s=first,
            loss=float(value),
            loss_relative_error=abs(float(value - reference[0])) / abs(float(reference[0])),
            gradient_relative_error=_relative_error(g, reference[1]),
            times_ms=[],
        )
        print(
            f"  {label}: first call {first:.2f} s, loss {float(value):.8g}, gradient error "
            f"{rows[label]['gradient_relative_error']:.1e}",
            flush=True,
        )
    for r in range(rounds):
        for label in rows:
            start = time.perf_counter()
            jax.block_until_ready(grads[label](params))
            rows[label]["times_ms"].append(1e3 * (time.perf_counter() - start))
        print(f"  round {r + 1}/{rounds}", end="\r", flush=True)
    base = float(np.median(rows[REFERENCE]["times_ms"]))
    for row in rows.values():
        row["median_ms"] = float(np.median(row["times_ms"]))
        row["ratio"] = row["median_ms"] / base
    return list(rows.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--problems", default=",".join(PROBLEMS))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "paper", "tables"))
    args = parser.parse_args()
    rows = []
    for name in args.problems.split(","):
        print(f"{name}:", flush=True)
        rows += measure(name, args.rounds)
    lines = [
        "| problem | adjoint= | gradient (ms, median) | / RecursiveCheckpointAdjoint | first call (s) | "
        "loss rel. diff. | gradient rel. error |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['problem']} | {row['adjoint']} | {row['median_ms']:.2f} | {row['ratio']:.2f} | "
            f"{row['first_call_s']:.2f} | {row['loss_relative_error']:.1e} | "
            f"{row['gradient_relative_error']:.1e} |"
        )
    table = "\n".join(lines)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "diffrax-adjoint.md"), "w") as fh:
        fh.write(
            f"{table}\n\nOne process, {args.rounds} interleaved rounds, {os.cpu_count()} CPU cores, "
            f"`python experiments/diffrax_adjoint.py`.\n"
        )
    with open(os.path.join(args.out, "diffrax-adjoint.json"), "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
