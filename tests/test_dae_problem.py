"""`sciad.DAEProblem`, the fully implicit form F(u', u, p, t) = 0 solved by sciad's BDF: Robertson against its
mass-matrix form and SciPy's Radau, a DAE whose ∂F/∂u' mixes its states and equations (closed form), consistent
initialisation, gradients through the steps (in p, u0, t0 and the save times) against central differences and
the closed form, jit + vmap, a dose, "auto"'s choice, and the boundary's refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad

# --- Robertson, semi-explicit (its algebraic state a zero column of ∂F/∂u') -------------------------------------
K = jnp.array([0.04, 3e7, 1e4])
# SciPy's Radau at rtol 1e-12, atol 1e-14: y(1), y(10)
RADAU = np.array(
    [
        [9.6645973733300095e-01, 3.0746265785785545e-05, 3.3509516401214280e-02],
        [8.4136992384184572e-01, 1.6233909379931077e-05, 1.5861384224877689e-01],
    ]
)


def rates(u, p):
    y1, y2, y3 = u
    k1, k2, k3 = p
    return jnp.stack([-k1 * y1 + k3 * y2 * y3, k1 * y1 - k2 * y2**2 - k3 * y2 * y3, y1 + y2 + y3 - 1])


def robertson(du, u, p, t):
    return jnp.array([1.0, 1.0, 0.0]) * du - rates(u, p)


def test_robertson_against_its_mass_matrix_form_and_radau():
    ts = jnp.array([0.0, 1.0, 10.0])
    prob = sciad.DAEProblem(robertson, jnp.array([1.0, 0.0, 0.0]), jnp.zeros(3), (0.0, 10.0), K)
    sol = sciad.solve(prob, saveat=ts, rtol=1e-8, atol=1e-10)
    mass = sciad.ODEProblem(lambda u, p, t: rates(u, p), prob.u0, (0.0, 10.0), K, mass_matrix=jnp.array([1.0, 1, 0]))
    ref = sciad.solve(mass, saveat=ts, solver="bdf", rtol=1e-8, atol=1e-10)
    # F = M u' − f is the mass-matrix form: the same steps, the same numbers up to rounding
    assert int(sol.stats["steps"]) == int(ref.stats["steps"]) > 50
    np.testing.assert_allclose(sol.us, ref.us, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(sol.us[1:], RADAU, rtol=2e-6)


# --- a DAE whose ∂F/∂u' has no zero column: x' = -a x + z, 0 = z - c x, in states u = Q (x, z), equations mixed by P
Q = jnp.array([[1.0, 0.5], [0.3, 1.0]])
Q_INV = jnp.linalg.inv(Q)
P_MIX = jnp.array([[2.0, 1.0], [1.0, 1.0]])
P0 = jnp.array([1.0, 0.4])  # (a, c): x decays at a - c
TS = jnp.array([0.25, 0.5, 0.9])
RTOL, ATOL = 1e-9, 1e-11


def mixed(du, u, p, t):
    a, c = p
    x, z = Q_INV @ u
    return P_MIX @ jnp.stack([(Q_INV @ du)[0] + a * x - z, z - c * x])


def exact(p, u0, ts, t0=0.0):
    """u(ts) (T, 2) from u0's differential part x0 = (Q⁻¹ u0)_0 (its algebraic part solved: z = c x)."""
    a, c = p
    x = (Q_INV @ u0)[0] * jnp.exp((c - a) * (ts - t0))
    return jnp.stack([x, c * x], axis=-1) @ Q.T


CONSISTENT = Q @ jnp.array([1.0, 0.4])
MIXED = sciad.DAEProblem(mixed, CONSISTENT, jnp.zeros(2), (0.0, 1.0), P0)


def test_mixed_split_is_by_rank():
    jac = np.asarray(MIXED.derivative_jacobian)
    assert jac.shape == (2, 2) and np.all(np.abs(jac) > 0.1)  # no zero column or row: found by rank
    assert MIXED.derivative_jacobian.rank == 1


@jax.jit
def batch(u0s, p):
    return jax.vmap(
        lambda u0: sciad.solve(MIXED, u0=u0, p=p, saveat=jnp.concatenate([jnp.zeros(1), TS]), rtol=RTOL, atol=ATOL).us
    )(u0s)


