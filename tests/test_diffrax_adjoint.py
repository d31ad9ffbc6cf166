"""`sciad.diffrax_adjoint`: diffrax's own `diffeqsolve` calls with only `adjoint=` changed give diffrax's
solution (the same steps, to rounding) and sciad's gradients; and `sciad.solve`'s
`stepsize_controller` and `dt0`, which it rests on."""

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
import pytest

import sciad
from sciad.problems._lotka_volterra import lotka_volterra_rhs


def _lotka_volterra(t, y, args):
    return lotka_volterra_rhs(y, args, t)


P = jnp.array([1.5, 1.0, 3.0, 1.0])
Y0 = jnp.array([1.0, 1.0])
TS = jnp.linspace(0.5, 9.5, 7)
CONTROLLER = dfx.PIDController(rtol=1e-8, atol=1e-8, pcoeff=0.2, icoeff=0.5, dtmax=0.7)


def _solve(
    adjoint,
    y0,
    args,
    *,
    t0=0.0,
    t1=10.0,
    dt0=0.05,
    saveat=dfx.SaveAt(t0=True, ts=TS, t1=True),
    controller=CONTROLLER,
    **options,
):
    return dfx.diffeqsolve(
        dfx.ODETerm(_lotka_volterra),
        dfx.Tsit5(),
        t0,
        t1,
        dt0,
        y0,
        args,
        saveat=saveat,
        stepsize_controller=controller,
        adjoint=adjoint,
        **options,
    )


def _value_and_grad(loss, argnums=1):
    """A loss `loss(adjoint, ...) -> (value, solution)`'s value, solution and gradient, compiled once per
    adjoint (one program gives the solution and its gradient)."""
    return jax.jit(jax.value_and_grad(loss, argnums, has_aux=True), static_argnums=0)


def _sum_of_squares(adjoint, y0, args):
    sol = _solve(adjoint, y0, args)
    return jnp.sum(sol.ys[:, 0] ** 2), sol


_SUM_OF_SQUARES = _value_and_grad(_sum_of_squares, (1, 2))  # diffrax's reference compiled once for the module


@pytest.mark.parametrize("sensealg,rtol", [("auto", 1e-12), ("GaussAdjoint", 1e-6), ("InterpolatingAdjoint", 1e-6)])
def test_diffraxs_solution_and_its_gradient(sensealg, rtol):
    """The solution is diffrax's to rounding (the same steps: the controller's gains and limits and dt0
    are diffrax's; a save at t1 is interpolated there); the gradient in y0 and args is
    RecursiveCheckpointAdjoint's (exactly, by "auto"'s DiscreteAdjoint), under jit."""
    (_, ours), our_grads = _SUM_OF_SQUARES(sciad.diffrax_adjoint(sensealg), Y0, P)
    (_, theirs), their_grads = _SUM_OF_SQUARES(dfx.RecursiveCheckpointAdjoint(), Y0, P)
    np.testing.assert_allclose(ours.ys, theirs.ys, rtol=1e-14)
    np.testing.assert_array_equal(ours.ts, theirs.ts)
    for key in ("num_steps", "num_accepted_steps", "num_rejected_steps"):
        assert int(ours.stats[key]) == int(theirs.stats[key]), key
    assert ours.result == dfx.RESULTS.successful
    for a, b in zip(our_grads, their_grads):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * float(jnp.max(jnp.abs(b))))


