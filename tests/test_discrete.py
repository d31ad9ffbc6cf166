"""DiscreteAdjoint's stored reverse pass (`sciad.adjoints._discrete._reverse_steps`) gives diffrax's
RecursiveCheckpointAdjoint gradient, the discrete solution's own, wherever its bookkeeping could slip:
several saves in one step, saves at t0 and t1, an integral, a batch whose members take different
numbers of steps, backwards time, an implicit solver, a solve that outgrows the stored steps, and
second derivatives."""

import collections
import functools
import re

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
import sciad.adjoints._base as adjoints_base
import sciad.adjoints._discrete as discrete
from sciad.problems._lotka_volterra import lotka_volterra_rhs as lotka_volterra

U0 = np.array([1.0, 1.0])
P0 = np.array([1.5, 1.0, 3.0, 1.0])
TOL = {"rtol": 1e-7, "atol": 1e-7}


def diffrax_saves(p, u0, ts, t0, t1, solver="tsit5", max_steps=4096, adjoint=dfx.RecursiveCheckpointAdjoint()):
    """u at ts by diffrax's own solve (sciad's step controller; t1 < t0: in s = -t, u' = -f, as sciad does)."""
    solver, sign = sciad.get_solver(solver), 1 if t1 > t0 else -1
    term = dfx.ODETerm(lambda s, y, p: sign * lotka_volterra(y, p, sign * s))
    sol = dfx.diffeqsolve(
        term,
        solver,
        sign * t0,
        sign * t1,
        None,
        u0,
        args=p,
        saveat=dfx.SaveAt(ts=sign * jnp.asarray(ts)),
        stepsize_controller=sciad.step_controller(solver, TOL["rtol"], TOL["atol"]),
        max_steps=max_steps,
        adjoint=adjoint,
    )
    return sol.ys


def sciad_saves(p, u0, ts, t0, t1, solver="tsit5", max_steps=4096, **options):
    prob = sciad.ODEProblem(lotka_volterra, U0, (t0, t1), P0)
    return sciad.solve(
        prob,
        u0=u0,
        p=p,
        saveat=ts,
        solver=solver,
        max_steps=max_steps,
        sensealg=sciad.DiscreteAdjoint(),
        **TOL,
        **options,
    ).us


def weights(ts):
    return jnp.arange(1.0, 2 * len(ts) + 1).reshape(len(ts), 2)


def gradients(saves, ts, *args, ps=None, **kwargs):
    """The gradient in (p, u0) of a weighted sum of the saves at (P0, U0), or at each p of `ps` (vmapped)."""
    w = weights(ts)
    grad = jax.grad(lambda p, u0: jnp.sum(w * saves(p, u0, ts, *args, **kwargs)), argnums=(0, 1))
    if ps is None:
        return jax.jit(grad)(P0, U0)
    return jax.jit(jax.vmap(grad, in_axes=(0, None)))(ps, U0)


# a batch of parameters whose members take different numbers of steps
BATCH = np.stack([P0, P0 * np.array([2.0, 1.0, 0.5, 1.5])])


@pytest.mark.parametrize(
    "ts, t0, t1, ps",
    [
        (np.linspace(0.0, 5.0, 301), 0.0, 5.0, None),  # several saves per step, at t0 and at t1
        (np.array([0.7, 0.7001, 3.1]), 0.0, 5.0, BATCH),  # two saves in one step, none at the ends; a batch
        (np.array([4.0, 2.5, 0.0]), 5.0, 0.0, None),  # backwards in time
    ],
    ids=["saves-at-the-ends", "two-saves-in-a-step-batched", "backwards"],
)
def test_stored_reverse_pass_is_diffrax_recursive_checkpointing(ts, t0, t1, ps):
    """The gradient in (p, u0) is diffrax's RecursiveCheckpointAdjoint's; under vmap over p (members taking
    different numbers of steps), each member's."""
    ours = gradients(sciad_saves, ts, t0, t1, ps=ps)
    theirs = gradients(diffrax_saves, ts, t0, t1, ps=ps)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_stored_reverse_pass_with_an_implicit_solver():
    ts = np.linspace(0.0, 3.0, 7)
    ours = gradients(sciad_saves, ts, 0.0, 3.0, solver="kvaerno5")
    theirs = gradients(diffrax_saves, ts, 0.0, 3.0, solver="kvaerno5")
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-8)


@pytest.mark.slow
def test_a_solve_past_the_stored_steps_is_recomputed_from_checkpoints():
    """More steps than `STORED_STEPS`: the solve continues in segments, each re-solved on the way back."""
    ts = np.array([150.0, 300.0])
    steps = int(
        sciad.solve(sciad.ODEProblem(lotka_volterra, U0, (0.0, 300.0), P0), saveat=ts, max_steps=10**5, **TOL).stats[
            "steps"
        ]
    )
    assert steps > sciad.adjoints.STORED_STEPS
    ours = gradients(sciad_saves, ts, 0.0, 300.0, max_steps=10**5)
    theirs = gradients(diffrax_saves, ts, 0.0, 300.0, max_steps=10**5)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-8)


