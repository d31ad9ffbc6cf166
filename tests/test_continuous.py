"""The continuous adjoints are one class of two pieces: where u comes from (`source`) and what runs
backwards (`backward`). The sensealgs are its constructors; the pieces compose beyond them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from sciad.adjoints._continuous import Backsolved, Checkpointed, ContinuousAdjoint, LambdaGauss, LambdaMu, Stored
from sciad.problems._lotka_volterra import lotka_volterra_rhs as lotka_volterra

CONSTRUCTORS = (sciad.InterpolatingAdjoint, sciad.GaussAdjoint, sciad.BacksolveAdjoint)


@pytest.mark.parametrize("cls", CONSTRUCTORS)
def test_sensealgs_are_constructors_of_one_class(cls):
    assert issubclass(cls, ContinuousAdjoint)
    own = [name for name in vars(cls) if not (name.startswith("__") or name == "_abc_impl")]
    assert own == [], f"{cls.__name__} defines {own}: its body is its __init__ only"
    assert "__init__" in vars(cls)


def test_options_read_the_pieces():
    stored = sciad.InterpolatingAdjoint(interval_max_steps=40, seminorm=True)
    assert stored.source == Stored(Checkpointed(None, 40)) and stored.backward == LambdaMu(True)
    assert (
        stored.checkpointing,
        stored.checkpoints,
        stored.interval_max_steps,
        stored.seminorm,
        stored.stores_interpolation,
    ) == (False, None, 40, True, True)
    checkpointed = sciad.GaussAdjoint(checkpointing=True, checkpoints=[0.5])
    assert checkpointed.source == Checkpointed((0.5,), None) and checkpointed.backward == LambdaGauss()
    assert not checkpointed.stores_interpolation and not hasattr(checkpointed, "seminorm")
    backsolve = sciad.BacksolveAdjoint(on_instability="warn", drift_tolerance=7.5)
    assert backsolve.source == Backsolved("warn", 7.5)
    assert (backsolve.on_instability, backsolve.drift_tolerance, backsolve.seminorm) == ("warn", 7.5, False)
    assert not hasattr(backsolve, "checkpointing")
    assert sciad.QuadratureAdjoint() == sciad.InterpolatingAdjoint(seminorm=True)
    assert hash(sciad.QuadratureAdjoint()) == hash(sciad.InterpolatingAdjoint(seminorm=True))


def test_pieces_compose_beyond_the_named_sensealgs():
    """u re-solved backwards with λ, ∂L/∂p by Gauss quadrature: a pairing no constructor names, right
    to the tolerance (against forward mode through the steps), with integer stats."""
    prob = sciad.ODEProblem(lotka_volterra, np.array([1.0, 1.0]), (0.0, 2.0), np.array([1.5, 1.0, 3.0, 1.0]))
    composed = ContinuousAdjoint(sciad.ad.get("jax-reverse"), Backsolved("raise", 300.0), LambdaGauss())

    def loss(p, sensealg):
        sol = sciad.solve(prob, p=p, saveat=np.linspace(0.0, 2.0, 5), sensealg=sensealg, rtol=1e-9, atol=1e-9)
        return jnp.sum(sol.us), sol.stats["steps"]

    (_, steps), g = jax.jit(jax.value_and_grad(lambda p: loss(p, composed), has_aux=True))(prob.p)
    reference = jax.jit(jax.grad(lambda p: loss(p, sciad.ForwardDiffSensitivity())[0]))(prob.p)
    np.testing.assert_allclose(g, reference, rtol=1e-6)
    assert steps.dtype == jnp.int32 and steps > 0


def _large(n, t1=1.0):
    """u' = -p ⊙ u + 0.3 sin t (1 + u / (1 + u²)), n states and parameters (experiments/large_nonstiff.py)."""
    rng = np.random.default_rng(0)
    rhs = lambda u, p, t: -p * u + 0.3 * jnp.sin(t) * (1 + u / (1 + u**2))  # noqa: E731
    return sciad.ODEProblem(rhs, rng.uniform(0.5, 1.5, n), (0.0, t1), rng.uniform(0.5, 2.0, n))


def _gradient(prob, sensealg, max_steps=4096):
    def loss(p):
        us = sciad.solve(
            prob,
            p=p,
            saveat=np.array([0.5 * prob.tspan[1], prob.tspan[1]]),
            sensealg=sensealg,
            rtol=1e-6,
            atol=1e-6,
            max_steps=max_steps,
        ).us
        return jnp.sum(us[-1] ** 2)

    return jax.jit(jax.grad(loss))


def _temporaries(fn, p) -> int:
    return fn.lower(p).compile().memory_analysis().temp_size_in_bytes


def test_stored_cost_follows_the_steps_not_max_steps():
    """A stored adjoint's buffers are sized by bytes, not by max_steps (issue 33): at 2,000 states its
    XLA temporaries stay within 1.5× from max_steps 4,096 to 100,000 and within 4× diffrax RCA's."""
    import diffrax as dfx

    prob = _large(2000)
    p = jnp.asarray(prob.p)
    small = _temporaries(_gradient(prob, sciad.GaussAdjoint()), p)
    large = _temporaries(_gradient(prob, sciad.GaussAdjoint(), 100_000), p)
    assert large <= 1.5 * small, (small, large)

    def rca_loss(p):
        solver = sciad.get_solver("tsit5")
        sol = dfx.diffeqsolve(
            dfx.ODETerm(lambda t, u, p: prob.f(u, p, t)),
            solver,
            0.0,
            1.0,
            None,
            prob.u0,
            p,
            saveat=dfx.SaveAt(ts=np.array([0.5, 1.0])),
            stepsize_controller=sciad.step_controller(solver, 1e-6, 1e-6),
            max_steps=4096,
        )
        return jnp.sum(sol.ys[-1] ** 2)

    assert small <= 4 * _temporaries(jax.jit(jax.grad(rca_loss)), p)


@pytest.mark.parametrize(
    "sensealg",
    [
        sciad.GaussAdjoint(),
        pytest.param(sciad.InterpolatingAdjoint(), marks=pytest.mark.slow),
        pytest.param(sciad.InterpolatingAdjoint(checkpointing=True, interval_max_steps=16), marks=pytest.mark.slow),
    ],
)
def test_past_the_stored_steps_the_sweep_recheckpoints(sensealg):
    """A solve of more steps than the stored budget (2,000 states: 16 steps) falls back on checkpoints in
    levels (checkpointing=True, interval_max_steps=16 with max_steps 40,000: three), under vmap (the batch's
    member at p against the discrete adjoint's gradient: the sweep alone and batched in one program)."""
    prob = _large(2000, t1=20.0)
    p = jnp.asarray(prob.p)
    reference = _gradient(prob, sciad.DiscreteAdjoint(), 40_000)(p)
    batched = jax.vmap(_gradient(prob, sensealg, 40_000))(jnp.stack([p, 1.1 * p]))
    assert jnp.max(jnp.abs(batched[0] - reference)) < 1e-4 * jnp.max(jnp.abs(reference))
