"""`sciad bench dae`: index-1 DAEs M u' = f(u, p, t) (a singular diagonal M), sciad's Rodas5P against
SUNDIALS' IDAS through CasADi: forward solves, and gradients of a loss of the saved states in three
or five parameters, checked against a tight reference, then timed in interleaved rounds in one process
(`sciad.timing.compare`).

Problems:

- **Robertson** as a DAE (3 states): y1' = −k1 y1 + k3 y2 y3, y2' = k1 y1 − k3 y2 y3 − k2 y2²,
  0 = y1 + y2 + y3 − 1 (the conservation law replaces y3's equation); θ = log(k1, k2, k3) at
  (0.04, 3e7, 1e4), y(0) = (1, 0, 0), saved at t = 0.4, 4, 40; loss Σ_t (y1 + 10⁴ y2 + y3).
  rtol = 1e-6, atol = 1e-10.
- **reaction–diffusion with an algebraic potential** (2N states): on x ∈ [0, 1], N cells of width
  h = 1/N (cell centres),

      u_t = D u_xx + a u (1 − u) − b u φ          (zero flux at both ends)
      0   = φ_xx − κ² φ + u                        (φ = 0 at both ends)

  — logistic growth of a density u, consumed where a screened-Poisson potential φ, sourced by u
  itself, is high. The algebraic block's Jacobian ∂/∂φ = Δ_h − κ² I is nonsingular (negative
  definite), so the DAE is index 1. Second-order central differences (ghost cells: u mirrored,
  φ negated). p = (D, a, b) = (0.01, 1, 20), κ = 5; u(0) = 0.1 + 0.8 exp(−((x − 0.3)/0.1)²),
  φ(0) solved from u(0) (consistent initialisation: sciad's Newton, IDAS's IDACalcIC); saved at
  t = 1, 2, 3, 4, 5; loss Σ_t mean(u²) + mean(φ). rtol = 1e-6, atol = 1e-8. Stiffness grows as
  D/h² (2,500 at N = 500). The full run: 100, 1,000, 5,000 and 20,000 states; quick: 100.
- **a lithium-ion cell** (full run only): the single-particle model with electrolyte (SPMe, Marquis et al.
  2019) of `sciad_bench.battery`, Chen 2020's LG M50 parameters, 40 shells per particle and 30 electrolyte
  cells per region: 170 differential states (particle and electrolyte concentrations) and 93 algebraic ones
  (the electrolyte potential per cell, the two Butler–Volmer overpotentials, the terminal voltage), 263 in
  all; a 1C discharge from rest to 3,000 s (83 % of the nominal capacity, V from 4.02 to 3.24 V; every
  concentration stays inside its range), saved every 300 s; θ = the logs of the two particle
  diffusivities, the two reaction-rate constants and a factor on the electrolyte diffusivity; loss Σ_t V(t).
  rtol = 1e-6, atol = 1e-8. `voltage_curve` (dae-battery.png) draws the discharge by both solvers.

Methods: sciad `solve(..., solver="rodas5p", jacobian="auto")`: one factorisation of M/(hγ) − J per
step, reused by every stage and by the derivatives' solves; "auto" takes the sparse path from 256
states on (the pattern of J from f's jaxpr ∪ M's, its entries by coloured JVPs, SciPy's SuperLU on
the host: `sciad.stiff.Sparse`), a dense Jacobian and LU below (Robertson, 100 states); the
consistent initialisation's Newton goes by the sparse LU too (the sparse and dense paths side by side
are in paper/tables/dae.md). Its gradients by ForwardDiffSensitivity, DiscreteAdjoint, GaussAdjoint (up to `GAUSS_UP_TO`
states) and "auto" (DiscreteAdjoint but on Robertson, `Choice.report()`), and ForwardDiffSensitivity from the
consistent u0 with `initialization="none"` ("u0 consistent", the initialisation's own cost left out: the same
gradient, since
Rodas's first step re-solves the algebraic states by a Newton step whose derivative in them vanishes at
consistency, and on the reaction–diffusion their initial values do not depend on p at all). A call left out
at a size is recorded with the reason. IDAS (`casadi.integrator(..., "idas", {"x": ..., "z": ..., "ode": ...,
"alg": ...}, 0, saveat)`, its Jacobians sparse and symbolic, CasADi's default linear solver, a
sparse QR), forward, with forward
sensitivities (`jtimes(L, θ, I, False)`: 3 directions) and with adjoint sensitivities (`jtimes(L,
θ, 1, True)`: the reverse mode of the integrator, IDAS's backward problem from checkpoints).
Tolerances matched: the same rtol and atol for both (IDAS's adjoint and sensitivities at its
defaults, the forward's).

CasADi's IDAS adjoint over an output grid fails on both problems (IDASolveB: "the error test failed
repeatedly", or IDACalcICB: no consistent backward initial values; CasADi 3.8.2), and errs by ~1 %
(Robertson) or ~2e-4 (reaction–diffusion) when its seeds fall on the algebraic outputs.
"IDAS adjoint (output grid)" is that form, recorded as it fails; "IDAS adjoint (per interval)"
chains one integrator per save interval (one backward problem each, started at its end) with the
loss written in the differential states, which is the same loss on consistent states (Robertson:
y3 = 1 − y1 − y2; reaction–diffusion: mean(φ) = wᵀu with w = (κ² I − Δ_h)⁻ᵀ 1/N; the battery: V in
closed form, `SPMe.consistent`). Its backward problem shares the forward's tolerances (CasADi 3.8 has no
separate ones), and at the matched ones it errs beyond the check from 5,000 states (4.7e-4, 2.2e-3 at 20,000):
"IDAS adjoint (per interval), tolerances / 100" is the same at rtol and atol / `IDAS_TIGHTER` (beyond
`IDAS_TIGHTER_FROM` states).

Each record: problem, states, what (forward, gradient), name, compile_s (the first call, compilation
or CasADi's construction of the derivative integrators included), median_s, times_s, rel_error
against the reference (sciad's ForwardDiffSensitivity from the consistent u0 at the tolerances × 1e-4), ok
(or why a call was skipped at this size), steps (forward; IDAS's from its stats).
"""