@pytest.mark.parametrize("checkpoints", [None, 3])
def test_a_solve_in_segments(monkeypatch, checkpoints):
    """16 stored steps: the solve runs in segments, the earlier ones re-solved from their starts on the
    way back (with room for 3 checkpoints, several segments from one of them), to diffrax's gradient."""
    monkeypatch.setattr(adjoints_base, "STORED_STEPS", 16)
    if checkpoints is not None:
        monkeypatch.setattr(discrete, "CHECKPOINT_BYTES", checkpoints * (8 * 8 + 3))  # t, y, FSAL, controller
    ours = gradients(sciad_saves, SEGMENTS_TS, 0.0, 5.0)
    for a, b in zip(ours, _diffrax_gradients_over_segments()):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


SEGMENTS_TS = np.linspace(0.0, 5.0, 31)


@functools.cache
def _diffrax_gradients_over_segments():
    """diffrax's gradient for test_a_solve_in_segments, computed once for its cases."""
    return gradients(diffrax_saves, SEGMENTS_TS, 0.0, 5.0)


def test_the_program_does_not_grow_with_max_steps():
    """The gradient's program at max_steps 100,000 is the one at 4,096 (only buffer sizes differ): a
    larger max_steps adds segments at run time, not code to compile."""
    ts = np.linspace(0.0, 5.0, 11)

    def operations(max_steps):
        loss = lambda p: jnp.sum(sciad_saves(p, U0, ts, 0.0, 5.0, max_steps=max_steps))  # noqa: E731
        return collections.Counter(re.findall(r"stablehlo\.\w+", jax.jit(jax.grad(loss)).lower(P0).as_text()))

    assert operations(100_000) == operations(4096)


def test_an_integral_and_the_time_span():
    """∫ u₁² dt and u(t1) in p, u0 and t1 (traced): against central differences of the same solve."""
    prob = sciad.ODEProblem(lotka_volterra, U0, (0.0, 2.0), P0)

    def loss(p, t1):
        sol = sciad.solve(
            prob,
            p=p,
            tspan=(0.0, t1),
            saveat=jnp.stack([t1]),
            integrand=lambda u, p, t: u[0] ** 2,
            sensealg=sciad.DiscreteAdjoint(),
            rtol=1e-10,
            atol=1e-10,
        )
        return sol.integral + jnp.sum(sol.us[-1])

    g_p, g_t1 = jax.jit(jax.grad(loss, argnums=(0, 1)))(P0, 2.0)
    loss = jax.jit(loss)
    h = 1e-6
    fd_t1 = (loss(P0, 2.0 + h) - loss(P0, 2.0 - h)) / (2 * h)
    fd_p = np.array([(loss(P0 + h * e, 2.0) - loss(P0 - h * e, 2.0)) / (2 * h) for e in np.eye(4)])
    np.testing.assert_allclose(g_t1, fd_t1, rtol=1e-6)
    np.testing.assert_allclose(g_p, fd_p, rtol=1e-6)


@pytest.mark.slow
def test_second_derivatives_replay_the_reverse_pass():
    ts = np.linspace(0.0, 2.0, 5)
    loss = lambda p, saves: jnp.sum(weights(ts) * saves(p, U0, ts, 0.0, 2.0))  # noqa: E731
    ours = jax.hessian(lambda p: loss(p, sciad_saves))(P0)
    theirs = jax.hessian(lambda p: loss(p, lambda *a: diffrax_saves(*a, adjoint=dfx.DirectAdjoint())))(P0)
    np.testing.assert_allclose(ours, theirs, rtol=1e-8)


@pytest.mark.parametrize(
    "solver",
    [dfx.Tsit5(), dfx.Dopri5(), dfx.Dopri8(), dfx.Bosh3(), dfx.Heun(), dfx.Euler()],
    ids=lambda s: type(s).__name__,
)
def test_restep_is_the_solvers_own_step(solver):
    """The step DiscreteAdjoint's reverse pass pulls back (`Stepper.restep`) is the step the loop takes after a
    jump (an explicit tableau's stages unrolled: `explicit_rk_step`), y1 and the dense output to the last bit,
    and that step is diffrax's own to rounding, its error estimate and its FSAL state included."""
    from sciad.adjoints._loop import Stepper

    def f(t, y, a):
        return jnp.stack([a * y[1] * jnp.cos(t), -(y[0] ** 3) + y[1] * t])

    stepper = Stepper.of(dfx.ODETerm(f), solver, sciad.step_controller(solver, 1e-6, 1e-6), forward_mode=False)
    y0, t0, t1 = jnp.array([0.3, -0.7]), 0.2, 0.45

    @jax.jit  # every step compiled as one program (eagerly, a small program per operation)
    def steps():
        y1, dense = stepper.restep(t0, t1, y0, 1.3)
        own_y1, _, own_dense, _, _ = stepper.step(t0, t1, y0, 1.3, stepper.zero_state(t0, t1, y0, 1.3), True)
        between = [stepper.interpolation(t0, t1, d).evaluate(0.33) for d in (dense, own_dense)]
        terms, state = dfx.ODETerm(f), solver.init(dfx.ODETerm(f), t0, t1, y0, 1.3)
        # FSAL's first stage evaluated, and taken from the state
        ours = [stepper.step(t0, t1, y0, 1.3, state, made_jump)[:4] for made_jump in (True, False)]
        diffrax = [solver.step(terms, t0, t1, y0, 1.3, state, made_jump)[:4] for made_jump in (True, False)]
        return (y1, own_y1), between, ours, diffrax

    (y1, own_y1), between, ours, diffrax = steps()
    np.testing.assert_array_equal(y1, own_y1)
    np.testing.assert_array_equal(*between)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(diffrax)):
        np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-15)
