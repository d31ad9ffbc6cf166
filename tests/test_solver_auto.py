"""`solver="auto"` (`sciad.solve`'s default): a solver chosen while tracing from a stiffness
estimate on concrete values (`sciad._solver_choice`), compiled once per f's content, reported in
`Choice.report()`; and auto's `sparse-stages` rule for a Rosenbrock solver."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
import sciad._solve
from sciad._auto import heuristic
from sciad._solver_choice import auto_solver
from sciad.problems import brusselator_pde, lotka_volterra


def robertson(u, p, t):
    k1, k2, k3 = p
    return jnp.stack([-k1 * u[0] + k3 * u[1] * u[2], k1 * u[0] - k3 * u[1] * u[2] - k2 * u[1] ** 2, k2 * u[1] ** 2])


def van_der_pol(u, p, t):
    return jnp.stack([u[1], p[0] * (1 - u[0] ** 2) * u[1] - u[0]])


ROBERTSON = sciad.ODEProblem(robertson, np.array([1.0, 0.0, 0.0]), (0.0, 100.0), np.array([0.04, 3e7, 1e4]))
STIFF_VDP = sciad.ODEProblem(van_der_pol, np.array([2.0, 0.0]), (0.0, 1.0), np.array([1000.0]))  # ρ|t1 − t0|/3 = 1,000


def chosen(prob, **kw):
    return sciad.select_sensealg(prob, solver="auto", **kw).features


@pytest.mark.parametrize("prob", [ROBERTSON, STIFF_VDP], ids=["robertson", "van-der-pol-1000"])
def test_stiff_problems_choose_rodas5p_and_say_why(prob):
    feat = chosen(prob)
    assert feat.solver == "Rodas5P" and feat.solver_reason.startswith("stiff:")
    assert f"{prob.u0.size} states" in feat.solver_reason and "ρ(∂f/∂u)" in feat.solver_reason


def test_robertsons_stiffness_is_found_past_its_initial_state():
    """At u0 = (1, 0, 0) ∂f/∂u's stiff couplings vanish (ρ = 0.04); one explicit first step on they do not."""
    assert (
        sciad._solver_choice.stiffness(robertson, ROBERTSON.u0, ROBERTSON.p, ROBERTSON.tspan, rtol=1e-6, atol=1e-6).rho
        > 1e4
    )


def test_lotka_volterra_chooses_tsit5():
    feat = chosen(lotka_volterra().problem)
    assert feat.solver == "Tsit5" and feat.solver_reason.startswith("not stiff:")


def test_a_mass_matrix_chooses_rodas5p():
    dae = sciad.ODEProblem(
        lambda u, p, t: robertson(u, p, t).at[2].set(u[0] + u[1] + u[2] - 1),
        ROBERTSON.u0,
        (0.0, 1.0),
        ROBERTSON.p,
        mass_matrix=np.array([1.0, 1.0, 0.0]),
    )
    feat = chosen(dae)
    assert feat.solver == "Rodas5P" and "mass matrix" in feat.solver_reason


def test_a_fast_oscillation_is_not_stiff():
    """u'' = −ω² u, ω = 1,000 over 160 periods: ρ(∂f/∂u) = ω, but the mode never decays, so resolving it
    is the accuracy's work (Tsit5 about 10x faster than Rodas5P at rtol 1e-3 to 1e-9)."""
    rotation = sciad.ODEProblem(
        lambda u, p, t: jnp.stack([p[0] * u[1], -p[0] * u[0]]), np.array([1.0, 0.0]), (0.0, 1.0), np.array([1000.0])
    )
    feat = chosen(rotation)
    assert feat.solver == "Tsit5" and "ρ(∂f/∂u) ≈ 1e+03" in feat.solver_reason


def test_the_report_names_the_solver_and_why():
    report = sciad.select_sensealg(STIFF_VDP).report()  # solver="auto" by default
    assert "- solver: Rodas5P" in report and "- solver reason: stiff:" in report
    given = sciad.select_sensealg(STIFF_VDP, solver="tsit5").report()
    assert "- solver: Tsit5" in given and "- solver reason: given" in given


def test_solve_chooses_by_default(monkeypatch):
    picks = []

    def recording(*args, **kw):
        picks.append(auto_solver(*args, **kw))
        return picks[-1]

    monkeypatch.setattr(sciad._solver_choice, "auto_solver", recording)
    sciad.solve(STIFF_VDP, saveat=[1.0])
    sciad.solve(lotka_volterra().problem, saveat=[1.0], solver=None)
    assert [pick.name for pick in picks] == ["rodas5p", "tsit5"]


