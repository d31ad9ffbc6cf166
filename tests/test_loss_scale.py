"""A gradient's accuracy does not depend on the loss's scale (DESIGN: no silent wrong number).

The adjoint systems are linear in the cotangent, so a loss × s must give s × the gradient, to
rounding, for every sensealg at the user's tolerances (rtol = atol = 1e-6): a loss of 1e-8 (a mean
over many points, small units) once gave InterpolatingAdjoint 120× the gradient, because λ's error
was held to the user's atol. Each case is one compiled program batched over the scales (1e-8, 1, 1e8);
the gradient at scale 1 is checked against a tight-tolerance reference.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from helpers import SENSEALGS, central_differences

SCALES = jnp.asarray([1e-8, 1.0, 1e8])
P = np.array([0.7, 0.4])


def rate(u, p, t):
    """u' = -k u + p sin(3t) u² (the reviewer's problem), k = p[0], p = p[1]."""
    return -p[0] * u + p[1] * jnp.sin(3 * t) * u**2


PROB = sciad.ODEProblem(rate, np.array([1.0, 0.5]), (0.0, 5.0), P)
TS = np.linspace(0.0, 5.0, 11)


def saves(p, sensealg, **tolerances):
    return jnp.sum(sciad.solve(PROB, p=p, saveat=TS, sensealg=sensealg, **tolerances).us ** 2)


def integral(p, sensealg, **tolerances):
    sol = sciad.solve(PROB, p=p, integrand=lambda u, p, t: u[0] ** 2 + p[1] * u[1], sensealg=sensealg, **tolerances)
    return sol.integral


def events(p, sensealg, **tolerances):
    """A dose at t = 1 and a reset where u[0] falls through 0.3 (state-dependent: its time moves with p)."""
    callbacks = [
        sciad.PresetTimeCallback(jnp.asarray([1.0]), lambda u, p, t: u + p[1]),
        sciad.ContinuousCallback(lambda u, p, t: u[0] - 0.3, lambda u, p, t: u.at[0].add(0.5), "down"),
    ]
    sol = sciad.solve(PROB, p=p, saveat=TS, callbacks=callbacks, max_events=4, sensealg=sensealg, **tolerances)
    return jnp.sum(sol.us[:, 0] ** 2) + jnp.sum(sol.event_times[1][:2])


LOSSES = {"saves": saves, "integral": integral, "events": events}


@functools.cache
def reference_gradient(name):
    """A loss's gradient in p at rtol = atol = 1e-11 (computed once, where a test asks). The saves' through the
    steps by forward mode (ForwardDiffSensitivity: within about 1e-8 of the exact gradient, as
    test_adjoint_tolerances_tighten_the_backward_solve needs); the others' by central differences of the solve
    (relative steps of 1e-4: within about 1e-7, each checked to 1e-4 by one test; only the solve to compile,
    about a quarter of forward mode's compile with the events)."""
    loss = LOSSES[name]
    if name == "saves":
        return jax.jit(jax.grad(lambda p: loss(p, sciad.ForwardDiffSensitivity(), rtol=1e-11, atol=1e-11)))(P)
    return central_differences(jax.jit(lambda p: loss(p, None, rtol=1e-11, atol=1e-11)), P, rel_step=1e-4)


def scaled_gradients(loss, sensealg, **tolerances):
    """The gradients of s × loss divided by s, for each s of SCALES (3, m)."""
    grad = jax.grad(lambda p, s: s * loss(p, sensealg, **tolerances))
    return jax.jit(jax.vmap(grad, in_axes=(None, 0)))(P, SCALES) / SCALES[:, None]


CASES = [(loss, name) for loss in LOSSES for name in SENSEALGS]
FAST = [("saves", name) for name in ("GaussAdjoint", "InterpolatingAdjoint", "BacksolveAdjoint")] + [
    ("integral", "InterpolatingAdjoint-checkpointing"),
    ("events", "GaussAdjoint"),
]


@pytest.mark.parametrize(
    "loss, name", [pytest.param(*case, marks=[] if case in FAST else [pytest.mark.slow]) for case in CASES]
)
def test_gradient_does_not_depend_on_the_loss_scale(loss, name):
    gradients = scaled_gradients(LOSSES[loss], SENSEALGS[name]())
    unit = gradients[1]
    np.testing.assert_allclose(
        gradients,
        np.broadcast_to(unit, gradients.shape),
        rtol=1e-9,
        err_msg=f"{name} on {loss}: the gradient changes with the loss's scale",
    )
    reference = reference_gradient(loss)
    assert np.max(np.abs(unit - reference)) <= 1e-4 * np.max(np.abs(reference)), (name, loss, unit, reference)


def test_adjoint_tolerances_tighten_the_backward_solve():
    """adjoint_rtol / adjoint_atol set the backward solve's tolerances alone: tighter ones bring the
    continuous adjoint's gradient closer to the reference while the forward solve stays as it was."""
    loose = scaled_gradients(saves, sciad.GaussAdjoint(), rtol=1e-8, atol=1e-8, adjoint_rtol=1e-3, adjoint_atol=1e-3)
    tight = scaled_gradients(saves, sciad.GaussAdjoint(), rtol=1e-8, atol=1e-8, adjoint_rtol=1e-9, adjoint_atol=1e-9)
    reference = reference_gradient("saves")
    error = lambda g: np.max(np.abs(g - reference)) / np.max(np.abs(reference))  # noqa: E731
    assert error(tight[1]) < 1e-6 < error(loose[1])
    np.testing.assert_allclose(tight, np.broadcast_to(tight[1], tight.shape), rtol=1e-9)


def test_adjoint_tolerances_are_checked():
    with pytest.raises(ValueError, match="adjoint_atol must be a positive number"):
        sciad.solve(PROB, adjoint_atol=0.0)
