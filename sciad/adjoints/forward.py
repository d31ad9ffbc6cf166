"""The forward sensitivity equations."""


import diffrax as dfx
import jax.numpy as jnp

import sciad.ad as ad
from sciad.adjoints.base import AbstractSensitivity, Products, Setup, stats_vector


class ForwardSensitivity(AbstractSensitivity):
    """Continuous forward sensitivities: u' = f, S' = (∂f/∂u) S + ∂f/∂p solved
    as one augmented system with error control on u and S. `jvp` is the
    engine for the Jacobian-vector products (a backend or registry name).

    A directional tangent (jvp) carries one sensitivity column; a gradient
    carries all n + m columns (cost grows with n + m: best for small problems).
    """

    jvp: ad.AbstractBackend

    def __init__(self, jvp="jax-forward"):
        self.jvp = ad.get(jvp)

    def _solve(self, setup: Setup, u0, p, s0, dps):
        """u and sensitivity columns S (k, n) with S(t0) = s0, each column's p-direction in dps (k, m)."""
        prods = Products(setup.f, self.jvp)

        def rhs(t, y, p):
            u, s = y
            du = setup.f(u, p, t)
            ds = prods.columns(lambda c: prods.jvp(u, p, t, c[0], c[1])[1], (s, dps))
            return du, ds

        sol = setup.diffeqsolve(dfx.ODETerm(rhs), (u0, s0), p, setup.t0, setup.t1,
                                ts=jnp.asarray(setup.ts, u0.dtype))
        return sol

    def forward(self, setup: Setup, u0, p):
        sol = setup.forward(u0, p)
        return sol.ys, stats_vector(sol, u0.dtype), (u0, p)

    def pushforward(self, setup: Setup, residuals, du0, dp):
        u0, p = residuals
        sol = self._solve(setup, u0, p, du0[None], dp[None])
        return sol.ys[1][:, 0]

    def pullback(self, setup: Setup, residuals, w):
        u0, p = residuals
        n, m = u0.shape[0], p.shape[0]
        eye = jnp.eye(n + m, dtype=u0.dtype)
        sol = self._solve(setup, u0, p, eye[:, :n], eye[:, n:])
        grads = jnp.einsum("tn,tkn->k", w, sol.ys[1])  # S: (T, n+m columns, n)
        return grads[:n], grads[n:]
