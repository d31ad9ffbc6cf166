"""`solve`: the one pipeline every problem kind goes through (`sciad._problem.AbstractProblem`): the
shared checks, the kind's `Setup`, the sensealg ("auto"'s, or the one given, refusing what it cannot
serve), its solve (through the events where there are callbacks), the `Solution`."""

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Int, PRNGKeyArray, PyTree, Real, Shaped

from sciad import _events as events
from sciad._brownian import BrownianPath
from sciad._custom_types import RealScalarLike
from sciad._dense import DenseOutput
from sciad._errors import raising_solve_errors
from sciad._problem import (
    AbstractProblem,
    Request,
    check_inputs,
    check_integrand,
    check_saveat,
    check_time_span,
)
from sciad._stiff import AbstractStageJacobian, is_implicit
from sciad.adjoints._base import AbstractSensitivity
from sciad.adjoints._registry import resolve


class Solution(eqx.Module):
    """`ts` (T,); `us`: u0's structure with a leading time axis (T, ...), like diffrax's `ys`;
    `integral`: ∫_{t0}^{t1} g(u, p, t) dt with the integrand's structure (None without one);
    `stats` (integers) with `steps`, `accepted_steps`, `rejected_steps`, `function_evaluations`
    of the forward solve; with `dense=True`, `interpolation(t)` evaluates u (u0's structure) at any t in tspan.
    `t_final`: t1, or the time a stopping event ended the solve (save times after it are reported at
    t_final, with the state there). With callbacks, `event_times`: one array (max_events,) per callback,
    the times it fired in order, then inf; `event_counts` (callbacks,) how many times each fired.
    An SDE's solve: `brownian`, the path it used (`.evaluate(t0, t1)`: the increment W(t1) - W(t0)); pass it
    back as `brownian=` (or the same key) to solve on the same path."""

    ts: Real[Array, " T"]
    us: PyTree[Shaped[Array, "T ..."]]
    stats: dict[str, Any]
    t_final: Real[Array, ""]
    interpolation: DenseOutput | None = None
    integral: PyTree[Array] | None = None
    event_times: tuple[Real[Array, " max_events"], ...] | None = None
    event_counts: Int[Array, " callbacks"] | None = None
    brownian: BrownianPath | dfx.AbstractBrownianPath | None = None


SDESolution = Solution  # an SDE's solve is a `Solution` with its `brownian` path


