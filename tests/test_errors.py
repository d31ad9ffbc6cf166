"""Errors a user can act on (issue 31, item 4): each names the argument and the fix.

A `sciad.SolveError` is caught as itself wherever sciad's call runs eagerly (the forward solve,
an eager `jax.grad`'s backward pass, `sciad.steady_state`, `Solution.interpolation`) and arrives as
the last line of JAX's runtime error under a user's `jax.jit`; NaN and inf in u0 and p are named,
by leaf, first; sensealgs that are classes, diffrax's adjoints or misspelt names are refused
naming what to pass; integrands and vector fields that cannot be traced name themselves (and
diffrax's argument order); preset event times outside tspan are refused.
"""

import os
import subprocess
import sys

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad

DECAY = sciad.ODEProblem(
    lambda u, p, t: -p["k"] * u, np.array([1.0, 2.0]), (0.0, 1.0), {"k": np.array(1.0), "c": np.zeros(2)}
)
# u' = -p u, re-solved backwards by BacksolveAdjoint, blows up (e^{20 t}): its pullback refuses.
STIFF_DECAY = sciad.ODEProblem(lambda u, p, t: -p * u, np.array([1.0, 1.0]), (0.0, 5.0), np.array([20.0, 1.0]))
MAX_STEPS = "^the maximum number of solver steps was reached: the ODE solve needed more than max_steps=2 steps"
UNSTABLE = "^BacksolveAdjoint: the state re-solved backwards in time departs"


def total(x) -> jax.Array:
    return sum(jnp.sum(leaf) for leaf in jax.tree.leaves(x))


# --- 1. SolveError is caught as itself wherever sciad's call runs eagerly ------------------------------


def test_solve_error_is_caught_eagerly():
    with pytest.raises(sciad.SolveError, match=MAX_STEPS) as info:
        sciad.solve(DECAY, max_steps=2)
    assert type(info.value) is sciad.SolveError and info.value.__cause__ is None
    assert "Traceback" not in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("sensealg", ["GaussAdjoint", "DiscreteAdjoint"])
def test_solve_error_is_caught_in_an_eager_grads_forward_pass(sensealg):
    with pytest.raises(sciad.SolveError, match=MAX_STEPS):
        jax.grad(lambda p: total(sciad.solve(DECAY, p=p, max_steps=2, sensealg=sensealg).us))(DECAY.p)


def test_solve_error_is_caught_in_an_eager_grads_backward_pass():
    """BacksolveAdjoint's check runs in its pullback, which JAX runs after sciad.solve has returned."""

    def loss(p):
        return total(sciad.solve(STIFF_DECAY, p=p, saveat=[5.0], sensealg=sciad.BacksolveAdjoint()).us)

    with pytest.raises(sciad.SolveError, match=UNSTABLE):
        jax.grad(loss)(STIFF_DECAY.p)
    with pytest.raises(sciad.SolveError, match=UNSTABLE):  # the derivatives of the dense output run the same rules
        jax.grad(
            lambda p: total(
                sciad.solve(STIFF_DECAY, p=p, dense=True, sensealg=sciad.BacksolveAdjoint()).interpolation(2.0)
            )
        )(STIFF_DECAY.p)


def test_a_check_run_eagerly_is_caught_as_a_solve_error():
    """Eagerly, equinox runs a check as its own jitted call, whose failure JAX raises as a ValueError."""
    checked = sciad._errors.raising_solve_errors(lambda x: sciad._errors.error_if(x, x > 0, "the message"))
    with pytest.raises(sciad.SolveError, match="^the message$"):
        checked(jnp.ones(()))


def test_steady_state_error_is_caught_eagerly():
    oscillator = sciad.ODEProblem(lambda u, p, t: jnp.stack([u[1], -u[0]]), np.ones(2), (0.0, 1.0))
    with pytest.raises(sciad.SolveError, match="^no steady state was found within max_steps=20 time steps"):
        sciad.steady_state(oscillator, solver="tsit5", max_steps=20)


def test_under_jit_the_solve_error_is_the_last_line_of_jaxs_error():
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(jax.jit(lambda p: sciad.solve(DECAY, p=p, max_steps=2).us)(DECAY.p))
    assert not isinstance(info.value, sciad.SolveError)
    last = str(info.value).strip().splitlines()[-1]
    assert last.startswith("SolveError: the maximum number of solver steps was reached")
    assert sciad.errors.summary(info.value) == last
    assert sciad.errors.summary(sciad.SolveError("message")) == "SolveError: message"


