"""Events: doses, impacts, resets and stopping conditions, differentiated by every sensealg.

Closed forms (a bouncing ball, repeated dosing of a one-compartment model, a projectile's landing,
an integrate-and-fire neuron) at rtol = atol = 1e-10, their derivatives by central differences of the
closed forms; each diffrax defect the issue names is a case (event-time gradients of zero: 451, state
gradients after an event: 729, two events in one step: 639, resets: 277). Under jit, vmap (members
with different numbers of events), jvp and Hessians; PyTrees and closures; Kvaerno5; "auto".
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from helpers import SENSEALGS, assert_agrees, central_differences, slow_except, values_and_jacobian

TOL = 1e-10
AGREEMENT = 1e-6
G = 9.81


# --- a bouncing ball: h' = v, v' = -g, v -> -e v where h crosses zero downwards -------------------------


def fall(u, p, t):
    return jnp.stack([u[1], -G + 0.0 * p["e"]])


BALL = sciad.ODEProblem(fall, np.array([1.0, 0.0]), (0.0, 2.0), {"e": np.array(0.9)})
BOUNCE = sciad.ContinuousCallback(lambda u, p, t: u[0], lambda u, p, t: jnp.stack([u[0], -p["e"] * u[1]]), "down")


def ball_closed(h0, e, t):
    """(impact times, (h, v) at t) of a ball dropped from rest at h0."""
    times, v = [np.sqrt(2 * h0 / G)], e * np.sqrt(2 * h0 * G)
    while times[-1] + 2 * v / G <= t:
        times.append(times[-1] + 2 * v / G)
        v *= e
    s = t - times[-1]
    return np.array(times), np.array([v * s - G * s**2 / 2, v - G * s])


def ball(h0, e, sensealg="InterpolatingAdjoint", max_events=6):
    return sciad.solve(
        BALL,
        u0=jnp.stack([h0, 0.0 * h0]),
        p={"e": e},
        callbacks=[BOUNCE],
        rtol=TOL,
        atol=TOL,
        sensealg=sensealg,
        max_events=max_events,
    )


@pytest.mark.parametrize("name", slow_except(list(SENSEALGS), fast=["InterpolatingAdjoint"]))
def test_bouncing_ball(name):
    """Height and velocity after three bounces and the bounce times, with their Jacobians in h0 and e."""
    sensealg = SENSEALGS[name]()

    def outputs(x):
        sol = ball(x[0], x[1], sensealg)
        return jnp.concatenate([sol.us[-1], sol.event_times[0][:3]]), (sol.event_counts[0], sol.event_times[0])

    def closed(x):
        times, state = ball_closed(*x, 2.0)
        return np.concatenate([state, times[:3]])

    x = np.array([1.0, 0.9])
    (values, (count, times)), jacobian = values_and_jacobian(outputs, x, has_aux=True)
    assert int(count) == 3 and np.all(np.isinf(times[3:]))
    assert_agrees(values, closed(x), f"{name}: values", AGREEMENT)
    assert_agrees(jacobian, central_differences(closed, x).T, f"{name}: Jacobian", AGREEMENT)


# --- repeated dosing: u' = -k u, u += D at each dose time ----------------------------------------------


def elimination(u, p, t):
    return -p["k"] * u


PK = sciad.ODEProblem(elimination, np.array([0.0]), (0.0, 10.0), {"k": np.array(0.3)})
SAVES = np.array([1.0, 3.0, 6.0, 10.0])


def pk_closed(k, dose, times, ts=SAVES):
    """Concentrations at `ts` and the area under the curve on [0, 10]."""
    at = np.array([sum(dose * np.exp(-k * (t - td)) for td in times if td <= t) for t in ts])
    return at, sum(dose / k * (1 - np.exp(-k * (10.0 - td))) for td in times)


def dosed(k, dose, times, sensealg="InterpolatingAdjoint", solver="tsit5", **options):
    cb = sciad.PresetTimeCallback(times, lambda u, p, t: u + dose)
    return sciad.solve(
        PK,
        p={"k": k},
        saveat=SAVES,
        callbacks=[cb],
        rtol=TOL,
        atol=TOL,
        sensealg=sensealg,
        solver=solver,
        integrand=lambda u, p, t: u[0],
        **options,
    )


@pytest.mark.parametrize("name", slow_except(list(SENSEALGS), fast=["BacksolveAdjoint"]))
def test_repeated_dosing(name):
    """Concentrations and AUC, their gradients in k, the dose and the (traced) dose times."""
    sensealg = SENSEALGS[name]()

    def outputs(x):
        sol = dosed(x[0], x[1], x[2:], sensealg)
        return jnp.concatenate([sol.us[:, 0], sol.integral[None]])

    def closed(x):
        at, auc = pk_closed(x[0], x[1], x[2:])
        return np.concatenate([at, [auc]])

    x = np.array([0.3, 1.0, 0.0, 2.0, 4.5])
    values, jacobian = values_and_jacobian(outputs, x)
    assert_agrees(values, closed(x), f"{name}: values", AGREEMENT)
    assert_agrees(jacobian, central_differences(closed, x).T, f"{name}: Jacobian", AGREEMENT)


@pytest.mark.parametrize("name", slow_except(list(SENSEALGS), fast=[]))
def test_kvaerno5_with_events(name):
    """Doses with an implicit solver: the gradient in k."""
    sensealg = SENSEALGS[name]()
    times = np.array([0.0, 2.0, 4.5])
    g = jax.jit(jax.grad(lambda k: dosed(k, 1.0, times, sensealg, solver="kvaerno5").integral))(0.3)
    expected = central_differences(lambda k: pk_closed(k, 1.0, times)[1], np.array(0.3))
    assert_agrees(g, expected, f"{name}, Kvaerno5", AGREEMENT)


@pytest.mark.slow
def test_hessian_through_doses_and_auto():
    """Forward over reverse through the doses (k and the dose); "auto" picks a sensealg that agrees (k and a
    dose time)."""
    times = np.array([0.0, 2.0, 4.5])

    def auc(x):
        return dosed(x[0], x[1], times).integral

    closed = lambda x: pk_closed(x[0], x[1], times)[1]  # noqa: E731
    x = np.array([0.3, 1.0])
    hessian = central_differences(lambda y: central_differences(closed, y, rel_step=1e-4), x, rel_step=1e-4)
    assert_agrees(jax.jit(jax.hessian(auc))(x), hessian, "Hessian", 1e-5)
    auto = jax.jit(jax.grad(lambda x: dosed(x[0], 1.0, jnp.stack([0.0, x[1], 4.5]), "auto").integral))
    assert_agrees(
        auto(np.array([0.3, 2.0])),
        central_differences(lambda x: pk_closed(x[0], 1.0, [0.0, x[1], 4.5])[1], np.array([0.3, 2.0])),
        "auto",
        AGREEMENT,
    )


# --- a projectile stops where it lands ------------------------------------------------------------------


def flight(u, p, t):
    return jnp.stack([u[2], u[3], -p["c"] * u[2], -G - p["c"] * u[3]])


SHOT = sciad.ODEProblem(flight, np.array([0.0, 0.0, 3.0, 4.0]), (0.0, 10.0), {"c": np.array(0.0)})
LANDS = sciad.ContinuousCallback(lambda u, p, t: u[1], None, "down")


def landing(v, sensealg="InterpolatingAdjoint"):
    sol = sciad.solve(
        SHOT,
        u0=jnp.concatenate([jnp.zeros(2), v]),
        saveat=np.array([0.0, 0.5, 5.0, 10.0]),
        callbacks=[LANDS],
        rtol=TOL,
        atol=TOL,
        sensealg=sensealg,
    )
    return sol, jnp.stack([sol.t_final, sol.us[-1, 0]])


@pytest.mark.parametrize("name", slow_except(list(SENSEALGS), fast=["ForwardSensitivity-seminorm"]))
def test_projectile_landing_time_and_distance(name):
    """Landing time 2 v_y / g and distance 2 v_x v_y / g, and their gradients in the launch velocity: the
    event time's gradient is not zero (diffrax 451) and the state after it is right (729). Save times
    after the landing report t_final and the state there."""
    sensealg = SENSEALGS[name]()
    v = np.array([3.0, 4.0])
    (out, sol), jacobian = values_and_jacobian(lambda v: landing(v, sensealg)[::-1], v, has_aux=True)
    assert_agrees(out, np.array([2 * v[1] / G, 2 * v[0] * v[1] / G]), f"{name}: values", AGREEMENT)
    assert_agrees(sol.ts, np.array([0.0, 0.5, 2 * v[1] / G, 2 * v[1] / G]), "save times after the stop", 1e-12)
    np.testing.assert_array_equal(sol.us[2], sol.us[3])
    expected = np.array([[0.0, 2 / G], [2 * v[1] / G, 2 * v[0] / G]])
    assert_agrees(jacobian, expected, f"{name}: Jacobian", AGREEMENT)


@pytest.mark.slow
def test_vmap_jvp_and_hessian_with_events():
    """Members with different numbers of bounces under vmap; a jvp; the landing distance's Hessian is
    refused, by name (second derivatives through a state-dependent event time are not available yet)."""
    heights = jnp.array([1.0, 0.3])
    sols = jax.jit(jax.vmap(lambda h: ball(h, 0.9)))(heights)
    np.testing.assert_array_equal(sols.event_counts[:, 0], [len(ball_closed(h, 0.9, 2.0)[0]) for h in [1.0, 0.3]])
    assert sols.event_counts[0, 0] != sols.event_counts[1, 0]
    grads = jax.jit(jax.vmap(jax.grad(lambda h: ball(h, 0.9).us[-1, 0])))(heights)
    for h, g in zip(heights, grads):
        assert_agrees(
            g, central_differences(lambda h: ball_closed(h, 0.9, 2.0)[1][0], np.asarray(h)), "vmap", AGREEMENT
        )
    v = np.array([3.0, 4.0])
    tangent = jax.jit(lambda v: jax.jvp(lambda v: landing(v)[1], (v,), (np.array([1.0, -1.0]),))[1])(v)
    assert_agrees(tangent, np.array([-2 / G, (4.0 - 3.0) * 2 / G]), "jvp", AGREEMENT)
    with pytest.raises(Exception, match="second derivatives through the time of a state-dependent event"):
        jax.jit(jax.hessian(lambda v: landing(v)[1][1]))(v)


# --- resets, ordering, PyTrees and closures -------------------------------------------------------------


@pytest.mark.slow
def test_integrate_and_fire_resets():
    """V' = (I - V) / τ, V -> 0 where V crosses 1 upwards (a reset, diffrax 277): spikes every
    τ ln(I / (I - 1)), and the spike times' gradient in I."""
    tau = 0.5
    prob = sciad.ODEProblem(lambda u, p, t: (p["I"] - u) / tau, np.array([0.0]), (0.0, 3.0), {"I": np.array(1.5)})
    spike = sciad.ContinuousCallback(lambda u, p, t: u[0] - 1.0, lambda u, p, t: jnp.zeros_like(u), "up")

    def spikes(current):
        return sciad.solve(prob, p={"I": current}, callbacks=[spike], rtol=TOL, atol=TOL, max_events=8).event_times[0][
            :5
        ]

    period = lambda current: tau * np.log(current / (current - 1))  # noqa: E731
    assert_agrees(spikes(1.5), period(1.5) * np.arange(1, 6), "spike times", AGREEMENT)
    assert_agrees(jax.jit(jax.jacrev(spikes))(1.5), np.arange(1, 6) * tau * (1 / 1.5 - 1 / 0.5), "gradient", AGREEMENT)


