"""`sciad bench losses`: losses beyond the saved states, sciad against diffrax's closest equivalent.

- control-cost: a Van der Pol oscillator driven by a control of 16 radial basis functions,
  J(θ) = ∫₀¹⁰ |x|² + 0.1 c(t)² dt. sciad: `integrand=` with every sensealg; diffrax: the
  state augmented with the running cost by hand, with its adjoints.
- time-of-flight: a projectile with quadratic drag, launched at speed v at angle a, lands near
  x = 10 at the final time T; L = (x(T) - 10)² + y(T)² differentiated in (drag, v, a, T).
  sciad: `tspan=(0, T)` traced, every sensealg; diffrax: a traced t1 (its BacksolveAdjoint
  cannot differentiate t1, diffrax issue 244).
- steady states: dose–response fits of gene circuits (`sciad_bench.steady`): `sciad.steady_state`
  with `SteadyStateAdjoint` against diffrax's `ImplicitAdjoint` at a steady-state event.

Each gradient is checked against sciad's `DiscreteAdjoint` at rtol = atol = 1e-10 before it is
timed (`sciad_bench.harness.run`: interleaved rounds, one process).
"""

import dataclasses
import json
import pathlib
import time
from collections.abc import Callable

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np

import sciad
from sciad import get_solver
from sciad.adjoints import engine_option, step_controller
from sciad_bench import harness, plots, tables
from sciad_bench.harness import Combination, sciad_combination
from sciad_bench.steady import induced_circuit, steady_state_cases, time_steady_state

ROUNDS = {False: (15, None), True: (5, 10.0)}  # (rounds, seconds of rounds per tier) by quick
SENSEALGS = (
    "InterpolatingAdjoint",
    "GaussAdjoint",
    "BacksolveAdjoint",
    "DiscreteAdjoint",
    "ForwardDiffSensitivity",
    "ForwardSensitivity",
)
QUICK_SENSEALGS = ("InterpolatingAdjoint", "DiscreteAdjoint")
ENGINES = {"vjp": "jax-reverse", "jvp": "jax-forward", None: None}  # by the sensealg's engine option


@dataclasses.dataclass(frozen=True)
class LossCase:
    """A loss of an ODE solve as a function of a flat vector `inputs` (m,): `objective(x, sensealg)`
    by sciad, `diffrax_objective(x, adjoint)` by diffrax's closest equivalent. What
    `sciad_bench.harness.run` times, as it does a `Benchmark`; `tolerance`: its gradient check's
    (None: the harness's 100 × rtol)."""

    name: str
    inputs: np.ndarray
    states: int
    sciad_loss: Callable
    diffrax_loss: Callable
    rtol: float = 1e-6
    atol: float = 1e-6
    tolerance: float | None = None

    @property
    def size(self) -> int:
        return self.states + self.inputs.size

    def objective(self, x, sensealg="auto"):
        return self.sciad_loss(x, sensealg, self.rtol, self.atol)


CENTRES = np.linspace(0.0, 10.0, 16)


def _control(theta, t):
    return jnp.sum(theta * jnp.exp(-((t - CENTRES) ** 2) / 0.5))


def _van_der_pol(u, theta, t):
    x, v = u[0], u[1]
    return jnp.stack([v, (1 - x**2) * v - x + _control(theta, t)])


def _running_cost(u, theta, t):
    return u[0] ** 2 + u[1] ** 2 + 0.1 * _control(theta, t) ** 2


def control_cost() -> LossCase:
    u0 = np.array([2.0, 0.0])
    prob = sciad.ODEProblem(_van_der_pol, u0, (0.0, 10.0), np.zeros(16))

    def sciad_loss(theta, sensealg, rtol, atol):
        return sciad.solve(
            prob, p=theta, integrand=_running_cost, solver="tsit5", rtol=rtol, atol=atol, sensealg=sensealg
        ).integral

    def augmented(t, y, theta):
        return jnp.concatenate([_van_der_pol(y[:2], theta, t), _running_cost(y[:2], theta, t)[None]])

    def diffrax_loss(theta, adjoint, rtol, atol):
        y0 = jnp.concatenate([jnp.asarray(u0, theta.dtype), jnp.zeros(1, theta.dtype)])
        return _diffrax_solve(augmented, y0, theta, 10.0, adjoint, rtol, atol)[2]

    return LossCase("control-cost", np.full(16, 0.1), 2, sciad_loss, diffrax_loss)


def _projectile(u, p, t):
    speed = jnp.sqrt(u[2] ** 2 + u[3] ** 2)
    return jnp.stack([u[2], u[3], -p[0] * speed * u[2], -1.0 - p[0] * speed * u[3]])


def _launch(x):
    drag, speed, angle, _ = x
    return jnp.stack([0.0 * speed, 0.0 * speed, speed * jnp.cos(angle), speed * jnp.sin(angle)]), drag[None]


def _miss(u1):
    return (u1[0] - 10.0) ** 2 + u1[1] ** 2


def time_of_flight() -> LossCase:
    prob = sciad.ODEProblem(_projectile, np.array([0.0, 0.0, 3.0, 3.0]), (0.0, 4.0), np.array([0.1]))

    def sciad_loss(x, sensealg, rtol, atol):
        u0, p = _launch(x)
        sol = sciad.solve(
            prob, u0=u0, p=p, tspan=(0.0, x[3]), saveat=x[3:], solver="tsit5", rtol=rtol, atol=atol, sensealg=sensealg
        )
        return _miss(sol.us[-1])

    def diffrax_loss(x, adjoint, rtol, atol):
        u0, p = _launch(x)
        return _miss(_diffrax_solve(lambda t, u, p: _projectile(u, p, t), u0, p, x[3], adjoint, rtol, atol))

    return LossCase("time-of-flight", np.array([0.05, 4.0, 0.8, 2.2]), 4, sciad_loss, diffrax_loss)


