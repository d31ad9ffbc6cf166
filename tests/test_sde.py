"""SDE solves (`sciad.SDEProblem`): pathwise solutions against closed forms given the Brownian path,
every sensealg's pathwise gradient against the closed form's derivative and against finite differences
on the same key, the Brownian path itself, composition (jit, vmap over keys, PyTrees, integrals,
Hessians, float32) and the errors at the boundary."""

import functools

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from helpers import reference_for
from sciad._sde_solvers import SDE_SOLVERS

MU, SIGMA, U0, T = 0.5, 0.3, 1.0, 1.0
KEY = jax.random.key(0)
DT = 2.0**-8
P = np.array([MU, SIGMA])


def drift(u, p, t):
    return p[0] * u


def diffusion(u, p, t):
    return p[1] * u


GBM = {
    calculus: sciad.SDEProblem(drift, diffusion, np.array([U0]), (0.0, T), P, calculus=calculus)
    for calculus in ("ito", "stratonovich")
}


def gbm_exact(calculus, p, W):
    """u(T) of geometric Brownian motion given W_T, and its derivative in (μ, σ)."""
    mu, sigma = p
    shift = -(sigma**2) / 2 if calculus == "ito" else 0.0
    u = U0 * np.exp((mu + shift) * T + sigma * W)
    return u, np.array([u * T, u * ((-sigma * T if calculus == "ito" else 0.0) + W)])


@jax.jit
def increment(path, s, t):
    """W_t - W_s on a Brownian path: one compiled program per kind of path (an eager `evaluate` compiles
    its own at each call)."""
    return path.evaluate(s, t)


def path_of(key, dt, dtype=np.dtype("float64")):
    """The Brownian path a solve on [0, T] with `key` and step dt draws (the brownian path test checks a solve's
    against it)."""
    return sciad.BrownianPath(key, 0.0, dt, int(round(T / dt)), (1,), dtype)


@functools.cache
def brownian_at_T(dt=DT):
    """W_T on KEY's path at step dt (the solves' own path), once per dt in a process."""
    return float(increment(path_of(KEY, dt), 0.0, T)[0])


@pytest.mark.parametrize("calculus", ["ito", "stratonovich"])
@pytest.mark.parametrize("solver", list(SDE_SOLVERS))
def test_geometric_brownian_motion_matches_its_closed_form_on_the_path(calculus, solver):
    """Every solver on either calculus (the other calculus by the drift correction), to its strong order."""

    def run():
        sol = sciad.solve(GBM[calculus], key=KEY, dt0=DT, solver=solver, sensealg="DiscreteAdjoint")
        return sol.us[-1, 0], sol.brownian.evaluate(0.0, T)[0], sol.ts, sol.stats["steps"]

    u, W, ts, steps = jax.jit(run)()  # one compiled program (eagerly, one per operation besides the loop)
    exact, _ = gbm_exact(calculus, P, float(W))
    tolerance = 2e-2 if solver == "euler" else 2e-3  # strong order 1/2 against 1 at dt = 2^-8
    assert abs(float(u) - exact) < tolerance * exact
    assert ts.tolist() == [0.0, T] and int(steps) == 256


ALL = [
    "ForwardDiffSensitivity",
    "ForwardSensitivity",
    "DiscreteAdjoint",
    "BacksolveAdjoint",
    "InterpolatingAdjoint",
    "GaussAdjoint",
    "ReversibleAdjoint",
]
EXACT = [
    "ForwardDiffSensitivity",
    "ForwardSensitivity",
    "DiscreteAdjoint",
    "ReversibleAdjoint",
]  # the steps' derivative
# every sensealg with every solver it serves; the default run takes one solver per sensealg, the slow run the rest
FAST = {
    "ForwardDiffSensitivity": "milstein",
    "ForwardSensitivity": "heun",
    "DiscreteAdjoint": "euler",
    "BacksolveAdjoint": "reversible_heun",
    "InterpolatingAdjoint": "milstein",
    "GaussAdjoint": "heun",
    "ReversibleAdjoint": "reversible_heun",
}
CASES = [
    pytest.param(name, solver, marks=[] if FAST[name] == solver else [pytest.mark.slow])
    for name in ALL
    for solver in (
        ["reversible_heun"] if name == "ReversibleAdjoint" else ["milstein", "heun", "reversible_heun", "euler"]
    )
]


def final(p, calculus, solver, sensealg, key=KEY, dt=DT):
    return sciad.solve(GBM[calculus], p=p, key=key, dt0=dt, solver=solver, sensealg=sensealg).us[-1, 0]


# one program per case (the key traced, dt static), shared by the module
FINAL = jax.jit(final, static_argnums=(1, 2, 3, 5))
GRAD_FINAL = jax.jit(jax.grad(final), static_argnums=(1, 2, 3, 5))
HESSIAN_FINAL = jax.jit(jax.hessian(final), static_argnums=(1, 2, 3, 5))