def test_neural_ode_example():
    """diffrax's neural ODE example (an MLP held by the term, a batch of initial states under vmap, a
    jitted value and gradient in the model): the same loss, and RecursiveCheckpointAdjoint's gradient."""

    class Func(eqx.Module):
        mlp: eqx.nn.MLP

        def __call__(self, t, y, args):
            return self.mlp(y)

    @eqx.filter_jit  # the model and the batch drawn in one program (eagerly, a small program per operation)
    def setup(key):
        mlp = eqx.nn.MLP(2, 2, 16, 2, activation=jax.nn.softplus, final_activation=jax.nn.tanh, key=key)
        return Func(mlp), jax.random.normal(key, (3, 2))

    func, y0s = setup(jax.random.PRNGKey(0))
    ts = jnp.linspace(0.0, 3.0, 12)

    def loss(func, adjoint):
        ys = jax.vmap(
            lambda y0: (
                dfx.diffeqsolve(
                    dfx.ODETerm(func),
                    dfx.Tsit5(),
                    ts[0],
                    ts[-1],
                    ts[1] - ts[0],
                    y0,
                    stepsize_controller=dfx.PIDController(rtol=1e-3, atol=1e-6),
                    saveat=dfx.SaveAt(ts=ts),
                    adjoint=adjoint,
                ).ys
            )
        )(y0s)
        return jnp.mean(ys**2)

    value_and_grad = eqx.filter_jit(eqx.filter_value_and_grad(loss))
    ours, theirs = value_and_grad(func, sciad.diffrax_adjoint()), value_and_grad(func, dfx.RecursiveCheckpointAdjoint())
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-13)
    for a, b in zip(jax.tree.leaves(ours[1]), jax.tree.leaves(theirs[1])):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_stiff_problem_with_kvaerno5():
    """Robertson's kinetics by Kvaerno5 (diffrax's stiff example): diffrax's solution, and the gradient in
    the rates of RecursiveCheckpointAdjoint's to the tolerance."""

    def robertson(t, y, k):
        return jnp.stack(
            [-k[0] * y[0] + k[2] * y[1] * y[2], k[0] * y[0] - k[2] * y[1] * y[2] - k[1] * y[1] ** 2, k[1] * y[1] ** 2]
        )

    k, y0 = jnp.array([0.04, 3e7, 1e4]), jnp.array([1.0, 0.0, 0.0])

    def solve(adjoint, k):
        return dfx.diffeqsolve(
            dfx.ODETerm(robertson),
            dfx.Kvaerno5(),
            0.0,
            1.0,
            None,
            y0,
            k,
            saveat=dfx.SaveAt(ts=jnp.array([0.1, 1.0])),
            stepsize_controller=dfx.PIDController(rtol=1e-6, atol=1e-8),
            adjoint=adjoint,
        )

    def loss(adjoint, k):
        sol = solve(adjoint, k)
        return jnp.sum(sol.ys[:, 0]), sol

    (_, ours), our_grad = _value_and_grad(loss)(sciad.diffrax_adjoint("GaussAdjoint"), k)
    (_, theirs), their_grad = _value_and_grad(loss)(dfx.RecursiveCheckpointAdjoint(), k)
    np.testing.assert_allclose(ours.ys, theirs.ys, rtol=1e-12, atol=1e-15)
    # p dL/dp: comparable across rates of very different sizes
    np.testing.assert_allclose(our_grad * k, their_grad * k, rtol=1e-4, atol=1e-8)


def test_event_stops_where_diffraxs_does():
    """A falling body stopped by an event at the ground: the stopping time and state are diffrax's
    (located by its root finder), saved after the saves made before it, then inf where diffrax leaves
    inf, `event_mask` and `result` say it fired; the stopping time's derivative in the height is the analytic 1 /
    sqrt(2 g h)."""
    g = 9.81

    def fall(t, y, args):
        return jnp.stack([y[1], -g * jnp.ones_like(y[0])])

    event = dfx.Event(lambda t, y, args, **kwargs: y[0], root_finder=optx.Newton(1e-12, 1e-12))
    saveat = dfx.SaveAt(ts=jnp.array([0.2, 5.0]), t1=True)

    def solve(adjoint, h):
        return dfx.diffeqsolve(
            dfx.ODETerm(fall),
            dfx.Tsit5(),
            0.0,
            10.0,
            0.01,
            jnp.stack([h, 0.0 * h]),
            saveat=saveat,
            stepsize_controller=dfx.PIDController(rtol=1e-8, atol=1e-8),
            event=event,
            adjoint=adjoint,
        )

    def stop(adjoint, h):
        sol = solve(adjoint, h)
        return sol.ts[1], sol

    (_, ours), dt_dh = _value_and_grad(stop)(sciad.diffrax_adjoint(), 2.0)
    theirs = solve(dfx.RecursiveCheckpointAdjoint(), 2.0)
    np.testing.assert_allclose(ours.ts, theirs.ts, rtol=1e-9)
    assert np.isinf(ours.ts[2]) and np.all(np.isinf(ours.ys[2]))
    np.testing.assert_allclose(ours.ys[:2], theirs.ys[:2], rtol=1e-8, atol=1e-9)
    assert bool(ours.event_mask) and ours.result == dfx.RESULTS.event_occurred
    np.testing.assert_allclose(ours.ts[1], np.sqrt(2 * 2.0 / g), rtol=1e-9)
    np.testing.assert_allclose(dt_dh, 1 / np.sqrt(2 * g * 2.0), rtol=1e-6)


