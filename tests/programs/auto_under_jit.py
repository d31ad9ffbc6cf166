"""A fresh process of tests/test_select.py: `sensealg="auto"` under `jax.jit` and `equinox.filter_jit`
with no un-jitted call first (the choice made while tracing) gives DiscreteAdjoint's gradient.

    python tests/programs/auto_under_jit.py

Prints "ok", or fails with the mismatch.
"""

import equinox as eqx
import jax
import numpy as np

jax.config.update("jax_enable_x64", True)  # before sciad is imported, as a user's script does

import sciad  # noqa: E402


def f(u, p, t):
    xp = sciad.ad.namespace(u, p)
    return -u + xp.tanh(xp.reshape(p, (12, 12)) @ u)


def main():
    rng = np.random.default_rng(0)
    prob = sciad.ODEProblem(f, rng.normal(size=12), (0.0, 1.0), 0.1 * rng.normal(size=144))
    ts = np.linspace(0.0, 1.0, 5)

    def loss(p, sensealg):
        return sciad.solve(prob, p=p, saveat=ts, sensealg=sensealg).us.sum()

    ref = jax.grad(loss)(prob.p, sciad.DiscreteAdjoint())
    for wrap in (jax.jit, eqx.filter_jit):
        g = wrap(jax.grad(lambda p: loss(p, "auto")))(prob.p)
        np.testing.assert_allclose(g, ref, rtol=1e-3, atol=1e-8)
    print("ok")


if __name__ == "__main__":
    main()