@pytest.mark.parametrize("name,solver", CASES)
def test_pathwise_gradients_match_the_closed_form_and_the_steps(name, solver):
    """Each sensealg's gradient of u(T) in (μ, σ) on one path: against the closed form's derivative
    (to the solver's strong order) and, for those exact for the steps, against the steps' derivative
    (forward mode through them, `reference_for`: DiscreteAdjoint for ForwardDiffSensitivity itself) to
    rounding; the continuous adjoints against it to their own discretisation error."""
    calculus, grad = "ito", GRAD_FINAL
    g = np.asarray(grad(P, calculus, solver, name))
    _, exact = gbm_exact(calculus, P, brownian_at_T())
    tolerance = 3e-2 if solver == "euler" else 6e-3
    np.testing.assert_allclose(g, exact, rtol=tolerance, atol=tolerance * abs(exact).max())
    discrete = np.asarray(grad(P, calculus, solver, reference_for(name)))
    if name in EXACT:
        np.testing.assert_allclose(g, discrete, rtol=1e-9, atol=1e-12)
    else:
        np.testing.assert_allclose(g, discrete, rtol=2 * tolerance)  # both within tolerance of the closed form


@pytest.mark.parametrize(
    "sensealg,solver",
    [
        (sciad.ReversibleAdjoint(vjp="jax-forward"), "reversible_heun"),
        (sciad.InterpolatingAdjoint(vjp="jax-transpose"), "milstein"),
        (sciad.ForwardSensitivity(jvp="jax-reverse"), "heun"),
    ],
)
def test_engines_give_the_same_products(sensealg, solver):
    """Another engine's products give the default engine's gradient: on the pathwise test's problem and
    solver for the sensealg (its program gives the default's)."""
    default = sciad.adjoints.parse(type(sensealg).__name__)
    g = GRAD_FINAL(P, "ito", solver, sensealg)
    np.testing.assert_allclose(g, GRAD_FINAL(P, "ito", solver, default), rtol=1e-10)


def test_discrete_derivative_matches_finite_differences_on_the_same_key():
    h = 1e-6
    g = GRAD_FINAL(P, "ito", "milstein", "DiscreteAdjoint")
    fd = [
        (
            FINAL(P + h * e, "ito", "milstein", "DiscreteAdjoint")
            - FINAL(P - h * e, "ito", "milstein", "DiscreteAdjoint")
        )
        / (2 * h)
        for e in np.eye(2)
    ]
    np.testing.assert_allclose(g, fd, rtol=1e-7)


@pytest.mark.parametrize("name", ["InterpolatingAdjoint", "BacksolveAdjoint", "GaussAdjoint"])
def test_continuous_adjoints_converge_to_the_pathwise_derivative(name):
    """Halving dt (on the same Brownian motion: the finer path refines the coarser one in law, so
    compare each against the closed form on its own path) shrinks the error."""
    errors = []
    for dt in (2.0**-5, 2.0**-9):
        g = np.asarray(GRAD_FINAL(P, "stratonovich", "heun", name, KEY, dt))
        errors.append(np.max(np.abs(g - gbm_exact("stratonovich", P, brownian_at_T(dt))[1])))
    assert errors[1] < errors[0] / 4, errors


def ornstein_uhlenbeck(theta, sigma, increments, dt):
    """u(T) of du = -θ u dt + σ dW, u0 = 1, given the increments (the stochastic integral ∫ e^{-θ(T-s)} dW by
    the midpoint rule: the integrand is deterministic) and its derivatives in θ and σ."""
    s = (np.arange(len(increments)) + 0.5) * dt
    weights = np.exp(-theta * (T - s))
    integral = weights @ increments
    u = np.exp(-theta * T) + sigma * integral
    d_theta = -T * np.exp(-theta * T) - sigma * ((T - s) * weights) @ increments
    return u, np.array([d_theta, integral])


@pytest.mark.parametrize(
    "name,solver",
    [
        ("DiscreteAdjoint", "euler"),
        ("ReversibleAdjoint", "reversible_heun"),
        ("InterpolatingAdjoint", "milstein"),
        ("GaussAdjoint", "heun"),
    ],
)
def test_ornstein_uhlenbeck_with_its_stochastic_integral(name, solver):
    ou = sciad.SDEProblem(
        lambda u, p, t: -p[0] * u, lambda u, p, t: p[1] + 0 * u, np.array([1.0]), (0.0, T), np.array([0.7, 0.4])
    )

    def run(p):
        sol = sciad.solve(ou, p=p, key=KEY, dt0=DT, solver=solver, sensealg=name)
        return sol.us[-1, 0], sol.brownian

    (u, path), g = jax.jit(jax.value_and_grad(run, has_aux=True))(ou.p)
    exact, d_exact = ornstein_uhlenbeck(0.7, 0.4, np.asarray(path.increments())[:, 0], DT)
    assert abs(float(u) - exact) < 2e-3
    np.testing.assert_allclose(g, d_exact, rtol=5e-3, atol=1e-3)