import dataclasses
import functools
import json
import pathlib
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse
import scipy.sparse.linalg

import sciad
from sciad.timing import compare
from sciad_bench import plots
from sciad_bench.battery import THETA as BATTERY_THETA
from sciad_bench.battery import SPMe, namespace
from sciad_bench.peers import casadi_call
from sciad_bench.tables import seconds

SIZES = {True: (50,), False: (50, 500, 2500, 10_000)}  # N: reaction–diffusion has 2N states
AGREEMENT = {"forward": 1e-4, "gradient": 1e-4}  # rtol 1e-6 solves against one at 1e-10
TIGHT = 1e-4  # the reference's rtol and atol: the benchmark's times this
IDAS = "IDAS (CasADi)"
SENSEALGS = ("ForwardDiffSensitivity", "DiscreteAdjoint", "GaussAdjoint", "auto")
# states: GaussAdjoint beyond is left out (1.2 s at 1,000 states, 15x IDAS's adjoint, growing faster than the rest)
GAUSS_UP_TO = 5_000
GAUSS_WHY = "its backward Rodas forms the whole (λ, μ) system's Jacobian every step"
# IDAS's adjoint (per interval) at the matched tolerances errs by 4.7e-4 (5,000 states) and 2.2e-3 (20,000): its
# backward problem shares the forward's tolerances (CasADi 3.8 has no separate ones); at rtol, atol / 100 by 1e-5.
# Timed beside it beyond IDAS_TIGHTER_FROM states (below, the matched one passes: 4.7e-5 at 1,000 states)
IDAS_TIGHTER = 100.0
IDAS_TIGHTER_FROM = 1_000
# A gradient's max_steps: DiscreteAdjoint allocates its residuals for max_steps steps up front, a dense (n, n)
# matrix each (diffrax's default 4,096 asks 36 GB at 1,000 states)
MAX_STEPS = 1024


@dataclasses.dataclass(frozen=True)
class DAEBench:
    """One problem, for sciad (`problem`, `loss` of the saved states (T, n)) and for IDAS
    (`casadi_dae(P)`: the CasADi DAE dict in symbolic parameters P, `x0`, `z0` (a guess),
    `casadi_loss(xf, zf, P)` of the saved differential and algebraic states (columns: times),
    `casadi_loss_differential` the same written with the differential states only)."""

    name: str
    grid: int | None
    problem: sciad.ODEProblem
    saveat: np.ndarray
    loss: Callable
    rtol: float
    atol: float
    casadi_dae: Callable
    x0: np.ndarray
    z0: np.ndarray
    casadi_loss: Callable
    casadi_loss_differential: Callable
    u0_consistent: np.ndarray

    @property
    def states(self) -> int:
        return self.problem.u0.size


