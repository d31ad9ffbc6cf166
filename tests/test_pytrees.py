"""PyTree states and parameters, closures over traced values and traced save times, for every sensealg."""

import dataclasses

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from helpers import HOST_ENGINES, SENSEALGS, assert_agrees, reference_for, slow_except
from sciad.adjoints import describe

TIGHT = {"rtol": 1e-10, "atol": 1e-10}
MATRIX = slow_except(list(SENSEALGS), fast=["InterpolatingAdjoint"])
ALL_SLOW = slow_except(list(SENSEALGS), fast=[])
TS = np.linspace(0.0, 2.0, 5)
# gradients agree componentwise to RTOL + RTOL · max|reference| (within 1e-6 of the largest component)
RTOL = 5e-7


def oscillator(u, p, t):
    """A forced oscillator with an MLP force: u = {"x", "v"}, p an equinox MLP."""
    force = p(jnp.stack([u["x"], u["v"]]))
    return {"x": u["v"], "v": force[0] - u["x"]}


U0 = {"x": jnp.array(1.0), "v": jnp.array(0.0)}
MLP = eqx.nn.MLP(2, 2, 8, 1, activation=jnp.tanh, key=jax.random.PRNGKey(0), dtype=jnp.float64)


def squares(tree):
    return sum(jnp.sum(v**2) for v in jax.tree.leaves(tree))


@pytest.fixture(scope="module")
def diffrax_gradient():
    def loss(mlp):
        sol = dfx.diffeqsolve(
            dfx.ODETerm(lambda t, u, p: oscillator(u, p, t)),
            dfx.Tsit5(),
            0.0,
            2.0,
            None,
            U0,
            args=mlp,
            saveat=dfx.SaveAt(ts=TS),
            stepsize_controller=dfx.PIDController(**TIGHT),
            max_steps=10_000,
        )
        return squares(sol.ys)

    return eqx.filter_jit(eqx.filter_grad(loss))(MLP)


@pytest.mark.parametrize("name", MATRIX)
def test_dict_state_and_equinox_model_match_diffrax(name, diffrax_gradient):
    prob = sciad.ODEProblem(oscillator, U0, (0.0, 2.0), MLP)
    sensealg = describe(SENSEALGS[name]())  # by name, as `solve` reads it
    loss = eqx.filter_jit(
        eqx.filter_grad(lambda p: squares(sciad.solve(prob, p=p, saveat=TS, sensealg=sensealg, **TIGHT).us))
    )
    grad = loss(MLP)
    assert jax.tree.structure(eqx.filter(grad, eqx.is_array)) == jax.tree.structure(eqx.filter(MLP, eqx.is_array))
    assert_agrees(eqx.filter(grad, eqx.is_array), eqx.filter(diffrax_gradient, eqx.is_array), name, RTOL)


def test_solution_has_the_state_structure():
    prob = sciad.ODEProblem(oscillator, U0, (0.0, 2.0), MLP)
    sol = eqx.filter_jit(lambda: sciad.solve(prob, saveat=TS, dense=True))()  # eagerly, a program per operation
    assert set(sol.us) == {"x", "v"} and sol.us["x"].shape == (5,)
    assert sol.stats["steps"].dtype == jnp.int32
    np.testing.assert_allclose(sol.interpolation(2.0)["x"], sol.us["x"][-1], rtol=1e-6)


@dataclasses.dataclass
class Rates:
    growth: jax.Array
    decay: jax.Array


jax.tree_util.register_dataclass(Rates, data_fields=["growth", "decay"], meta_fields=[])


def logistic(u, p, t):
    prey, (scale,) = u
    return (p.growth * prey * (1 - prey / scale), (-p.decay * scale,))


@pytest.mark.parametrize("name", MATRIX)
def test_tuple_state_and_dataclass_parameters(name):
    u0 = (jnp.array([0.1, 0.2]), (jnp.array(2.0),))
    p = Rates(jnp.array(1.5), jnp.array(0.1))
    prob = sciad.ODEProblem(logistic, u0, (0.0, 3.0), p)

    def loss(p, sensealg):
        return squares(sciad.solve(prob, p=p, saveat=np.linspace(0, 3, 4), sensealg=SENSEALGS[sensealg](), **TIGHT).us)

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    grad, ref = grad(p, name), grad(p, reference_for(name))
    assert isinstance(grad, Rates)
    assert_agrees(grad, ref, name, RTOL)


