"""Delay differential equations (`sciad.DDEProblem`): solutions against the method of steps' closed forms,
gradients in u0, p, the lags and the history's parameters against closed forms and central differences,
delays shorter than a step, state-dependent delays, PyTrees, integrals, jit, vmap, Hessians, and the errors."""

import functools

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from helpers.differences import gradient_and_central_differences

TIGHT = {"rtol": 1e-10, "atol": 1e-10}


def decay(u, h, p, t):
    """u'(t) = -a u(t - τ), p = (τ, a)."""
    return -p[1] * h(t - p[0])


DECAY = sciad.DDEProblem(decay, jnp.array([1.0]), None, (0.0, 3.0), jnp.array([1.0, 1.0]), lags=lambda p: (p[0],))


def decay_closed_form(t, tau=1.0, a=1.0):
    """u' = -a u(t - τ), u = 1 before 0, on [0, 3τ] by the method of steps."""
    t = np.asarray(t)
    s1, s2 = np.clip(t - tau, 0, None), np.clip(t - 2 * tau, 0, None)
    return 1 - a * t + a**2 * s1**2 / 2 - a**3 * s2**3 / 6


@jax.jit
def decay_solved(ts, t1):
    """DECAY's solution at the save times `ts` (13) on [0, t1] (both traced) and its steps."""
    sol = sciad.solve(DECAY, saveat=ts, tspan=(0.0, t1), **TIGHT)
    return sol.us[:, 0], sol.stats["steps"]


def test_the_solution_is_the_method_of_steps_closed_form():
    ts = jnp.linspace(0.0, 3.0, 13)
    us, steps = decay_solved(ts, 3.0)
    np.testing.assert_allclose(us, decay_closed_form(ts), atol=1e-12)
    # piecewise polynomials of degree ≤ 3 between breakpoints: Tsit5 is exact on each, so the steps are few
    assert int(steps) < 15


@jax.jit  # traced once: the Jacobian and the Hessian transform its jaxpr
def decay_end(p):
    return sciad.solve(DECAY, p=p, saveat=jnp.array([1.5, 2.5]), **TIGHT).us[:, 0]


@functools.cache
def decay_end_derivatives():
    """The Jacobian of u(1.5), u(2.5) in p = (τ, a) (reverse mode) and their Hessians (forward over that reverse,
    as `jax.hessian`), at p = (1, 1), from one program."""
    p = jnp.array([1.0, 1.0])
    jacobian = jax.jacrev(decay_end)
    hessians, jac = jax.jit(jax.jacfwd(lambda p: (lambda j: (j, j))(jacobian(p)), has_aux=True))(p)
    return jac, hessians[0]


def test_gradients_in_the_lag_and_the_rate_are_the_closed_forms():
    # u(t) = 1 - a t + a² (t - τ)² / 2 on [τ, 2τ]: ∂u/∂τ = -a² (t - τ), ∂u/∂a = -t + a (t - τ)²
    jac = decay_end_derivatives()[0]
    np.testing.assert_allclose(jac[0], [-0.5, -1.5 + 0.25], atol=1e-9)
    grad = jac[1]
    # on [2τ, 3τ]: u = 1 - a t + a² (t - τ)²/2 - a³ (t - 2τ)³/6
    t = 2.5
    expected = [-(t - 1.0) + (t - 2.0) ** 2, -t + (t - 1.0) ** 2 - 3 * (t - 2.0) ** 3 / 6]
    np.testing.assert_allclose(grad, expected, atol=1e-9)


JUMP = sciad.DDEProblem(
    decay,
    jnp.array([1.0]),
    lambda p, t: jnp.array([p[2]]),
    (0.0, 2.5),
    jnp.array([1.0, 1.0, 0.3]),
    lags=lambda p: (p[0],),
)


def jump_loss(x):
    """x = (τ, a, c, u0)."""
    sol = sciad.solve(JUMP, p=x[:3], u0=x[3:], saveat=jnp.array([0.7, 1.6, 2.5]), **TIGHT)
    return jnp.sum(sol.us**2)