# --- Robertson -----------------------------------------------------------------------------------

ROBERTSON_WEIGHTS = np.array([1.0, 1e4, 1.0])


def _robertson_f(u, theta, t):
    k1, k2, k3 = jnp.exp(theta)
    return jnp.stack(
        [-k1 * u[0] + k3 * u[1] * u[2], k1 * u[0] - k3 * u[1] * u[2] - k2 * u[1] ** 2, u[0] + u[1] + u[2] - 1]
    )


def robertson() -> DAEBench:
    import casadi as ca

    saveat = np.array([0.4, 4.0, 40.0])
    problem = sciad.ODEProblem(
        _robertson_f,
        np.array([1.0, 0.0, 0.0]),
        (0.0, float(saveat[-1])),
        np.log([0.04, 3e7, 1e4]),
        mass_matrix=np.array([1.0, 1.0, 0.0]),
    )

    def casadi_dae(P):
        x, z = ca.SX.sym("x", 2), ca.SX.sym("z", 1)
        k = ca.exp(P)
        return {
            "x": x,
            "z": z,
            "p": P,
            "ode": ca.vertcat(-k[0] * x[0] + k[2] * x[1] * z, k[0] * x[0] - k[2] * x[1] * z - k[1] * x[1] ** 2),
            "alg": x[0] + x[1] + z - 1,
        }

    w = ROBERTSON_WEIGHTS
    return DAEBench(
        "Robertson",
        None,
        problem,
        saveat,
        lambda us: jnp.sum(us @ w),
        1e-6,
        1e-10,
        casadi_dae,
        np.array([1.0, 0.0]),
        np.zeros(1),
        lambda xf, zf, P: ca.sum2(ca.DM(w[:2]).T @ xf + w[2] * zf),
        lambda xf, zf, P: ca.sum2(ca.DM(w[:2] - w[2]).T @ xf + w[2]),  # y3 = 1 − y1 − y2
        problem.u0,
    )


# --- reaction–diffusion with an algebraic potential ----------------------------------------------

KAPPA = 5.0


def _laplacian(v, h, mirror: bool):
    """The 3-point Laplacian of cell values v (N,): ghost cells mirrored (zero flux) or negated (v = 0 at the wall)."""
    sign = 1.0 if mirror else -1.0
    padded = jnp.concatenate([sign * v[:1], v, sign * v[-1:]])
    return (padded[2:] - 2 * v + padded[:-2]) / h**2


def _laplacian_matrix(n: int, h: float, mirror: bool):
    sign = 1.0 if mirror else -1.0
    L = scipy.sparse.diags([np.ones(n - 1), -2 * np.ones(n), np.ones(n - 1)], [-1, 0, 1], format="lil")  # pyright: ignore[reportArgumentType]  # SciPy's stubs
    L[0, 0] += sign  # pyright: ignore[reportIndexIssue]  # SciPy's stubs
    L[n - 1, n - 1] += sign  # pyright: ignore[reportIndexIssue]  # SciPy's stubs
    return (L / h**2).tocsc()  # pyright: ignore[reportAttributeAccessIssue]  # SciPy's stubs