def test_jit_vmap_consistent_initialisation():
    # the second and third start with inconsistent algebraic parts (du0 zeros is inconsistent for all)
    u0s = jnp.stack([CONSISTENT, Q @ jnp.array([1.0, 2.0]), Q @ jnp.array([-0.5, 0.0])])
    us = batch(u0s, P0)
    ts = jnp.concatenate([jnp.zeros(1), TS])
    for u0, got in zip(u0s, us):
        np.testing.assert_allclose(got, exact(P0, u0, ts), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(us[1, 0], Q @ jnp.array([1.0, 0.4]), rtol=1e-10)  # z = c x at t0


W = jnp.array([[1.0, -2.0], [0.5, 1.0], [3.0, 0.25]])  # the loss's weights on u(TS)


def loss_of(sensealg):
    def loss(p, u0, ts, t0):
        us = sciad.solve(MIXED, u0=u0, p=p, tspan=(t0, 1.0), saveat=ts, sensealg=sensealg, rtol=RTOL, atol=ATOL).us
        return jnp.sum(W * us)

    return loss


FORWARD = jax.jit(loss_of(sciad.DiscreteAdjoint()))


def central(fn, x, h):
    return np.array([(fn(x + h * e) - fn(x - h * e)) / (2 * h) for e in np.eye(x.size)])


@pytest.mark.parametrize("sensealg", [sciad.ForwardDiffSensitivity(), sciad.DiscreteAdjoint()], ids=type)
def test_gradients_through_the_steps(sensealg):
    args = (P0, Q @ jnp.array([1.0, 2.0]), TS, jnp.asarray(0.1))  # an inconsistent u0, initialised
    grads = jax.jit(jax.grad(loss_of(sensealg), argnums=(0, 1, 2, 3)))(*args)
    truth = jax.grad(lambda *a: jnp.sum(W * exact(*a)), argnums=(0, 1, 2, 3))(*args)
    for i, h in enumerate((1e-5, 1e-5, 1e-6, 1e-6)):
        x = jnp.atleast_1d(args[i])

        def at(x, i=i):
            return FORWARD(*(x.reshape(jnp.shape(args[i])) if j == i else a for j, a in enumerate(args)))

        np.testing.assert_allclose(np.atleast_1d(grads[i]), central(at, x, h), rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(grads[i], truth[i], rtol=1e-6, atol=1e-8)
    # u0's algebraic direction (Q e_1) moves nothing: its derivative is zero
    assert abs(float(grads[1] @ (Q @ jnp.array([0.0, 1.0])))) < 1e-8


def test_dose_reinitialises():
    # x jumps by 1 at t = 0.5; z is re-solved to c x there
    dose = sciad.PresetTimeCallback(times=jnp.array([0.5]), affect=lambda u, p, t: u + Q @ jnp.array([1.0, 0.0]))
    sol = sciad.solve(MIXED, saveat=jnp.array([0.5, 1.0]), callbacks=[dose], rtol=RTOL, atol=ATOL)
    after = exact(P0, CONSISTENT, jnp.asarray(0.5)) + (Q @ jnp.array([1.0, P0[1]]))
    np.testing.assert_allclose(sol.us[0], after, rtol=1e-7)
    np.testing.assert_allclose(sol.us[1], exact(P0, after, jnp.asarray(1.0), 0.5), rtol=1e-7)


def test_auto_picks_through_the_steps():
    choice = sciad.select_sensealg(MIXED, saveat=TS)
    assert isinstance(choice.sensealg, sciad.ForwardDiffSensitivity)
    assert choice.heuristic_pick.rule == "implicit-dae" and "n + m = 4 ≤ 8 tangents" in choice.report()
    many = sciad.DAEProblem(lambda du, u, p, t: mixed(du, u, p[:2], t), CONSISTENT, jnp.zeros(2), (0, 1), jnp.ones(9))
    assert isinstance(sciad.select_sensealg(many, saveat=TS).sensealg, sciad.DiscreteAdjoint)


def test_refusals():
    with pytest.raises(ValueError, match="ForwardDiffSensitivity.*DiscreteAdjoint"):
        sciad.solve(MIXED, sensealg=sciad.GaussAdjoint())
    with pytest.raises(ValueError, match="solved by sciad's BDF"):
        sciad.solve(MIXED, solver="rodas5p")
    with pytest.raises(ValueError, match="densely"):
        sciad.solve(MIXED, jacobian="sparse")
    with pytest.raises(ValueError, match=r"du0\[0\] has shape \(3,\) but u0\[0\] has shape \(2,\)"):
        sciad.DAEProblem(lambda du, u, p, t: [du[0] - u[0]], [jnp.ones(2)], [jnp.ones(3)], (0.0, 1.0))
    with pytest.raises(ValueError, match=r"returns a PyTree .* but u0 is an array of shape \(2,\): the residual has"):
        sciad.DAEProblem(lambda du, u, p, t: (du, u), jnp.ones(2), jnp.ones(2), (0.0, 1.0))
    # x' = z, 0 = x - 1: the constraint holds x alone (index 2)
    with pytest.raises(ValueError, match="not index 1"):
        sciad.DAEProblem(lambda du, u, p, t: jnp.stack([du[0] - u[1], u[0] - 1]), jnp.ones(2), jnp.zeros(2), (0, 1))
    with pytest.raises(sciad.SolveError, match="u0 and du0 are not consistent"):
        sciad.solve(MIXED, u0=Q @ jnp.array([1.0, 2.0]), initialization="check")


def test_float32_pytree_state_dense():
    # x' = -a x + z, 0 = z - c x on a dict state, in float32 (F computing in float64 is cast back)
    def residual(du, u, p, t):
        return {"x": du["x"] + p[0] * u["x"] - u["z"], "z": u["z"] - p[1] * u["x"]}

    one, zero = jnp.ones((), jnp.float32), jnp.zeros((), jnp.float32)
    prob = sciad.DAEProblem(residual, {"x": one, "z": one}, {"x": zero, "z": zero}, (0.0, 1.0), P0)
    p = P0.astype(jnp.float32)
    sol = sciad.solve(prob, u0={"x": one, "z": one}, p=p, saveat=TS, rtol=1e-5, atol=1e-7, dense=True)
    x = np.exp((P0[1] - P0[0]) * np.asarray(TS))
    assert sol.us["x"].dtype == jnp.float32
    np.testing.assert_allclose(sol.us["x"], x, rtol=1e-4)
    np.testing.assert_allclose(sol.us["z"], P0[1] * x, rtol=1e-4)  # z initialised to c x from 1
    between = sol.interpolation(jnp.array([0.1, 0.7]))  # the BDF's own dense output
    np.testing.assert_allclose(between["x"], np.exp((P0[1] - P0[0]) * np.array([0.1, 0.7])), rtol=1e-4)