@pytest.mark.parametrize("name", ALL_SLOW)  # by default: test_losses (closures in g; save-time gradients)
def test_closure_over_differentiated_values(name):
    """f closes over k (differentiated) and over an MLP (differentiated with eqx.filter_grad)."""

    def loss(k, mlp, sensealg):
        prob = sciad.ODEProblem(lambda u, p, t: -k * p * u + 0.1 * mlp(u), jnp.ones(2), (0.0, 1.0), jnp.array(0.5))
        return jnp.sum(sciad.solve(prob, saveat=TS / 2, sensealg=SENSEALGS[sensealg](), **TIGHT).us)

    small = eqx.nn.MLP(2, 2, 4, 1, activation=jnp.tanh, key=jax.random.PRNGKey(1), dtype=jnp.float64)
    grad = eqx.filter_jit(eqx.filter_grad(lambda args: loss(*args, name)))((jnp.array(2.0), small))
    ref = eqx.filter_jit(eqx.filter_grad(lambda args: loss(*args, "ForwardDiffSensitivity")))((jnp.array(2.0), small))
    assert_agrees(grad, ref, name, RTOL)
    ks = jnp.array([1.0, 2.0, 3.0])
    batched = jax.jit(jax.vmap(jax.grad(lambda k: loss(k, small, name))))(ks)
    np.testing.assert_allclose(batched[1], grad[0], rtol=1e-6)


def test_closure_over_constants_runs_on_host_engines():
    data = np.array([0.5, 1.5])
    prob = sciad.ODEProblem(
        lambda u, p, t: -p * u * sciad.ad.namespace(u).asarray(data), np.ones(2), (0.0, 1.0), np.array(1.0)
    )
    g = jax.grad(lambda p: jnp.sum(sciad.solve(prob, p=p, sensealg=sciad.InterpolatingAdjoint(vjp="torch")).us))
    g = jax.jit(g)  # one compiled program (an eager gradient compiles one per operation)
    np.testing.assert_allclose(g(1.0), -np.sum(data * np.exp(-data)), rtol=1e-5)


@pytest.mark.parametrize("name", ALL_SLOW)  # by default: test_losses (closures in g; save-time gradients)
def test_traced_saveat(name):
    prob = sciad.problems.lotka_volterra().problem

    @jax.jit
    def grad(p, ts):
        return jax.grad(lambda p: jnp.sum(sciad.solve(prob, p=p, saveat=ts, sensealg=SENSEALGS[name]()).us))(p)

    for ts in (np.linspace(0.0, 10.0, 11), np.linspace(1.0, 9.5, 11)):
        ref = jax.grad(lambda p: jnp.sum(sciad.solve(prob, p=p, saveat=ts, sensealg=SENSEALGS[name]()).us))(prob.p)
        np.testing.assert_allclose(grad(prob.p, jnp.asarray(ts)), ref, rtol=1e-10)
    assert grad._cache_size() == 1  # new save times do not retrace


@pytest.mark.slow
def test_per_sample_save_times_under_vmap():
    prob = sciad.problems.lotka_volterra().problem
    grids = jnp.stack([jnp.linspace(0.0, 5.0, 6), jnp.linspace(2.0, 10.0, 6)])

    def grad(ts):
        return jax.grad(lambda p: jnp.sum(sciad.solve(prob, p=p, saveat=ts).us))(prob.p)

    batched = jax.jit(jax.vmap(grad))(grids)
    for i, ts in enumerate(np.asarray(grids)):
        np.testing.assert_allclose(batched[i], grad(ts), rtol=1e-6)


def test_traced_saveat_checked_when_run():
    prob = sciad.problems.lotka_volterra().problem
    solve = jax.jit(lambda ts: sciad.solve(prob, saveat=ts).us)
    with pytest.raises(Exception, match=r"saveat must be finite times inside tspan, non-decreasing"):
        jax.block_until_ready(solve(jnp.array([0.0, 2.0, 1.0])))
    with pytest.raises(Exception, match=r"saveat must be finite times inside tspan, non-decreasing"):
        jax.block_until_ready(solve(jnp.array([0.0, 11.0])))