def reaction_diffusion(n: int) -> DAEBench:
    import casadi as ca

    h = 1.0 / n
    x = (np.arange(n) + 0.5) * h
    u0 = np.concatenate([0.1 + 0.8 * np.exp(-(((x - 0.3) / 0.1) ** 2)), np.zeros(n)])

    def f(y, p, t):
        D, a, b = p
        u, phi = y[:n], y[n:]
        return jnp.concatenate(
            [D * _laplacian(u, h, True) + a * u * (1 - u) - b * u * phi, _laplacian(phi, h, False) - KAPPA**2 * phi + u]
        )

    saveat = np.arange(1.0, 6.0)
    problem = sciad.ODEProblem(
        f,
        u0,
        (0.0, float(saveat[-1])),
        np.array([0.01, 1.0, 20.0]),
        mass_matrix=np.concatenate([np.ones(n), np.zeros(n)]),
    )
    lap_u, lap_phi = ca.DM(_laplacian_matrix(n, h, True)), ca.DM(_laplacian_matrix(n, h, False))

    def casadi_dae(P):
        u, phi = ca.SX.sym("u", n), ca.SX.sym("phi", n)
        return {
            "x": u,
            "z": phi,
            "p": P,
            "ode": P[0] * (lap_u @ u) + P[1] * u * (1 - u) - P[2] * u * phi,
            "alg": lap_phi @ phi - KAPPA**2 * phi + u,
        }

    def loss(us):
        return jnp.sum(jnp.mean(us[:, :n] ** 2, axis=1) + jnp.mean(us[:, n:], axis=1))

    def casadi_loss(uf, phif, P):
        return ca.sum2(ca.sum1(uf**2) + ca.sum1(phif)) / n

    # φ = A⁻¹ u, A = κ² I − Δ_h, on consistent states (whatever p): mean(φ) = wᵀ u with w = A⁻ᵀ 1 / n
    A = (KAPPA**2 * scipy.sparse.identity(n) - _laplacian_matrix(n, h, False)).tocsc()
    w = ca.DM(scipy.sparse.linalg.spsolve(A.T.tocsc(), np.ones(n) / n))

    def casadi_loss_differential(uf, phif, P):
        return ca.sum2(ca.sum1(uf**2) / n + w.T @ uf)

    return DAEBench(
        "reaction-diffusion",
        n,
        problem,
        saveat,
        loss,
        1e-6,
        1e-8,
        casadi_dae,
        u0[:n],
        np.zeros(n),
        casadi_loss,
        casadi_loss_differential,
        np.concatenate([u0[:n], scipy.sparse.linalg.spsolve(A, u0[:n])]),  # pyright: ignore[reportArgumentType, reportCallIssue]  # SciPy's stubs
    )


# --- a lithium-ion cell: the single-particle model with electrolyte ---------------------------------

BATTERY_SAVEAT = np.arange(300.0, 3001.0, 300.0)  # s: 1C from rest to 83 % of the nominal capacity (V ≈ 3.24 V)


def battery(shells: int = 40, cells: int = 30) -> DAEBench:
    """The SPMe of `sciad_bench.battery` (Marquis et al. 2019, Chen 2020's LG M50), 1C discharge, θ = its five
    log-parameters; loss Σ_t V(t) over the save times. IDAS's per-interval adjoint takes V in the differential
    states (`SPMe.consistent`)."""
    import casadi as ca

    model = SPMe(shells, cells)
    k = model.differential
    theta = np.asarray(BATTERY_THETA)
    z0 = np.asarray(model.consistent(jnp.asarray(model.x0), jnp.asarray(theta), namespace("jax")))
    u0 = np.concatenate([model.x0, np.zeros_like(z0)])
    problem = sciad.ODEProblem(model.rhs, u0, (0.0, float(BATTERY_SAVEAT[-1])), theta, mass_matrix=model.mass_matrix)
    xp = namespace("casadi")

    def casadi_dae(P):
        x, z = ca.SX.sym("x", k), ca.SX.sym("z", model.states - k)
        ode, alg = model.equations(x, z, P, xp)
        return {"x": x, "z": z, "p": P, "ode": ode, "alg": alg}

    def casadi_loss_differential(xf, zf, P):
        return sum(model.consistent(xf[:, i], P, xp)[-1] for i in range(xf.shape[1]))

    return DAEBench(
        "SPMe battery",
        None,
        problem,
        BATTERY_SAVEAT,
        lambda us: jnp.sum(us[:, -1]),
        1e-6,
        1e-8,
        casadi_dae,
        model.x0,
        z0,
        lambda xf, zf, P: ca.sum2(zf[-1, :]),
        casadi_loss_differential,
        np.concatenate([model.x0, z0]),
    )


# --- the calls -----------------------------------------------------------------------------------


def _compiled(jitted, *args):
    compiled = jitted.lower(*args).compile()
    return functools.partial(compiled, *args)


def sciad_forward(b: DAEBench, rtol=None, atol=None, initialization=None):
    """jit of the saved states; with `initialization="none"` from `u0_consistent`."""
    u0 = b.u0_consistent if initialization == "none" else b.problem.u0
    return _compiled(
        jax.jit(
            lambda p: (
                sciad.solve(
                    b.problem,
                    u0=u0,
                    p=p,
                    saveat=b.saveat,
                    solver="rodas5p",
                    jacobian="auto",
                    rtol=rtol or b.rtol,
                    atol=atol or b.atol,
                    initialization=initialization,
                ).us
            )
        ),
        b.problem.p,
    )