@raising_solve_errors
def solve(
    prob: AbstractProblem,
    *,
    saveat: Real[ArrayLike, " T"] | Sequence[RealScalarLike] | None = None,
    u0: PyTree[ArrayLike] | None = None,
    p: PyTree[Any] = None,
    tspan: tuple[RealScalarLike, RealScalarLike] | None = None,
    integrand: Callable[[PyTree[Array], PyTree[Any], RealScalarLike], PyTree[Array]] | None = None,
    solver: str | dfx.AbstractSolver | None = "auto",
    rtol: float | None = None,
    atol: float | None = None,
    sensealg: str | AbstractSensitivity = "auto",
    max_steps: int = 4096,
    dense: bool = False,
    jacobian: str | AbstractStageJacobian = "auto",
    callbacks: Sequence[events.AbstractCallback] = (),
    max_events: int | None = None,
    adjoint_rtol: float | None = None,
    adjoint_atol: float | None = None,
    initialization: str | None = None,
    stepsize_controller: dfx.PIDController | None = None,
    dt0: RealScalarLike | None = None,
    key: PRNGKeyArray | None = None,
    brownian: BrownianPath | dfx.AbstractBrownianPath | None = None,
    history_steps: int | None = None,
) -> Solution:
    """Solve `prob` (an `ODEProblem`, a `DAEProblem`, an `SDEProblem` or a `DDEProblem`) and save u at `saveat`
    (default: t0 and t1; concrete or traced times (T,)). Options a problem's kind does not take are refused, naming it.

    Differentiable (jax.grad, jax.vjp, jax.jvp, jax.jacfwd, jax.hessian; under jax.jit and
    jax.vmap) with respect to `u0` and `p` passed here (PyTrees like the problem's), values f
    closes over, the save times and the time span, by the rules of `sensealg` (default `"auto"`:
    one picked from what is known at trace time, as `sciad.select_sensealg` reports it; or any of
    `sciad.adjoints.SENSEALGS`, as an instance or its name). `tspan=(t0, t1)` overrides the
    problem's (concrete or traced; t1 < t0 integrates backwards in time, save times then
    decreasing; traced times keep the problem's direction). `integrand` g(u, p, t) (a scalar or a
    PyTree of arrays) gives `Solution.integral` = ∫_{t0}^{t1} g dt, integrated with the solve under
    its error control (q' = g rides along with u), differentiable by every sensealg (the
    continuous adjoints add ∂g/∂u to λ's equation and ∂g/∂p to μ's). `solver` (default "auto") is a
    name in `SOLVERS`, a diffrax solver, or "auto" (or None): chosen while tracing, as
    `sciad.select_sensealg(...).report()` says with why: "rodas5p" for a mass matrix or a stiff
    problem, else "tsit5". Stiff means that an explicit method would spend more steps on stability
    alone than `sciad._solver_choice.stiff_steps` allows: from the eigenvalues of ∂f/∂u that power
    iterations of JVPs find at u0 and an explicit first step on, counting the modes that decay
    within the time span (an undamped oscillation is the accuracy's work, not stiffness;
    `sciad._solver_choice`), read from concrete values: this call's u0, p and tspan, the problem's
    own where they are traced ("tsit5", saying so, when nothing is concrete); stage solves
    dense or sparse as `jacobian` says. Steps are adaptive (PID control at `rtol`, `atol`; or by a
    `diffrax.PIDController` passed as `stepsize_controller`, whose gains and limits every solve takes,
    the forward solve's at its rtol and atol, the adjoint solves' at theirs), the first of size `dt0`
    (t1 - t0's sign) where given (default: selected from f at u0, as diffrax does). A solve that
    needs more than `max_steps` steps (default 4096, as diffrax) raises an error (rtol, atol: default
    1e-6). The continuous adjoints solve their linear adjoint systems for the cotangent divided by its largest entry and
    scale back, so a gradient's accuracy does not depend on the loss's scale; they control that
    normalised λ (and μ) at `adjoint_rtol`, `adjoint_atol` (default: `rtol`, `atol`). With
    `dense=True`, `Solution.interpolation(t)` gives u at any t in tspan from the same solve, its
    derivatives by the same sensealg (`sciad._dense.DenseOutput`). `jacobian` is how an implicit
    solver's Newton steps solve with I − hγ ∂f/∂u, in the forward solve and in the adjoint solves:
    "auto" (default: "sparse" for an implicit or Rosenbrock solver on hundreds of states or more whose
    ∂f/∂u is sparse, else "dense"; `sciad._stiff.auto_jacobian`), "dense" (diffrax's dense Jacobian and LU),
    "sparse" (the pattern detected from f's jaxpr, entries by coloured JVPs, SciPy's sparse LU once
    per step; "bdf" keeps it across steps), "matrix-free" (Newton–Krylov: GMRES on Jacobian-vector
    products; not "bdf"), or a `sciad.stiff.Sparse(...)` / `sciad.stiff.MatrixFree(...)`.

    A problem with a mass matrix M (`ODEProblem(..., mass_matrix=M)`; a singular M is an index-1
    DAE) is solved by a solver that takes M: "rodas5p" ("auto"'s choice then) or "rodas4", or
    `sciad.Rodas5P()` / `sciad.Rodas4()` (given without M, they take the problem's). They
    factorise W = M/(hγ) − ∂f/∂u once per step and solve every stage with it: densely
    (`jacobian="dense"`), or with `jacobian="sparse"` (and "auto" where it picks it) by the sparse
    path (∂f/∂u's pattern from f's jaxpr ∪ M's, coloured JVPs, SciPy's sparse LU on the host), the
    derivatives' linear solves reusing the same factors; or with "matrix-free" by GMRES on
    Jacobian-vector products to a tight tolerance (`sciad.stiff.MatrixFree.stage_rtol`).
    `initialization` (default: "consistent" where M is singular, else "none"): "consistent" solves u0's algebraic
    states from its
    differential ones (Newton, differentiated by the implicit function theorem: d/du0 of the
    differential part is right; `sciad._dae.initialise`), "check" raises a `SolveError` when u0's
    algebraic states are further from consistency than atol + rtol |u|, "none" takes u0 as it is.
    Every sensealg differentiates it with respect to u0, p and the values f closes over:
    `ForwardDiffSensitivity` and `DiscreteAdjoint` through the solver's steps ("auto" picks one of
    them), `ForwardSensitivity` by the sensitivity DAE M S' = (∂f/∂u) S + ∂f/∂p from consistent
    tangents, the continuous adjoints by the adjoint DAE Mᵀ λ' = −(∂f/∂u)ᵀ λ (− (∂g/∂u)ᵀ with an
    integrand), solved backwards by the same solver, with consistent λ at every save time and
    ∂L/∂u0 = Mᵀ λ(t0) (`sciad._dae`; `BacksolveAdjoint` refuses, by its own check, what it cannot
    re-solve backwards: stiff problems such as Robertson). A derivative in a time (t0, t1, a save time,
    an event time) is u' there, for a DAE the consistent u' (the algebraic states' from the time
    derivative of their equations: `sciad._dae.consistent_derivative`), and `dense=True` interpolates by
    Rodas's own dense output. After an event's affect the state is re-initialised at the event time in
    the same `initialization` mode: "consistent" re-solves its algebraic states (differentiated as at t0),
    "check" raises a `SolveError` if the affect left them inconsistent, "none" takes the affect's state as
    it is (the affect must then keep it consistent itself).

    `callbacks`: `sciad.ContinuousCallback` and `sciad.PresetTimeCallback` events (doses, impacts,
    resets, stopping conditions), in time order, several in one step in order, simultaneous ones in
    the order given; the saved state at an event time is the state after it. Every sensealg
    differentiates through them (event times that depend on u0 and p included: `sciad._events`).
    `max_events` (static; default: the preset times, plus 16 with continuous callbacks) bounds the
    events; more raise a `SolveError` saying so. Each segment between events is one solve of at most
    `max_steps` steps.

    An `SDEProblem` is solved along the Brownian path from `key` or `brownian` (its own options: a
    `sciad.BrownianPath` to reuse, `Solution.brownian`, or a diffrax Brownian path). With `dt0`, fixed
    steps on the grid t_k = t0 + k dt (dt = dt0, or the largest step below it that divides tspan; save
    and preset event times on the grid), along a `BrownianPath` (exact increments per step,
    reconstructible, flat memory); without `dt0`, adaptive steps (PID control at `rtol`, `atol`, default
    1e-3, of the solver's error estimate, landing on the save times) along a
    `diffrax.VirtualBrownianTree`; a traced tspan takes adaptive steps. `solver`: a name in
    `SDE_SOLVERS` or one of diffrax's SDE solvers (`sciad._sde.LOOP_SOLVER_TYPES`; default: adaptive,
    Heun; fixed, Milstein for Itô diagonal and scalar noise, Euler–Maruyama for Itô general noise, Heun
    for Stratonovich); a solver of the other calculus solves the problem with the drift corrected.
    Differentiable pathwise (the derivative of this path's solution) in u0, p and the values the
    functions close over, not in the times, by every sensealg: ForwardDiffSensitivity,
    ForwardSensitivity and DiscreteAdjoint through the steps, ReversibleAdjoint by reversible Heun's
    own reversal, the continuous adjoints by the adjoint SDE in Stratonovich form (fixed steps).
    `Solution.brownian` is the path it used. Not yet: state-dependent events and t1 < t0 (refused
    naming the fix).

    A `DAEProblem` (F(u', u, p, t) = 0, index 1) is solved by `sciad.BDF` on its residual, its algebraic states
    read off ∂F/∂u' at (du0, u0) and initialised as `initialization` says (default "consistent"); differentiated
    through its steps (`ForwardDiffSensitivity`, `DiscreteAdjoint`, `ForwardSensitivity`) in u0, p and the times;
    `PresetTimeCallback`s re-initialise after their affects (`sciad._dae_problem`).

    A `DDEProblem` is solved by the method of steps: a Runge-Kutta solver ("auto": Tsit5, or Kvaerno5 where
    the instantaneous Jacobian is stiff), adaptive, its rate reading the solution's own dense output at the
    past times it asks for (the last `history_steps` steps kept, default as many as fit a small memory
    budget; a `SolveError` says when the lags reach back further), its steps landing on the breakpoints
    t0 + Σ kᵢ τᵢ (up to the solver's order + 1) where lags do not depend on the state, a step longer than
    the shortest lag refined by fixed-point iteration, and a step at most twice the past step it reads
    from; `PresetTimeCallback`s (doses) applied between its steps. Differentiable through its steps
    (`ForwardDiffSensitivity`, "auto"'s pick, and `ForwardSensitivity`, whose sensitivity DDE discretised on
    the same steps is their derivative) in u0, p and the values the functions close over: lags(p) and the
    history's parameters included, the breakpoints moving with the lags. Not yet: other sensealgs,
    Rosenbrock solvers, `ContinuousCallback`s, derivatives in the times and the dose times, breakpoints of
    state-dependent lags (their steps are controlled by the error estimate).

    Checked at the call, raising TypeError or ValueError that names the argument (and the PyTree
    leaf) and the fix: `u0`, `p` like the problem's, with float leaves, finite where concrete
    (`sciad._problem.check_inputs`); the tolerances and `max_steps`; `tspan` and `saveat` where
    concrete; the integrand (by tracing it); the callbacks (their functions by tracing, concrete
    preset times inside tspan); and `sensealg` (a class, one of diffrax's adjoints or a misspelt
    name is refused naming what to pass). What can only be checked while the solve runs (traced
    u0 or p with NaN or inf, named by leaf; traced times; more than `max_steps` steps; an unstable
    BacksolveAdjoint; too many events) raises `sciad.SolveError`: as itself where this call runs
    eagerly (also in the backward pass of an eager `jax.grad`), and inside JAX's runtime error,
    as its last line, under a user's `jax.jit`.
    """
    if not isinstance(prob, AbstractProblem):
        raise TypeError(
            f"prob must be a sciad.ODEProblem, DAEProblem, SDEProblem or DDEProblem, got {type(prob).__name__}"
        )
    given = {
        "dense": dense,
        "jacobian": jacobian,
        "adjoint_rtol": adjoint_rtol,
        "adjoint_atol": adjoint_atol,
        "initialization": initialization,
        "stepsize_controller": stepsize_controller,
        "key": key,
        "brownian": brownian,
        "history_steps": history_steps,
    }
    options = _options(prob, given)
    u0, p = check_inputs(prob, u0, p)
    t0, t1, sign = check_time_span(tspan, prob.tspan)
    ts = check_saveat(saveat, t0, t1, sign)
    entries = 0 if integrand is None else check_integrand(integrand, u0, p, t0)
    auto = sensealg is None or (isinstance(sensealg, str) and sensealg == "auto")
    callbacks = tuple(callbacks) if isinstance(callbacks, (list, tuple)) else callbacks
    request = Request(
        u0,
        p,
        t0,
        t1,
        sign,
        ts,
        integrand,
        entries,
        solver,
        auto,
        rtol,
        atol,
        max_steps,
        dt0,
        callbacks,
        max_events,
        options,
    )
    staged = prob.staged(request)
    # "auto" picks from shapes, settings and the problem's facts (under jit too); else an instance, a name or a
    # `sciad.adjoints.describe` string
    sensealg = staged.auto_sensealg() if auto else resolve(sensealg)
    setup, u0_flat = staged.prepared(sensealg)
    reason = sensealg.refusal(setup)
    if reason is not None:
        raise ValueError(reason)
    advice = sensealg.slow_for(setup.n, setup.implicit)
    if advice:
        warnings.warn(advice, UserWarning, stacklevel=3)
    p_flat, dtype, n, T = staged.p, setup.f.dtype, setup.n, len(ts)
    extras = {}
    if callbacks and not staged.events_in_steps:
        plan = staged.plan()
        us, q, stats, happened = events.solve(setup, sensealg, plan, u0_flat, p_flat)
        extras = _event_record(plan, happened, sign)
        ts = sign * jnp.minimum(sign * jnp.asarray(ts, dtype), sign * extras["t_final"])
    else:
        ys, stats = sensealg.solve(setup, u0_flat, p_flat)
        us, q = ys[:T, :n], ys[T, n:]
        extras["t_final"] = jnp.asarray(t1, dtype)
        if callbacks:  # preset times, each of which happened
            plan = staged.plan()
            happened = events.Events(
                extras["t_final"], plan.preset, plan.preset_owners, jnp.sum(plan.preset_owners >= 0)
            )
            extras = _event_record(plan, happened, sign)
    integral = None if staged.q is None else staged.q.unravel(q)
    evals = _evaluations_per_step(setup.solver)
    steps = stats.astype(jnp.int32)
    solution_stats = {
        "steps": steps[0],
        "accepted_steps": steps[1],
        "rejected_steps": steps[2],
        "function_evaluations": steps[0] * evals if evals else None,
    }
    extras |= staged.extras(setup, sensealg, u0_flat)
    return Solution(jnp.asarray(ts, dtype), jax.vmap(staged.u.unravel)(us), solution_stats, integral=integral, **extras)