@pytest.mark.slow
def test_hessian_with_respect_to_a_dict():
    def f(u, p, t):
        return -p["k"] * u + p["c"]

    prob = sciad.ODEProblem(f, jnp.ones(2), (0.0, 1.0), {"k": jnp.array(0.7), "c": jnp.array([0.1, 0.2])})

    def loss(p, sensealg):
        return squares(sciad.solve(prob, p=p, saveat=TS / 2, sensealg=SENSEALGS[sensealg](), **TIGHT).us)

    h = jax.jit(jax.hessian(loss), static_argnums=1)(prob.p, "InterpolatingAdjoint")
    ref = jax.hessian(loss)(prob.p, "ForwardDiffSensitivity")
    assert set(h) == {"k", "c"} and set(h["c"]) == {"k", "c"}
    assert_agrees(h, ref, "Hessian", RTOL)


# --- host engines ------------------------------------------------------------------


def dict_field(u, p, t):
    xp = sciad.ad.namespace(u["y"], p["a"])
    return {"y": -p["a"] * u["y"] + xp.flip(p["b"], axis=0)}


@pytest.mark.parametrize("engine", slow_except(HOST_ENGINES, fast=["torch"]))
def test_host_engines_take_dicts(engine):
    prob = sciad.ODEProblem(dict_field, {"y": np.ones(2)}, (0.0, 1.0), {"a": np.array(0.5), "b": np.array([0.1, 0.3])})

    def loss(p, sensealg):
        return squares(sciad.solve(prob, p=p, saveat=TS / 2, sensealg=sensealg).us)

    grad = jax.jit(jax.grad(loss), static_argnums=1)(prob.p, sciad.InterpolatingAdjoint(vjp=engine))
    ref = jax.jit(jax.grad(loss), static_argnums=1)(prob.p, sciad.InterpolatingAdjoint())
    assert set(grad) == {"a", "b"}
    assert_agrees(grad, ref, engine, 10 * RTOL)


def test_host_engine_refuses_a_model_and_a_traced_closure():
    prob = sciad.ODEProblem(oscillator, U0, (0.0, 2.0), MLP)
    with pytest.raises(TypeError, match=r"p is a MLP, which a host engine cannot hold"):
        sciad.solve(prob, saveat=TS, sensealg=sciad.InterpolatingAdjoint(vjp="torch"))

    def loss(k):
        prob = sciad.ODEProblem(lambda u, p, t: -k * u, np.ones(2), (0.0, 1.0))
        return jnp.sum(sciad.solve(prob, sensealg=sciad.BacksolveAdjoint(vjp="torch")).us)

    with pytest.raises(ValueError, match="f closes over traced values.*host engine"):
        jax.grad(loss)(1.0)


# --- bad input -----------------------------------------------------------------------


def test_mismatched_structure_and_shapes_are_named():
    prob = sciad.ODEProblem(oscillator, U0, (0.0, 2.0), MLP)
    with pytest.raises(ValueError, match=r"u0 has structure .* but the problem's u0 has structure"):
        sciad.solve(prob, u0={"x": 1.0})
    with pytest.raises(ValueError, match=r"u0\['v'\] has shape \(2,\) but the problem's u0\['v'\] has shape \(\)"):
        sciad.solve(prob, u0={"x": jnp.array(1.0), "v": jnp.zeros(2)})
    with pytest.raises(ValueError, match=r"f\(u, p, t\)\['v'\] returns shape \(2,\) but u0\['v'\] has shape \(\)"):
        sciad.ODEProblem(lambda u, p, t: {"x": u["x"], "v": jnp.zeros(2)}, U0, (0.0, 1.0))


def test_integer_and_non_finite_leaves_are_named():
    with pytest.raises(TypeError, match=r"u0\['n'\] has dtype int"):
        sciad.ODEProblem(lambda u, p, t: u, {"n": np.array([1, 2])}, (0.0, 1.0))
    with pytest.raises(TypeError, match=r"p\['k'\] has dtype int"):
        sciad.ODEProblem(lambda u, p, t: u, np.ones(2), (0.0, 1.0), {"k": np.array(3)})
    with pytest.raises(ValueError, match=r"p\['k'\]\[1\] contains non-finite values"):
        sciad.ODEProblem(lambda u, p, t: u, np.ones(2), (0.0, 1.0), {"k": [np.array(1.0), np.array(np.nan)]})
