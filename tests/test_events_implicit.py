"""State-dependent events with implicit solvers, against closed forms.

A decay u' = -k u reset by b where u falls through a level a: the event time τ = ln(u0 / a) / k and
u(T) = (a + b) e^{-k (T - τ)} for T past τ (once). The event is located on the implicit solver's own
steps, with its root finder prepared as `diffrax.diffeqsolve` prepares it (a second step loop that
skipped that once crashed every implicit solver here), and differentiated by every sensealg through
the dense, sparse and matrix-free Newton.
"""

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from helpers import SENSEALGS

LEVEL, T = 0.4, 2.0
P = np.array([0.8, 0.5])  # k, b


def decay(u, p, t):
    return -p[0] * u


PROB = sciad.ODEProblem(decay, np.array([1.0]), (0.0, T), P)
RESET = sciad.ContinuousCallback(lambda u, p, t: u[0] - LEVEL, lambda u, p, t: u + p[1], "down")


def closed_form(p, u0=1.0):
    """(u(T), τ) in closed form."""
    k, b = p
    tau = jnp.log(u0 / LEVEL) / k
    return (LEVEL + b) * jnp.exp(-k * (T - tau)), tau


def loss_closed(p):
    u, tau = closed_form(p)
    return u + tau


def loss(p, sensealg, solver, jacobian, tol):
    sol = sciad.solve(
        PROB,
        p=p,
        callbacks=[RESET],
        max_events=2,
        solver=solver,
        jacobian=jacobian,
        sensealg=sensealg,
        rtol=tol,
        atol=tol,
    )
    return sol.us[-1, 0] + sol.event_times[0][0]


SOLVERS = {
    "Kvaerno3": dfx.Kvaerno3,
    "Kvaerno4": dfx.Kvaerno4,
    "Kvaerno5": dfx.Kvaerno5,
    "KenCarp3": dfx.KenCarp3,
    "KenCarp4": dfx.KenCarp4,
    "KenCarp5": dfx.KenCarp5,
    "ImplicitEuler": dfx.ImplicitEuler,
}
# (rtol = atol of the solve, of the check): ImplicitEuler is first order (0.1 % off at 1e-6, over 4,096 steps at 1e-9
# steps); diffrax's KenCarp solvers with their VeryChord root finder take ~1,000 steps at 1e-6 and over
# 100,000 at 1e-9 on a plain decay (with optimistix.Newton, 30).
TOLERANCES = {"ImplicitEuler": (1e-6, 3e-3), **{f"KenCarp{k}": (1e-6, 1e-4) for k in (3, 4, 5)}}
CASES = (
    [("Kvaerno5", "dense", name) for name in SENSEALGS]
    + [(solver, "dense", "GaussAdjoint") for solver in SOLVERS if solver != "Kvaerno5"]
    + [
        ("Kvaerno5", jacobian, name)
        for jacobian in ("sparse", "matrix-free")
        for name in ("GaussAdjoint", "DiscreteAdjoint", "ForwardSensitivity")
    ]
)
FAST = {
    ("Kvaerno5", "dense", "GaussAdjoint"),
    ("KenCarp4", "dense", "GaussAdjoint"),
    ("Kvaerno5", "sparse", "DiscreteAdjoint"),
}


@pytest.mark.parametrize(
    "solver, jacobian, name", [pytest.param(*case, marks=[] if case in FAST else [pytest.mark.slow]) for case in CASES]
)
def test_reset_at_a_level_against_the_closed_form(solver, jacobian, name):
    solve_tol, tolerance = TOLERANCES.get(solver, (1e-9, 1e-6))
    value, gradient = jax.jit(jax.value_and_grad(loss), static_argnums=(1, 2, 3, 4))(
        P, SENSEALGS[name](), SOLVERS[solver](), jacobian, solve_tol
    )
    np.testing.assert_allclose(value, loss_closed(P), rtol=tolerance)
    np.testing.assert_allclose(gradient, jax.grad(loss_closed)(P), rtol=tolerance)