def test_backwards_in_time_with_saveat_fn_and_subs():
    """t1 < t0 (a negative dt0), and `SaveAt(subs=...)` with a `fn`: diffrax's `ts` and `ys`, and its
    gradient."""
    saveat = dfx.SaveAt(subs=[dfx.SubSaveAt(ts=TS[::-1], fn=lambda t, y, args: y[0] * t), dfx.SubSaveAt(t1=True)])

    def solve(adjoint, args):
        return _solve(adjoint, Y0, args, t0=10.0, t1=0.0, dt0=-0.05, saveat=saveat)

    def loss(adjoint, p):
        sol = solve(adjoint, p)
        return jnp.sum(sol.ys[0]) + jnp.sum(sol.ys[1]), sol

    (_, ours), our_grad = _value_and_grad(loss)(sciad.diffrax_adjoint(), P)
    (_, theirs), their_grad = _value_and_grad(loss)(dfx.RecursiveCheckpointAdjoint(), P)
    for a, b in zip(jax.tree.leaves((ours.ts, ours.ys)), jax.tree.leaves((theirs.ts, theirs.ys))):
        np.testing.assert_allclose(a, b, rtol=1e-14)
    np.testing.assert_allclose(our_grad, their_grad, rtol=1e-10)


def test_forward_mode_and_a_hessian():
    """jax.jacfwd and jax.hessian through diffeqsolve (RecursiveCheckpointAdjoint refuses forward mode):
    the Jacobian is the reverse-mode gradient, the Hessian symmetric and diffrax's own forward over forward
    mode's (ForwardMode)."""

    def loss(adjoint, p):
        return jnp.sum(_solve(adjoint, Y0, p, t1=3.0, saveat=dfx.SaveAt(t1=True)).ys ** 2)

    ours = sciad.diffrax_adjoint("ForwardDiffSensitivity")
    jacfwd, grad, hessian = (
        jax.jit(transform(loss, 1), static_argnums=0) for transform in (jax.jacfwd, jax.grad, jax.hessian)
    )
    np.testing.assert_allclose(jacfwd(ours, P), grad(ours, P), rtol=1e-10)
    ours = hessian(ours, P)
    np.testing.assert_allclose(ours, ours.T, rtol=1e-8, atol=1e-10)
    theirs = jax.jit(jax.jacfwd(jax.jacfwd(loss, 1), 1), static_argnums=0)(dfx.ForwardMode(), P)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize(
    "case,fix",
    [
        (dict(controller=dfx.ConstantStepSize()), "PIDController"),
        (dict(saveat=dfx.SaveAt(steps=True)), "SaveAt(ts=...)"),
        (dict(saveat=dfx.SaveAt(t1=True, dense=True)), "dense=True"),
        (dict(event=dfx.Event(lambda t, y, args, **kwargs: y[0] > 2.0)), "float"),
    ],
)
def test_refuses_what_it_does_not_serve(case, fix):
    """What sciad's sensealgs do not serve raises NotImplementedError at the call, naming what to pass."""
    with pytest.raises(NotImplementedError, match=fix.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        _solve(sciad.diffrax_adjoint(), Y0, P, **case)


def test_an_sde_is_refused():
    brownian = dfx.VirtualBrownianTree(0.0, 1.0, tol=1e-3, shape=(2,), key=jax.random.PRNGKey(0))
    terms = dfx.MultiTerm(dfx.ODETerm(_lotka_volterra), dfx.ControlTerm(lambda t, y, args: 0.1 * y, brownian))
    with pytest.raises(NotImplementedError, match="SDEProblem"):
        dfx.diffeqsolve(terms, dfx.Heun(), 0.0, 1.0, 0.01, Y0, P, adjoint=sciad.diffrax_adjoint())


def test_solve_takes_diffraxs_controller_and_first_step():
    """`sciad.solve(..., stepsize_controller=, dt0=)`: the steps of diffrax's solve with that controller and
    dt0 (backwards in time too); conflicting tolerances and a dt0 against the direction are refused."""
    prob = sciad.ODEProblem(lotka_volterra_rhs, Y0, (0.0, 10.0), P)
    # forwards: the module's diffrax solve (saves at t0, TS, t1); backwards: its own
    _, forwards = _SUM_OF_SQUARES(dfx.RecursiveCheckpointAdjoint(), Y0, P)[0]
    backwards = _solve(
        dfx.RecursiveCheckpointAdjoint(), Y0, P, t0=10.0, t1=0.0, dt0=-0.05, saveat=dfx.SaveAt(ts=TS[::-1])
    )
    for tspan, dt0, ts, theirs, saved in (
        ((0.0, 10.0), 0.05, TS, forwards, slice(1, -1)),
        ((10.0, 0.0), -0.05, TS[::-1], backwards, slice(None)),
    ):
        ours = jax.jit(  # compiled whole (eagerly, a small program per operation)
            lambda: sciad.solve(prob, tspan=tspan, saveat=ts, solver="tsit5", stepsize_controller=CONTROLLER, dt0=dt0)
        )()
        np.testing.assert_allclose(ours.us, theirs.ys[saved], rtol=1e-14)
        assert int(ours.stats["steps"]) == int(theirs.stats["num_steps"])
    with pytest.raises(ValueError, match="rtol=0.001 differs from stepsize_controller.rtol"):
        sciad.solve(prob, rtol=1e-3, stepsize_controller=CONTROLLER)
    with pytest.raises(TypeError, match="diffrax.PIDController"):
        sciad.solve(prob, stepsize_controller=dfx.ConstantStepSize())
    with pytest.raises(ValueError, match="dt0 must be a finite step of t1 - t0's sign"):
        sciad.solve(prob, dt0=-0.1)


@pytest.mark.parametrize("sensealg", ["auto", "GaussAdjoint"])
def test_event_with_an_implicit_solver_pytrees_and_vmap(sensealg):
    """A stopping event with an implicit solver (Kvaerno3), dict states and args, under jit(vmap(grad)): the
    stopping time's derivative in the height is 1 / sqrt(2 g h) for each member."""

    def fall(t, y, args):
        return {"h": y["v"], "v": -args["g"] * jnp.ones_like(y["h"])}

    event = dfx.Event(lambda t, y, args, **kwargs: y["h"], root_finder=optx.Newton(1e-12, 1e-12))

    def stop(h):
        return dfx.diffeqsolve(
            dfx.ODETerm(fall),
            dfx.Kvaerno3(),
            0.0,
            10.0,
            0.01,
            {"h": h, "v": 0.0 * h},
            {"g": 9.81},
            saveat=dfx.SaveAt(t1=True),
            event=event,
            stepsize_controller=dfx.PIDController(rtol=1e-8, atol=1e-8),
            adjoint=sciad.diffrax_adjoint(sensealg),
        ).ts[0]

    heights = jnp.array([1.0, 2.0])
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(stop)))(heights), 1 / np.sqrt(2 * 9.81 * heights), rtol=1e-6)