def test_reversible_and_backsolve_memory_is_flat_in_the_steps():
    """The compiled gradient's temporaries: the same for 100 and 1000 steps (ReversibleAdjoint reconstructs,
    BacksolveAdjoint re-solves), against DiscreteAdjoint's stored steps, which grow with them."""
    prob = sciad.SDEProblem(drift, diffusion, np.ones(8), (0.0, 1.0), P)

    def temporaries(name, solver, steps):
        def loss(p):
            return sciad.solve(prob, p=p, key=KEY, dt0=1 / steps, solver=solver, sensealg=name).us[-1].sum()

        return jax.jit(jax.grad(loss)).lower(P).compile().memory_analysis().temp_size_in_bytes

    for name, solver in (("ReversibleAdjoint", "reversible_heun"), ("BacksolveAdjoint", "heun")):
        assert temporaries(name, solver, 1000) == temporaries(name, solver, 100), name
    assert temporaries("DiscreteAdjoint", "euler", 1000) > 2 * temporaries("DiscreteAdjoint", "euler", 100)


def test_brownian_path_is_exact_reusable_and_checkable():
    sol = sciad.solve(GBM["ito"], key=KEY, dt0=0.1, saveat=[0.0, 0.5, 1.0], solver="euler")
    path = sol.brownian
    increments = np.asarray(path.increments())
    assert increments.shape == (10, 1)
    np.testing.assert_array_equal(path_of(KEY, 0.1).increments(), increments)  # the path `path_of` builds
    # path.evaluate by `increment`: one compiled program for every (s, t) (an eager evaluate compiles one per call)
    np.testing.assert_allclose(increment(path, 0.0, 1.0), increments.sum(0), rtol=1e-12)
    np.testing.assert_allclose(increment(path, 0.2, 0.5), increments[2:5].sum(0), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(increment(path, 0.5, 0.2), -increments[2:5].sum(0), rtol=1e-12, atol=1e-14)  # reversed
    np.testing.assert_allclose(increment(path, 0.3, 0.4), increments[3], rtol=1e-12, atol=1e-14)  # one step: one draw
    np.testing.assert_allclose(path.increment(3), increments[3])
    # the Euler steps by hand on the same increments
    u = U0
    for dW in increments[:, 0]:
        u = u + MU * u * 0.1 + SIGMA * u * dW
    np.testing.assert_allclose(sol.us[-1, 0], u, rtol=1e-12)
    again = sciad.solve(GBM["ito"], brownian=path, dt0=0.1, saveat=[0.0, 0.5, 1.0], solver="euler")
    np.testing.assert_array_equal(again.us, sol.us)
    # off the grid: a bridge between the step's ends, deterministic in t
    inside = increment(path, 0.0, 0.25)
    assert np.all(np.isfinite(inside)) and np.array_equal(inside, increment(path, 0.0, 0.25))


def test_brownian_bridge_has_brownian_moments():
    def w_at(key):
        return sciad.BrownianPath(key, 0.0, 0.5, 4, (1,), np.dtype("float64")).evaluate(0.8)[0]

    w = np.asarray(jax.jit(jax.vmap(w_at))(jax.random.split(KEY, 20000)))  # one program (eagerly, one per operation)
    assert abs(w.mean()) < 0.03 and abs(w.var() - 0.8) < 0.03


def test_diffrax_virtual_brownian_tree_as_the_path():
    import diffrax

    tree = diffrax.VirtualBrownianTree(0.0, T, tol=1e-4, shape=(1,), key=jax.random.key(3))
    sol = sciad.solve(GBM["stratonovich"], brownian=tree, dt0=2.0**-6, solver="heun")
    exact, _ = gbm_exact("stratonovich", P, float(increment(tree, 0.0, T)[0]))
    assert abs(float(sol.us[-1, 0]) - exact) < 1e-3


@pytest.fixture
def optimised():
    """XLA's optimisations on for one test: with them off and the older fusion emitter (conftest's settings for
    fast compiles) XLA:CPU computes reverse mode through a diffrax.VirtualBrownianTree wrongly (diffrax's own
    RecursiveCheckpointAdjoint too: another gradient under jit than eagerly)."""
    jax.config.update("jax_disable_most_optimizations", False)
    yield
    jax.config.update("jax_disable_most_optimizations", True)


@pytest.mark.usefixtures("optimised")
@pytest.mark.parametrize("solver", ["heun", dfx.ReversibleHeun()], ids=["heun", "diffrax-ReversibleHeun"])
def test_adaptive_steps_on_a_virtual_brownian_tree(solver):
    """Without dt0 the steps are adaptive (PID control of the solver's error estimate) on a
    VirtualBrownianTree from the key, landing on the save times (traced under jit): the Itô problem solved in
    Stratonovich form (drift corrected) matches the closed form on the tree's path at every save time, its
    gradient in (μ, σ) the closed form's, and every sensealg that follows the steps ForwardDiffSensitivity's to
    rounding (the exact derivative of the same steps: DiscreteAdjoint's reverse pass, with reversible Heun's
    state stored beside y, ForwardSensitivity's engine products, reversible Heun's reconstruction by
    ReversibleAdjoint)."""
    ts = jnp.array([0.0, 0.37, T])

    def run(p, ts, sensealg):
        sol = sciad.solve(GBM["ito"], key=KEY, p=p, saveat=ts, solver=solver, sensealg=sensealg, rtol=1e-5, atol=1e-5)
        return sol.us[-1, 0], sol

    names = ("ForwardDiffSensitivity", "ForwardSensitivity", "DiscreteAdjoint")
    names += () if solver == "heun" else ("ReversibleAdjoint",)
    grads = {}
    for name in names:
        (u, sol), grads[name] = jax.jit(jax.value_and_grad(run, has_aux=True), static_argnums=2)(P, ts, name)
    assert 100 < int(sol.stats["steps"]) < 4096
    W = np.array([float(increment(sol.brownian, 0.0, t)[0]) for t in (0.37, T)])
    exact = U0 * np.exp((MU - SIGMA**2 / 2) * np.array([0.37, T]) + SIGMA * W)  # Itô GBM at t on the path
    np.testing.assert_allclose(np.asarray(sol.us[1:, 0]), exact, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(sol.ts), ts)
    np.testing.assert_allclose(grads["ForwardDiffSensitivity"], gbm_exact("ito", P, W[-1])[1], rtol=1e-3)
    for name in names[1:]:
        np.testing.assert_allclose(grads[name], grads["ForwardDiffSensitivity"], rtol=1e-11)


def test_checkpointed_adjoint_sde_matches_the_stored_one():
    """InterpolatingAdjoint(checkpointing=True) re-solves the forward path between checkpoints on the same
    Brownian path: the same adjoint SDE on the same grid as the stored path's, so the same gradient (the stored
    one the pathwise test's program: Milstein, the default for Itô's fixed steps)."""
    checkpointed = sciad.InterpolatingAdjoint(checkpointing=True, checkpoints=(0.25, 0.5))
    grads = [GRAD_FINAL(P, "ito", "milstein", s) for s in ("InterpolatingAdjoint", checkpointed)]
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12)


