"""Events on DAEs (a mass matrix): after an event's affect the algebraic states are re-initialised at the
event time in the solve's `initialization` mode, differentiably; conditions on algebraic states.

A linear index-1 DAE with a preset dose on its differential state and a reset where its algebraic
state crosses a level has a closed form; its derivatives in (x0, a, b, dose, dose time), the event
times' included, are the reference for every sensealg (jit, vmap). Central differences of the solve
(float64, rtol = atol = 1e-10) where the algebraic equation depends on t; the "check" and "none" modes;
a full singular M; a Hessian; Robertson with the conservation law as its algebraic equation against its
ODE form.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from helpers.dae import R_INV, ROBERTSON_P, Q, R, robertson, robertson_dae
from helpers.differences import gradient_and_central_differences, relative_steps

TOL = dict(rtol=1e-10, atol=1e-10)
AGREEMENT = 1e-7
slow = pytest.mark.slow


# --- x' = -a x + z, 0 = z - b x: x = x0 e^{ct}, c = b - a; dose x += d at td; x halves where z falls to L --

LEVEL = 0.5
TS = np.array([0.3, 1.0, 2.0])
X = np.array([1.5, 2.0, 0.5, 0.7, 0.5])  # x0, a, b, d, td
WEIGHTS = jnp.array([[0.3, 1.0], [0.7, 2.0], [-0.4, 3.0]])


def linear(u, p, t):
    a, b = p[0], p[1]
    return jnp.stack([-a * u[0] + u[1], u[1] - b * u[0]])


def closed(x):
    """(x, z) at TS and the two resets' times: the first reset before 0.3, the dose at td = 0.5 lifting
    z above L again, the second reset just after it."""
    x0, a, b, d, td = x
    c = b - a
    tau1 = jnp.log(LEVEL / (b * x0)) / c
    after = LEVEL / (2 * b)  # x after a reset
    lifted = after * jnp.exp(c * (td - tau1)) + d
    tau2 = td + jnp.log(LEVEL / (b * lifted)) / c
    xs = after * jnp.exp(c * (jnp.asarray(TS) - jnp.array([tau1, tau2, tau2])))
    return jnp.stack([xs, b * xs], -1), jnp.stack([tau1, tau2])


def callbacks(x, consistent=False):
    """The dose and the reset; `consistent`: their affects set z = b x themselves (else z is left as it was)."""

    def keeping(affect):
        return lambda u, p, t: jnp.stack([affect(u, p)[0], p[1] * affect(u, p)[0]]) if consistent else affect(u, p)

    return [
        sciad.PresetTimeCallback(x[4:5], keeping(lambda u, p: u.at[0].add(p[2]))),
        sciad.ContinuousCallback(lambda u, p, t: u[1] - LEVEL, keeping(lambda u, p: u.at[0].multiply(0.5)), "down"),
    ]


PROBLEM = sciad.ODEProblem(linear, np.array([1.5, 0.0]), (0.0, 2.0), X[1:4], mass_matrix=np.array([1.0, 0.0]))


def solved(x, sensealg=None, **kw):
    sol = sciad.solve(
        PROBLEM, u0=jnp.stack([x[0], 0.0]), p=x[1:4], saveat=TS, callbacks=callbacks(x), sensealg=sensealg, **TOL, **kw
    )
    return sol.us, sol.event_times[1][:2]


def loss(outputs):
    us, times = outputs
    return jnp.sum(WEIGHTS * us) + times[0] + 2 * times[1]


def test_closed_form():
    """Saved states (z re-initialised after each affect: z = b x), the reset times, the counts."""
    # each one compiled program (eagerly, the solve with callbacks and the closed form compile one per operation)
    us, times = jax.jit(closed)(X)
    sol = jax.jit(lambda: sciad.solve(PROBLEM, saveat=TS, callbacks=callbacks(X), **TOL))()
    np.testing.assert_allclose(sol.us, us, rtol=1e-8)
    np.testing.assert_allclose(sol.event_times[1][:2], times, rtol=1e-9)
    np.testing.assert_array_equal(sol.event_counts, [1, 2])


@pytest.mark.parametrize(
    "sensealg",
    [
        pytest.param(sciad.DiscreteAdjoint(), marks=slow),
        pytest.param(sciad.GaussAdjoint(), marks=slow),
        pytest.param(sciad.ForwardDiffSensitivity(), marks=slow),
        pytest.param(sciad.ForwardSensitivity(), marks=slow),
        pytest.param(sciad.InterpolatingAdjoint(), marks=slow),
    ],
    ids=sciad.adjoints.describe,
)
def test_gradient_through_events(sensealg):
    """∂L/∂(x0, a, b, d, td) under jit, L on the saved states and the reset times, against the closed
    form's: through the affects, the re-initialisations, the preset time and the located times."""
    grad = jax.jit(jax.grad(lambda x: loss(solved(x, sensealg))))(X)
    np.testing.assert_allclose(grad, jax.grad(lambda x: loss(closed(x)))(X), rtol=AGREEMENT)


