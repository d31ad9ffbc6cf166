"""`ODEProblem`: M u' = f(u, p, t), u(t0) = u0, on tspan = (t0, t1) (M the identity unless a
`mass_matrix` is given), and what it adds to the solve: its solver (by name, or "auto" by stiffness), a
DAE's consistent initialisation, stage Jacobians, backward time, dense output."""

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PyTree

from sciad import _events as events
from sciad._bdf import BDF
from sciad._custom_types import RealScalarLike
from sciad._dae import MassMatrix, check_initialization, dae_solver, initialise
from sciad._dense import DenseOutput
from sciad._problem import (
    TRACED_TSPAN,
    AbstractProblem,
    Request,
    Staged,
    check_params,
    check_rhs,
    check_state,
    check_steps,
    check_tolerances,
    check_tspan,
)
from sciad._pytrees import Layout
from sciad._rosenbrock import Rodas4, Rodas5P
from sciad._solver_choice import choose
from sciad._stiff import AbstractStageJacobian, is_implicit, with_stage_jacobian
from sciad._vector_field import VectorField
from sciad.adjoints._base import AbstractSensitivity, Setup

if TYPE_CHECKING:
    import scipy.sparse

SOLVERS = {
    "tsit5": dfx.Tsit5,
    "dopri5": dfx.Dopri5,
    "dopri8": dfx.Dopri8,
    "bosh3": dfx.Bosh3,
    "kvaerno3": dfx.Kvaerno3,
    "kvaerno5": dfx.Kvaerno5,
    "rodas5p": Rodas5P,
    "rodas4": Rodas4,
    "bdf": BDF,
}


def get_solver(solver) -> dfx.AbstractSolver:
    """A diffrax solver: `solver` itself, or a new one by its name in `SOLVERS`."""
    if isinstance(solver, dfx.AbstractSolver):
        return solver
    if solver not in SOLVERS:
        raise ValueError(
            f'unknown solver {solver!r}; choose one of {sorted(SOLVERS)}, "auto" (chosen by '
            "stiffness) or pass a diffrax solver"
        )
    return SOLVERS[solver]()


class ODEProblem(AbstractProblem):
    """An initial value problem u' = f(u, p, t) on tspan = (t0, t1).

    `u0` is any PyTree of float arrays (a vector, a dict of arrays, ...) and
    `f(u, p, t)` returns du/dt with u0's structure and shapes; `p` is any
    PyTree (arrays, dicts, an equinox model; its non-array leaves are static)
    or None (no parameters: an empty vector). `f` may close over other values,
    traced ones included (their gradients are right). Write f with
    `sciad.ad.namespace(u)` so every engine can run it. A PyTree itself.

    Checked here, when the problem is made (each error names the argument and the leaf): f is
    callable; u0's leaves are float arrays or numbers (`check_state`) and p's array leaves are
    float (`check_params`), both finite where they are concrete (traced ones, made under
    `jax.jit`, are checked when a solve runs: `check_finite`); tspan is two finite numbers with
    t1 ≠ t0 (t1 < t0 integrates backwards in time: `check_tspan`); and f(u0, p, t0) returns u0's
    structure and shapes (`check_rhs`: by tracing f, without running it; a diffrax-ordered
    f(t, y, args) is named as such).

    `mass_matrix` M (constant) makes it M u' = f(u, p, t) over the flattened state (n,) (u0's leaves
    raveled in order, as `jax.flatten_util.ravel_pytree`): None (the identity), a vector (n,) (M's
    diagonal), a matrix (n, n), or a SciPy sparse matrix (made dense: the DAE solvers factorise
    densely). A singular M makes a differential-algebraic problem (index 1): a zero diagonal entry,
    or a zero row, marks an algebraic equation, whose row of f is the residual that must vanish,
    e.g. M = [1, 1, 0] with f's last entry y1 + y2 + y3 - 1. Checked here (shape against u0's size,
    finite entries) and held as a `sciad._dae.MassMatrix` (`numpy.asarray(prob.mass_matrix)`);
    `sciad.solve` then steps a DAE solver (Rodas5P by default) and initialises consistently.
    """

    f: Callable[[PyTree[Array], PyTree[Any], RealScalarLike], PyTree[Array]]
    u0: PyTree[Array]
    tspan: tuple[float, float] = eqx.field(static=True)
    p: PyTree[Any] = None
    mass_matrix: MassMatrix | None = eqx.field(static=True, default=None)
    options: ClassVar[dict[str, Any]] = {
        "stepsize_controller": None,
        "dense": False,
        "jacobian": "auto",
        "adjoint_rtol": None,
        "adjoint_atol": None,
        "initialization": None,
    }

    def __init__(
        self,
        f: Callable[[PyTree[Array], PyTree[Any], RealScalarLike], PyTree[Array]],
        u0: PyTree[ArrayLike],
        tspan: tuple[RealScalarLike, RealScalarLike],
        p: PyTree[Any] = None,
        *,
        mass_matrix: Float[ArrayLike, " n"]
        | Float[ArrayLike, "n n"]
        | "scipy.sparse.sparray | scipy.sparse.spmatrix"
        | None = None,
    ):
        if not callable(f):
            raise TypeError(f"ODEProblem(f=...): f must be callable f(u, p, t), got {f!r}")
        self.f = f
        self.u0 = check_state("u0", u0)
        # no parameters: an empty vector of u0's precision (it must not widen a float32 solve)
        self.p = check_params("p", np.zeros((0,), jnp.result_type(*jax.tree.leaves(self.u0))) if p is None else p)
        self.tspan = check_tspan(tspan, traced=TRACED_TSPAN)
        self.mass_matrix = MassMatrix.of(mass_matrix, sum(int(np.size(x)) for x in jax.tree.leaves(self.u0)))
        check_rhs(f, self.u0, self.p, self.tspan[0])

    def staged(self, request: Request) -> "Staged":
        return _staged(self, request)