def test_a_history_that_jumps_at_t0_differentiated_in_its_parameters_and_the_lag():
    """history(p, t) = c ≠ u0: the derivative of u jumps at τ, which the solve's steps land on, and the jump
    moves with τ; the gradient in p and u0 against central differences."""
    _, grad, fd = gradient_and_central_differences(jump_loss, np.array([1.0, 1.0, 0.3, 1.0]), 1e-6)
    np.testing.assert_allclose(grad[:3], fd[:3], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(grad[3:], fd[3:], rtol=1e-7)


def mackey_glass(u, h, p, t):
    beta, gamma, n, tau = p
    past = h(t - tau)
    return beta * past / (1 + past**n) - gamma * u


MACKEY_GLASS = sciad.DDEProblem(
    mackey_glass, jnp.array([1.2]), None, (0.0, 40.0), jnp.array([0.2, 0.1, 10.0, 17.0]), lags=lambda p: (p[3],)
)


def mackey_glass_loss(p, sensealg="auto"):
    return jnp.sum(sciad.solve(MACKEY_GLASS, p=p, saveat=jnp.linspace(0.0, 40.0, 9), sensealg=sensealg, **TIGHT).us)


mackey_glass_value_and_grad = jax.jit(jax.value_and_grad(mackey_glass_loss))


@functools.cache
def mackey_glass_derivatives():
    """At p = (0.2, 0.1, 10, 17): the gradient ("auto": through the steps) and its central differences (one
    program), and ForwardSensitivity's gradient."""
    p = np.array([0.2, 0.1, 10.0, 17.0])
    _, grad, fd = gradient_and_central_differences(mackey_glass_loss, p, 1e-6, mackey_glass_value_and_grad)
    forward = jax.jit(jax.grad(lambda p: mackey_glass_loss(p, "ForwardSensitivity")))(p)
    return grad, fd, forward


def test_a_step_does_not_outrun_the_past_it_reads():
    """Mackey-Glass (chaotic at τ = 17) to t = 100 at rtol 1e-6: a step of 8 read a past resolved in steps of 2,
    its stages missing the past's features between them (error 2e-3, unseen by the error estimate); bounded by
    twice the past's steps, the error is the tolerance's."""
    prob = sciad.DDEProblem(mackey_glass, jnp.array([1.2]), None, (0.0, 100.0), MACKEY_GLASS.p, lags=(17.0,))
    ts = jnp.linspace(50.0, 100.0, 6)
    solved = jax.jit(
        lambda tol: sciad.solve(prob, saveat=ts, rtol=tol, atol=tol, max_steps=20_000).us, static_argnums=0
    )
    np.testing.assert_allclose(solved(1e-6), solved(1e-12), atol=1e-5)


def test_mackey_glass_gradient_in_every_parameter_and_the_delay():
    grad, fd, _ = mackey_glass_derivatives()
    np.testing.assert_allclose(grad, fd, rtol=1e-6)


def test_forward_sensitivity_is_the_derivative_of_the_steps():
    """ForwardSensitivity's sensitivity DDE, discretised on the forward steps, is forward mode through them."""
    grad, _, forward = mackey_glass_derivatives()
    np.testing.assert_allclose(forward, grad, rtol=1e-12)


def test_an_ensemble_over_parameters_equals_each_member():
    """`sciad.ensemble` (vmap over members, the delays among their parameters): each member's gradient is its own."""
    ps = jnp.array([[0.2, 0.1, 10.0, 17.0], [0.25, 0.1, 9.0, 15.0], [0.2, 0.12, 10.0, 12.5]])

    def total(ps):
        return jnp.sum(sciad.ensemble(MACKEY_GLASS, ps=ps, saveat=jnp.linspace(0.0, 40.0, 9), **TIGHT).us)

    batch = jax.jit(jax.grad(total))(ps)
    np.testing.assert_allclose(batch[0], mackey_glass_derivatives()[0], rtol=1e-10)
    for p, g in zip(ps[1:], batch[1:]):
        np.testing.assert_allclose(g, mackey_glass_value_and_grad(p)[1], rtol=1e-10)


SHORT = sciad.DDEProblem(
    lambda u, h, p, t: -p[0] * h(t - 0.01) + jnp.sin(t),
    jnp.array([1.0]),
    None,
    (0.0, 3.0),
    jnp.array([2.0]),
    lags=(0.01,),
)


def test_lags_shorter_than_the_step_by_fixed_point_iteration():
    """The default solve takes steps far longer than the lag (refined by fixed-point iteration); the reference
    steps below the lag (its past then always already computed): its values at p and p ± ε in one program."""

    def solved(p, controller=None):
        tolerances = {"rtol": 1e-8, "atol": 1e-8} if controller is None else {}
        sol = sciad.solve(SHORT, p=p, saveat=jnp.array([1.0, 3.0]), stepsize_controller=controller, **tolerances)
        return sol.us[:, 0], (sol.us[:, 0], sol.stats["steps"])

    below = dfx.PIDController(rtol=1e-10, atol=1e-10, dtmax=0.005)
    p, eps = jnp.array([2.0]), 1e-6

    jac, (us, steps) = jax.jit(jax.jacfwd(solved, has_aux=True))(p)
    below_lag = jax.jit(lambda p: solved(p, below)[0])  # one program, run at each point
    reference = [below_lag(q) for q in (p, p + eps, p - eps)]
    assert int(steps) < 150  # 300 steps would stay below the lag
    np.testing.assert_allclose(us, reference[0], atol=1e-7)
    np.testing.assert_allclose(jac[:, 0], (reference[1] - reference[2]) / (2 * eps), atol=1e-6)


def test_state_dependent_lags():
    """lags(u, p, t): a lag that does not in fact vary gives the parameter-lag solve; one that does, its gradient
    against central differences."""
    fixed = sciad.DDEProblem(
        decay, jnp.array([1.0]), None, (0.0, 3.0), jnp.array([1.0, 1.0]), lags=lambda u, p, t: (p[0],)
    )
    ts = jnp.linspace(0.0, 3.0, 7)

    def f(u, h, p, t):
        return -p[1] * h(t - p[0] / (1 + u[0] ** 2))

    varying = sciad.DDEProblem(
        f,
        jnp.array([1.0]),
        lambda p, t: jnp.cos(t)[None],
        (0.0, 3.0),
        jnp.array([1.0, 1.0]),
        lags=lambda u, p, t: (p[0] / (1 + u[0] ** 2),),
    )
    # the second derivative jumps where t - τ(u) crosses t0, a time no step lands on: the discrete solution's
    # derivatives converge more slowly there (at 1e-10 central differences are off by 5e-4 themselves)
    us = jax.jit(lambda: sciad.solve(fixed, saveat=ts, **TIGHT).us[:, 0])()  # (eagerly: a program per operation)
    np.testing.assert_allclose(us, decay_closed_form(ts), atol=1e-8)
    _, grad, fd = gradient_and_central_differences(
        lambda p: jnp.sum(sciad.solve(varying, p=p, saveat=ts, rtol=1e-12, atol=1e-12).us ** 2),
        np.array([1.0, 1.0]),
        1e-4,
    )
    np.testing.assert_allclose(grad, fd, rtol=1e-5)


def test_pytree_state_history_and_an_integral():
    def f(u, h, p, t):
        past = h(t - 1.0)
        return {"x": -p["a"] * past["x"], "y": past["x"] - u["y"]}

    prob = sciad.DDEProblem(
        f,
        {"x": jnp.array(1.0), "y": jnp.zeros(2)},
        lambda p, t: {"x": jnp.asarray(1.0), "y": jnp.zeros(2)},
        (0.0, 2.0),
        {"a": jnp.array(1.0)},
        lags=(1.0,),
    )

    def solved(a):
        sol = sciad.solve(prob, p={"a": a}, saveat=jnp.array([1.0, 2.0]), integrand=lambda u, p, t: u["x"], **TIGHT)
        return sol.integral, sol.us

    (integral, us), (g, _) = jax.jit(lambda a: jax.jvp(solved, (a,), (jnp.ones_like(a),)))(jnp.array(1.0))
    np.testing.assert_allclose(us["x"], decay_closed_form(np.array([1.0, 2.0])), atol=1e-12)
    # ∫0^2 u = ∫0^1 (1 - t) + ∫1^2 (1 - t + (t - 1)²/2) = 1/2 + (-1/2 + 1/6)
    np.testing.assert_allclose(integral, 0.5 - 0.5 + 1 / 6, atol=1e-12)
    # ∂/∂a of ∫0^2 (1 - a t + a² (t - 1)₊²/2) dt = -2 + a/3
    np.testing.assert_allclose(g, -2 + 1 / 3, atol=1e-10)


def test_hessian_in_the_parameters():
    hess = decay_end_derivatives()[1]
    # u(1.5) = 1 - 1.5 a + a² (1.5 - τ)²/2
    expected = [[1.0, -2 * 0.5], [-2 * 0.5, 0.25]]
    np.testing.assert_allclose(hess, expected, atol=1e-7)


def test_bad_input_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match="positive finite"):
        sciad.DDEProblem(decay, jnp.array([1.0]), None, (0.0, 1.0), jnp.array([1.0, 1.0]), lags=(-1.0,))
    with pytest.raises(TypeError, match=r"take \(p\)"):
        sciad.DDEProblem(decay, jnp.array([1.0]), None, (0.0, 1.0), jnp.array([1.0, 1.0]), lags=lambda u, p: (1.0,))
    with pytest.raises(ValueError, match="shape"):
        sciad.DDEProblem(lambda u, h, p, t: jnp.zeros(2), jnp.array([1.0]), None, (0.0, 1.0), lags=(1.0,))
    with pytest.raises(ValueError, match="forwards in time"):
        sciad.DDEProblem(decay, jnp.array([1.0]), None, (1.0, 0.0), jnp.array([1.0, 1.0]), lags=(1.0,))
    # the solve's refusals at its boundary, each raised while tracing (under jit: nothing compiled)
    with pytest.raises(ValueError, match="ForwardDiffSensitivity"):
        compiled(DECAY, sensealg=sciad.GaussAdjoint())
    with pytest.raises(ValueError, match="JAX engines"):
        compiled(DECAY, sensealg=sciad.ForwardSensitivity(jvp="finite-differences"))
    with pytest.raises(ValueError, match="Runge-Kutta solvers"):
        compiled(DECAY, solver="rodas5p")
    with pytest.raises(ValueError, match="no dense="):
        compiled(DECAY, dense=True)
    with pytest.raises(ValueError, match="scalar time"):
        compiled(sciad.DDEProblem(lambda u, h, p, t: -h(t - u), jnp.array([1.0]), None, (0.0, 1.0), lags=(1.0,)))
    # and while it runs: a SolveError, carried by JAX's runtime error under jit
    with pytest.raises(jax.errors.JaxRuntimeError) as raised:
        compiled(MACKEY_GLASS, history_steps=4)
    assert sciad.errors.summary(raised.value).startswith("SolveError:") and "history_steps" in str(raised.value)
    with pytest.raises(jax.errors.JaxRuntimeError, match="lags must be positive"):
        jax.jit(lambda p: sciad.solve(DECAY, p=p).us)(jnp.array([-1.0, 1.0]))


