"""The calibration corpus of BacksolveAdjoint's self-check: problems where its gradient is right and
where it is wrong (unstable backwards in time), the cases the check's limits are set on
(experiments/backsolve_calibration.py prints their margins; tests/test_backsolve_check.py tests them).
The check is then tested on different problems it was not set on: tests/helpers/backsolve_heldout.py.

Right and wrong are measured, not assumed. A gradient's error is relative (its largest entry's,
over the reference's largest entry) against a tight reference (`reference`: DiscreteAdjoint at
rtol = atol = REFERENCE_TOL in float64, with Dopri8, or Kvaerno5 where the problem is stiff). The
gradient is right (`right`) when that error is within RIGHT_FACTOR × what the forward solve's own
accuracy allows: the error InterpolatingAdjoint makes at the same solver and tolerances (`own`: the
same adjoint equations with u from the forward solve instead of re-solved backwards), taken as at
least RTOL_FACTOR × rtol (a global error of a few tens of tolerances is an accurate solve's). It is
wrong otherwise, and where the backward solve fails (the check's step budget included). Each case
says which it is, and tests/test_backsolve_check.py checks that label against the measurement.
"""

import contextlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import sciad
import sciad.adjoints._continuous as continuous
from sciad.problems import hamiltonian_node

REFERENCE_TOL = 1e-12
RIGHT_FACTOR = 10.0
RTOL_FACTOR = 10.0


class Case(NamedTuple):
    """A problem, its save times, solver and tolerances; whether BacksolveAdjoint's gradient is wrong
    there; the steps allowed; and the solver of the tight reference (an implicit one where the
    problem is stiff; None: dopri8)."""

    name: str
    problem: sciad.ODEProblem
    saveat: list
    solver: str
    rtol: float
    atol: float
    wrong: bool
    max_steps: int = 100_000
    reference_solver: str | None = None


def right(error: float, rtol: float, own) -> bool:
    """Whether a gradient with this relative error is right at this rtol, where InterpolatingAdjoint's
    error is `own()` (a function: called only where the rtol alone does not decide)."""
    if error <= RIGHT_FACTOR * RTOL_FACTOR * rtol:
        return True
    return bool(np.isfinite(error) and error <= RIGHT_FACTOR * own())


def own(case: Case, exact) -> float:
    """InterpolatingAdjoint's relative error at the case's solver and tolerances."""
    return relative_error(gradient(case, sciad.InterpolatingAdjoint()), exact)


def loss(case: Case, p, sensealg, *, solver=None, rtol=None, atol=None, dtype=None):
    """Σ u(t)² over the save times."""
    problem = case.problem
    if dtype is not None:
        problem = sciad.ODEProblem(problem.f, np.asarray(problem.u0, dtype), problem.tspan, p)
    ts = jnp.asarray(case.saveat, np.asarray(problem.u0).dtype)
    sol = sciad.solve(
        problem,
        p=p,
        saveat=ts,
        solver=solver or case.solver,
        rtol=rtol or case.rtol,
        atol=atol or case.atol,
        sensealg=sensealg,
        max_steps=case.max_steps,
    )
    return jnp.sum(sol.us**2)


def gradient(case: Case, sensealg, **options) -> np.ndarray:
    """∂loss/∂p, flattened."""
    p = case.problem.p
    if options.get("dtype") is not None:
        p = jax.tree.map(lambda leaf: np.asarray(leaf, options["dtype"]), p)
    return np.asarray(ravel_pytree(jax.jit(jax.grad(lambda p: loss(case, p, sensealg, **options)))(p))[0])


def reference(case: Case) -> np.ndarray:
    """The tight reference gradient: DiscreteAdjoint at REFERENCE_TOL in float64."""
    return gradient(
        case,
        sciad.DiscreteAdjoint(),
        solver=case.reference_solver or "dopri8",
        rtol=REFERENCE_TOL,
        atol=REFERENCE_TOL,
        dtype=np.float64,
    )


def relative_error(g, exact) -> float:
    error = float(np.max(np.abs(np.asarray(g, np.float64) - exact)) / np.max(np.abs(exact)))
    return error if np.isfinite(error) else np.inf