def test_eqx_on_error_is_honoured():
    """The checks are equinox's: EQX_ON_ERROR=nan gives NaN in place of a failed solve's values, and a
    gradient then holds no host callback (no warning either), as JAX's persistent cache requires."""
    script = (
        "import jax, numpy as np, sciad\n"
        "prob = sciad.ODEProblem(lambda u, p, t: -p * u, np.ones(2), (0.0, 1.0), np.ones(2))\n"
        "print(np.isnan(jax.jit(lambda p: sciad.solve(prob, p=p, max_steps=2).us)(prob.p)).all())\n"
        "lv = sciad.problems.lotka_volterra()\n"
        "grad = jax.grad(lambda p: lv.objective(p, 'InterpolatingAdjoint'))\n"
        "print(str(jax.make_jaxpr(grad)(lv.inputs)).count('callback'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "EQX_ON_ERROR": "nan"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout.strip().splitlines()[-2:] == ["True", "0"], done.stderr


def callback_sites(fn, *args) -> int:
    """How many host callbacks the jaxpr of `fn(*args)` holds, nested jaxprs included."""

    def count(jaxpr):
        n = 0
        for eqn in jaxpr.eqns:
            n += "callback" in eqn.primitive.name
            for param in eqn.params.values():
                for sub in param if isinstance(param, (tuple, list)) else (param,):
                    inner = sub if hasattr(sub, "eqns") else getattr(sub, "jaxpr", None)
                    n += count(inner) if hasattr(inner, "eqns") else 0
        return n

    return count(jax.make_jaxpr(fn)(*args).jaxpr)


@pytest.mark.parametrize("sensealg", ["auto", "InterpolatingAdjoint", "GaussAdjoint"])
def test_a_gradient_holds_few_host_callbacks(sensealg):
    """One jax.grad of Lotka-Volterra's loss: sciad's checks on p, the forward and the backward solve,
    the stability limit of a derivative through the steps ("auto" is one) and the chaos warning, diffrax's
    two on saveat (equinox's check holds two callbacks, its TPU fallback the second). None runs unless a
    check fires."""
    lv = sciad.problems.lotka_volterra()
    assert callback_sites(jax.grad(lambda p: lv.objective(p, sensealg)), lv.inputs) <= 13


# --- 2. NaN and inf in u0 and p are named, by leaf, before anything else fails -------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_p_under_an_eager_grad_names_the_leaf(bad):
    p = {"k": np.array(1.0), "c": np.array([0.0, bad])}
    with pytest.raises(
        ValueError,
        match=r"^p\['c'\] contains non-finite values \(NaN or inf\) \(first at index "
        r"\(1,\)\)|^p\['c'\] contains non-finite values \(NaN or inf\): pass finite",
    ):
        jax.grad(lambda p: total(sciad.solve(DECAY, p=p).us))(p)
    with pytest.raises(ValueError, match=r"^u0 contains non-finite values .* \(first at index \(0,\)\)"):
        jax.grad(lambda u0: total(sciad.solve(DECAY, u0=u0).us))(np.array([bad, 1.0]))


def test_non_finite_p_under_jit_names_the_leaf_before_the_step_limit():
    """NaN in p would also exhaust max_steps=2: the finite check is reported, naming the leaf."""
    p = {"k": np.array(np.nan), "c": np.zeros(2)}
    grad = jax.jit(jax.grad(lambda p: total(sciad.solve(DECAY, p=p, max_steps=2).us)))
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(grad(p))
    assert sciad.errors.summary(info.value).startswith(
        "SolveError: p['k'] contains non-finite values (NaN or inf): pass finite values"
    )


def test_non_finite_member_under_vmap_is_a_solve_error_naming_the_leaf():
    ks = jnp.array([1.0, jnp.inf])
    with pytest.raises(sciad.SolveError, match=r"^p\['k'\] contains non-finite values"):
        jax.vmap(lambda k: sciad.solve(DECAY, p={"k": k, "c": jnp.zeros(2)}).us)(ks)


# --- 3. sensealgs: what to pass instead ----------------------------------------------------------------


@pytest.mark.parametrize(
    "call, sensealg, message",
    [
        (
            sciad.solve,
            sciad.GaussAdjoint,
            "sensealg=sciad.GaussAdjoint is a class: pass an instance, sciad.GaussAdjoint()",
        ),
        (
            sciad.solve,
            sciad.QuadratureAdjoint,
            "sensealg=sciad.QuadratureAdjoint is a function: pass what it returns, sciad.QuadratureAdjoint()",
        ),
        (
            sciad.solve,
            dfx.RecursiveCheckpointAdjoint(),
            "sensealg=diffrax.RecursiveCheckpointAdjoint() is diffrax's; sciad's equivalent is sciad.DiscreteAdjoint()",
        ),
        (
            sciad.solve,
            dfx.DirectAdjoint(),
            "sensealg=diffrax.DirectAdjoint() is diffrax's; sciad's equivalent is sciad.DiscreteAdjoint()",
        ),
        (
            sciad.solve,
            dfx.BacksolveAdjoint(),
            "sensealg=diffrax.BacksolveAdjoint() is diffrax's; sciad's equivalent is sciad.BacksolveAdjoint()",
        ),
        (
            sciad.solve,
            dfx.ForwardMode(),
            "sensealg=diffrax.ForwardMode() is diffrax's; sciad's equivalent is sciad.ForwardDiffSensitivity()",
        ),
        (
            sciad.solve,
            dfx.ImplicitAdjoint(),
            "sensealg=diffrax.ImplicitAdjoint() is diffrax's; sciad's equivalent is "
            "sciad.steady_state(prob, sensealg=sciad.SteadyStateAdjoint())",
        ),
        (
            sciad.solve,
            dfx.RecursiveCheckpointAdjoint,
            "sensealg=diffrax.RecursiveCheckpointAdjoint is diffrax's; sciad's equivalent is sciad.DiscreteAdjoint()",
        ),
        (
            sciad.solve,
            "GausAdjoint",
            "unknown sensealg 'GausAdjoint' (did you mean 'GaussAdjoint'?); pass one of ['BacksolveAdjoint'",
        ),
        (
            sciad.solve,
            "interpolatingadjoint",
            "unknown sensealg 'interpolatingadjoint' (did you mean 'InterpolatingAdjoint'?)",
        ),
        (
            sciad.solve,
            sciad.SteadyStateAdjoint(),
            "sensealg=sciad.SteadyStateAdjoint() differentiates a steady state: pass it to sciad.steady_state",
        ),
        (
            sciad.steady_state,
            sciad.SteadyStateAdjoint,
            "sensealg=sciad.SteadyStateAdjoint is a class: pass an instance, sciad.SteadyStateAdjoint()",
        ),
        (
            sciad.steady_state,
            dfx.ImplicitAdjoint(),
            "sensealg=diffrax.ImplicitAdjoint() is diffrax's; sciad's equivalent is sciad.SteadyStateAdjoint()",
        ),
        (
            sciad.steady_state,
            dfx.RecursiveCheckpointAdjoint(),
            "sensealg=diffrax.RecursiveCheckpointAdjoint() is diffrax's; pass sciad.SteadyStateAdjoint()",
        ),
        (
            sciad.steady_state,
            sciad.GaussAdjoint,
            "steady_state takes sensealg=SteadyStateAdjoint(...) (the implicit function theorem), got GaussAdjoint",
        ),
    ],
)
def test_the_sensealg_to_pass_is_named(call, sensealg, message):
    with pytest.raises(ValueError) as info:
        call(DECAY, sensealg=sensealg)
    assert str(info.value).startswith(message)


def test_quadrature_adjoint_by_name_is_accepted():
    def solve(sensealg):  # compiled whole (eagerly, a program per operation)
        return jax.jit(lambda: sciad.solve(DECAY, sensealg=sensealg).us)()

    np.testing.assert_array_equal(solve("QuadratureAdjoint"), solve(sciad.QuadratureAdjoint()))
    assert sciad.adjoints._registry.resolve("QuadratureAdjoint(checkpointing=True)") == sciad.QuadratureAdjoint(
        checkpointing=True
    )


# --- 4. integrands that do not return floats, or cannot be called as g(u, p, t) ------------------------


@pytest.mark.parametrize(
    "g, message",
    [
        (lambda u, p, t: 3, "got a Python int (3): return a float array, e.g. jnp.asarray(3.0)"),
        (lambda u, p, t: "energy", "got a Python str ('energy'): return a float array"),
        (lambda u, p, t: jnp.sum(u > 0), "got an array of shape () and dtype"),
    ],
)
def test_integrand_that_does_not_return_floats_is_named(g, message):
    with pytest.raises(ValueError) as info:
        sciad.solve(DECAY, integrand=g)
    assert str(info.value).startswith("integrand g(u, p, t) must return a float scalar or a PyTree of float arrays, ")
    assert message in str(info.value)


def test_integrand_with_the_wrong_signature_is_named():
    with pytest.raises(
        TypeError,
        match=r"^integrand g\(u, p, t\) failed when traced .* takes 2 positional "
        r"arguments but 3 were given.*it must take \(u, p, t\)",
    ) as info:
        sciad.solve(DECAY, integrand=lambda u, p: u[0])
    assert isinstance(info.value.__cause__, TypeError)
    with pytest.raises(TypeError, match=r"^integrand g\(u, p, t\) failed when traced"):
        sciad.solve(DECAY, integrand=lambda u, p, t: u["x"])


# --- 5. a vector field in diffrax's order f(t, y, args) ------------------------------------------------

HINT = (
    "sciad's vector field is f(u, p, t) (state first), diffrax's is f(t, y, args): reorder the arguments, "
    "e.g. lambda u, p, t: f(t, u, p)"
)


def test_diffrax_ordered_vector_field_is_named():
    def decay(t, y, args):
        return -args["k"] * y

    with pytest.raises(TypeError) as info:
        sciad.ODEProblem(decay, np.array([1.0, 2.0]), (0.0, 1.0), {"k": np.array(1.0)})
    assert str(info.value).startswith("f(u, p, t) failed when traced")
    assert str(info.value).endswith(HINT)
    assert "does not support string indexing" in str(info.value.__cause__)  # the original, chained
    # no time-like name, but f(t0, u0, p) has u0's structure: the wrong structure is named with the hint
    with pytest.raises(ValueError, match=r"^f\(u, p, t\) returns .* they must match") as info:
        sciad.ODEProblem(
            lambda a, b, c: jax.tree.map(lambda y: -c * y, b), {"x": np.ones(2)}, (0.0, 1.0), np.array(2.0)
        )
    assert str(info.value).endswith(HINT)


def test_a_state_first_vector_field_with_a_bug_gets_no_diffrax_hint():
    with pytest.raises(TypeError) as info:
        sciad.ODEProblem(lambda u, p, t: -p["k"] * u, np.ones(2), (0.0, 1.0), np.ones(1))
    assert "diffrax" not in str(info.value) and info.value.__cause__ is not None


# --- 6. preset event times outside tspan ----------------------------------------------------------------


def dosed(times, **options):
    return sciad.solve(DECAY, callbacks=[sciad.PresetTimeCallback(times, lambda u, p, t: u + 1.0)], **options)


def test_preset_times_outside_tspan_are_named():
    with pytest.raises(
        ValueError,
        match=r"^callbacks\[0\]: PresetTimeCallback times \[1.5, -0.5\] lie outside "
        r"tspan \(0.0, 1.0\): drop them or widen tspan",
    ):
        dosed([0.5, 1.5, -0.5])
    with pytest.raises(
        ValueError,
        match=r"^callbacks\[0\]: PresetTimeCallback times \[1.5\] lie outside tspan "
        r"\(1.0, 0.0\)",
    ):
        dosed([0.5, 1.5], tspan=(1.0, 0.0))
    with pytest.raises(ValueError, match=r"PresetTimeCallback times \[2.0\] lie outside"):  # eager grad: primal times
        jax.grad(lambda ts: total(dosed(ts).us))(jnp.array([0.5, 2.0]))
    # t0 and t1 are inside: the same check on the concrete times, each solve compiled whole (eagerly, a solve with
    # callbacks compiles a small program per operation)
    jax.jit(lambda: dosed([0.0, 0.5, 1.0]).us)()
    jax.jit(lambda: dosed([1.0, 0.5, 0.0], tspan=(1.0, 0.0)).us)()


def test_traced_preset_times_outside_tspan_fail_when_the_solve_runs():
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(jax.jit(lambda ts: dosed(ts).us)(jnp.array([0.5, 1.5])))
    assert sciad.errors.summary(info.value) == (
        "SolveError: callbacks[0]: PresetTimeCallback times lie outside tspan "
        "(0.0, 1.0): drop them or widen tspan (a time outside it would never "
        "fire)"
    )


# --- an option of another problem kind is named, with the kind's own ---------------------------------------


NOISY_DECAY = sciad.SDEProblem(lambda u, p, t: -u, lambda u, p, t: 0.1 * u, jnp.ones(2), (0.0, 1.0))


@pytest.mark.parametrize(
    "prob, option",
    [
        (DECAY, {"key": jax.random.key(0)}),
        (DECAY, {"brownian": object()}),
        (NOISY_DECAY, {"dense": True}),
        (NOISY_DECAY, {"jacobian": "sparse"}),
        (NOISY_DECAY, {"adjoint_rtol": 1e-8}),
    ],
)
def test_an_option_of_another_problem_kind_is_named(prob, option):
    (name,) = option
    with pytest.raises(ValueError, match=f"{type(prob).__name__} solves take no {name}= \\(their own options: "):
        sciad.solve(prob, **option)