@slow
def test_vmap_over_doses():
    """A batch of dose sizes: values and gradients under jit(vmap(value_and_grad))."""
    xs = np.stack([X, X + np.array([0.0, 0.0, 0.0, 0.1, 0.05]), X + np.array([0.0, 0.1, 0.0, 0.2, 0.1])])
    values, grads = jax.jit(jax.vmap(jax.value_and_grad(lambda x: loss(solved(x, sciad.DiscreteAdjoint())))))(xs)
    for x, value, grad in zip(xs, values, grads):
        np.testing.assert_allclose(value, loss(closed(x)), rtol=1e-8)
        np.testing.assert_allclose(grad, jax.grad(lambda x: loss(closed(x)))(x), rtol=AGREEMENT)


@slow
def test_hessian_through_a_dose():
    """Forward over reverse (ForwardDiffSensitivity) in (a, b, d) through a dose and its re-initialisation,
    against the closed form's Hessian (dose time concrete: second derivatives in a traced preset time
    stop at diffrax's `nextafter`, for ODEs as well)."""

    def value(y, closed_form=False):
        a, b, d = y[0], y[1], y[2]
        if closed_form:
            xs = (X[0] * jnp.exp((b - a) * 0.5) + d) * jnp.exp((b - a) * (jnp.asarray(TS[1:]) - 0.5))
            return jnp.sum(xs * (1 + b))
        sol = sciad.solve(
            PROBLEM, p=y, saveat=TS[1:], callbacks=callbacks(X)[:1], sensealg=sciad.ForwardDiffSensitivity(), **TOL
        )
        return jnp.sum(sol.us)

    y = X[1:4]
    np.testing.assert_allclose(
        jax.jit(jax.hessian(value))(y), jax.hessian(lambda y: value(y, True))(y), rtol=1e-7, atol=1e-10
    )


@slow
@pytest.mark.parametrize(
    "sensealg", [sciad.DiscreteAdjoint(), pytest.param(sciad.GaussAdjoint(), marks=slow)], ids=sciad.adjoints.describe
)
def test_full_mass_matrix(sensealg):
    """The same DAE in u = R w, its equations mixed by Q (a full singular M): the dose and the reset act
    on w, the reset's condition on w's algebraic state; states, times and the gradient as the closed form's."""
    prob = sciad.ODEProblem(
        lambda u, p, t: jnp.asarray(Q) @ linear(jnp.asarray(R_INV) @ u, p, t),
        np.zeros(2),
        (0.0, 2.0),
        X[1:4],
        mass_matrix=Q @ np.diag([1.0, 0.0]) @ R_INV,
    )

    def w(u):
        return jnp.asarray(R_INV) @ u

    def outputs(x):
        events = [
            sciad.PresetTimeCallback(x[4:5], lambda u, p, t: u + jnp.asarray(R) @ jnp.stack([p[2], 0.0])),
            sciad.ContinuousCallback(
                lambda u, p, t: w(u)[1] - LEVEL, lambda u, p, t: jnp.asarray(R) @ (w(u) * jnp.array([0.5, 1.0])), "down"
            ),
        ]
        sol = sciad.solve(
            prob,
            u0=jnp.asarray(R) @ jnp.stack([x[0], 0.0]),
            p=x[1:4],
            saveat=TS,
            callbacks=events,
            sensealg=sensealg,
            **TOL,
        )
        return jax.vmap(w)(sol.us), sol.event_times[1][:2]

    value, grad = jax.jit(jax.value_and_grad(lambda x: loss(outputs(x))))(X)
    np.testing.assert_allclose(value, loss(closed(X)), rtol=1e-9)
    np.testing.assert_allclose(grad, jax.grad(lambda x: loss(closed(x)))(X), rtol=AGREEMENT)


# --- the algebraic equation depends on t: 0 = z - b x - sin t -------------------------------------------


def forced(u, p, t):
    return linear(u, p, t).at[1].add(-jnp.sin(t))


