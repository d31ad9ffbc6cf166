"""Differentiating through the solver's steps: discretise-then-optimise."""

import diffrax as dfx
import jax
import jax.numpy as jnp

from sciad.adjoints.base import AbstractSensitivity, Setup, checked, plain_forward, stats_vector


def _solution(setup: Setup, adjoint=None):
    """(u0, p) -> (us, (us, stats, result)): a solve shaped for jax.vjp / jax.jacfwd with has_aux."""

    def solve(u0, p):
        sol = setup.forward(u0, p, adjoint=adjoint)
        return sol.ys, (sol.ys, stats_vector(sol, u0.dtype), sol.result)

    return solve


class DiscreteAdjoint(AbstractSensitivity):
    """Reverse-mode AD through the solver's steps with diffrax's recursive
    checkpointing (`RecursiveCheckpointAdjoint`): the exact gradient of the
    discrete solution. The baseline every other sensealg is checked against.
    The forward pass records the reverse pass's residuals (no re-solve)."""

    def forward(self, setup: Setup, u0, p, active):
        if active is None:
            return plain_forward(setup, u0, p)
        _, pb, (us, stats, result) = jax.vjp(_solution(setup), u0, p, has_aux=True)
        return us, stats, (u0, p, pb, result)

    def pullback(self, setup: Setup, residuals, w):
        _, _, pb, result = residuals
        return checked(result, pb(w))


class ForwardDiffSensitivity(AbstractSensitivity):
    """Forward-mode AD through the solver (diffrax `ForwardMode`), dual numbers
    carried through every step, as SciMLSensitivity's ForwardDiffSensitivity.
    The forward pass carries one tangent per differentiated input (n for u0,
    m for p) and keeps the Jacobian d us / d(u0, p); jvps and gradients are
    then products with it. Best when n + m is small."""

    def forward(self, setup: Setup, u0, p, active):
        if active is None:
            return plain_forward(setup, u0, p)
        argnums = tuple(i for i, on in enumerate(active) if on)
        jacs, (us, stats, result) = jax.jacfwd(
            _solution(setup, dfx.ForwardMode()), argnums=argnums, has_aux=True)(u0, p)
        full = [None, None]
        for i, jac in zip(argnums, jacs):
            full[i] = checked(result, jac)
        return us, stats, (u0, p, tuple(full))

    def pullback(self, setup: Setup, residuals, w):
        return tuple(None if jac is None else jnp.tensordot(w, jac, axes=2) for jac in residuals[2])

    def pushforward(self, setup: Setup, residuals, du0, dp):
        return sum(jnp.tensordot(jac, v, axes=1) for jac, v in zip(residuals[2], (du0, dp)) if jac is not None)