def compiled(prob, **options):
    """The solve's states, compiled whole."""
    return jax.jit(lambda: sciad.solve(prob, **options).us)()


def test_auto_reports_its_rule_for_delays():
    from sciad._auto import auto_dde_sensealg

    choice = auto_dde_sensealg(
        MACKEY_GLASS.u0, MACKEY_GLASS.p, np.zeros(3), solver=dfx.Tsit5(), lags=1, rtol=1e-6, atol=1e-6
    )
    assert isinstance(choice.sensealg, sciad.ForwardDiffSensitivity)
    assert "dde-through-steps" in choice.report() and "delays: 1" in choice.report()


STIFF = sciad.DDEProblem(
    lambda u, h, p, t: -p[0] * (u - jnp.cos(t)) - p[1] * h(t - 1.0),
    jnp.array([0.5]),
    None,
    (0.0, 4.0),
    jnp.array([1e4, 1.0]),
    lags=(1.0,),
)


def test_a_stiff_delay_equation_by_an_implicit_solver():
    """solver="auto" estimates the instantaneous Jacobian's stiffness and takes Kvaerno3: a thousand steps
    where Tsit5 takes thousands; its gradient against central differences (of steps large enough for Newton's
    own tolerance not to show)."""
    ts = jnp.linspace(0.0, 4.0, 9)

    def loss(p):
        sol = sciad.solve(STIFF, p=p, saveat=ts, rtol=1e-8, atol=1e-8)
        return jnp.sum(sol.us), sol.stats["steps"]

    p = STIFF.p
    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True))  # the differences' values from it too
    (_, steps), grad = value_and_grad(p)
    # Newton's tolerance moves the loss by about 1e-8: steps of 100 and 0.1 (truncation below 5e-3; the noise,
    # 1e-8 / 200, is 1e-2 of ∂/∂p[0] = -2.6e-8)
    values = [value_and_grad(p + d)[0][0] for d in jnp.array([[100.0, 0], [-100.0, 0], [0, 0.1], [0, -0.1]])]
    fd = [(values[0] - values[1]) / 200.0, (values[2] - values[3]) / 0.2]
    np.testing.assert_allclose(grad[0], fd[0], rtol=2e-2)
    np.testing.assert_allclose(grad[1], fd[1], rtol=5e-3)
    assert int(steps) < 2000  # Tsit5: over 14,000 at rtol 1e-6