def sciad_steps(b: DAEBench) -> int:
    sol = jax.jit(
        lambda p: sciad.solve(
            b.problem, p=p, saveat=b.saveat, solver="rodas5p", rtol=b.rtol, atol=b.atol, jacobian="auto"
        )
    )(b.problem.p)
    return int(sol.stats["steps"])


def sciad_gradient(b: DAEBench, sensealg, rtol=None, atol=None, initialization=None):
    """jit(grad) of the loss; with `initialization="none"` from `u0_consistent` (no initialisation to differentiate)."""
    u0 = b.u0_consistent if initialization == "none" else b.problem.u0

    def loss(p):
        return b.loss(
            sciad.solve(
                b.problem,
                u0=u0,
                p=p,
                saveat=b.saveat,
                solver="rodas5p",
                rtol=rtol or b.rtol,
                atol=atol or b.atol,
                jacobian="auto",
                sensealg=sensealg,
                initialization=initialization,
                max_steps=MAX_STEPS,
            ).us
        )

    return _compiled(jax.jit(jax.grad(loss)), b.problem.p)


def reference(b: DAEBench, what: str):
    """The tight reference of `what`: sciad's forward solve or ForwardDiffSensitivity gradient, from the consistent
    u0, at rtol, atol × TIGHT."""
    tight = dict(rtol=b.rtol * TIGHT, atol=b.atol * TIGHT, initialization="none")
    return sciad_forward(b, **tight) if what == "forward" else sciad_gradient(b, "ForwardDiffSensitivity", **tight)


def _integrator(b: DAEBench, P, grid, t0=0.0, tighter: float = 1.0):
    import casadi as ca

    return ca.integrator(
        "F",
        "idas",
        b.casadi_dae(P),
        t0,
        [float(t) for t in grid],
        {"abstol": b.atol / tighter, "reltol": b.rtol / tighter, "max_num_steps": 100_000},
    )


def idas_forward(b: DAEBench, stats: dict | None = None):
    """IDAS's saved states (T, n), u = (x, z) as sciad's."""
    import casadi as ca

    P = ca.SX.sym("P", b.problem.p.size)
    F = _integrator(b, P, b.saveat)
    p = np.asarray(b.problem.p)

    solve = casadi_call(lambda p: F(x0=b.x0, z0=b.z0, p=p), p)

    def call():
        out = solve()
        if stats is not None:
            stats.update(F.stats())
        return np.vstack([np.asarray(out["xf"]), np.asarray(out["zf"])]).T

    return call


def idas_gradient(b: DAEBench, mode: str, tighter: float = 1.0):
    """The gradient of the loss by IDAS: mode "forward" (forward sensitivities, one direction per parameter),
    "adjoint" (the integrator's reverse mode over the output grid) or "adjoint per interval" (one integrator
    per save interval, the loss in the differential states where one is given); rtol and atol / `tighter`."""
    import casadi as ca

    k = b.problem.p.size
    P = ca.MX.sym("P", k)
    if mode == "adjoint per interval":
        x, z, loss, t0 = ca.DM(b.x0), ca.DM(b.z0), 0, 0.0
        lossof = b.casadi_loss_differential or b.casadi_loss
        for t in b.saveat:
            F = _integrator(b, ca.SX.sym("P", k), [float(t)], t0, tighter)
            out = F(x0=x, z0=z, p=P)
            x, z, t0 = out["xf"], out["zf"], float(t)
            loss = loss + lossof(x, z, P)
        grad = ca.jtimes(loss, P, ca.DM.ones(1), True)
    else:
        F = _integrator(b, ca.SX.sym("P", k), b.saveat)
        out = F(x0=b.x0, z0=b.z0, p=P)
        loss = b.casadi_loss(out["xf"], out["zf"], P)
        grad = ca.jtimes(loss, P, ca.DM.eye(k), False) if mode == "forward" else ca.jtimes(loss, P, ca.DM.ones(1), True)
    fn = ca.Function("gradient", [P], [grad])
    call = casadi_call(fn, np.asarray(b.problem.p))
    return lambda: np.asarray(call()).ravel()