def test_backsolve_drift_check_on_sdes():
    """BacksolveAdjoint re-solves u backwards on the same path and checks it against the stored forward states:
    a mildly mean-reverting Ornstein–Uhlenbeck process passes (DiscreteAdjoint's gradient to the adjoint's
    discretisation error; forward mode through the steps), a strongly reverting one (e^{θ T} = e^{50} growth
    backwards) raises, naming why."""

    prob = sciad.SDEProblem(
        lambda u, p, t: -p[0] * u, lambda u, p, t: p[1] + 0 * u, np.array([1.0]), (0.0, 1.0), np.array([1.0, 0.3])
    )

    def loss(p, sensealg):
        return sciad.solve(prob, p=p, key=KEY, dt0=2**-8, sensealg=sensealg, solver="heun").us[-1, 0]

    # the mild case compiled (the steps' derivative by forward mode through them, `reference_for`)
    gradient = jax.jit(jax.grad(loss), static_argnums=1)
    mild = np.array([1.0, 0.3])
    np.testing.assert_allclose(
        gradient(mild, "BacksolveAdjoint"), gradient(mild, reference_for("BacksolveAdjoint")), rtol=1e-6
    )
    # the strong one eagerly: the SolveError itself from an eager gradient's backward pass
    with pytest.raises(sciad.SolveError, match="re-solved backwards in time departs from the forward solution"):
        jax.grad(loss)(np.array([50.0, 0.3]), "BacksolveAdjoint")


def test_traced_tspan_takes_adaptive_steps_and_refuses_time_derivatives():
    """A traced tspan (jit) takes adaptive steps: the same solution and gradient in p as the concrete one;
    a derivative in a time is refused (a Brownian path has none), as is a traced tspan with a fixed grid."""
    stratonovich = GBM["stratonovich"]

    def final(p, t1, sensealg="ForwardDiffSensitivity"):
        return sciad.solve(stratonovich, p=p, key=KEY, tspan=(0.0, t1), rtol=1e-4, atol=1e-4, sensealg=sensealg).us[
            -1, 0
        ]

    traced = jax.jit(jax.value_and_grad(final))(P, T)
    concrete = jax.jit(jax.value_and_grad(lambda p: final(p, T)))(P)  # T a Python float inside the program
    np.testing.assert_allclose(traced[0], concrete[0], rtol=1e-13)
    np.testing.assert_allclose(traced[1], concrete[1], rtol=1e-12)
    # refused as jit traces the gradient (eagerly, the forward solve was compiled and run before the refusal)
    with pytest.raises(ValueError, match="not differentiable in its times"):
        jax.jit(jax.grad(final, argnums=1))(P, T)
    with pytest.raises(ValueError, match="a traced tspan of an SDE solve takes adaptive steps"):
        jax.jit(lambda t1: sciad.solve(stratonovich, key=KEY, dt0=0.1, tspan=(0.0, t1)).us)(T)