def test_an_explicit_solver_on_a_stiff_delay_equation_refuses_its_gradient():
    """Tsit5's steps sit at its stability limit: forward mode through them would give a gradient off by orders of
    magnitude (measured: 500 times, and of the wrong sign), so it is refused, naming the implicit solver."""
    loss = jax.jit(jax.grad(lambda p: jnp.sum(sciad.solve(STIFF, p=p, solver="tsit5", max_steps=20_000).us)))
    with pytest.raises(jax.errors.JaxRuntimeError, match="kvaerno3"):
        loss(STIFF.p)


def test_closures_over_differentiated_values():
    def end(a):
        prob = sciad.DDEProblem(lambda u, h, p, t: -a * h(t - 1.0), jnp.array([1.0]), None, (0.0, 2.0), lags=(1.0,))
        return sciad.solve(prob, saveat=jnp.array([2.0]), **TIGHT).us[0, 0]

    value, grad = jax.jit(jax.value_and_grad(end))(1.0)  # u(2) = 1 - 2a + a²/2
    np.testing.assert_allclose([value, grad], [-0.5, -1.0], atol=1e-12)


def test_traced_save_times_and_tspan_under_jit():
    """One compiled program for other save times and another t1."""
    ts = jnp.linspace(0.25, 2.0, 13)
    np.testing.assert_allclose(decay_solved(ts, 2.0)[0], decay_closed_form(ts), atol=1e-12)
    np.testing.assert_allclose(decay_solved(ts + 0.5, 2.5)[0], decay_closed_form(ts + 0.5), atol=1e-12)


