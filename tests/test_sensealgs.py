"""The correctness matrix: every sensealg × every installed AD engine.

Gradients of L = Σ u(t_k) (Lotka–Volterra) and L = Σ u(t_k)² (a small neural
ODE) with respect to u0 and p, taken with `jax.grad` under `jax.jit` at
rtol = atol = 1e-10 in float64, agree with `DiscreteAdjoint` and with central
finite differences of the loss to 1e-5 relative.

Foreign engines (torch, autograd, finite differences) run every product of
f through a host callback, so they use a shorter horizon; the JAX engines
(jax-*, enzyme) use the full one.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
import sciad.ad as ad
import sciad.adjoints._base as adjoints_base
from helpers import (
    HOST_ENGINES,
    SENSEALGS,
    WITH_ENGINE,
    assert_agrees,
    central_differences,
    engine_matrix,
    reference_for,
    slow_except,
)
from sciad.adjoints import (
    BacksolveAdjoint,
    DiscreteAdjoint,
    ForwardDiffSensitivity,
    ForwardSensitivity,
    GaussAdjoint,
    InterpolatingAdjoint,
)
from sciad.problems._lotka_volterra import lotka_volterra_rhs as lotka_volterra

RTOL = ATOL = 1e-10
FOREIGN_TOL = 1e-8  # foreign engines: short horizon, tolerance 1e-8 (still 1e-5 agreement)
AGREEMENT = 1e-5
FOREIGN = set(HOST_ENGINES)


# --- problems -----------------------------------------------------------------


HIDDEN = 8


def neural_ode(u, p, t):
    """2 → 8 (tanh) → 2, parameters flattened into p: W1 (8, 2), b1 (8,), W2 (2, 8), b2 (2,)."""
    xp = ad.namespace(u, p)
    w1 = xp.reshape(p[: 2 * HIDDEN], (HIDDEN, 2))
    b1 = p[2 * HIDDEN : 3 * HIDDEN]
    w2 = xp.reshape(p[3 * HIDDEN : 5 * HIDDEN], (2, HIDDEN))
    b2 = p[5 * HIDDEN :]
    h = xp.tanh(xp.matmul(w1, u) + b1)
    return xp.matmul(w2, h) + b2


def _neural_params():
    rng = np.random.default_rng(0)
    return rng.normal(scale=0.5, size=5 * HIDDEN + 2)


def case(name: str, short: bool):
    """(problem, saveat, loss of us) for a named test problem; `short` for foreign engines."""
    if name == "lotka-volterra":
        t1 = 1.0 if short else 10.0
        prob = sciad.ODEProblem(lotka_volterra, np.array([1.0, 1.0]), (0.0, t1), np.array([1.5, 1.0, 3.0, 1.0]))
        return prob, np.linspace(0.0, t1, round(10 * t1) + 1), jnp.sum
    t1 = 0.5 if short else 3.0
    prob = sciad.ODEProblem(neural_ode, np.array([0.5, -0.3]), (0.0, t1), _neural_params())
    return prob, np.linspace(0.0, t1, round(10 * t1) + 1), lambda us: jnp.sum(us**2)


def loss_fn(name, short, sensealg, saveat=None, tol=None):
    prob, ts, g = case(name, short)
    ts = ts if saveat is None else saveat
    tol = tol or (FOREIGN_TOL if short else RTOL)

    def loss(u0, p):
        return g(sciad.solve(prob, u0=u0, p=p, saveat=ts, rtol=tol, atol=tol, sensealg=sensealg).us)

    return prob, loss


def gradient(name, short, sensealg, saveat=None):
    prob, loss = loss_fn(name, short, sensealg, saveat)
    g_u0, g_p = jax.jit(jax.grad(loss, argnums=(0, 1)))(prob.u0, prob.p)
    return np.concatenate([g_u0, g_p])


@functools.cache
def discrete_reference(name, short, saveat=None):
    return gradient(name, short, DiscreteAdjoint(), None if saveat is None else np.asarray(saveat))


@functools.cache
def finite_difference_reference(name, short):
    """Central differences of the loss (rtol = atol = 1e-10 always), relative step 1e-5."""
    prob, loss = loss_fn(name, short, DiscreteAdjoint(), tol=RTOL)
    return np.concatenate(central_differences(jax.jit(lambda x: loss(*x)), (prob.u0, prob.p)))


# --- the matrix -----------------------------------------------------------------

PROBLEMS = ["lotka-volterra", "neural-ode"]


@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize(
    "short",
    [False, pytest.param(True, marks=pytest.mark.slow)],  # short: foreign engines'
    ids=["full", "short"],
)
def test_discrete_adjoint_matches_finite_differences(problem, short):
    assert_agrees(
        discrete_reference(problem, short),
        finite_difference_reference(problem, short),
        f"DiscreteAdjoint vs finite differences ({problem}, short={short})",
        AGREEMENT,
    )


@pytest.mark.parametrize("problem", PROBLEMS)
def test_forward_diff_sensitivity(problem):
    grad = gradient(problem, False, ForwardDiffSensitivity())
    assert_agrees(grad, discrete_reference(problem, False), "vs DiscreteAdjoint", AGREEMENT)
    assert_agrees(grad, finite_difference_reference(problem, False), "vs finite differences", AGREEMENT)


SLOW_ENGINES = FOREIGN | {"enzyme"}  # host callbacks; Enzyme compiles each product slowly


def check_gradient(problem, sensealg, engine):
    short = engine in FOREIGN
    grad = gradient(problem, short, SENSEALGS[sensealg](engine))
    assert np.all(np.isfinite(grad))
    assert_agrees(grad, discrete_reference(problem, short), "vs DiscreteAdjoint", AGREEMENT)
    assert_agrees(grad, finite_difference_reference(problem, short), "vs finite differences", AGREEMENT)


# the default run takes each sensealg on one of the two problems (each engine on both)
@pytest.mark.parametrize("sensealg, engine", engine_matrix(WITH_ENGINE, SLOW_ENGINES, fast=WITH_ENGINE[0::2]))
def test_gradient_lotka_volterra(sensealg, engine):
    check_gradient("lotka-volterra", sensealg, engine)


@pytest.mark.parametrize("sensealg, engine", engine_matrix(WITH_ENGINE, SLOW_ENGINES, fast=WITH_ENGINE[1::2]))
def test_gradient_neural_ode(sensealg, engine):
    """ForwardSensitivity on the neural ODE carries n + m = 44 columns."""
    check_gradient("neural-ode", sensealg, engine)


# --- jvp, vmap, checkpoints, saveat ------------------------------------------------

# every shared variant but the reference, and the options beyond theirs, with default engines
ALL_DEFAULT = {
    **{name: make() for name, make in SENSEALGS.items() if name != "DiscreteAdjoint"},
    "GaussAdjoint-checkpointing": GaussAdjoint(checkpointing=True),
    "BacksolveAdjoint-seminorm": BacksolveAdjoint(seminorm=True),
    "InterpolatingAdjoint-seminorm": InterpolatingAdjoint(seminorm=True),
    "DiscreteAdjoint-recursive": DiscreteAdjoint(stored_steps=8),
}


# the options beyond the shared variants' run with the slow tests
FAST_DEFAULTS = [
    "ForwardDiffSensitivity",
    "ForwardSensitivity",
    "BacksolveAdjoint",
    "InterpolatingAdjoint",
    "InterpolatingAdjoint-checkpointing",
    "GaussAdjoint",
]

DU0, DP = np.array([0.3, -0.7]), np.array([0.1, 0.2, -0.5, 0.4])


@functools.cache
def _jvp(sensealg):
    """Directional derivative of the (short) Lotka–Volterra loss along (DU0, DP)."""
    prob, loss = loss_fn("lotka-volterra", True, sensealg)
    return jax.jit(lambda u0, p: jax.jvp(loss, (u0, p), (DU0, DP))[1])(prob.u0, prob.p)


@functools.cache
def _directional_difference() -> float:
    """The same directional derivative by central differences of the compiled solve (no rule of any sensealg)."""
    prob, loss = loss_fn("lotka-volterra", True, DiscreteAdjoint())
    along = jax.jit(lambda e: loss(prob.u0 + e * DU0, prob.p + e * DP))
    return float(central_differences(along, np.zeros(())))


# the continuous adjoints share one pushforward (forward mode through the solver): one of them by default
# (ForwardDiffSensitivity's jvp is jax.jvp through diffrax's steps: with the slow tests)
@pytest.mark.parametrize(
    "sensealg", slow_except(list(ALL_DEFAULT), fast=["ForwardSensitivity", "InterpolatingAdjoint"])
)
def test_jvp_matches_central_differences(sensealg):
    expected = _directional_difference()
    np.testing.assert_allclose(_jvp(ALL_DEFAULT[sensealg]), expected, rtol=AGREEMENT)
    # forward and reverse agree: the gradient's inner product with the direction
    np.testing.assert_allclose(
        discrete_reference("lotka-volterra", True) @ np.concatenate([DU0, DP]), expected, rtol=AGREEMENT
    )


def test_forward_sensitivity_seminorm_is_the_discrete_derivative():
    """S out of the error control: the forward solve's steps, and with an explicit solver the sensitivities
    are the derivative of the discrete solution, forward mode through the steps to rounding (at rtol = 1e-6,
    where the continuous gradients differ from it by about 1e-6)."""
    prob, ts, g = case("lotka-volterra", False)

    def grad(sensealg):
        def loss(u0, p):
            return g(sciad.solve(prob, u0=u0, p=p, saveat=ts, rtol=1e-6, atol=1e-6, sensealg=sensealg).us)

        return np.concatenate(jax.jit(jax.grad(loss, argnums=(0, 1)))(prob.u0, prob.p))

    discrete = grad(ForwardDiffSensitivity())
    np.testing.assert_allclose(grad(ForwardSensitivity(seminorm=True)), discrete, rtol=1e-10)
    assert not np.allclose(grad(ForwardSensitivity()), discrete, rtol=1e-10)


def test_jvp_with_a_foreign_engine():
    """ForwardSensitivity's tangent goes through the engine's pushforward: central differences' directional
    derivative."""
    if "torch" not in ad.available():
        pytest.skip("torch is not installed")
    np.testing.assert_allclose(_jvp(ForwardSensitivity(jvp="torch")), _directional_difference(), rtol=AGREEMENT)


def test_vmap_of_gradient():
    prob, loss = loss_fn("lotka-volterra", True, InterpolatingAdjoint())
    ps = np.stack([prob.p, prob.p * 1.1, prob.p * 0.9])
    batched = jax.jit(jax.vmap(jax.grad(loss, argnums=1), in_axes=(None, 0)))(prob.u0, ps)
    _, reference = loss_fn("lotka-volterra", True, ForwardDiffSensitivity())
    one = jax.jit(jax.grad(reference, argnums=1))
    assert batched.shape == ps.shape
    for i, p in enumerate(ps):
        np.testing.assert_allclose(batched[i], one(prob.u0, p), rtol=AGREEMENT)


@pytest.mark.slow  # the default run has InterpolatingAdjoint's jvp and the vmap of its gradient
def test_jacfwd_and_jacrev_agree():
    prob, _ = loss_fn("lotka-volterra", True, None)

    def us(p):
        return sciad.solve(prob, p=p, saveat=[0.3, 0.6, 1.0], rtol=RTOL, atol=ATOL, sensealg=InterpolatingAdjoint()).us

    np.testing.assert_allclose(
        jax.jit(jax.jacfwd(us))(prob.p), jax.jit(jax.jacrev(us))(prob.p), rtol=AGREEMENT, atol=1e-8
    )


@pytest.mark.slow  # checkpointing=True runs in the default matrix; chosen checkpoints with the slow tests
@pytest.mark.parametrize("checkpoints", [[0.5], [0.15, 0.234, 0.95], np.linspace(0.0, 1.0, 7)])
def test_interpolating_adjoint_custom_checkpoints(checkpoints):
    sensealg = InterpolatingAdjoint(checkpointing=True, checkpoints=checkpoints)
    assert_agrees(
        gradient("lotka-volterra", True, sensealg),
        discrete_reference("lotka-volterra", True),
        f"checkpoints {checkpoints}",
        AGREEMENT,
    )


@pytest.mark.parametrize("make", slow_except([InterpolatingAdjoint, GaussAdjoint], fast=[]), ids=lambda c: c.__name__)
def test_checkpoints_by_step_count(make):
    """Two save points over the whole horizon: with a checkpoint every 2 accepted steps
    (interval_max_steps=4) the reverse pass re-solves tens of short intervals, unused
    checkpoints are zero-length intervals, and the gradient is unchanged."""
    saveat = (0.0, 10.0)
    grad = gradient("lotka-volterra", False, make(checkpointing=True, interval_max_steps=4), np.asarray(saveat))
    assert_agrees(grad, discrete_reference("lotka-volterra", False, saveat), "a checkpoint every 2 steps", AGREEMENT)


PAST_THE_CAP = {
    "InterpolatingAdjoint": InterpolatingAdjoint(),
    "GaussAdjoint": GaussAdjoint(),
    "DiscreteAdjoint": DiscreteAdjoint(),
}


STORED = 128  # the steps stored (sciad.adjoints.STORED_STEPS, 4096) lowered so that a short solve runs past them


@functools.cache
def _oscillator_gradients(sensealg):
    """∂/∂p of Σ u(t_k)² for a lightly damped oscillator over t ≤ 40 (about 320 steps) at p and 1.1 p, under
    vmap, and the steps each took."""
    prob = sciad.ODEProblem(
        lambda u, p, t: jnp.stack([u[1], -p[0] * u[0] - p[1] * u[1]]),
        np.array([1.0, 0.0]),
        (0.0, 40.0),
        np.array([1.0, 0.01]),
    )

    def loss(p):
        sol = sciad.solve(prob, p=p, saveat=np.linspace(0.0, 40.0, 9), sensealg=sensealg, rtol=1e-8, atol=1e-8)
        return jnp.sum(sol.us**2), sol.stats["steps"]

    return jax.jit(jax.vmap(jax.grad(loss, has_aux=True)))(np.stack([prob.p, 1.1 * prob.p]))


@pytest.mark.parametrize("name", slow_except(list(PAST_THE_CAP), fast=["InterpolatingAdjoint"]))
def test_a_solve_past_the_stored_steps_is_recomputed_right(name, monkeypatch):
    """With 128 steps stored, a solve of about 320 steps: the storing sensealgs recompute from checkpoints
    (DiscreteAdjoint in three segments), and agree with forward mode, under vmap too."""
    monkeypatch.setattr(adjoints_base, "STORED_STEPS", STORED)
    reference, _ = _oscillator_gradients(ForwardDiffSensitivity())
    gradients, steps = _oscillator_gradients(PAST_THE_CAP[name])
    assert np.all(steps > 2 * STORED), steps
    assert_agrees(gradients, reference, f"{name} vs ForwardDiffSensitivity", AGREEMENT)


@pytest.mark.slow
def test_checkpointed_memory_grows_by_checkpoints_not_dense_steps():
    """XLA's buffers for the gradient as max_steps grows 10×: with checkpoints by step
    count each extra step allowed costs a share of one checkpoint (t and u every k
    steps), not a stored dense step; InterpolatingAdjoint without checkpoints stores at
    most STORED_STEPS dense steps and past them re-solves with such checkpoints."""
    prob, ts, _ = case("lotka-volterra", False)

    def growth(sensealg):
        def temp_bytes(max_steps):
            def loss(p):
                return jnp.sum(sciad.solve(prob, p=p, saveat=ts[[0, -1]], max_steps=max_steps, sensealg=sensealg).us)

            stats = jax.jit(jax.grad(loss)).lower(prob.p).compile().memory_analysis()
            if stats is None:
                pytest.skip("this backend reports no memory analysis")
            return stats.temp_size_in_bytes

        return temp_bytes(40960) - temp_bytes(4096)

    dense_steps = (40960 - 4096) * 8 * 2 * 8  # Tsit5's dense step: 7 stages and y, 2 states, float64
    for sensealg in (InterpolatingAdjoint(), InterpolatingAdjoint(checkpointing=True)):
        assert growth(sensealg) < dense_steps / 50


@pytest.mark.parametrize("sensealg", slow_except(list(ALL_DEFAULT), fast=["InterpolatingAdjoint-checkpointing"]))
def test_saveat_without_t0_and_t1(sensealg):
    """The loss sees u at interior times only: λ starts at 0 at t1, and the
    gradient wrt u0 is transported back over [t0, first saveat]."""
    saveat = (0.25, 0.5, 0.8, 0.95)
    grad = gradient("lotka-volterra", True, ALL_DEFAULT[sensealg], np.asarray(saveat))
    reference = gradient(
        "lotka-volterra", True, SENSEALGS[reference_for(sensealg.partition("-")[0])](), np.asarray(saveat)
    )
    assert_agrees(grad, reference, "interior saveat", AGREEMENT)


# --- what is not supported raises ---------------------------------------------------


def test_unknown_engine_name():
    for name in WITH_ENGINE:
        with pytest.raises(ValueError, match="unknown AD backend 'no-such-engine'"):
            SENSEALGS[name]("no-such-engine")


def test_engine_must_be_a_backend():
    with pytest.raises((TypeError, ValueError), match="backend"):
        InterpolatingAdjoint(vjp=42)


def test_checkpoints_need_checkpointing():
    with pytest.raises(ValueError, match="needs checkpointing=True"):
        InterpolatingAdjoint(checkpoints=[1.0])


def test_stored_steps_must_be_positive():
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match=r"DiscreteAdjoint\(stored_steps=...\) must be a positive int"):
            DiscreteAdjoint(stored_steps=bad)


def test_checkpoints_outside_tspan():
    prob, loss = loss_fn("lotka-volterra", True, InterpolatingAdjoint(checkpointing=True, checkpoints=[5.0]))
    with pytest.raises(ValueError, match="checkpoints must lie inside tspan"):
        jax.grad(loss, argnums=1)(prob.u0, prob.p)


def test_sensealg_class_instead_of_instance():
    prob, _, _ = case("lotka-volterra", True)
    with pytest.raises(
        ValueError,
        match=r"sensealg=sciad.InterpolatingAdjoint is a class: pass an instance, "
        r"sciad.InterpolatingAdjoint\(\)",
    ):
        sciad.solve(prob, sensealg=InterpolatingAdjoint)
