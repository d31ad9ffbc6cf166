"""`sciad.solve` and `sciad.ODEProblem`: what a solve returns, and bad input."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import sciad
import sciad.ad as ad
import sciad.ad._errors
from helpers import SENSEALGS, slow_except
from sciad._ode import SOLVERS
from sciad.adjoints import DiscreteAdjoint, ForwardSensitivity, GaussAdjoint, InterpolatingAdjoint, QuadratureAdjoint
from sciad.problems._lotka_volterra import lotka_volterra_rhs as lotka_volterra

MAX_STEPS_ERROR = "maximum number of solver steps was reached"


def lv(t1=10.0, dtype=np.float64):
    return sciad.ODEProblem(
        lotka_volterra, np.array([1.0, 1.0], dtype), (0.0, t1), np.array([1.5, 1.0, 3.0, 1.0], dtype)
    )


# A stiff linear problem u' = A u with eigenvalues -1 and -10⁴, exact solution expm(A t) u0.
STIFF_A = np.array([[-1.0, 0.0], [9999.0, -10000.0]]) @ np.eye(2)


def linear(u, p, t):
    xp = ad.namespace(u, p)
    return xp.stack([p[0] * u[0] + p[1] * u[1], p[2] * u[0] + p[3] * u[1]])


def stiff():
    return sciad.ODEProblem(linear, np.array([1.0, 0.0]), (0.0, 2.0), STIFF_A.ravel())


# --- what a solve returns ----------------------------------------------------------


def test_shapes_and_default_saveat():
    sol = sciad.solve(lv())
    assert sol.ts.shape == (2,) and sol.us.shape == (2, 2)
    np.testing.assert_allclose(sol.ts, [0.0, 10.0])
    np.testing.assert_allclose(sol.us[0], [1.0, 1.0])
    assert sol.interpolation is None

    sol = sciad.solve(lv(), saveat=np.linspace(0.0, 10.0, 101))
    assert sol.ts.shape == (101,) and sol.us.shape == (101, 2)


def test_stats():
    sol = sciad.solve(lv(), saveat=np.linspace(0.0, 10.0, 11))
    steps = int(sol.stats["steps"])
    assert steps > 10
    assert int(sol.stats["accepted_steps"]) + int(sol.stats["rejected_steps"]) == steps
    assert int(sol.stats["function_evaluations"]) == 6 * steps  # Tsit5: 7 stages, first same as last
    tight = sciad.solve(lv(), saveat=np.linspace(0.0, 10.0, 11), rtol=1e-10, atol=1e-10)
    assert int(tight.stats["steps"]) > 3 * steps
    assert sciad.solve(stiff(), solver="kvaerno5").stats["function_evaluations"] is None  # implicit: unknown


@pytest.mark.slow  # the default run's dense output: test_losses.py
def test_dense_interpolation():
    ts = np.linspace(0.0, 10.0, 41)
    sol = sciad.solve(lv(), saveat=ts, dense=True, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(sol.interpolation(0.0), [1.0, 1.0], rtol=1e-12)
    dense = jnp.stack([sol.interpolation(t) for t in ts])
    np.testing.assert_allclose(dense, sol.us, rtol=1e-7, atol=1e-9)
    between = sciad.solve(lv(), saveat=[3.33], rtol=1e-8, atol=1e-8).us[0]
    np.testing.assert_allclose(sol.interpolation(3.33), between, rtol=1e-5)


@pytest.mark.parametrize("solver", slow_except(sorted(SOLVERS), fast=["tsit5"]))  # implicit ones: test_stiff
def test_named_solvers_agree(solver):
    reference = sciad.solve(lv(), saveat=[2.5, 5.0], solver="dopri8", rtol=1e-12, atol=1e-12).us
    # Low-order solvers need more than the default 4096 steps at 1e-8.
    us = sciad.solve(lv(), saveat=[2.5, 5.0], solver=solver, rtol=1e-8, atol=1e-8, max_steps=100_000).us
    np.testing.assert_allclose(us, reference, rtol=1e-5)


def test_diffrax_solver_instance():
    import diffrax

    us = sciad.solve(lv(), solver=diffrax.Heun(), rtol=1e-6, atol=1e-6, max_steps=100_000).us
    np.testing.assert_allclose(us, sciad.solve(lv()).us, rtol=1e-3)


def test_kvaerno5_on_a_stiff_problem():
    prob = stiff()
    exact = scipy.linalg.expm(STIFF_A * 2.0) @ prob.u0
    implicit = sciad.solve(prob, solver="kvaerno5", rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(implicit.us[-1], exact, rtol=1e-6)
    explicit = sciad.solve(prob, solver="tsit5", rtol=1e-8, atol=1e-8, max_steps=100_000)
    assert int(implicit.stats["steps"]) * 20 < int(explicit.stats["steps"])


def test_jit_and_vmap():
    prob = lv()
    saveat = np.linspace(0.0, 10.0, 11)
    one = jax.jit(lambda u0, p: sciad.solve(prob, u0=u0, p=p, saveat=saveat).us)
    np.testing.assert_allclose(one(prob.u0, prob.p), sciad.solve(prob, saveat=saveat).us, rtol=1e-12)
    u0s = np.array([[1.0, 1.0], [2.0, 0.5], [0.5, 2.0]])
    batched = jax.jit(jax.vmap(lambda u0: sciad.solve(prob, u0=u0, saveat=saveat).us))(u0s)
    assert batched.shape == (3, 11, 2)
    for i, u0 in enumerate(u0s):
        np.testing.assert_allclose(batched[i], one(u0, prob.p), rtol=1e-6)


def test_precisions_with_a_differentiated_closure():
    """A float32 u0 without parameters stays float32; a float32 u0 with float64 p solves in float64; both
    with f closing over a differentiated value (f is called in the solve's precision)."""

    def loss(w, u0, p):
        prob = sciad.ODEProblem(lambda u, q, t: -w * u * (1.0 if p is None else q), u0, (0.0, 1.0), p)
        sol = sciad.solve(prob, saveat=[1.0])
        return jnp.sum(sol.us), sol.us

    for u0, p, dtype in (
        (np.ones(2, np.float32), None, jnp.float32),
        (np.ones(2, np.float32), np.ones(2), jnp.float64),
    ):
        grad, us = jax.jit(jax.grad(loss, has_aux=True))(1.0, u0, p)
        assert us.dtype == dtype
        np.testing.assert_allclose(grad, -2 * np.exp(-1.0), rtol=1e-5)


def test_float32_stays_float32():
    prob = lv(dtype=np.float32)
    sol = sciad.solve(prob, saveat=np.linspace(0.0, 10.0, 11))
    assert sol.us.dtype == jnp.float32 and sol.ts.dtype == jnp.float32
    grad = jax.jit(jax.grad(lambda p: jnp.sum(sciad.solve(prob, p=p, saveat=[1.0, 2.0]).us)))(prob.p)
    assert grad.dtype == jnp.float32 and np.all(np.isfinite(grad))


# --- bad input --------------------------------------------------------------------


def test_u0_shape_differs_from_f_output():
    def f(u, p, t):
        return jnp.concatenate([u, u[:1]])

    with pytest.raises(ValueError, match=r"f\(u, p, t\) returns shape \(3,\) but u0 has shape \(2,\)"):
        sciad.ODEProblem(f, np.ones(2), (0.0, 1.0))
    with pytest.raises(ValueError, match=r"u0 has shape \(3,\) but the problem's u0 has shape \(2,\)"):
        sciad.solve(lv(), u0=np.ones(3))
    with pytest.raises(ValueError, match=r"f\(u, p, t\) returns a PyTree .* but u0 is an array of shape \(2,\)"):
        sciad.ODEProblem(lambda u, p, t: [u[0], u[1]], np.ones(2), (0.0, 1.0))


@pytest.mark.parametrize("name", ["u0", "p"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_input_eagerly(name, bad):
    prob = lv()
    value = np.array(getattr(prob, name))
    value[1] = bad
    with pytest.raises(ValueError, match=f"{name} contains non-finite values"):
        sciad.ODEProblem(lotka_volterra, **{"u0": prob.u0, "p": prob.p, name: value}, tspan=(0.0, 1.0))
    with pytest.raises(ValueError, match=f"{name} contains non-finite values"):
        sciad.solve(prob, **{name: value})


@pytest.mark.parametrize("name", slow_except(["u0", "p"], fast=["p"]))
def test_non_finite_input_under_jit_is_a_runtime_error(name):
    prob = lv(t1=1.0)
    value = np.array(getattr(prob, name))
    value[0] = np.nan

    def loss(x):
        return jnp.sum(sciad.solve(prob, **{name: x}).us)

    with pytest.raises(Exception, match=f"{name} contains non-finite values"):
        jax.block_until_ready(jax.jit(loss)(value))
    with pytest.raises(Exception, match=f"{name} contains non-finite values"):
        jax.block_until_ready(jax.jit(jax.grad(loss))(value))


def test_tspan_empty():
    with pytest.raises(ValueError, match="is empty: t1 must differ from t0"):
        sciad.ODEProblem(lotka_volterra, np.ones(2), (1.0, 1.0), np.ones(4))
    with pytest.raises(ValueError, match="is empty: t1 must differ from t0"):
        sciad.solve(lv(), tspan=(2.0, 2.0))


def test_tspan_not_a_pair_or_not_finite():
    with pytest.raises(ValueError, match=r"tspan must be a pair of numbers"):
        sciad.ODEProblem(lotka_volterra, np.ones(2), (0.0, 1.0, 2.0), np.ones(4))
    with pytest.raises(ValueError, match="tspan must be finite"):
        sciad.ODEProblem(lotka_volterra, np.ones(2), (0.0, np.inf), np.ones(4))


def test_traced_tspan_in_the_problem_names_the_solves_tspan():
    """A problem's tspan is static: traced times go to the solve, which takes them under jit."""
    f = lambda u, p, t: -p * u
    with pytest.raises(
        ValueError,
        match=r"ODEProblem\(tspan=...\) got traced times.*sciad.solve\(prob, "
        r"tspan=\(t0, t1\)\)",
    ):
        jax.jit(lambda t1: sciad.ODEProblem(f, np.ones(2), (0.0, t1), np.ones(2)).u0)(1.0)
    prob = sciad.ODEProblem(f, np.ones(2), (0.0, 1.0), np.ones(2))
    final = jax.jit(lambda t1: sciad.solve(prob, tspan=(0.0, t1)).us[-1])(2.0)
    np.testing.assert_allclose(final, np.exp(-2.0) * np.ones(2), rtol=1e-4)


def test_saveat_unsorted():
    """Repeated times are taken (tests/test_repeated_saveat.py); times out of order are not."""
    with pytest.raises(ValueError, match="saveat must be non-decreasing"):
        sciad.solve(lv(), saveat=[0.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="saveat must be non-increasing"):
        sciad.solve(lv(), tspan=(10.0, 0.0), saveat=[0.0, 1.0])


@pytest.mark.parametrize("saveat", [[-0.5, 1.0], [1.0, 10.5]])
def test_saveat_outside_tspan(saveat):
    with pytest.raises(ValueError, match=r"saveat must lie inside tspan \(0.0, 10.0\)"):
        sciad.solve(lv(), saveat=saveat)


def test_unknown_solver_and_sensealg():
    with pytest.raises(ValueError, match=r"unknown solver 'rk4'; choose one of \['bdf', 'bosh3'"):
        sciad.solve(lv(), solver="rk4")
    with pytest.raises(ValueError, match=r"unknown sensealg 'Adjoint'; pass one of \['BacksolveAdjoint'"):
        sciad.solve(lv(), sensealg="Adjoint")


@pytest.mark.slow  # names and instances give the same gradient in the default run: the describe() test
def test_sensealg_by_name():
    """A name is that sensealg: the same gradient, to the bit, as the instance's, and not another's."""

    def gradient(sensealg):
        return jax.jit(jax.grad(lambda p: jnp.sum(sciad.solve(lv(), p=p, sensealg=sensealg).us)))(lv().p)

    by_name = gradient("GaussAdjoint")
    np.testing.assert_array_equal(by_name, gradient(GaussAdjoint()))
    assert not np.array_equal(by_name, gradient(DiscreteAdjoint()))


def test_quadrature_adjoint_is_interpolating_with_seminorm():
    """SciML's QuadratureAdjoint is InterpolatingAdjoint(seminorm=True), by instance and by name, options kept."""
    assert QuadratureAdjoint("torch", checkpointing=True) == InterpolatingAdjoint(
        "torch", checkpointing=True, seminorm=True
    )
    assert sciad.adjoints.parse("QuadratureAdjoint(checkpointing=True)") == QuadratureAdjoint(checkpointing=True)


def _needed_steps():
    return int(sciad.solve(lv(), saveat=np.linspace(0.0, 10.0, 11)).stats["steps"])


def _max_steps_loss(sensealg):
    prob, max_steps = lv(), _needed_steps() - 1

    def loss(p):
        return jnp.sum(
            sciad.solve(prob, p=p, saveat=np.linspace(0.0, 10.0, 11), max_steps=max_steps, sensealg=sensealg).us
        )

    return prob, loss


def test_max_steps_primal():
    prob, loss = _max_steps_loss(None)
    with pytest.raises(Exception, match=MAX_STEPS_ERROR):
        loss(prob.p)
    with pytest.raises(Exception, match=MAX_STEPS_ERROR):
        jax.block_until_ready(jax.jit(loss)(prob.p))


@pytest.mark.parametrize("name", slow_except(list(SENSEALGS), fast=["InterpolatingAdjoint"]))
def test_max_steps_gradient_under_jit_raises(name):
    """Under jit the forward solve of a gradient can be dead code; its failure must still surface."""
    prob, loss = _max_steps_loss(SENSEALGS[name]())
    with pytest.raises(Exception, match=MAX_STEPS_ERROR):
        jax.block_until_ready(jax.jit(jax.grad(loss))(prob.p))


@pytest.mark.parametrize("name", slow_except(["DiscreteAdjoint", "InterpolatingAdjoint"], fast=[]))
def test_max_steps_jvp_under_jit_raises(name):
    prob, loss = _max_steps_loss(SENSEALGS[name]())
    with pytest.raises(Exception, match=MAX_STEPS_ERROR):
        jax.block_until_ready(jax.jit(lambda p: jax.jvp(loss, (p,), (p,))[1])(prob.p))


def test_checkpointed_interval_hits_its_max_steps():
    prob = lv()
    sensealg = InterpolatingAdjoint(checkpointing=True, checkpoints=[5.0], interval_max_steps=3)

    def loss(p):
        return jnp.sum(sciad.solve(prob, p=p, saveat=[0.0, 10.0], sensealg=sensealg).us)

    with pytest.raises(Exception, match="more than interval_max_steps=3 steps"):
        jax.block_until_ready(jax.jit(jax.grad(loss))(prob.p))


def test_bad_tolerances_and_max_steps():
    with pytest.raises(ValueError, match="rtol must be a positive number"):
        sciad.solve(lv(), rtol=0.0)
    with pytest.raises(ValueError, match="atol must be a positive number"):
        sciad.solve(lv(), atol=np.nan)
    with pytest.raises(ValueError, match="max_steps must be a positive integer"):
        sciad.solve(lv(), max_steps=0)


@pytest.mark.parametrize("engine", ["torch", "autograd", "enzyme"])
def test_missing_engine_package(monkeypatch, engine):
    cls = ad.BACKENDS[engine]
    real = importlib.util.find_spec
    monkeypatch.setattr(
        sciad.ad._errors.importlib.util, "find_spec", lambda name, *a: None if name == cls.package else real(name, *a)
    )
    with pytest.raises(ad.MissingEngineError, match=rf"pip install 'sciad\[{cls.extra}\]'"):
        InterpolatingAdjoint(vjp=engine)
    with pytest.raises(ad.MissingEngineError, match=f"needs the package '{cls.package}'"):
        ForwardSensitivity(jvp=engine)
    assert engine not in ad.available()


def test_run_time_errors_under_jit_end_with_one_clear_message():
    prob = lv(t1=10.0)
    grad = jax.jit(jax.grad(lambda p: jnp.sum(sciad.solve(prob, p=p, saveat=[5.0, 10.0], max_steps=5).us)))
    with pytest.raises(Exception) as info:
        jax.block_until_ready(grad(prob.p))
    message = str(info.value).strip()
    assert message.splitlines()[-1].startswith(
        "SolveError: the maximum number of solver steps was reached: the "
        "ODE solve needed more than max_steps=5 steps; pass a larger max_steps"
    )
    assert "Please wrap your program" not in message and message.count("SolveError") == 1
    with pytest.raises(sciad.SolveError, match="^the maximum .* needed more than max_steps=5"):  # eagerly: itself
        sciad.solve(prob, saveat=[5.0, 10.0], max_steps=5)


DESCRIBED = [
    InterpolatingAdjoint("jax-forward", checkpointing=True, interval_max_steps=32),
    sciad.GaussAdjoint("jax-transpose", checkpointing=True),
    sciad.BacksolveAdjoint(on_instability="warn", drift_tolerance=20.0, seminorm=True),
    sciad.ForwardSensitivity(seminorm=True),
    sciad.DiscreteAdjoint(stored_steps=16),
    sciad.ForwardDiffSensitivity(),
    sciad.QuadratureAdjoint(),
]


def test_solve_takes_every_string_describe_prints():
    """Every sensealg's `describe` string is that sensealg to `solve` (through the one resolver it uses)."""
    for sensealg in DESCRIBED:
        assert sciad.adjoints._registry.resolve(sciad.adjoints.describe(sensealg)) == sensealg


@pytest.mark.slow
@pytest.mark.parametrize("sensealg", DESCRIBED, ids=sciad.adjoints.describe)
def test_solve_by_string_gives_the_instances_gradient(sensealg):
    prob = sciad.ODEProblem(lambda u, p, t: -p * u, np.ones(2), (0.0, 1.0), np.array([0.5, 1.0]))
    text = sciad.adjoints.describe(sensealg)
    grad = jax.jit(jax.grad(lambda p: jnp.sum(sciad.solve(prob, p=p, sensealg=text).us)))(prob.p)
    np.testing.assert_allclose(
        grad, jax.jit(jax.grad(lambda p: jnp.sum(sciad.solve(prob, p=p, sensealg=sensealg).us)))(prob.p), rtol=1e-12
    )