def test_ensembles_by_vmap_over_keys_under_jit():
    keys = jax.random.split(KEY, 64)

    def mean_final(p, name, solver):
        single = jax.vmap(lambda k: final(p, "ito", solver, name, k, 2.0**-6))(keys)
        return jnp.mean(single), single

    # the mean, the paths' u(T) and the gradient of the mean from one compiled program per sensealg
    mean_and_grad = jax.jit(jax.value_and_grad(mean_final, has_aux=True), static_argnums=(1, 2))
    (mean, single), g = mean_and_grad(P, "DiscreteAdjoint", "milstein")
    for name in ("ReversibleAdjoint", "InterpolatingAdjoint", "ForwardDiffSensitivity"):
        solver = "reversible_heun" if name == "ReversibleAdjoint" else "milstein"
        np.testing.assert_allclose(mean_and_grad(P, name, solver)[1], g, rtol=5e-2)
    assert float(jnp.std(single)) > 0.1  # different paths
    # E[u(T)] = u0 e^{μT}
    assert abs(float(mean) - np.exp(MU * T)) < 3 * float(jnp.std(single)) / 8


def test_parameter_cotangents_of_paths_under_vmap_are_summed_in_the_loop():
    """Under `jax.vmap` over keys the exact sensealgs keep one cotangent of the shared parameters, summed as
    the backward pass goes, not one per path: XLA's temporaries of the gradient grow with the paths by far
    less than a parameter cotangent per path (m = 4,096 parameters, 2 states)."""
    weights = np.linspace(0.5, 1.5, 4096)
    prob = sciad.SDEProblem(lambda u, p, t: -u * jnp.mean(p), lambda u, p, t: 0.1 * u, np.ones(2), (0.0, 1.0), weights)

    def temporaries(name, solver, paths):
        keys = jax.random.split(KEY, paths)

        def loss(p):
            solve = lambda k: sciad.solve(prob, p=p, key=k, dt0=0.1, solver=solver, sensealg=name).us[-1]  # noqa: E731
            return jnp.sum(jax.vmap(solve)(keys))

        return jax.jit(jax.grad(loss)).lower(weights).compile().memory_analysis().temp_size_in_bytes

    per_path = 4096 * 8
    for name, solver in (("ReversibleAdjoint", "reversible_heun"), ("DiscreteAdjoint", "euler")):
        assert temporaries(name, solver, 64) - temporaries(name, solver, 8) < 56 * per_path / 4, name


