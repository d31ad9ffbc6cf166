"""The continuous adjoints are one class of two pieces: where u comes from (`source`) and what runs
backwards (`backward`). The sensealgs are its constructors; the pieces compose beyond them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from sciad.adjoints._continuous import (Backsolved, Checkpointed, ContinuousAdjoint, LambdaGauss, LambdaMu,
                                        Stored)
from sciad.problems._lotka_volterra import lotka_volterra_rhs as lotka_volterra

pytestmark = pytest.mark.usefixtures("fast_compiles")

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
    assert (stored.checkpointing, stored.checkpoints, stored.interval_max_steps, stored.seminorm,
            stored.stores_interpolation) == (False, None, 40, True, True)
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
    to the tolerance (against DiscreteAdjoint), with integer stats."""
    prob = sciad.ODEProblem(lotka_volterra, np.array([1.0, 1.0]), (0.0, 2.0), np.array([1.5, 1.0, 3.0, 1.0]))
    composed = ContinuousAdjoint(sciad.ad.get("jax-reverse"), Backsolved("raise", 300.0), LambdaGauss())

    def loss(p, sensealg):
        sol = sciad.solve(prob, p=p, saveat=np.linspace(0.0, 2.0, 5), sensealg=sensealg, rtol=1e-9, atol=1e-9)
        return jnp.sum(sol.us), sol.stats["steps"]

    (_, steps), g = jax.value_and_grad(loss, has_aux=True)(prob.p, composed)
    reference = jax.grad(lambda p: loss(p, sciad.DiscreteAdjoint())[0])(prob.p)
    np.testing.assert_allclose(g, reference, rtol=1e-6)
    assert steps.dtype == jnp.int32 and steps > 0