def _staged(prob: ODEProblem, r: Request) -> "_ODEStaged":
    """The ODE's solve: its solver ("auto": by stiffness, from concrete values), a DAE's solver and stage
    Jacobians, the field in the solve's forward time s = sign t, steps under PID control."""
    o = r.options
    rtol, atol, controller, dt0 = check_steps(o["stepsize_controller"], r.dt0, r.rtol, r.atol, r.sign)
    check_tolerances(rtol, atol, r.max_steps)
    adjoint_rtol, adjoint_atol = (
        own if own is not None else tol for own, tol in ((o["adjoint_rtol"], rtol), (o["adjoint_atol"], atol))
    )
    check_tolerances(adjoint_rtol, adjoint_atol, r.max_steps, prefix="adjoint_")
    mass = prob.mass_matrix
    initialization = check_initialization(o["initialization"], mass)
    jacobian: str | AbstractStageJacobian = o["jacobian"]
    # concrete values: the problem's where traced; stiffness for auto's sensealg with an explicit solver
    solver, _, stiff = choose(
        prob,
        r.solver,
        r.u0,
        r.p,
        (r.t0, r.t1),
        rtol=rtol,
        atol=atol,
        jacobian=jacobian,
        implicit=lambda solver: is_implicit(get_solver(solver)),
        stiffness=r.auto,
    )
    solver = dae_solver(get_solver(solver), mass, r.entries)
    solver, stages = with_stage_jacobian(solver, jacobian, prob.f, r.u0, r.p, r.t0)
    if o["dense"] and r.callbacks:
        raise ValueError(
            "dense=True with callbacks is not supported: the state jumps at events; save at the times you need (saveat)"
        )
    sign = r.sign
    # Time runs forward inside: a backward problem in s = -t, u' = -f(u, p, -s), q' = -g(u, p, -s).
    f, g = (prob.f, r.integrand) if sign > 0 else (_in_reverse(prob.f), r.integrand and _in_reverse(r.integrand))
    field = VectorField.of(f, r.u0, r.p, sign * r.t0, host=False, integrand=g)
    dtype = field.dtype
    s0, s1 = (sign * jnp.asarray(t, dtype) for t in (r.t0, r.t1))
    saves = sign * jnp.asarray(r.ts, dtype)
    if r.integrand is not None and not r.callbacks:  # q(t1) is saved last
        saves = jnp.concatenate([saves, s1[None]])
    setup = Setup(
        field,
        solver,
        s0,
        s1,
        saves,
        float(rtol),
        float(atol),
        int(r.max_steps),
        float(adjoint_rtol),
        float(adjoint_atol),
        stepsize_controller=controller,
        dt0=None if dt0 is None else jnp.asarray(dt0, dtype),
    )
    u0 = jnp.asarray(field.u.ravel(r.u0), dtype)  # traced leaves checked finite first (check_inputs)
    p = jnp.asarray(field.p.ravel(eqx.filter(r.p, eqx.is_array)), dtype)
    return _ODEStaged(setup, u0, p, field.u, field.q, prob, r, f, g, stiff, stages, initialization)


@dataclasses.dataclass(frozen=True)
class _ODEStaged(Staged):
    setup: Setup
    u0: jax.Array
    p: jax.Array
    u: Layout
    q: Layout | None
    prob: ODEProblem
    request: Request
    f: Callable  # f and the integrand in the solve's forward time
    g: Callable | None
    stiff: Any
    stages: Any
    initialization: str

    def auto_sensealg(self) -> AbstractSensitivity:
        from sciad._auto import auto_sensealg

        r, setup = self.request, self.setup
        # the parameters: p and the traced values f closes over (a network's weights), both differentiated
        return auto_sensealg(
            r.u0,
            (r.p, setup.f.held),
            r.ts,
            solver=setup.solver,
            rtol=setup.rtol,
            atol=setup.atol,
            max_steps=setup.max_steps,
            integral_entries=r.entries,
            jacobian=self.stages,
            mass_matrix=self.prob.mass_matrix is not None,
            stiff=self.stiff,
        ).sensealg

    def prepared(self, sensealg: AbstractSensitivity) -> tuple[Setup, jax.Array]:
        setup, r, mass = self.setup, self.request, self.prob.mass_matrix
        if any(not e.traced for e in sensealg.engines()):  # a host engine calls f with its closure values as they are
            setup = dataclasses.replace(
                setup, f=VectorField.of(self.f, r.u0, r.p, setup.t0, host=True, integrand=self.g)
            )
        consistent = self.initialization == "consistent" and mass is not None and mass.singular
        if sensealg.initialises and consistent and not r.callbacks:
            # initialised in its forward pass: m tangents for p, not n for u0
            return dataclasses.replace(setup, consistent=True), self.u0
        u0 = initialise(self.initialization, setup.f, mass, self.u0, self.p, setup.t0, setup.rtol, setup.atol)
        return setup, u0

    def plan(self):
        r = self.request
        return events.Plan.of(
            r.callbacks, self.setup.f, r.u0, r.p, (r.t0, r.t1), r.sign, r.max_events, self.initialization
        )

    def extras(self, setup: Setup, sensealg: AbstractSensitivity, u0: jax.Array) -> dict[str, Any]:
        if not self.request.options["dense"]:
            return {}
        return {"interpolation": DenseOutput.of(setup, sensealg, u0, self.p, self.request.sign)}


def _in_reverse(fn):
    """fn(u, p, t) in s = -t: -fn(u, p, -s) (leafwise; any array type)."""
    return lambda u, p, s: jax.tree.map(lambda x: -x, fn(u, p, -s))