def test_the_past_finds_the_step_that_holds_a_time():
    """Past's search against counting, on rings of several sizes, before and after they wrap."""
    from sciad._dde import Past, Piece

    index = jax.jit(lambda past, ss: jax.vmap(past._index)(ss))  # one program per ring size
    rng = np.random.default_rng(0)
    for size in (1, 5, 16, 37):
        for count in (1, size - 1, size, 3 * size + 2):
            if count < 1:
                continue
            starts_all = np.cumsum(rng.uniform(0.1, 1.0, count))
            starts = np.full(size, np.inf)
            for j, t in enumerate(starts_all):
                starts[j % size] = t
            ring = Piece(jnp.asarray(starts), None, None)
            past = Past(jnp.asarray(0.0), None, ring, jnp.asarray(count), None, None, None)
            first = max(count - size, 0)
            ss = rng.uniform(-0.5, starts_all[-1] + 1.0, 25)
            found = index(past, jnp.asarray(ss))
            for s, slot in zip(ss, found):
                k = max(int(np.sum(starts_all[first:] <= s)) - 1, 0)
                assert int(slot) == (first + k) % size


@pytest.mark.parametrize(
    "solver",
    [dfx.Euler(), dfx.Heun(), dfx.Bosh3(), dfx.Tsit5(), dfx.Dopri5(), dfx.Dopri8(), dfx.Kvaerno5()],
    ids=lambda solver: type(solver).__name__,
)
def test_the_past_keeps_each_solvers_dense_output_exactly(solver):
    """A step's dense output, kept as one polynomial (`Piece`), is the solver's own interpolation."""
    from sciad._dde import Past

    term = dfx.ODETerm(lambda t, y, args: jnp.stack([jnp.sin(3 * t) * y[1], -(y[0] ** 3)]))
    y0, t0, t1 = jnp.array([1.0, 0.5]), jnp.asarray(0.2), jnp.asarray(0.9)
    if isinstance(solver, dfx.AbstractImplicitSolver):
        solver = eqx.tree_at(lambda s: s.root_finder, solver, dfx.VeryChord(rtol=1e-10, atol=1e-10))
    state = solver.init(term, t0, t1, y0, None)
    info = solver.step(term, t0, t1, y0, None, state, False)[2]
    interpolation = solver.interpolation_cls(t0=t0, t1=t1, **info)
    piece = Past.empty(solver, y0, t0, 4).piece(interpolation, t0, t1)
    for s in np.linspace(0.2, 0.9, 8):
        np.testing.assert_allclose(piece.evaluate(s), interpolation.evaluate(s), rtol=1e-12, atol=1e-13)


