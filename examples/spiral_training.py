"""Train the spiral neural ODE (Chen et al. 2018; the paper's Appendix B, Example 2).

The network is an equinox MLP, u' = NN(u³) with 2 → hidden → 2 and tanh,
passed to sciad as the parameters p itself (a PyTree; its activation is a static
leaf); `eqx.filter_value_and_grad` returns gradients with the MLP's structure and
optax's Adam follows them.

    python examples/spiral_training.py            # 500 iterations, 50 hidden units
"""

import pathlib
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import optax

import sciad
from sciad.problems import spiral_data

matplotlib.use("Agg")
import matplotlib.pyplot as plt

U0 = np.array([2.0, 0.0], np.float32)
TS = np.linspace(0.0, 1.5, 30)


def field(u, mlp, t):
    """u' = MLP(u³)."""
    return mlp(u**3)


def neural_ode(hidden: int, seed: int) -> sciad.ODEProblem:
    """u' = MLP(u³) as an ODEProblem whose parameters p are the MLP."""
    mlp = eqx.nn.MLP(2, 2, width_size=hidden, depth=1, activation=jnp.tanh, key=jax.random.key(seed))
    return sciad.ODEProblem(field, U0, (0.0, 1.5), mlp)


def main(
    iterations: int = 500,
    hidden: int = 50,
    learning_rate: float = 0.05,
    sensealg="auto",
    print_every: int = 50,
    out_dir="results/examples",
    seed: int = 0,
) -> dict:
    """Fit the network to 30 points of the true spiral u' = (u³)ᵀA; save
    `spiral_loss.png` and `spiral_fit.png` under `out_dir`. `sensealg="auto"`
    lets `sciad.select_sensealg` choose. Returns the loss history and the
    trained parameters."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = spiral_data(U0, TS)
    prob = neural_ode(hidden, seed)
    if sensealg == "auto":
        sensealg = sciad.select_sensealg(prob, saveat=TS, rtol=1e-5, atol=1e-5).sensealg
    size = sum(x.size for x in jax.tree.leaves(eqx.filter(prob.p, eqx.is_array)))
    print(f"{size} parameters, gradients by {sciad.adjoints.describe(sensealg)}")

    def predict(p, ts=TS):
        return sciad.solve(prob, p=p, saveat=ts, rtol=1e-5, atol=1e-5, sensealg=sensealg).us

    def loss(p):
        return jnp.sum((predict(p) - data) ** 2)

    optimizer = optax.adam(learning_rate)

    @eqx.filter_jit
    def step(p, state):
        value, grad = eqx.filter_value_and_grad(loss)(p)
        updates, state = optimizer.update(grad, state, eqx.filter(p, eqx.is_array))
        return eqx.apply_updates(p, updates), state, value

    p, state = prob.p, optimizer.init(eqx.filter(prob.p, eqx.is_array))
    losses, start = [], time.perf_counter()
    for i in range(iterations):
        p, state, value = step(p, state)
        losses.append(float(value))
        if i % print_every == 0 or i == iterations - 1:
            print(f"iteration {i:4d}  loss {losses[-1]:10.4f}  ({time.perf_counter() - start:.1f} s)")
    final = float(loss(p))
    print(f"loss {losses[0]:.4f} -> {final:.4f} in {iterations} iterations")

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.semilogy(losses)
    ax.set(xlabel="iteration", ylabel="squared error", title="Spiral neural ODE: training loss")
    fig.tight_layout()
    fig.savefig(out / "spiral_loss.png", dpi=120)
    plt.close(fig)

    fine = np.linspace(0.0, 1.5, 300)
    fitted, initial = np.asarray(predict(p, fine)), np.asarray(predict(prob.p, fine))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    for k, name in enumerate("xy"):
        left.plot(TS, data[:, k], "o", ms=4, color=f"C{k}", label=f"{name} data")
        left.plot(fine, fitted[:, k], "-", color=f"C{k}", label=f"{name} fitted")
    left.set(xlabel="t", ylabel="u(t)", title="States over time")
    left.legend(fontsize=8)
    right.plot(data[:, 0], data[:, 1], "o", ms=4, color="k", label="true spiral")
    right.plot(initial[:, 0], initial[:, 1], ":", color="C7", label="untrained")
    right.plot(fitted[:, 0], fitted[:, 1], "-", color="C3", label="fitted")
    right.set(xlabel="x", ylabel="y", title="Phase plane")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "spiral_fit.png", dpi=120)
    plt.close(fig)
    return {"losses": np.array(losses + [final]), "p": p}


if __name__ == "__main__":
    main()