def forward_plan(b: DAEBench) -> dict:
    """name → build (called with a stats dict)."""
    return {"sciad Rodas5P": lambda stats: sciad_forward(b), IDAS: lambda stats: idas_forward(b, stats)}


def gradient_plan(b: DAEBench) -> dict:
    """name → build (called with a stats dict) or, for a call left out at this size, the reason."""
    plan = {}
    for s in SENSEALGS:
        if s == "GaussAdjoint" and b.states > GAUSS_UP_TO:
            plan[f"sciad {s}"] = f"skipped beyond {GAUSS_UP_TO:,} states: {GAUSS_WHY}"
        else:
            plan[f"sciad {s}"] = (lambda s: lambda stats: sciad_gradient(b, s))(s)
    plan["sciad ForwardDiffSensitivity, u0 consistent"] = lambda stats: sciad_gradient(
        b, "ForwardDiffSensitivity", initialization="none"
    )
    plan[f"{IDAS} forward sensitivities"] = lambda stats: idas_gradient(b, "forward")
    plan[f"{IDAS} adjoint (output grid)"] = lambda stats: idas_gradient(b, "adjoint")
    plan[f"{IDAS} adjoint (per interval)"] = lambda stats: idas_gradient(b, "adjoint per interval")
    if b.states > IDAS_TIGHTER_FROM:
        plan[f"{IDAS} adjoint (per interval), tolerances / {IDAS_TIGHTER:g}"] = lambda stats: idas_gradient(
            b, "adjoint per interval", IDAS_TIGHTER
        )
    return plan


def _measure(b: DAEBench, what: str, plan: dict, rounds: int, log) -> list[dict]:
    skipped = {name: why for name, why in plan.items() if isinstance(why, str)}
    names = [name for name in plan if name not in skipped]
    stats = {name: {} for name in names}
    builds = [functools.partial(plan[name], stats[name]) for name in names]
    rows = compare(
        builds,
        functools.partial(reference, b, what),
        tolerance=AGREEMENT[what],
        rounds=rounds,
        on_compile=lambda i: log(f"  {b.name} {b.states} states, {what}: compiling {names[i]}"),
    )
    rows = dict(zip(names, rows))
    steps = {"sciad Rodas5P": sciad_steps(b)} if what == "forward" else {}
    if stats.get(IDAS):
        steps[IDAS] = stats[IDAS].get("nsteps")  # pyright: ignore[reportArgumentType]  # inferred too narrow
    return [
        {
            "problem": b.name,
            "grid": b.grid,
            "states": b.states,
            "what": what,
            "name": name,
            "steps": steps.get(name),
            **rows.get(name, {"ok": skipped.get(name), "times_s": []}),
        }
        for name in plan
    ]


def problems(quick: bool, sizes=None, with_battery: bool | None = None):
    """The benchmark's problems, smallest first (built lazily: a 1,000-state problem takes a moment); the battery
    (`with_battery`) by default in the full run only."""
    yield robertson
    if not quick if with_battery is None else with_battery:
        yield battery
    for n in sizes or SIZES[quick]:
        yield functools.partial(reaction_diffusion, n)


def voltage_curve(b: DAEBench, points: int = 61) -> dict:
    """The battery's terminal voltage over its discharge by sciad and by IDAS (both at the benchmark's
    tolerances): {"t_s", "sciad", "IDAS"}."""
    ts = np.linspace(0.0, float(b.saveat[-1]), points)
    curve = dataclasses.replace(b, saveat=ts[1:])
    V = [
        np.concatenate([[b.u0_consistent[-1]], np.asarray(call())[:, -1]])
        for call in (sciad_forward(curve), idas_forward(curve))
    ]
    return {"t_s": ts.tolist(), "sciad": V[0].tolist(), "IDAS": V[1].tolist()}


