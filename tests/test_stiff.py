"""Every sensealg on stiff problems with implicit solvers.

Gradients of the stiff Oregonator (first 5 time units) and of the stiff
Brusselator PDE (4×4 grid) with Kvaerno5 at rtol = atol = 1e-8 agree with
`DiscreteAdjoint` to 1e-5 relative, and `DiscreteAdjoint` with central
finite differences; every diffrax implicit solver (by name or instance,
IMEX KenCarp included) serves the continuous adjoints (checked against
forward mode through the steps); BacksolveAdjoint
refuses problems that are unstable backwards in time.
"""

import dataclasses
import functools
import warnings

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
import sciad.ad as ad
from helpers import SENSEALGS, assert_agrees, central_differences, reference_for, slow_except
from sciad.ad._linear import HigherOrderError
from sciad.adjoints import BacksolveAdjoint, DiscreteAdjoint, ForwardSensitivity, InterpolatingAdjoint
from sciad.problems import brusselator_pde, oregonator

TOL = 1e-8
AGREEMENT = 1e-5
BENCHES = {"oregonator": lambda: oregonator(t1=5.0), "brusselator-pde": lambda: brusselator_pde(4)}
# every shared variant but BacksolveAdjoint (unstable backwards here) and the reference
STIFF_SENSEALGS = [name for name in SENSEALGS if name not in ("BacksolveAdjoint", "DiscreteAdjoint")]


def bench(name, tol=TOL):
    return dataclasses.replace(BENCHES[name](), rtol=tol, atol=tol)


@functools.cache
def gradient(name, sensealg):
    b = bench(name)
    return np.asarray(jax.jit(jax.grad(lambda p: b.objective(p, sensealg)))(b.problem.p))


# with the slow tests: an implicit adjoint runs in the default run on the relaxation problem (KenCarp4)
@pytest.mark.slow
@pytest.mark.parametrize(
    "problem, sensealg", [(problem, sensealg) for problem in BENCHES for sensealg in STIFF_SENSEALGS]
)
def test_every_sensealg_with_kvaerno5(problem, sensealg):
    assert bench(problem).solver == "kvaerno5"
    assert_agrees(gradient(problem, SENSEALGS[sensealg]()), gradient(problem, DiscreteAdjoint()), sensealg, AGREEMENT)


@pytest.mark.slow
@pytest.mark.parametrize("problem", list(BENCHES))
def test_discrete_adjoint_matches_finite_differences(problem):
    tight = bench(problem, tol=1e-11)
    fd = central_differences(jax.jit(tight.objective), tight.problem.p, rel_step=1e-4, floor=0.0)
    np.testing.assert_allclose(gradient(problem, DiscreteAdjoint()), fd, rtol=1e-4)


# --- any implicit diffrax solver, and the stiff relaxation backsolve cannot do ---------------


def relaxation(u, p, t):
    """u' = −k (u − sin t) + c cos t, p = (k, c): stiff for k ≫ 1, unstable backwards in time."""
    xp = ad.namespace(u, p)
    return -p[0] * (u - xp.sin(t)) + p[1] * xp.cos(t)


RELAXATION = sciad.ODEProblem(relaxation, np.array([0.5, -0.5]), (0.0, 2.0), np.array([100.0, 1.0]))


def relaxation_gradient(sensealg, solver, tol=TOL):
    def loss(p):
        sol = sciad.solve(RELAXATION, p=p, saveat=[0.5, 1.0, 2.0], solver=solver, rtol=tol, atol=tol, sensealg=sensealg)
        return jnp.sum(sol.us**2)

    return np.asarray(jax.jit(jax.grad(loss))(RELAXATION.p))


SOLVERS = {
    "kvaerno3": "kvaerno3",
    "Kvaerno4()": dfx.Kvaerno4(),
    "KenCarp4()": dfx.KenCarp4(),
    "ImplicitEuler()": dfx.ImplicitEuler(),
}


@pytest.mark.parametrize("solver", slow_except(list(SOLVERS), fast=["KenCarp4()"]))
@pytest.mark.parametrize(
    "sensealg",
    slow_except(["ForwardSensitivity", "InterpolatingAdjoint", "GaussAdjoint"], fast=["InterpolatingAdjoint"]),
)
def test_implicit_solvers_by_name_and_instance(sensealg, solver):
    tol = 1e-5 if solver == "ImplicitEuler()" else TOL  # first order: loose tolerance, loose agreement
    got = relaxation_gradient(SENSEALGS[sensealg](), SOLVERS[solver], tol)
    expected = relaxation_gradient(SENSEALGS[reference_for(sensealg)](), SOLVERS[solver], tol)
    assert_agrees(got, expected, f"{sensealg} with {solver}", 1e-2 if solver == "ImplicitEuler()" else AGREEMENT)