def _diffrax_solve(vector_field, y0, args, t1, adjoint, rtol, atol):
    """y(t1) by diffrax's Tsit5 with sciad's step-size controller."""
    solver = get_solver("tsit5")
    sol = dfx.diffeqsolve(
        dfx.ODETerm(vector_field),
        solver,
        0.0,
        t1,
        None,
        y0,
        args=args,
        saveat=dfx.SaveAt(t1=True),
        stepsize_controller=step_controller(solver, rtol, atol),
        max_steps=4096,
        adjoint=adjoint,
    )
    return sol.ys[-1]  # pyright: ignore[reportOptionalSubscript]  # saved: not None


def diffrax_combination(adjoint: str) -> Combination:
    """The case's `diffrax_objective` with `adjoint` (ForwardMode differentiated by `jax.jacfwd`)."""

    def build(case: LossCase):
        def loss(x):
            return case.diffrax_loss(x, getattr(dfx, adjoint)(), case.rtol, case.atol)

        return jax.jit(jax.jacfwd(loss) if adjoint == "ForwardMode" else jax.grad(loss))

    return Combination(f"diffrax {adjoint}", "jax", build, kind="peer")


def auto_combination() -> Combination:
    return Combination("auto", None, lambda case: jax.jit(jax.grad(lambda x: case.objective(x, "auto"))))


def plan(quick: bool) -> list[tuple[LossCase, list[Combination]]]:
    sensealgs = QUICK_SENSEALGS if quick else SENSEALGS
    combos = [auto_combination()] + [sciad_combination(s, ENGINES[engine_option(s)]) for s in sensealgs]
    peers = [diffrax_combination(a) for a in ("RecursiveCheckpointAdjoint", "BacksolveAdjoint", "ForwardMode")]
    return [(case, combos + peers) for case in (control_cost(), time_of_flight())]


def ratio_table(records) -> str:
    """Per case: auto's and sciad's fastest median against diffrax's fastest correct adjoint."""
    lines = [
        "| case | auto (ms) | fastest sciad (ms) | fastest diffrax (ms) | diffrax / auto | diffrax / fastest sciad |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for case in dict.fromkeys(r["problem"] for r in records):
        group = [r for r in records if r["problem"] == case]
        auto = next((r for r in group if r["sensealg"] == "auto" and r["ok"]), None)
        ours, peer = tables.best(group, kind="sciad"), tables.best(group, kind="peer")
        cells = [f"{r['median_s'] * 1e3:.3g} ({r['label']})" if r else "–" for r in (auto, ours, peer)]
        ratios = [f"{peer['median_s'] / r['median_s']:.2f}" if r and peer else "–" for r in (auto, ours)]
        lines.append(f"| {case} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines) + "\n"


def steady_table(rows) -> str:
    """Steady-state fits: sciad's `SteadyStateAdjoint` against diffrax's `ImplicitAdjoint`."""
    lines = [
        "| steady-state fit | sciad (ms) | diffrax ImplicitAdjoint (ms) | diffrax / sciad | rel. error | ok |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ms = [f"{r[k] * 1e3:.3g}" if r[k] else "–" for k in ("sciad_s", "diffrax_s")]
        speedup = f"{1 / r['ratio']:.2f}" if r["ratio"] else "–"
        lines.append(f"| {r['name']} | {ms[0]} | {ms[1]} | {speedup} | {r['rel_error']:.1e} | {r['ok']} |")
    return "\n".join(lines) + "\n"


def time_cases(cases, *, quick: bool, repeats: int | None) -> list[dict]:
    """Each (case, combinations) of `cases` checked and timed by `sciad_bench.harness.run`, with progress."""
    rounds, budget = ROUNDS[quick]
    progress = harness.Progress(sum(len(c) + 1 for _, c in cases))
    records = []
    for case, combos in cases:
        records += harness.run(
            case, combos, repeats=repeats or rounds, budget=budget, progress=progress, tolerance=case.tolerance
        )
    progress.close()
    return records


def run_losses(*, quick: bool = False, repeats: int | None = None, out=None, verbose: bool = True) -> list[dict]:
    """Run the cases, write records.json, losses.png and table.md to `out` (default results/losses)."""
    rounds = ROUNDS[quick][0]
    out = pathlib.Path(out or "results/losses")
    start = time.perf_counter()
    records = time_cases(plan(quick), quick=quick, repeats=repeats)
    steady = time_steady_state(repeats or rounds, [induced_circuit(10, 8)] if quick else steady_state_cases())
    out.mkdir(parents=True, exist_ok=True)
    (out / "records.json").write_text(
        json.dumps({"experiment": "losses", "quick": quick, "records": records, "steady_state": steady}, indent=1)
    )
    plots.violin_plot(
        records, out / "losses.png", f"losses{' (quick)' if quick else ''}: gradient time, {records[0]['device']}"
    )
    table = (
        f"# losses{' (quick)' if quick else ''}\n\n{ratio_table(records)}\n{steady_table(steady)}\n"
        f"{tables.markdown_table(records)}"
    )
    (out / "table.md").write_text(table)
    if verbose:
        print(table)
        print(f"losses: {len(records)} records in {time.perf_counter() - start:.0f} s -> {out}/")
    return records