def test_the_estimate_compiles_once_per_program(monkeypatch):
    """An eager solve called again, or a new f with the same program, compiles nothing for the estimate."""
    traces = []
    power = sciad._solver_choice.power_iterates

    def counting(*args):
        traces.append(args)
        return power(*args)

    monkeypatch.setattr(sciad._solver_choice, "power_iterates", counting)

    def problem():  # a fresh function object each time, the same program (its own constant: not seen before)
        return sciad.ODEProblem(lambda u, p, t: -p * u + 0.123456789, np.ones(3), (0.0, 1.0), np.array([2.0]))

    first = sciad._solver_choice.stiffness(problem().f, np.ones(3), np.array([2.0]), (0.0, 1.0), rtol=1e-6, atol=1e-6)
    assert len(traces) == 2 and first.rho == pytest.approx(2.0)  # traced once: at u0 and a first step on
    again = sciad._solver_choice.stiffness(
        problem().f, np.full(3, 2.0), np.array([3.0]), (0.0, 2.0), rtol=1e-3, atol=1e-8
    )
    assert len(traces) == 2 and again.rho == pytest.approx(3.0)


def test_a_bad_solver_name_lists_auto():
    with pytest.raises(ValueError, match=r'unknown solver .rodas5.; choose one of \[.*\], "auto"'):
        sciad.solve(STIFF_VDP, solver="rodas5")


def test_traced_u0_and_p_choose_from_the_problems_values_and_differentiate(monkeypatch):
    picks = []

    def recording(*args, **kw):
        picks.append(auto_solver(*args, **kw))
        return picks[-1]

    monkeypatch.setattr(sciad._solver_choice, "auto_solver", recording)
    ts = np.array([0.5, 1.0])

    def loss(x, solver, rtol):  # x = (u0, p)
        return jnp.sum(sciad.solve(STIFF_VDP, u0=x[:2], p=x[2:], saveat=ts, solver=solver, rtol=rtol, atol=rtol).us)

    x = np.concatenate([STIFF_VDP.u0, STIFF_VDP.p])
    grad = jax.jit(jax.grad(loss), static_argnums=(1, 2))(x, "auto", 1e-8)
    assert [pick.name for pick in picks] == ["rodas5p"], picks
    assert "the problem's own" in picks[0].reason
    h = np.array([1e-4, 1e-4, 1e-1])  # central differences of tighter solves
    values = jax.jit(jax.vmap(loss, (0, None, None)), static_argnums=(1, 2))(
        np.concatenate([x + np.diag(h), x - np.diag(h)]), "rodas5p", 1e-11
    )
    np.testing.assert_allclose(grad, (values[:3] - values[3:]) / (2 * h), rtol=1e-6)


def test_nothing_concrete_falls_back_to_tsit5_saying_so():
    reasons = []

    @eqx.filter_jit
    def traced_problem(prob):
        reasons.append(auto_solver(prob, prob.u0, prob.p, prob.tspan, rtol=1e-6, atol=1e-6))
        return prob.u0

    traced_problem(STIFF_VDP)
    k = jnp.asarray(1000.0)

    @jax.jit
    def closing_over(k):
        prob = sciad.ODEProblem(lambda u, p, t: van_der_pol(u, k * p, t), STIFF_VDP.u0, STIFF_VDP.tspan, np.ones(1))
        reasons.append(auto_solver(prob, prob.u0, prob.p, prob.tspan, rtol=1e-6, atol=1e-6))
        return k

    closing_over(k)
    assert [r.name for r in reasons] == ["tsit5", "tsit5"]
    assert "nothing concrete" in reasons[0].reason and "f closes over traced values" in reasons[1].reason


def test_a_rosenbrock_solver_with_sparse_stages_goes_through_the_steps():
    big = brusselator_pde(16)  # 512 states: the choice only, nothing solved
    choice = sciad.select_sensealg(big.problem, saveat=big.saveat)
    assert choice.features.solver == "Rodas5P" and "512 states" in choice.features.solver_reason
    assert choice.features.stage_jacobian == "sparse" and choice.features.linearly_implicit
    assert isinstance(choice.sensealg, sciad.ForwardDiffSensitivity) and choice.heuristic_pick.rule == "sparse-stages"
    assert "Rosenbrock" in choice.heuristic_pick.reason and "m = 3 ≤ 8" in choice.heuristic_pick.reason
    many = heuristic(dataclasses.replace(choice.features, parameters=40))  # reverse mode beyond few parameters
    assert isinstance(many.sensealg, sciad.DiscreteAdjoint) and "Newton" in many.reason
    kvaerno = sciad.select_sensealg(big.problem, saveat=big.saveat, solver="kvaerno5")
    assert isinstance(kvaerno.sensealg, sciad.GaussAdjoint) and not kvaerno.features.linearly_implicit


def test_a_float32_state_with_float64_parameters():
    prob = sciad.ODEProblem(van_der_pol, np.array([2.0, 0.0], np.float32), (0.0, 1.0), np.array([1000.0]))
    assert chosen(prob).solver == "Rodas5P"
