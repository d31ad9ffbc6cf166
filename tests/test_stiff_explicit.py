"""An explicit solver on a stiff problem: derivatives through its steps are refused with a SolveError
naming the fix, the error-controlled ones are right, and "auto" picks one of those."""

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from helpers import central_differences
from sciad._auto import features, heuristic
from sciad._stability import stability_boundary, stability_steps


def robertson(u, p, t):
    y1, y2, y3 = u
    return jnp.stack([-p[0] * y1 + p[2] * y2 * y3, p[0] * y1 - p[1] * y2**2 - p[2] * y2 * y3, p[1] * y2**2])


P = jnp.array([0.04, 3e7, 1e4])
PROB = sciad.ODEProblem(robertson, jnp.array([1.0, 0.0, 0.0]), (0.0, 0.4), P)
SAVES = jnp.array([0.1, 0.2, 0.4])
WEIGHTS = jnp.array([[1.0, 20.0, -1.0], [0.5, -10.0, 2.0], [1.0, 30.0, 1.0]])


def loss(p, solver, sensealg, rtol=1e-6):
    sol = sciad.solve(PROB, p=p, saveat=SAVES, solver=solver, sensealg=sensealg, rtol=rtol, atol=rtol, max_steps=20_000)
    return jnp.sum(sol.us * WEIGHTS)


gradient = jax.jit(jax.grad(loss), static_argnums=(1, 2, 3))


@pytest.fixture(scope="module")
def reference():
    """p ⊙ ∂L/∂p by central differences of Rodas5P's solve at rtol 1e-10 (no sensealg's rule; only the solve to
    compile): within about 1e-8 of forward mode through Rodas5P's steps."""
    solve = jax.jit(lambda p: loss(p, "rodas5p", None, 1e-10))
    return P * central_differences(solve, P, rel_step=1e-5, floor=0.0)


def test_stability_boundary_from_the_tableau():
    assert stability_boundary(dfx.Heun()) == pytest.approx(2.0, abs=1e-3)  # 1 + z + z²/2
    assert stability_boundary(dfx.Tsit5()) == pytest.approx(3.5, abs=0.05)
    assert stability_boundary(dfx.Dopri5()) == pytest.approx(3.3, abs=0.05)
    assert stability_boundary(dfx.Euler()) is None and stability_boundary(dfx.Kvaerno5()) is None


def test_stability_steps_of_a_linear_system():
    """u' = -λu: ρ = λ everywhere, counted once the mode has decayed below rtol: S = λ (T − ln(1/rtol)/λ) / β;
    an undamped rotation of any speed counts nothing."""
    u0, ts, us = jnp.ones(2), jnp.array([0.5, 1.0]), jnp.ones((2, 2))
    S, rotation = jax.jit(  # both compiled as one program (eagerly, a small program per operation)
        lambda: (
            stability_steps(lambda u, t: -250.0 * u, 0.0, 2.0, u0, ts, us, 2.5, 1e-6),
            stability_steps(lambda u, t: 1e4 * jnp.stack([u[1], -u[0]]), 0.0, 2.0, u0, ts, us, 2.5, 1e-6),
        )
    )()
    assert float(S) == pytest.approx((250.0 * 2.0 - np.log(1e6)) / 2.5, rel=1e-6)
    assert float(rotation) == 0.0


@pytest.mark.parametrize(
    "sensealg",
    [
        sciad.DiscreteAdjoint(),
        sciad.ForwardDiffSensitivity(),
        sciad.ForwardSensitivity(),
        sciad.ForwardSensitivity(seminorm=True),
    ],
    ids=lambda s: type(s).__name__,
)
def test_through_the_steps_is_refused(sensealg):
    with pytest.raises(sciad.SolveError, match="stability limit") as info:
        jax.grad(loss)(P, "tsit5", sensealg)
    assert "GaussAdjoint" in str(info.value) and 'solver="auto"' in str(info.value)


def test_refused_under_jit_as_the_last_line():
    with pytest.raises(Exception) as info:
        jax.jit(jax.grad(loss), static_argnums=(1, 2))(P, "tsit5", sciad.DiscreteAdjoint())
    assert sciad.errors.summary(info.value).startswith(
        "SolveError: DiscreteAdjoint carries its derivative on the steps"
    )


def test_error_controlled_gradients_are_right(reference):
    for sensealg in (sciad.GaussAdjoint(), sciad.InterpolatingAdjoint()):
        g = P * gradient(P, "tsit5", sensealg)
        np.testing.assert_allclose(g, reference, atol=1e-2 * float(jnp.max(jnp.abs(reference))), err_msg=str(sensealg))


def test_auto_picks_an_error_controlled_sensealg_when_stiff():
    feat = features(jnp.zeros(3), P, SAVES, solver=dfx.Tsit5(), rtol=1e-6, atol=1e-6, stiff=True)
    pick = heuristic(feat)
    assert pick.rule == "stiff-explicit" and isinstance(pick.sensealg, sciad.GaussAdjoint)
    assert (
        heuristic(features(jnp.zeros(3), P, SAVES, solver=dfx.Tsit5(), rtol=1e-6, atol=1e-6, stiff=False)).rule
        == "few-parameters"
    )


def test_no_alarm_on_a_fast_non_stiff_oscillation():
    """An active fast oscillation resolved by accuracy: its steps are far from the stability limit."""

    def f(u, p, t):
        return jnp.stack([p[0] * u[1], -p[0] * u[0]])

    prob = sciad.ODEProblem(f, jnp.array([1.0, 0.0]), (0.0, 1.0), jnp.array([200.0]))

    def osc(p):
        return jnp.sum(
            sciad.solve(
                prob, p=p, solver="tsit5", sensealg=sciad.DiscreteAdjoint(), rtol=1e-5, atol=1e-5, max_steps=20_000
            ).us[-1]
        )

    g = jax.jit(jax.grad(osc))(jnp.array([200.0]))  # compiled whole (an eager gradient compiles one per operation)
    # u1(1) + u2(1) = cos ω - sin ω: d/dω = -sin ω - cos ω
    np.testing.assert_allclose(g, -np.sin(200.0) - np.cos(200.0), rtol=1e-2)  # the solve at rtol 1e-5 over 32 turns


def test_auto_with_an_explicit_solver_on_a_stiff_problem_is_right(reference):
    """The solver given (Tsit5), the sensealg "auto": the stiffness estimate picks GaussAdjoint, and says so."""
    choice = sciad.select_sensealg(PROB, saveat=SAVES, solver="tsit5", rtol=1e-6, atol=1e-6)
    assert choice.heuristic_pick.rule == "stiff-explicit" and "stiff-explicit" in choice.report()
    g = P * gradient(P, "tsit5", "auto")
    np.testing.assert_allclose(g, reference, atol=1e-2 * float(jnp.max(jnp.abs(reference))))
