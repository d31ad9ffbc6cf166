"""Steady states: the gradient of a dose–response fit by `sciad.steady_state` (`SteadyStateAdjoint`)
against diffrax's closest equivalent, `diffeqsolve` to a steady-state event with `ImplicitAdjoint`,
checked against each other and timed side by side (`sciad.timing.compare`: interleaved rounds, medians).

Both step u' = f from u0 with Kvaerno5 at the same tolerances until RMS ‖f(u)‖ ≤ atol + rtol ‖u‖;
sciad then polishes with Newton's method (so its steady state is the more accurate one), and both
differentiate by the implicit function theorem (diffrax: a dense Jacobian of f; sciad: dense up to
100 states, GMRES above).
"""

import dataclasses
import functools

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np

import sciad
from sciad import get_solver
from sciad.adjoints import step_controller
from sciad.problems import GeneCircuitRHS
from sciad.timing import compare

TOLERANCE = 1e-8  # rtol = atol of both solves
AGREEMENT = 1e-4  # relative error (max norm) allowed between the two gradients: diffrax stops at the event


@dataclasses.dataclass(frozen=True)
class InducedCircuit:
    """A gene circuit (`GeneCircuitRHS`) with an inducer: gene 0's input h₀ is raised by the dose;
    p = {"circuit": [W, h, R, λ] (n² + 3n), "dose": d}."""

    n: int

    def __call__(self, x, p, t):
        inducer = np.eye(1, self.n * self.n + 3 * self.n, self.n * self.n)[0]
        return GeneCircuitRHS(self.n)(x, p["circuit"] + p["dose"] * inducer, t)


@dataclasses.dataclass(frozen=True)
class SteadyCase:
    """A dose–response fit: the steady states at `doses` (D,), loss = mean squared error to `data`
    (D, n), the circuit's own steady states at its true parameters; differentiated at the problem's
    parameters (the truth perturbed by 10%)."""

    name: str
    problem: sciad.ODEProblem
    doses: np.ndarray
    data: np.ndarray

    def loss(self, us):
        return jnp.mean((us - self.data) ** 2)

    def sciad_objective(self, circuit):
        def steady(dose):
            p = {"circuit": circuit, "dose": dose}
            return sciad.steady_state(self.problem, p=p, rtol=TOLERANCE, atol=TOLERANCE).u

        return self.loss(jax.vmap(steady)(jnp.asarray(self.doses)))

    def diffrax_objective(self, circuit):
        f, solver = self.problem.f, get_solver("kvaerno5")
        term = dfx.ODETerm(lambda t, u, p: f(u, p, t))

        def steady(dose):
            sol = dfx.diffeqsolve(
                term,
                solver,
                0.0,
                jnp.inf,
                None,
                jnp.asarray(self.problem.u0),
                args={"circuit": circuit, "dose": dose},
                stepsize_controller=step_controller(solver, TOLERANCE, TOLERANCE),
                event=dfx.Event(dfx.steady_state_event()),
                adjoint=dfx.ImplicitAdjoint(),
            )
            return sol.ys[-1]  # pyright: ignore[reportOptionalSubscript]  # saved: not None

        return self.loss(jax.vmap(steady)(jnp.asarray(self.doses)))


def induced_circuit(n: int, doses: int, seed: int = 0) -> SteadyCase:
    """n genes coupled weakly enough (W ~ N(0, (0.2/√n)²), R ~ U(1, 3), λ ~ U(1, 2): a contraction,
    one stable steady state for every dose), h ~ N(−0.5, 0.5²), doses log-spaced over [0.1, 10]."""
    rng = np.random.default_rng(seed)
    w = 0.2 / np.sqrt(n) * rng.standard_normal((n, n))
    truth = np.concatenate([w.ravel(), rng.normal(-0.5, 0.5, n), rng.uniform(1, 3, n), rng.uniform(1, 2, n)])
    dose_range = np.geomspace(0.1, 10.0, doses)
    problem = sciad.ODEProblem(InducedCircuit(n), np.zeros(n), (0.0, 1.0), {"circuit": truth, "dose": np.array(1.0)})
    case = SteadyCase(f"induced-gene-circuit-{n} ({doses} doses)", problem, dose_range, np.zeros((doses, n)))
    data = jax.jit(
        jax.vmap(lambda d: sciad.steady_state(problem, p={"circuit": truth, "dose": d}, rtol=1e-12, atol=1e-12).u)
    )(dose_range)
    perturbed = truth * (1 + 0.1 * rng.standard_normal(truth.shape))
    problem = sciad.ODEProblem(problem.f, problem.u0, problem.tspan, {"circuit": perturbed, "dose": np.array(1.0)})
    return dataclasses.replace(case, problem=problem, data=np.asarray(data))


def steady_state_cases() -> list[SteadyCase]:
    """A 10-gene circuit at 8 doses (130 parameters, dense solves) and a 120-gene one at 4 doses
    (14,760 parameters, GMRES)."""
    return [induced_circuit(10, 8), induced_circuit(120, 4)]


def time_steady_state(repeats: int, cases=None) -> list[dict]:
    """For each case (default `steady_state_cases()`): sciad's gradient checked against diffrax's
    (`rel_error`, max norm, at most `AGREEMENT`: `ok`), then both timed in `repeats` interleaved rounds.
    Rows: name, sciad_s and diffrax_s (median seconds per gradient, compiled), ratio (sciad over
    diffrax), rel_error, ok."""
    rows = []
    for case in steady_state_cases() if cases is None else cases:
        p = jnp.asarray(case.problem.p["circuit"])
        builds = [
            functools.partial(_gradient_call, objective, p)
            for objective in (case.sciad_objective, case.diffrax_objective)
        ]
        sciad_row, diffrax_row = compare(
            builds, reference=builds[1], tolerance=AGREEMENT, rounds=repeats, slow_call=None
        )
        sciad_s, diffrax_s = sciad_row.get("median_s"), diffrax_row.get("median_s")
        rows.append(
            {
                "name": case.name,
                "sciad_s": sciad_s,
                "diffrax_s": diffrax_s,
                "ratio": sciad_s / diffrax_s if sciad_s and diffrax_s else None,
                "rel_error": sciad_row["rel_error"],
                "ok": sciad_row["ok"],
            }
        )
    return rows


def _gradient_call(objective, p):
    """The call to time: the jitted gradient of `objective` at `p`."""
    return functools.partial(jax.jit(jax.grad(objective)), p)