@pytest.mark.parametrize(
    "sensealg",
    [sciad.ForwardDiffSensitivity(), pytest.param(sciad.GaussAdjoint(), marks=slow)],
    ids=sciad.adjoints.describe,
)
def test_time_dependent_constraint_against_central_differences(sensealg):
    """∂/∂(x0, a, b, d, td): z after the dose is b x + sin td, moving with td (∂h/∂t in the
    re-initialisation and in the consistent u' at td)."""
    prob = sciad.ODEProblem(forced, np.array([1.5, 0.0]), (0.0, 2.0), X[1:4], mass_matrix=np.array([1.0, 0.0]))

    def value(x, sensealg=None):
        sol = sciad.solve(
            prob, u0=jnp.stack([x[0], 0.0]), p=x[1:4], saveat=TS, callbacks=callbacks(x)[:1], sensealg=sensealg, **TOL
        )
        return jnp.sum(WEIGHTS * sol.us)

    # the gradient and the differences' values from one program
    _, grad, differences = gradient_and_central_differences(lambda x: value(x, sensealg), X, relative_steps(X))
    np.testing.assert_allclose(grad, differences, rtol=1e-6)


# --- initialization="check" and "none" after an affect ---------------------------------------------------


def test_check_and_none_after_an_affect():
    """ "check": an affect that leaves z inconsistent raises; one that keeps it consistent (z = b x) passes,
    and "none" takes its state as it is: both give the "consistent" solve."""
    u0 = jnp.array([1.5, 0.75])  # consistent

    @functools.partial(jax.jit, static_argnums=(0, 1))
    def run(initialization, consistent):  # compiled whole (eagerly, one small program per operation)
        return sciad.solve(
            PROBLEM, u0=u0, saveat=TS, callbacks=callbacks(X, consistent), initialization=initialization, **TOL
        ).us

    with pytest.raises(jax.errors.JaxRuntimeError) as raised:  # a SolveError, carried by JAX's under jit
        run("check", False)
    message = sciad.errors.summary(raised.value)
    assert message.startswith("SolveError: initialization='check': the state an event's affect returned is not")
    expected = closed(X)[0]
    for initialization in ("check", "none"):
        np.testing.assert_allclose(run(initialization, True), expected, rtol=1e-8)


# --- Robertson: the conservation law as the algebraic equation, against the ODE form ---------------------


def robertson_outputs(dae: bool, sensealg):
    """x = (log k, td, d) -> saved states at 1, 5, 10 and the time y3 reaches 0.1: a dose moves d from y3
    to y1 at td, and y3 rising through 0.1 moves 0.05 back (in the DAE the affect adds to y1 only, y3
    follows by re-initialisation)."""
    f, mass, back = (robertson_dae, np.array([1.0, 1.0, 0.0]), 0.0) if dae else (robertson, None, 1.0)
    prob = sciad.ODEProblem(f, np.array([1.0, 0.0, 0.0]), (0.0, 10.0), ROBERTSON_P, mass_matrix=mass)

    def outputs(x):
        d = x[4]
        events = [
            sciad.PresetTimeCallback(x[3:4], lambda u, p, t: u.at[0].add(d).at[2].add(-back * d)),
            sciad.ContinuousCallback(
                lambda u, p, t: u[2] - 0.1, lambda u, p, t: u.at[0].add(0.05).at[2].add(-back * 0.05), "up"
            ),
        ]
        sol = sciad.solve(
            prob,
            p=jnp.exp(x[:3]),
            saveat=jnp.array([1.0, 5.0, 10.0]),
            callbacks=events,
            solver="rodas5p",
            sensealg=sensealg,
            rtol=1e-10,
            atol=1e-12,
            max_steps=20_000,
        )
        return jnp.sum(sol.us * jnp.array([1.0, 1e4, 1.0])) + sol.event_times[1][0] / 10

    return outputs


@slow
@pytest.mark.parametrize(
    "sensealg", [sciad.DiscreteAdjoint(), pytest.param(sciad.GaussAdjoint(), marks=slow)], ids=sciad.adjoints.describe
)
def test_robertson_against_the_ode_form(sensealg):
    """The DAE's loss and its gradient in (log k, td, d) against the ODE form's (DiscreteAdjoint)."""
    x = np.concatenate([np.log(ROBERTSON_P), [3.0, 0.05]])
    value, grad = jax.jit(jax.value_and_grad(robertson_outputs(True, sensealg)))(x)
    expected, expected_grad = jax.jit(jax.value_and_grad(robertson_outputs(False, sciad.DiscreteAdjoint())))(x)
    np.testing.assert_allclose(value, expected, rtol=1e-8)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-6, atol=1e-8 * np.max(np.abs(expected_grad)))