@contextlib.contextmanager
def drift_recorded(drifts: list):
    """Within: every BacksolveAdjoint gradient traced appends to `drifts` the drift its check compares to
    `drift_tolerance` (read where the check hands it to `warn_if`; inf where the backward solve failed)."""
    warn_if = continuous.warn_if

    def recorded(x, pred, message, drift):
        token = jax.pure_callback(
            lambda d: (drifts.append(float(d)), np.zeros((), d.dtype))[1], jax.ShapeDtypeStruct((), drift.dtype), drift
        )
        return warn_if(jax.tree.map(lambda leaf: leaf + token.astype(leaf.dtype), x), pred, message, drift)

    continuous.warn_if = recorded
    try:
        yield drifts
    finally:
        continuous.warn_if = warn_if


def judged(case: Case) -> dict:
    """BacksolveAdjoint's gradient on `case` as its check sees it and as it is: the drift (with no drift limit,
    so every interval is solved; the step budget as it is), the relative error (inf where the backward solve
    failed) and whether the gradient is right (the reference, and InterpolatingAdjoint's error, computed
    only where needed)."""
    with drift_recorded([]) as drifts:
        g = gradient(case, sciad.BacksolveAdjoint(on_instability="warn", drift_tolerance=np.inf))
    (drift,) = drifts
    if not np.isfinite(drift):
        return dict(drift=drift, error=np.inf, right=False)
    exact = reference(case)
    error = relative_error(g, exact)
    return dict(drift=drift, error=error, right=right(error, case.rtol, lambda: own(case, exact)))


def breakpoints(case: Case) -> np.ndarray:
    """t0, the save times and t1: where the backward solve resets u."""
    return np.unique(np.concatenate([case.problem.tspan, np.ravel(case.saveat)]))


def _mlp(hidden: int, seed: int, damping: float, dtype):
    """u' = W2 tanh(W1 u + b1) + b2 − damping·u, 2 states, 5·hidden + 2 parameters."""
    rng = np.random.default_rng(seed)
    w1, w2 = rng.normal(size=(hidden, 2)), rng.normal(size=(2, hidden)) / np.sqrt(hidden)
    p = np.concatenate([w1.ravel(), 0.1 * rng.normal(size=hidden), w2.ravel(), np.zeros(2)]).astype(dtype)

    def f(u, p, t):
        h = hidden
        return (
            p[3 * h : 5 * h].reshape(2, h) @ jnp.tanh(p[: 2 * h].reshape(h, 2) @ u + p[2 * h : 3 * h])
            + p[5 * h :]
            - damping * u
        )

    return f, p


def _pendulum(u, p, t):
    return jnp.stack([u[1], -p[0] * jnp.sin(u[0]) - p[1] * u[1]])


def _lotka_volterra(u, p, t):
    return jnp.stack([p[0] * u[0] - p[1] * u[0] * u[1], -p[2] * u[1] + p[3] * u[0] * u[1]])


def _two_rates(u, p, t):
    """u' = A u, A = R diag(−p0, −p1) Rᵀ with R a 45° rotation: the fast mode's error grows like
    exp((p1 − p0) t) against the slow mode's solution when solved backwards."""
    rotation = jnp.array([[1.0, -1.0], [1.0, 1.0]]) / np.sqrt(2.0)
    return rotation @ (-p * (rotation.T @ u))


def _stuart_landau(u, p, t):
    """u' = (μ − |u|²) u + (ω + b |u|²) J u: an attracting limit cycle of radius √μ, its frequency
    sheared by b (the phase then depends on the radius); p = (μ, ω, b)."""
    r2 = u[0] ** 2 + u[1] ** 2
    return (p[0] - r2) * u + (p[1] + p[2] * r2) * jnp.stack([-u[1], u[0]])


def _brusselator(u, p, t):
    """The Brusselator, x' = A + x²y − (B + 1)x, y' = Bx − x²y: a stable focus at (A, B/A) for
    B < 1 + A²; p = (A, B)."""
    return jnp.stack([p[0] + u[0] ** 2 * u[1] - (p[1] + 1) * u[0], p[1] * u[0] - u[0] ** 2 * u[1]])