def test_events_in_one_step_fire_in_time_order():
    """u' = 1 is solved exactly, so steps grow tenfold and one step passes both levels: the level listed
    second, crossed first, fires first (diffrax 639); simultaneous preset events fire in the order given."""
    prob = sciad.ODEProblem(lambda u, p, t: jnp.ones_like(u), np.array([0.0]), (0.0, 1.0))
    levels = [
        sciad.ContinuousCallback(lambda u, p, t, c=c: u[0] - c, lambda u, p, t, s=s: u + s)
        for c, s in ((0.6, 0.0), (0.3, 0.1))
    ]
    # each solve one compiled program (an eager solve with callbacks compiles a small program per operation)
    sol = jax.jit(lambda: sciad.solve(prob, callbacks=levels, rtol=TOL, atol=TOL))()
    np.testing.assert_allclose([sol.event_times[1][0], sol.event_times[0][0]], [0.3, 0.5], rtol=1e-10)
    both = [
        sciad.PresetTimeCallback([0.5], lambda u, p, t: 2 * u),
        sciad.PresetTimeCallback([0.5], lambda u, p, t: u + 1),
    ]
    np.testing.assert_allclose(jax.jit(lambda: sciad.solve(prob, callbacks=both).us)()[-1], [(0.5 * 2 + 1) + 0.5])