def _options(prob: AbstractProblem, given: dict[str, Any]) -> dict[str, Any]:
    """The options of `prob`'s kind (`AbstractProblem.options`, defaults where not given); an option given that
    another kind takes is refused, naming the kind that takes it."""
    for name, value in given.items():
        if name in prob.options or value is None or (type(value) in (bool, str) and value == _DEFAULTS[name]):
            continue
        raise ValueError(
            f"{type(prob).__name__} solves take no {name}= (their own options: "
            f"{', '.join(prob.options) or 'none'}): drop it"
        )
    return {name: (default if given.get(name) is None else given[name]) for name, default in prob.options.items()}


_DEFAULTS = {"dense": False, "jacobian": "auto"}


def _event_record(plan: "events.Plan", happened: "events.Events", sign: int) -> dict:
    """`Solution`'s t_final, event_times and event_counts from the segments' ends and owners, in user time."""
    times = []
    for i in range(plan.callbacks):
        mine = happened.owners[: plan.max_events] == i
        order = jnp.argsort(~mine, stable=True)  # its events first, in time order
        times.append(jnp.where(mine[order], sign * happened.times[: plan.max_events][order], jnp.inf))
    counts = jnp.stack([jnp.sum(happened.owners == i) for i in range(plan.callbacks)]).astype(jnp.int32)
    return {"t_final": sign * happened.t_final, "event_times": tuple(times), "event_counts": counts}


def _evaluations_per_step(solver) -> int | None:
    """f evaluations per step of an explicit Runge–Kutta solver (FSAL-aware); None otherwise."""
    tableau = getattr(solver, "tableau", None)
    if tableau is None or is_implicit(solver):
        return None
    return tableau.num_stages - (1 if tableau.fsal else 0)
