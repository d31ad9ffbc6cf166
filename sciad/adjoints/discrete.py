"""Differentiating through the solver's steps: discretise-then-optimise."""

import diffrax as dfx
import jax

from sciad.adjoints.base import AbstractSensitivity, Setup, checked, stats_vector


class DiscreteAdjoint(AbstractSensitivity):
    """Reverse-mode AD through the solver's steps with diffrax's recursive
    checkpointing (`RecursiveCheckpointAdjoint`): the exact gradient of the
    discrete solution. The baseline every other sensealg is checked against."""

    def forward(self, setup: Setup, u0, p):
        sol = setup.forward(u0, p)
        return sol.ys, stats_vector(sol, u0.dtype), (u0, p)

    def pullback(self, setup: Setup, residuals, w):
        u0, p = residuals
        _, pb, result = jax.vjp(lambda u0, p: _ys_result(setup.forward(u0, p)), u0, p, has_aux=True)
        return checked(result, pb(w))


class ForwardDiffSensitivity(AbstractSensitivity):
    """Forward-mode AD through the solver (diffrax `ForwardMode`), dual numbers
    carried through every step, as SciMLSensitivity's ForwardDiffSensitivity.
    Gradients come from the full Jacobian d us / d(u0, p): n + m tangents in
    one batched solve, best when n + m is small."""

    def forward(self, setup: Setup, u0, p):
        sol = setup.forward(u0, p)
        return sol.ys, stats_vector(sol, u0.dtype), (u0, p)

    def pullback(self, setup: Setup, residuals, w):
        u0, p = residuals
        (jac_u0, jac_p), result = jax.jacfwd(
            lambda u0, p: _ys_result(setup.forward(u0, p, adjoint=dfx.ForwardMode())), argnums=(0, 1), has_aux=True
        )(u0, p)
        return checked(result, (
            jax.numpy.tensordot(w, jac_u0, axes=2),
            jax.numpy.tensordot(w, jac_p, axes=2),
        ))


def _ys_result(sol: dfx.Solution):
    return sol.ys, sol.result