def _duffing(u, p, t):
    """x'' + δ x' − x + x³ = 0: settles into a well at x = ±1; p = (δ,)."""
    return jnp.stack([u[1], -p[0] * u[1] + u[0] - u[0] ** 3])


def _rossler(u, p, t):
    """The Rössler system (chaotic, strongly contracting off its attractor); p = (a, b, c)."""
    return jnp.stack([-u[1] - u[2], u[0] + p[0] * u[1], p[1] + u[2] * (u[0] - p[2])])


def _fisher_kpp(points: int):
    """u_t = D u_xx + r u (1 − u) on a periodic grid of `points` cells (stiff: diffusion)."""
    dx = 1.0 / points

    def f(u, p, t):
        return p[0] * (jnp.roll(u, 1) - 2 * u + jnp.roll(u, -1)) / dx**2 + p[1] * u * (1 - u)

    x = np.linspace(0.0, 1.0, points, endpoint=False)
    return f, 0.5 + 0.4 * np.sin(2 * np.pi * x)


def cases() -> list[Case]:
    f, p = _mlp(128, 0, 0.05, np.float64)
    f32, p32 = _mlp(50, 1, 0.05, np.float32)
    f1, p1 = _mlp(32, 3, 0.1, np.float64)
    pend = sciad.ODEProblem(_pendulum, np.array([1.0, 0.0]), (0.0, 100.0), np.array([1.0, 0.2]))
    ham = hamiltonian_node()
    lv = sciad.ODEProblem(_lotka_volterra, np.ones(2), (0.0, 10.0), np.array([1.5, 1.0, 3.0, 1.0]))
    landau = np.array([0.5, 1.0, 0.0])  # μ, ω, shear
    return [
        # right: dissipative or conservative, long horizons, neural ODEs, f32 and f64, several tolerances
        Case(
            "neural ODE, 642 params, t ≤ 30",
            sciad.ODEProblem(f, np.array([1.0, -0.5]), (0.0, 30.0), p),
            [15.0, 30.0],
            "tsit5",
            1e-7,
            1e-7,
            False,
        ),
        Case(
            "neural ODE, 642 params, t ≤ 30, rtol 1e-10",
            sciad.ODEProblem(f, np.array([1.0, -0.5]), (0.0, 30.0), p),
            [15.0, 30.0],
            "tsit5",
            1e-10,
            1e-10,
            False,
        ),
        Case(
            "neural ODE, f32, t ≤ 10",
            sciad.ODEProblem(f32, np.array([1.0, -0.5], np.float32), (0.0, 10.0), p32),
            [10.0],
            "tsit5",
            1e-5,
            1e-5,
            False,
        ),
        Case(
            "pendulum, light damping, t ≤ 30",
            sciad.ODEProblem(_pendulum, np.array([1.0, 0.0]), (0.0, 30.0), np.array([1.0, 0.02])),
            [30.0],
            "dopri5",
            1e-8,
            1e-8,
            False,
        ),
        Case(
            "pendulum, light damping, t ≤ 300",
            sciad.ODEProblem(_pendulum, np.array([1.0, 0.0]), (0.0, 300.0), np.array([1.0, 0.005])),
            [300.0],
            "tsit5",
            1e-7,
            1e-7,
            False,
        ),
        Case("Hamiltonian neural ODE, 400 params, t ≤ 100", ham.problem, ham.saveat, "tsit5", 1e-8, 1e-8, False),
        Case("Lotka–Volterra, t ≤ 10", lv, np.linspace(0, 10, 11), "tsit5", 1e-6, 1e-6, False),
        Case("Lotka–Volterra, t ≤ 10, rtol 1e-10", lv, [10.0], "tsit5", 1e-10, 1e-10, False),
        Case("pendulum, damped, saved every 1", pend, np.linspace(0, 100, 101), "tsit5", 1e-8, 1e-8, False),
        # right as far as the forward solve's accuracy goes: u decays to 5e-5, below atol / rtol, and
        # InterpolatingAdjoint errs as much (5e-4); refused while the drift was measured against the
        # tolerance at the interval's start alone
        Case("pendulum, damped, t ≤ 100", pend, [100.0], "tsit5", 1e-8, 1e-8, False),
        # right although u departs exponentially backwards: the error stays in directions the loss and
        # λ hardly see (a contracting mode, the radius of a limit cycle, a well's floor)
        Case(
            "linear, rates 1 and 4, t ≤ 8",
            sciad.ODEProblem(_two_rates, np.array([1.0, 0.0]), (0.0, 8.0), np.array([1.0, 4.0])),
            [8.0],
            "tsit5",
            1e-8,
            1e-8,
            False,
        ),
        Case(
            "Stuart–Landau limit cycle, t ≤ 20",
            sciad.ODEProblem(_stuart_landau, np.array([0.1, 0.0]), (0.0, 20.0), landau),
            [10.0, 20.0],
            "tsit5",
            1e-7,
            1e-7,
            False,
        ),
        Case(
            "Stuart–Landau, sheared, t ≤ 20",
            sciad.ODEProblem(_stuart_landau, np.array([0.1, 0.0]), (0.0, 20.0), landau + [0, 0, 1]),
            [10.0, 20.0],
            "tsit5",
            1e-7,
            1e-7,
            False,
        ),
        Case(
            "Duffing, damped into a well, t ≤ 40",
            sciad.ODEProblem(_duffing, np.array([0.2, 0.0]), (0.0, 40.0), np.array([0.3])),
            [40.0],
            "tsit5",
            1e-8,
            1e-8,
            False,
        ),
        Case(
            "Duffing, damped into a well, t ≤ 100",
            sciad.ODEProblem(_duffing, np.array([0.2, 0.0]), (0.0, 100.0), np.array([0.3])),
            [50.0, 100.0],
            "tsit5",
            1e-7,
            1e-7,
            False,
        ),
        Case(
            "Brusselator, stable focus, t ≤ 60",
            sciad.ODEProblem(_brusselator, np.array([1.5, 1.0]), (0.0, 60.0), np.array([1.0, 1.5])),
            [30.0, 60.0],
            "tsit5",
            1e-6,
            1e-6,
            False,
        ),
        # wrong: unstable backwards
        Case(
            "Rössler, t ≤ 2",
            sciad.ODEProblem(_rossler, np.array([1.0, 1.0, 0.0]), (0.0, 2.0), np.array([0.2, 0.2, 5.7])),
            [2.0],
            "tsit5",
            1e-8,
            1e-8,
            True,
        ),
        Case(
            "Rössler, t ≤ 2.5",
            sciad.ODEProblem(_rossler, np.array([1.0, 1.0, 0.0]), (0.0, 2.5), np.array([0.2, 0.2, 5.7])),
            [2.5],
            "tsit5",
            1e-8,
            1e-8,
            True,
        ),
        Case(
            "neural ODE, damping 0.1, t ≤ 30",
            sciad.ODEProblem(f1, np.array([1.0, -0.5]), (0.0, 30.0), p1),
            [15.0, 30.0],
            "tsit5",
            1e-7,
            1e-7,
            True,
        ),
        Case(
            "Stuart–Landau limit cycle, t ≤ 40",
            sciad.ODEProblem(_stuart_landau, np.array([0.1, 0.0]), (0.0, 40.0), landau),
            [20.0, 40.0],
            "tsit5",
            1e-7,
            1e-7,
            True,
        ),
        Case(
            "linear, rates 1 and 20, t ≤ 5",
            sciad.ODEProblem(_two_rates, np.array([1.0, 0.0]), (0.0, 5.0), np.array([1.0, 20.0])),
            [5.0],
            "tsit5",
            1e-6,
            1e-6,
            True,
            reference_solver="kvaerno5",
        ),
        fisher_kpp(100),
    ]


def fisher_kpp(points: int) -> Case:
    """Fisher–KPP on `points` cells by Kvaerno5: wrong (diffusion unstable backwards in time)."""
    kpp, kpp0 = _fisher_kpp(points)
    return Case(
        f"Fisher–KPP, {points} states, Kvaerno5",
        sciad.ODEProblem(kpp, kpp0, (0.0, 1.0), np.array([0.01, 1.0])),
        [1.0],
        "kvaerno5",
        1e-6,
        1e-6,
        True,
        reference_solver="kvaerno5",
    )
