"""Repeated save times, as diffrax takes them (a series padded by repeating its last time): the values
repeat and the gradients add up, by every sensealg, for concrete and traced times, backwards in time,
with events, and for SDEs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from sciad.adjoints import ODE_SENSEALGS

P = jnp.array([1.0, 1.3])
PROB = sciad.ODEProblem(
    lambda u, p, t: jnp.stack([p[0] * u[1], -p[1] * u[0] - 0.1 * u[1]]), jnp.array([1.0, 0.5]), (0.0, 2.0), P
)
REPEATED = jnp.array([0.0, 0.0, 0.5, 0.5, 1.0, 2.0, 2.0])
INDEX = jnp.array([0, 0, 1, 1, 2, 3, 3])  # where each repeated time sits among the distinct ones
DISTINCT = jnp.array([0.0, 0.5, 1.0, 2.0])
W = jnp.arange(1.0, 15.0).reshape(7, 2) / 10  # the loss's weight on each saved value
TOL = 1e-6  # the solves' rtol = atol = 1e-8: the continuous adjoints against the discrete one


def loss(p, ts, w, sensealg, prob=PROB, **options):
    us = sciad.solve(prob, p=p, saveat=ts, sensealg=sensealg, rtol=1e-8, atol=1e-8, **options).us
    return jnp.sum(w * us), us


def summed(x, index=INDEX, size=len(DISTINCT)):
    return jax.ops.segment_sum(x, index, size)


def check(repeated, distinct, index=INDEX):
    """(loss, us), (∂p, ∂ts) at the repeated times against the same at the distinct ones (∂p alone: concrete
    times)."""
    ((value, us), dp), ((value_d, us_d), dp_d) = repeated, distinct
    (dp, dts), (dp_d, dts_d) = (dp, dp_d) if isinstance(dp, tuple) else ((dp, None), (dp_d, None))
    first = np.unique(index, return_index=True)[1][index]  # each time's first occurrence
    np.testing.assert_array_equal(us, us[first])  # the values repeat exactly
    np.testing.assert_allclose(us, us_d[index], rtol=TOL, atol=TOL)
    np.testing.assert_allclose(value, value_d, rtol=TOL)
    np.testing.assert_allclose(dp, dp_d, rtol=TOL, atol=TOL)
    if dts is not None:
        np.testing.assert_allclose(summed(dts, index, len(dts_d)), dts_d, rtol=TOL, atol=TOL)


GRAD = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True), static_argnums=3)


def cases(names, default):
    """`names` as parameters, those not in `default` left to the slow run (each compiles a gradient)."""
    return [pytest.param(name, marks=[] if name in default else [pytest.mark.slow]) for name in names]


@pytest.fixture(scope="module")
def reference():
    return GRAD(P, DISTINCT, summed(W), sciad.DiscreteAdjoint())


@pytest.mark.parametrize("name", cases(ODE_SENSEALGS, {"DiscreteAdjoint", "GaussAdjoint"}))
def test_traced_repeated_times_under_jit(name, reference):
    """Every sensealg, the times traced under `jax.jit` (repeats at t0 and t1 too): the values repeat and
    the gradients in p and in the times are those at the distinct times with the cotangents summed."""
    check(GRAD(P, REPEATED, W, ODE_SENSEALGS[name]()), reference)


BACKWARD = sciad.ODEProblem(PROB.f, PROB.u0, (2.0, 0.0), P)
EVENTS = [
    sciad.PresetTimeCallback(jnp.array([0.7]), lambda u, p, t: 0.9 * u),
    sciad.ContinuousCallback(lambda u, p, t: u[0] - 0.3, lambda u, p, t: u + 0.1, direction="down"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ODE_SENSEALGS))
def test_concrete_repeated_times_backwards(name):
    """Concrete times in a backward solve (non-increasing times)."""
    sensealg = ODE_SENSEALGS[name]()
    grad = jax.value_and_grad(loss, has_aux=True)
    index, w = jnp.array([0, 0, 1, 2, 2]), W[:5]
    check(
        grad(P, np.array([2.0, 2.0, 1.0, 0.0, 0.0]), w, sensealg, BACKWARD),
        grad(P, np.array([2.0, 1.0, 0.0]), summed(w, index, 3), sensealg, BACKWARD),
        index,
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ODE_SENSEALGS))
def test_concrete_repeated_times_with_events(name):
    """Concrete times in a solve with a dose and a state-dependent event."""
    sensealg = ODE_SENSEALGS[name]()
    grad = jax.value_and_grad(loss, has_aux=True)
    index, w = jnp.array([0, 1, 1, 2, 2, 3]), W[:6]
    check(
        grad(P, np.array([0.0, 0.5, 0.5, 1.0, 1.0, 2.0]), w, sensealg, callbacks=EVENTS),
        grad(P, np.array([0.0, 0.5, 1.0, 2.0]), summed(w, index, 4), sensealg, callbacks=EVENTS),
        index,
    )


def test_decreasing_times_are_still_refused():
    with pytest.raises(ValueError, match=r"saveat must be non-decreasing.*saveat\[2\] = 1.0 before saveat\[3\] = 0.5"):
        sciad.solve(PROB, saveat=[0.0, 0.5, 1.0, 0.5])
    with pytest.raises(ValueError, match="saveat must be non-increasing"):
        sciad.solve(BACKWARD, saveat=[2.0, 1.0, 1.0, 1.5])
    solve = jax.jit(lambda ts: sciad.solve(PROB, saveat=ts).us)
    with pytest.raises(Exception, match=r"saveat must be finite times inside tspan, non-decreasing"):
        jax.block_until_ready(solve(jnp.array([0.0, 1.0, 1.0, 0.5])))


SDE = sciad.SDEProblem(
    lambda u, p, t: p[0] * u, lambda u, p, t: p[1] * u, np.array([1.0, 2.0]), (0.0, 1.0), np.array([0.3, 0.2])
)
SDE_CASES = [
    ("DiscreteAdjoint", "euler"),
    pytest.param("GaussAdjoint", "heun", marks=pytest.mark.slow),
    pytest.param("ReversibleAdjoint", "reversible_heun", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name,solver", SDE_CASES)
def test_sde_repeated_times(name, solver):
    """An SDE's path saved at repeated grid times: the values repeat and are the path's at the distinct times
    (the same grid and path); the gradients add up: the cotangents split over the repeats give the gradient of
    the same cotangents summed onto each time's first occurrence (one compiled gradient, called with both)."""

    def sde_us(p, ts):
        return sciad.solve(SDE, p=p, key=jax.random.key(0), dt0=1 / 16, saveat=ts, solver=solver, sensealg=name).us

    def sde_loss(p, w):
        us = sde_us(p, np.array([0.0, 0.25, 0.25, 1.0, 1.0]))  # the times constants of the program
        return jnp.sum(w * us), us

    index = np.array([0, 1, 1, 2, 2])
    w = np.asarray(W[:5])  # NumPy: no eager JAX operation (each compiles a program of its own)
    first = np.unique(index, return_index=True)[1]
    w_first = np.zeros_like(w)
    np.add.at(w_first, first[index], w)  # the cotangents summed onto each time's first occurrence
    grad = jax.jit(jax.value_and_grad(sde_loss, has_aux=True))
    (value, us), dp = grad(SDE.p, w)
    (value_first, _), dp_first = grad(SDE.p, w_first)
    us_d = jax.jit(lambda p: sde_us(p, np.array([0.0, 0.25, 1.0])))(SDE.p)  # the solution alone
    np.testing.assert_array_equal(us, us_d[index])  # the same grid and path
    np.testing.assert_allclose(value, np.sum(w * np.asarray(us_d)[index]), rtol=1e-12)
    np.testing.assert_allclose(value_first, value, rtol=1e-12)
    np.testing.assert_allclose(dp, dp_first, rtol=1e-10)