def test_pytree_state_and_closures():
    """A dict state; the affect closes over a traced restitution, the condition over a traced floor."""

    def loss(e, floor):
        prob = sciad.ODEProblem(
            lambda u, p, t: {"h": u["v"], "v": -G * jnp.ones_like(u["v"])},
            {"h": np.array(1.0), "v": np.array(0.0)},
            (0.0, 2.0),
        )
        bounce = sciad.ContinuousCallback(
            lambda u, p, t: u["h"] - floor, lambda u, p, t: {"h": u["h"], "v": -e * u["v"]}, "down"
        )
        sol = sciad.solve(prob, callbacks=[bounce], rtol=TOL, atol=TOL, sensealg="GaussAdjoint")
        return sol.us["h"][-1] - floor

    closed = lambda x: ball_closed(1.0 - x[1], x[0], 2.0)[1][0]  # noqa: E731  (height above the floor)
    x = np.array([0.9, 0.1])
    value, gradient = values_and_jacobian(loss, *x, argnums=(0, 1))
    assert_agrees(value, closed(x), "value", AGREEMENT)
    assert_agrees(np.stack(gradient), central_differences(closed, x), "gradient", AGREEMENT)


# --- the boundary ---------------------------------------------------------------------------------------


def test_too_many_events_say_so():
    """A ball that keeps bouncing (a Zeno point) with a small max_events."""
    with pytest.raises(Exception, match="more than max_events=2 events"):
        jax.block_until_ready(ball(1.0, 0.9, max_events=2).us)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: sciad.ContinuousCallback(lambda u, p, t: u[0] > 0), "float scalar"),
        (lambda: sciad.ContinuousCallback(lambda u, p, t: u[0], lambda u, p, t: u[0]), "u0's structure"),
        (lambda: sciad.ContinuousCallback(lambda u, p, t: u[0], direction="upwards"), "direction"),
        (lambda: sciad.PresetTimeCallback(1.0, None), "affect"),
        (lambda: sciad.PresetTimeCallback([[1.0]], lambda u, p, t: u), "1-D array"),
    ],
)
def test_bad_callbacks_are_named(make, match):
    with pytest.raises((TypeError, ValueError), match=match):
        sciad.solve(BALL, callbacks=[make()])


def test_dense_output_and_max_events_are_checked():
    with pytest.raises(ValueError, match="dense=True with callbacks"):
        sciad.solve(BALL, callbacks=[BOUNCE], dense=True)
    with pytest.raises(ValueError, match="max_events"):
        sciad.solve(BALL, callbacks=[BOUNCE], max_events=-1)
    with pytest.raises(TypeError, match="list of sciad.ContinuousCallback"):
        sciad.solve(BALL, callbacks=BOUNCE)