def test_doses_at_preset_times_against_the_closed_form():
    """PresetTimeCallbacks on a delay equation, applied between its steps (at t1 too): u' = -a u(t - τ) with u += d
    at 1.5 and 3; the dose's jump reaches the rate a lag later. Solution and its derivatives in τ, a and d (the
    dose in p) are the method of steps' closed forms; ForwardSensitivity's equal forward mode's."""
    prob = sciad.DDEProblem(
        decay, jnp.array([1.0]), None, (0.0, 3.0), jnp.array([1.0, 1.0, 1.0]), lags=lambda p: (p[0],)
    )
    ts = jnp.array([0.0, 1.0, 1.5, 2.0, 2.7, 3.0])
    dose = sciad.PresetTimeCallback(times=[1.5, 3.0], affect=lambda u, p, t: u + p[2])

    def run(p, sensealg):
        return sciad.solve(prob, p=p, saveat=ts, callbacks=[dose], sensealg=sensealg, **TIGHT)

    def through_steps(p):  # the states, the doses' times and count alongside
        sol = run(p, "ForwardDiffSensitivity")
        return sol.us[:, 0], (sol.us[:, 0], sol.event_times[0], sol.event_counts[0])

    # one program: the Jacobians of the members of a vmapped batch, their doses in p (the first member's checked
    # against the closed form), and ForwardSensitivity's at the first
    members, (us, times, counts), forward = jax.jit(
        lambda ps: (
            *jax.vmap(jax.jacfwd(through_steps, has_aux=True))(ps),
            jax.jacfwd(lambda p: run(p, "ForwardSensitivity").us[:, 0])(ps[0]),
        )
    )(jnp.stack([prob.p, jnp.array([0.8, 1.2, 0.5])]))
    t = np.asarray(ts)
    # after the dose at 1.5 (d = 1): +d, and from 2.5 on the rate reads it: -a d (t - 2.5); the one at t1 = 3: +d
    np.testing.assert_allclose(
        us[0], decay_closed_form(t) + (t >= 1.5) - np.clip(t - 2.5, 0, None) + (t >= 3), atol=1e-12
    )
    assert [float(x) for x in times[0]] == [1.5, 3.0] and int(counts[0]) == 2
    jac = members[0]
    # ∂/∂τ = -a²(t - τ) + a³(t - 2τ)² + d a [t ≥ 2.5], ∂/∂a = -t + a(t - τ)² - a²(t - 2τ)³/2 - d(t - 2.5)₊ on [2, 3]
    expected = np.array([[-0.21, -0.1815, 0.8], [0.0, 0.0, 1.5]])
    np.testing.assert_allclose(jac[4:], expected, atol=1e-9)
    np.testing.assert_allclose(jac[2:4, 2], [1.0, 1.0], atol=1e-12)
    np.testing.assert_allclose(forward, jac, atol=1e-12)
    # an implicit solver's (its stages within the step)
    implicit = jax.jit(
        jax.jacfwd(
            lambda p: sciad.solve(prob, p=p, saveat=ts[4:], callbacks=[dose], solver="kvaerno3", **TIGHT).us[:, 0]
        )
    )
    np.testing.assert_allclose(implicit(prob.p), expected, atol=1e-7)
    # the second member's doses (d = 0.5) are its own
    assert [float(x) for x in times[1]] == [1.5, 3.0] and not np.allclose(members[1], jac)