def run_dae(
    *,
    quick: bool = False,
    repeats: int | None = None,
    out=None,
    verbose: bool = True,
    sizes=None,
    with_battery: bool | None = None,
) -> list[dict]:
    """Robertson, the battery (`with_battery`, default: the full run) and reaction–diffusion at every N of `sizes`
    (default `SIZES[quick]`), forward then gradient; records.json, dae.png, table.md (and the battery's
    discharge curve, dae-battery.png) in `out` (default results/dae)."""
    out = pathlib.Path(out or "results/dae")
    rounds = repeats or (2 if quick else 5)
    log = print if verbose else (lambda *_: None)
    start = time.perf_counter()
    records, curve = [], None
    for make in problems(quick, sizes, with_battery):
        b = make()
        for what, plan in (("forward", forward_plan(b)), ("gradient", gradient_plan(b))):
            rows = _measure(b, what, plan, rounds, log)
            records += rows
            for r in rows:
                log(
                    f"  {r['problem']:18s} {r['states']:5d} states {what:8s} {r['name']:42s} "
                    f"{seconds(r.get('median_s'))} s (first {seconds(r.get('compile_s'))}) ok={r.get('ok')}"
                )
        if make is battery:
            curve = voltage_curve(b)
    table = write(records, out, quick, curve)
    log(table)
    log(f"dae: {len(records)} records in {time.perf_counter() - start:.0f} s -> {out}/")
    return records


def write(records, out, quick: bool, curve: dict | None = None) -> str:
    """records.json, dae.png and table.md of `records` in `out` (and, given the battery's `voltage_curve`, it in
    records.json and dae-battery.png); the table."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "records.json").write_text(
        json.dumps(
            {"experiment": "dae", "quick": quick, "records": records, "battery_voltage": curve}, indent=1, default=float
        )
    )
    panels = {}
    for r in records:
        if r["problem"] == "reaction-diffusion" and r.get("ok") is True and r.get("median_s") is not None:
            panels.setdefault(f"reaction–diffusion, {r['what']}", {}).setdefault(r["name"], []).append(
                (r["states"], r["median_s"], not r["name"].startswith("sciad"))
            )
    plots.panels_log_log(
        panels,
        out / "dae.png",
        f"index-1 DAE, sciad Rodas5P (sparse LU from 256 states) vs SUNDIALS IDAS (sparse), rtol 1e-6"
        f"{' (quick)' if quick else ''}",
        xlabel="states",
        ylabel="median seconds per call",
    )
    if curve is not None:
        _voltage_plot(curve, out / "dae-battery.png")
    table = f"# DAEs: sciad against SUNDIALS IDAS{' (quick)' if quick else ''}\n\n{markdown(records)}"
    (out / "table.md").write_text(table)
    return table


def _voltage_plot(curve: dict, path) -> None:
    fig, ax = plots.plt.subplots(figsize=(5, 3.5))
    t = np.asarray(curve["t_s"]) / 60
    ax.plot(t, curve["sciad"], "-", label="sciad Rodas5P")
    ax.plot(t, curve["IDAS"], "--", label=IDAS)
    ax.set_xlabel("time (min)")
    ax.set_ylabel("terminal voltage (V)")
    ax.set_title("SPMe, LG M50 (Chen 2020), 1C discharge", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plots.plt.close(fig)


def markdown(records) -> str:
    """One row per problem, size, call and method: median, first call, steps, error against the reference,
    ok, and the median over IDAS's (forward: IDAS's forward solve; gradient: IDAS's fastest correct gradient);
    the fastest correct median of each group in bold."""
    rows = [
        "| problem | states | call | method | median (s) | first call (s) | steps | rel. error | ok | / IDAS |",
        "|---|---:|---|---|---:|---:|---:|---:|---|---:|",
    ]
    groups = {}
    for r in records:
        groups.setdefault((r["problem"], r["states"], r["what"]), []).append(r)
    for (problem, states, what), group in groups.items():
        timed = [r for r in group if r.get("ok") is True and r.get("median_s")]
        idas = [r for r in timed if r["name"].startswith(IDAS)]
        base = min((r["median_s"] for r in idas), default=None)
        best = min((r["median_s"] for r in timed), default=None)
        for r in group:
            median = seconds(r.get("median_s"))
            if r.get("median_s") is not None and r["median_s"] == best:
                median = f"**{median}**"
            ratio = "–" if base is None or not r.get("median_s") else f"{r['median_s'] / base:.2f}×"
            ok = r.get("ok")
            ok = ok if ok in (True, False) else str(ok).replace("|", "/")[:100]
            rows.append(
                f"| {problem} | {states} | {what} | {r['name']} | {median} | {seconds(r.get('compile_s'))} "
                f"| {r.get('steps') or '–'} | "
                f"{'–' if r.get('rel_error') is None else format(r['rel_error'], '.1e')} | {ok} | {ratio} |"
            )
    return "\n".join(rows) + "\n"