@pytest.mark.slow  # the default run's refusal: test_backsolve_check (the corpus's wrong case)
def test_backsolve_refuses_an_unstable_backward_solve():
    with pytest.raises(Exception, match="unstable backwards in time"):
        relaxation_gradient(BacksolveAdjoint(), "kvaerno5", 1e-6)


def test_backsolve_can_warn_instead():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = relaxation_gradient(BacksolveAdjoint(on_instability="warn"), "tsit5", 1e-6)
        jax.effects_barrier()
    assert np.all(np.isfinite(g))
    assert any("unstable backwards in time" in str(w.message) for w in caught)


@pytest.mark.slow  # the default run's: BacksolveAdjoint's Lotka–Volterra gradient in test_sensealgs
def test_backsolve_stays_quiet_when_stable():
    """Lotka–Volterra is stable backwards: no error, and the gradient is right."""
    b = sciad.problems.lotka_volterra()
    grad = jax.jit(jax.grad(b.objective), static_argnums=1)
    assert_agrees(
        grad(b.problem.p, BacksolveAdjoint()), grad(b.problem.p, InterpolatingAdjoint()), "backsolve", AGREEMENT
    )


def test_backsolve_options_are_checked():
    with pytest.raises(ValueError, match="on_instability"):
        BacksolveAdjoint(on_instability="ignore")
    with pytest.raises(ValueError, match="drift_tolerance"):
        BacksolveAdjoint(drift_tolerance=0.0)


# --- engines inside implicit adjoint solves ---------------------------------------------


@pytest.mark.slow
def test_enzyme_vjps_in_an_implicit_adjoint():
    """The Newton Jacobian of the λ system batches Enzyme's pullbacks with a loop (no batching rule)."""
    if "enzyme" not in ad.available():
        pytest.skip("enzyme-ad is not installed")
    assert_agrees(
        relaxation_gradient(InterpolatingAdjoint(vjp="enzyme"), "kvaerno5"),
        relaxation_gradient(DiscreteAdjoint(), "kvaerno5"),
        "enzyme",
        AGREEMENT,
    )


@pytest.mark.slow
def test_host_engine_vjps_in_an_implicit_adjoint():
    if "torch" not in ad.available():
        pytest.skip("torch is not installed")
    assert_agrees(
        relaxation_gradient(InterpolatingAdjoint(vjp="torch"), "kvaerno3", 1e-6),
        relaxation_gradient(DiscreteAdjoint(), "kvaerno3", 1e-6),
        "torch",
        AGREEMENT,
    )


def test_host_engine_backsolve_with_an_implicit_solver_says_why_not():
    """Newton steps on (u, λ, μ) need second derivatives of f, which a host engine cannot give inside JAX."""
    if "torch" not in ad.available():
        pytest.skip("torch is not installed")
    with pytest.raises(HigherOrderError, match="host engine 'torch'"):
        relaxation_gradient(BacksolveAdjoint(vjp="torch"), "kvaerno3")


# --- selection --------------------------------------------------------------------------


def test_selection_asks_the_solver_whether_it_is_implicit():
    from sciad._select import features

    assert features(RELAXATION, [1.0, 2.0], solver=dfx.KenCarp4()).implicit_solver is True
    assert features(RELAXATION, [1.0, 2.0], solver="tsit5").implicit_solver is False
    choice = sciad.select_sensealg(RELAXATION, saveat=[1.0, 2.0], solver=dfx.Kvaerno5())
    assert not isinstance(choice.sensealg, BacksolveAdjoint)


@pytest.mark.slow
def test_autotune_marks_a_failing_candidate_and_goes_on(monkeypatch):
    import sciad._select as select

    monkeypatch.setattr(
        select,
        "candidates",
        lambda feat: [(BacksolveAdjoint(), "unstable backwards: raises"), (InterpolatingAdjoint(), "works")],
    )
    choice = select.select_sensealg(RELAXATION, saveat=[1.0, 2.0], solver="kvaerno5", autotune=True, budget=600)
    by_name = {c["name"]: c for c in choice.candidates}  # the heuristic's pick is measured first, then these
    failed, works = by_name["BacksolveAdjoint(jax-reverse)"], by_name["InterpolatingAdjoint(jax-reverse)"]
    assert str(failed["ok"]).startswith("failed") and "backwards in time" in failed["ok"]
    assert works["ok"] is True


def test_forward_sensitivity_with_an_implicit_solver_on_many_states_warns():
    prob = sciad.ODEProblem(lambda u, p, t: -p * u, np.ones(32), (0.0, 0.1), np.array(2.0))
    with pytest.warns(UserWarning, match="sensealg='auto'"):
        sciad.solve(prob, solver="kvaerno5", sensealg=ForwardSensitivity())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sciad.solve(prob, solver="tsit5", sensealg=ForwardSensitivity())