def test_doses_refuse_what_they_cannot_serve():
    prob = sciad.DDEProblem(
        decay, jnp.array([1.0]), None, (0.0, 3.0), jnp.array([1.0, 1.0, 1.0]), lags=lambda p: (p[0],)
    )
    # each raised while tracing (under jit: nothing compiled)
    stop = sciad.ContinuousCallback(lambda u, p, t: u[0] - 0.5)
    with pytest.raises(ValueError, match="PresetTimeCallbacks .* only"):
        compiled(prob, callbacks=[stop])
    dose = sciad.PresetTimeCallback(times=[1.5], affect=lambda u, p, t: u + p[2])
    # Kvaerno5's stages reach past its step, across the jump a dose leaves in the past (with or without doses)
    with pytest.raises(ValueError, match="stages reach past the step's end .* solver='kvaerno3'"):
        compiled(prob, callbacks=[dose], solver="kvaerno5")

    def by_closure(d):
        dose = sciad.PresetTimeCallback(times=[1.5], affect=lambda u, p, t: u + d)
        return sciad.solve(prob, callbacks=[dose]).us[-1, 0]

    with pytest.raises(ValueError, match="closes over traced values: pass them in p"):
        jax.jit(jax.grad(by_closure))(1.0)

    def by_time(td):
        dose = sciad.PresetTimeCallback(times=jnp.stack([td]), affect=lambda u, p, t: u + p[2])
        return sciad.solve(prob, callbacks=[dose]).us[-1, 0]

    with pytest.raises(ValueError, match="dose times\\) takes no derivative"):
        jax.jit(jax.grad(by_time))(1.5)


def test_a_dose_where_a_breakpoint_falls_moves_no_step_with_the_lag():
    """A dose at 12 where the breakpoint 6τ of t0 falls (τ = 2): the step that lands there moves with the dose,
    not with 6τ; ∂/∂τ of a transit model's exposure against central differences."""

    def transit(u, h, p, t):
        return jnp.stack([-p[0] * u[0], p[0] * u[0] - p[1] * h(t - p[2])[1]])

    dose = sciad.PresetTimeCallback(times=[12.0], affect=lambda u, p, t: u.at[0].add(p[3]))
    prob = sciad.DDEProblem(
        transit, jnp.array([100.0, 0.0]), None, (0.0, 24.0), jnp.array([1.0, 0.2, 2.0, 100.0]), lags=lambda p: (p[2],)
    )

    def exposure(p):
        return jnp.sum(sciad.solve(prob, p=p, saveat=jnp.linspace(0.0, 24.0, 25), callbacks=[dose], **TIGHT).us[:, 1])

    _, grad, fd = gradient_and_central_differences(exposure, prob.p, 1e-6)
    np.testing.assert_allclose(grad, fd, rtol=1e-5)


@pytest.mark.parametrize("solver", ["tsit5", "kvaerno3"])
def test_a_step_ending_on_t0_plus_the_lag_reads_the_history_there(solver):
    """t1 = t0 + τ: the last step's final stages read the past at t0 itself, where the history's slope and the
    solution's differ; the step's interior reads the history, so must they (the solution's slope there gave
    ∂u(t1)/∂τ = -1.05 for 0.5). h(s) = 1 + s/2, u' = -a h(t - τ): u = 1 - a (t + t²/4 - τt/2) on [0, τ]."""
    prob = sciad.DDEProblem(
        decay,
        jnp.array([1.0]),
        lambda p, t: jnp.array([1.0 + 0.5 * t]),
        (0.0, 1.0),
        jnp.array([1.0, 1.0]),
        lags=lambda p: (p[0],),
    )
    t = np.array([0.5, 1.0])
    jac = jax.jit(jax.jacfwd(lambda p: sciad.solve(prob, p=p, saveat=t, solver=solver, **TIGHT).us[:, 0]))(prob.p)
    np.testing.assert_allclose(jac, np.stack([t / 2, -(t + t**2 / 4 - t / 2)], 1), atol=1e-9)