def test_pytree_state_and_mlp_parameters():
    mlp = eqx.nn.MLP(2, 2, 8, 1, activation=jnp.tanh, key=jax.random.key(1), dtype=jnp.float64)

    def a(u, model, t):
        out = model(jnp.stack([u["x"], u["v"]]))
        return {"x": u["v"], "v": out[0] - u["x"]}

    def b(u, model, t):
        return {"x": 0.1 + 0 * u["x"], "v": 0.2 * jnp.tanh(u["v"])}

    prob = sciad.SDEProblem(a, b, {"x": 1.0, "v": 0.0}, (0.0, 1.0), mlp)

    def loss(model, name, solver):
        sol = sciad.solve(prob, p=model, key=KEY, dt0=0.05, saveat=np.linspace(0, 1, 5), solver=solver, sensealg=name)
        return jnp.sum(sol.us["x"] ** 2)

    grad = eqx.filter_jit(eqx.filter_grad(loss))  # the strings static
    reference = grad(mlp, "DiscreteAdjoint", "reversible_heun")
    g = grad(mlp, "ReversibleAdjoint", "reversible_heun")
    assert jax.tree.structure(g) == jax.tree.structure(reference)
    for x, y in zip(jax.tree.leaves(g), jax.tree.leaves(reference)):
        np.testing.assert_allclose(x, y, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize(
    "name,solver",
    [("ForwardDiffSensitivity", "euler"), ("BacksolveAdjoint", "heun"), ("ReversibleAdjoint", "reversible_heun")],
)
def test_general_noise(name, solver):
    """Two states, three Brownian motions: diffusion an (n, m) = (2, 3) matrix."""
    prob = sciad.SDEProblem(
        lambda u, p, t: -p[0] * u,
        lambda u, p, t: p[1] * jnp.outer(jnp.tanh(u), jnp.ones(3)),
        np.array([1.0, 0.5]),
        (0.0, 1.0),
        P,
        noise=3,
    )

    def loss(p, sensealg):
        return jnp.sum(sciad.solve(prob, p=p, key=KEY, dt0=DT, solver=solver, sensealg=sensealg).us[-1] ** 2)

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    reference = grad(P, reference_for(name))  # the steps' derivative
    np.testing.assert_allclose(grad(P, name), reference, rtol=1e-9 if name != "BacksolveAdjoint" else 1e-2)


@pytest.mark.parametrize(
    "name,solver", [("DiscreteAdjoint", "milstein"), ("ReversibleAdjoint", "reversible_heun"), ("GaussAdjoint", "heun")]
)
def test_integral_losses(name, solver):
    """∫ u dt of GBM (Stratonovich), against its Riemann sum on the path's grid and its derivatives."""

    def loss(p):
        sol = sciad.solve(
            GBM["stratonovich"], p=p, key=KEY, dt0=DT, solver=solver, sensealg=name, integrand=lambda u, p, t: u[0]
        )
        return sol.integral, sol.brownian

    (q, path), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(P)
    W = np.concatenate([[0.0], np.cumsum(np.asarray(path.increments())[:, 0])])
    t = np.arange(len(W)) * DT
    u = U0 * np.exp(MU * t + SIGMA * W)
    trapezoid = DT * (u.sum() - 0.5 * (u[0] + u[-1]))
    du = np.stack([u * t, u * W])
    d_trapezoid = DT * (du.sum(1) - 0.5 * (du[:, 0] + du[:, -1]))
    assert abs(float(q) - trapezoid) < 2e-3 * trapezoid
    np.testing.assert_allclose(g, d_trapezoid, rtol=1e-2)


@pytest.mark.parametrize(
    "name", ["ForwardDiffSensitivity", "DiscreteAdjoint", "ReversibleAdjoint", "InterpolatingAdjoint"]
)
def test_hessians_forward_over_reverse(name):
    """The Hessian of u(T) in (μ, σ) by forward mode over each sensealg's gradient (forward over forward mode for
    ForwardDiffSensitivity), on the pathwise test's problem and solver for the sensealg: the central differences
    of that gradient (the pathwise test's program, the steps' derivative for the exact sensealgs) to rounding,
    and the closed form's Hessian to the solver's strong order."""
    solver = FAST[name]
    H = HESSIAN_FINAL(P, "ito", solver, name)
    h = 1e-5
    differences = [
        (GRAD_FINAL(P + h * e, "ito", solver, name) - GRAD_FINAL(P - h * e, "ito", solver, name)) / (2 * h)
        for e in np.eye(2)
    ]
    np.testing.assert_allclose(H, np.stack(differences, axis=1), rtol=1e-8)
    W = brownian_at_T()
    u, _ = gbm_exact("ito", P, W)
    b = W - SIGMA * T  # ∂ log u / ∂σ (∂ log u / ∂μ = T)
    exact = u * np.array([[T * T, T * b], [T * b, b * b - T]])
    np.testing.assert_allclose(H, exact, rtol=5e-2, atol=1e-2)  # the closed form's, to the solver's strong order


def test_jvp_and_float32():
    tangent = jax.jit(
        lambda p, v: jax.jvp(lambda p: final(p, "ito", "reversible_heun", "ReversibleAdjoint"), (p,), (v,))
    )(P, np.array([1.0, 0.0]))
    # against reverse mode: the same sensealg's reconstruction (its jvp is forward mode through the steps)
    np.testing.assert_allclose(tangent[1], GRAD_FINAL(P, "ito", "reversible_heun", "ReversibleAdjoint")[0], rtol=1e-9)
    prob32 = sciad.SDEProblem(drift, diffusion, np.array([U0], np.float32), (0.0, T), P.astype(np.float32))

    def final32(p, name):
        sol = sciad.solve(prob32, p=p, key=KEY, dt0=DT, sensealg=name, solver="reversible_heun")
        return sol.us[-1, 0], sol.brownian

    grad32 = jax.jit(jax.grad(final32, has_aux=True), static_argnums=1)
    g, path = grad32(P.astype(np.float32), "ReversibleAdjoint")
    assert g.dtype == np.float32 and path.dtype == np.float32  # float32 increments: another path than float64's
    np.testing.assert_allclose(g, grad32(P.astype(np.float32), "ForwardDiffSensitivity")[0], rtol=1e-4)
    np.testing.assert_allclose(g, gbm_exact("ito", P, float(increment(path, 0.0, T)[0]))[1], rtol=1e-2)


def test_closures_over_differentiated_values():
    def loss(s, name, solver):
        prob = sciad.SDEProblem(drift, lambda u, p, t: s * u, np.array([U0]), (0.0, T), P)
        return sciad.solve(prob, key=KEY, dt0=DT, solver=solver, sensealg=name).us[-1, 0]

    grad = jax.jit(jax.grad(loss), static_argnums=(1, 2))
    reference = grad(SIGMA, "DiscreteAdjoint", "milstein")
    np.testing.assert_allclose(reference, gbm_exact("ito", P, brownian_at_T())[1][1], rtol=5e-3)
    for name, solver in (("ReversibleAdjoint", "reversible_heun"), ("InterpolatingAdjoint", "milstein")):
        np.testing.assert_allclose(grad(SIGMA, name, solver), reference, rtol=5e-3)


@pytest.mark.parametrize(
    "name,solver", [("DiscreteAdjoint", "heun"), ("ReversibleAdjoint", "reversible_heun"), ("GaussAdjoint", "heun")]
)
def test_save_times_traced_under_jit(name, solver):
    """Save times as a traced array inside the jitted loss (repeats included): the same saves and gradient as
    the same times given as NumPy; a traced time off the grid raises when the program runs."""

    def loss(p, ts):
        us = sciad.solve(GBM["stratonovich"], p=p, key=KEY, dt0=DT, saveat=ts, solver=solver, sensealg=name).us
        return jnp.sum(us[:, 0] ** 2 * jnp.arange(1.0, 1.0 + us.shape[0]))

    ts = np.array([0.25, 0.5, 0.5, T])
    traced = jax.jit(jax.value_and_grad(loss))(P, jnp.asarray(ts))
    # the NumPy times constants of their own program (compiled: an eager gradient compiles one per operation)
    concrete = jax.jit(jax.value_and_grad(lambda p: loss(p, ts)))(P)
    np.testing.assert_allclose(traced[0], concrete[0], rtol=1e-12)
    np.testing.assert_allclose(traced[1], concrete[1], rtol=1e-12)
    with pytest.raises(jax.errors.JaxRuntimeError, match="saveat times must be on the step grid"):
        jax.jit(loss)(P, jnp.array([0.25 + DT / 3, T]))


@pytest.mark.parametrize(
    "name,solver",
    [
        ("DiscreteAdjoint", "milstein"),
        ("ReversibleAdjoint", "reversible_heun"),
        ("InterpolatingAdjoint", "heun"),
        ("ForwardDiffSensitivity", "euler"),
        ("ForwardDiffSensitivity", "adaptive"),
    ],
)
def test_preset_time_events(name, solver):
    """A dose u += d at t = 0.5 (and u *= 2 at t1) on GBM (Stratonovich): u(1) = 2 (u(½) + d) e^{μ/2 + σ (W_1 -
    W_½)}, saved at 0.5 after the dose; gradients in (μ, σ) and d, which the affect closes over. "adaptive":
    Heun's adaptive steps on a VirtualBrownianTree, the segments ending at the doses."""
    steps = {"rtol": 1e-5, "atol": 1e-5, "solver": "heun"} if solver == "adaptive" else {"dt0": DT, "solver": solver}

    def run(p, d):
        doses = [
            sciad.PresetTimeCallback([0.5], lambda u, p, t: u + d),
            sciad.PresetTimeCallback([T], lambda u, p, t: 2 * u),
        ]
        sol = sciad.solve(
            GBM["stratonovich"],
            p=p,
            key=KEY,
            saveat=[0.0, 0.5, T],
            sensealg=name,
            callbacks=doses,
            **steps,
        )
        us = sol.us[:, 0]
        return us[-1], (us, sol.brownian.evaluate(0.0, 0.5)[0], sol.brownian.evaluate(0.5, T)[0])

    # the saves, the path and the gradient of u(1) in (p, d) from one compiled program
    (_, (us, w1, w2)), g = jax.jit(jax.value_and_grad(run, argnums=(0, 1), has_aux=True))(P, 0.3)
    before = U0 * np.exp(MU * 0.5 + SIGMA * w1)
    after = 2 * (before + 0.3) * np.exp(MU * 0.5 + SIGMA * w2)
    tolerance = 3e-2 if solver == "euler" else 3e-3
    np.testing.assert_allclose(us, [U0, before + 0.3, after], rtol=tolerance)
    d_mu = 2 * (before * 0.5 * np.exp(MU * 0.5 + SIGMA * w2)) + after * 0.5
    d_sigma = 2 * before * w1 * np.exp(MU * 0.5 + SIGMA * w2) + after * w2
    d_dose = 2 * np.exp(MU * 0.5 + SIGMA * w2)
    exact = np.array([d_mu, d_sigma, d_dose])
    np.testing.assert_allclose(np.array([*g[0], g[1]]), exact, rtol=tolerance, atol=tolerance * np.abs(exact).max())


def test_auto_picks_and_reports_an_sde_rule():
    from sciad._auto import auto_sde_sensealg

    few = auto_sde_sensealg(np.ones(1), P, np.array([0.0, 1.0]), solver=dfx.Euler(), steps=100)
    assert isinstance(few.sensealg, sciad.ForwardDiffSensitivity) and "sde-few-parameters" in few.report()
    many = auto_sde_sensealg(np.ones(4), np.ones(300), np.array([0.0, 1.0]), solver=dfx.Euler(), steps=100)
    assert isinstance(many.sensealg, sciad.DiscreteAdjoint) and "sde-many-parameters" in many.report()
    rev = auto_sde_sensealg(np.ones(4), np.ones(300), np.array([0.0, 1.0]), solver=dfx.ReversibleHeun(), steps=100)
    assert isinstance(rev.sensealg, sciad.ReversibleAdjoint)
    # in a solve (compiled): few parameters, so forward mode through the steps
    np.testing.assert_array_equal(
        GRAD_FINAL(P, "ito", "milstein", "auto"), GRAD_FINAL(P, "ito", "milstein", "ForwardDiffSensitivity")
    )


def test_reversible_adjoint_registry_round_trip():
    alg = sciad.ReversibleAdjoint(vjp="jax-forward")
    assert sciad.adjoints.describe(alg) == "ReversibleAdjoint(jax-forward)"
    assert sciad.adjoints.parse("ReversibleAdjoint(jax-forward)") == alg
    assert sciad.adjoints.SENSEALGS["ReversibleAdjoint"] is sciad.ReversibleAdjoint


def test_errors_name_the_argument_and_the_fix():
    with pytest.raises(ValueError, match="noise"):
        sciad.SDEProblem(drift, diffusion, np.array([1.0]), (0.0, 1.0), P, noise="full")
    with pytest.raises(ValueError, match="calculus"):
        sciad.SDEProblem(drift, diffusion, np.array([1.0]), (0.0, 1.0), P, calculus="ito-ish")
    with pytest.raises(ValueError, match=r"diffusion\(u, p, t\) must return one \(n, m\) = \(1, 2\)"):
        sciad.SDEProblem(drift, diffusion, np.array([1.0]), (0.0, 1.0), P, noise=2)
    with pytest.raises(ValueError, match=r"diffusion\(u, p, t\) returns shape \(2,\)"):
        sciad.SDEProblem(drift, lambda u, p, t: jnp.ones(2), np.array([1.0]), (0.0, 1.0), P)
    with pytest.raises(TypeError, match="drift must be callable"):
        sciad.SDEProblem(None, diffusion, np.array([1.0]), (0.0, 1.0), P)
    prob = GBM["ito"]
    with pytest.raises(ValueError, match="has no error estimate, so it takes fixed steps: pass dt0"):
        sciad.solve(prob, key=KEY, solver="euler")  # adaptive steps (no dt0)
    with pytest.raises(ValueError, match="is an ODE solver"):
        sciad.solve(prob, key=KEY, solver=dfx.Tsit5())
    with pytest.raises(ValueError, match="Lévy areas"):
        sciad.solve(prob, key=KEY, solver=dfx.SRA1())
    with pytest.raises(ValueError, match="solves the adjoint SDE on a fixed grid"):
        sciad.solve(prob, key=KEY, sensealg="InterpolatingAdjoint")
    with pytest.raises(ValueError, match="BrownianPath, exact on its grid's steps: pass dt0"):
        sciad.solve(prob, brownian=path_of(KEY, 0.1))
    with pytest.raises(ValueError, match="key=jax.random.key"):
        sciad.solve(prob, dt0=0.1)
    with pytest.raises(ValueError, match="not on the step grid"):
        sciad.solve(prob, key=KEY, dt0=0.1, saveat=[0.0, 0.55])
    with pytest.raises(ValueError, match="solver='reversible_heun'"):
        sciad.solve(prob, key=KEY, dt0=0.1, solver="heun", sensealg="ReversibleAdjoint")
    with pytest.raises(ValueError, match="unknown SDE solver"):
        sciad.solve(prob, key=KEY, dt0=0.1, solver="tsit5")
    general = sciad.SDEProblem(drift, lambda u, p, t: jnp.ones((1, 2)), np.array([1.0]), (0.0, 1.0), P, noise=2)
    with pytest.raises(ValueError, match="solver='euler'"):
        sciad.solve(general, key=KEY, dt0=0.1, solver="milstein")
    with pytest.raises(ValueError, match="JAX engines"):
        sciad.solve(prob, key=KEY, dt0=0.1, sensealg=sciad.InterpolatingAdjoint(vjp="finite-differences"))
    with pytest.raises(ValueError, match="PresetTimeCallback only"):
        sciad.solve(prob, key=KEY, dt0=0.1, callbacks=[sciad.ContinuousCallback(lambda u, p, t: u[0] - 2.0)])
    with pytest.raises(ValueError, match="not on the step grid"):
        sciad.solve(prob, key=KEY, dt0=0.1, callbacks=[sciad.PresetTimeCallback([0.55], lambda u, p, t: u)])
    ode = sciad.ODEProblem(drift, np.array([1.0]), (0.0, 1.0), P)
    with pytest.raises(ValueError, match="ReversibleAdjoint needs an explicit solver for an ODE solve, got Kvaerno5"):
        jax.grad(lambda p: sciad.solve(ode, p=p, solver="kvaerno5", sensealg=sciad.ReversibleAdjoint()).us[-1, 0])(P)
