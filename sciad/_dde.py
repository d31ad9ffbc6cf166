"""`DDEProblem`: u'(t) = f(u(t), h, p, t) with h(s) the state at a past time s (`history(p, s)` before t0), and
what it adds to the solve: the method of steps on the one loop, the solution's own dense output held as its
past (`Past`, a ring of the last steps), the breakpoints its lags propagate, and a step refined by fixed-point
iteration where a lag is shorter than the step."""

import dataclasses
import functools
import inspect
import itertools
from collections.abc import Callable
from typing import Any, ClassVar

import diffrax as dfx
import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, PyTree

from sciad import _events
from sciad._custom_types import RealScalarLike
from sciad._errors import error_if
from sciad._ode import SOLVERS, get_solver
from sciad._problem import (
    AbstractProblem,
    Request,
    Staged,
    _traced,
    check_params,
    check_state,
    check_steps,
    check_tolerances,
    check_tspan,
)
from sciad._pytrees import Layout, leaf_names
from sciad._solver_choice import auto_solver
from sciad._vector_field import AroundVectorField, VectorField
from sciad.adjoints._base import AbstractSensitivity, Setup, stored_steps

LAG_KINDS = {1: "parameter", 3: "state"}  # a callable's positional parameters -> what its lags depend on
FIXED_POINT_ITERATIONS = 10  # at most, per step whose lag is shorter than the step
FIXED_POINT_TOLERANCE = 1e-2
PAST_STEPS = 2.0  # a step reads a past it may not outrun: at most this many times the past step it starts in


class DDEProblem(AbstractProblem):
    """A delay differential equation u'(t) = f(u(t), h, p, t) on tspan = (t0, t1), u(t0) = u0.

    `f(u, h, p, t)` returns u' with u0's structure, where `h(s)` gives the state (u0's structure) at a past time
    s ≤ t: the solution for s ≥ t0, `history(p, s)` before (`history` None: a constant history equal to u0).
    `lags` are the delays f reads the past at: a tuple of positive numbers, or a callable `lags(p)` returning a
    tuple or vector (delays that depend on the parameters, differentiable in them), or `lags(u, p, t)` (delays
    that depend on the state). They tell the solve where the solution's derivatives jump (t0 + sums of lags,
    which its steps land on) and how far back it keeps the solution. `u0` and `p` are PyTrees as for
    `ODEProblem`. Solved forward in time by a Runge-Kutta solver, explicit or implicit (`sciad.solve`).

    Checked here, each error naming the argument and the fix: callables, u0's and p's leaves, tspan
    (t1 > t0), constant lags (positive, finite), and what f, history and lags return at (u0, p, t0) (traced,
    not run)."""

    f: Callable[..., PyTree[Array]]
    u0: PyTree[Array]
    history: Callable[[PyTree[Any], RealScalarLike], PyTree[Array]] | None
    tspan: tuple[float, float] = eqx.field(static=True)
    p: PyTree[Any] = None
    lags: tuple[float, ...] | Callable = eqx.field(static=True, default=())
    options: ClassVar[dict[str, Any]] = {"history_steps": None, "stepsize_controller": None}

    def __init__(
        self,
        f: Callable[..., PyTree[Array]],
        u0: PyTree[ArrayLike],
        history: Callable[[PyTree[Any], RealScalarLike], PyTree[ArrayLike]] | None,
        tspan: tuple[RealScalarLike, RealScalarLike],
        p: PyTree[Any] = None,
        *,
        lags: tuple[RealScalarLike, ...] | Callable,
    ):
        if not callable(f):
            raise TypeError(f"DDEProblem(f=...): f must be callable f(u, h, p, t), got {f!r}")
        if history is not None and not callable(history):
            raise TypeError(
                f"DDEProblem(history=...): history must be callable history(p, t) or None (u0 before t0), got "
                f"{history!r}"
            )
        self.f, self.history = f, history
        self.u0 = check_state("u0", u0)
        self.p = check_params("p", np.zeros((0,), jnp.result_type(*jax.tree.leaves(self.u0))) if p is None else p)
        self.tspan = check_tspan(tspan)
        if self.tspan[1] < self.tspan[0]:
            raise ValueError(f"DDEProblem(tspan={tspan!r}): delay equations run forwards in time: pass t1 > t0")
        self.lags = _checked_lags(lags)
        check_dde_functions(self)

    def staged(self, request: Request) -> Staged:
        return _staged(self, request)


def _checked_lags(lags) -> tuple[float, ...] | Callable:
    if callable(lags):
        lag_kind(lags)
        return lags
    try:
        values = tuple(float(x) for x in np.atleast_1d(np.asarray(lags, dtype=float)))
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"DDEProblem(lags=...) must be a tuple of numbers, lags(p) or lags(u, p, t), got {lags!r}"
        ) from e
    if not values or not all(np.isfinite(x) and x > 0 for x in values):
        raise ValueError(
            f"DDEProblem(lags={lags!r}): the lags must be positive finite numbers (a delay of 0 is an ODE)"
        )
    return values


def lag_kind(lags) -> str:
    """ "constant" (a tuple), "parameter" (`lags(p)`) or "state" (`lags(u, p, t)`), from a callable's positional
    parameters."""
    if not callable(lags):
        return "constant"
    try:
        params = [
            q
            for q in inspect.signature(lags).parameters.values()
            if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD) and q.default is q.empty
        ]
    except (TypeError, ValueError) as e:
        raise TypeError("DDEProblem(lags=...): a callable needs a signature, lags(p) or lags(u, p, t)") from e
    if len(params) not in LAG_KINDS:
        raise TypeError(
            f"DDEProblem(lags=...) must take (p) (delays depending on the parameters) or (u, p, t) (on the state), "
            f"got a callable of {len(params)} parameters"
        )
    return LAG_KINDS[len(params)]


def lag_values(lags, u, p, t) -> jax.Array:
    """The lags (L,) at state u, parameters p (PyTrees) and time t."""
    kind = lag_kind(lags)
    if kind == "constant":
        values = lags
    else:
        values = lags(p) if kind == "parameter" else lags(u, p, t)
    return jnp.atleast_1d(jnp.stack([jnp.asarray(x) for x in values]) if isinstance(values, (tuple, list)) else values)


def check_dde_functions(prob: DDEProblem) -> None:
    """f(u0, h, p, t0) returns u0's structure and shapes (h returning u0's), history(p, t0) u0's, and lags a
    vector of floats: by tracing them, without running them; errors name the function."""
    u0, p, t0 = prob.u0, prob.p, prob.tspan[0]
    like_u0 = lambda s: jax.tree.map(jnp.asarray, u0)  # noqa: E731
    checks = [("f(u, h, p, t)", lambda u, p, t: prob.f(u, like_u0, p, t))]
    if prob.history is not None:
        checks.append(("history(p, t)", lambda u, p, t: prob.history(p, t)))  # pyright: ignore[reportOptionalCall]
    for call, fn in checks:
        out = _traced(call, fn, u0, p, t0)
        if jax.tree.structure(out) != jax.tree.structure(u0):
            raise ValueError(
                f"{call} must return u0's structure {jax.tree.structure(u0)}, got {jax.tree.structure(out)}"
            )
        for (label, y), (_, u) in zip(leaf_names(out, call), leaf_names(u0, "u0")):
            if not (hasattr(y, "dtype") and jnp.issubdtype(y.dtype, jnp.inexact)):
                raise ValueError(f"{label} must return float arrays, got {getattr(y, 'dtype', type(y).__name__)}")
            if tuple(y.shape) != tuple(np.shape(u)):
                raise ValueError(
                    f"{label} returns shape {tuple(y.shape)} but u0{label[len(call) :]} has shape {tuple(np.shape(u))}"
                )
    if callable(prob.lags):
        out = _traced("lags", lambda u, p, t: lag_values(prob.lags, u, p, t), u0, p, t0)
        if out.ndim != 1 or not jnp.issubdtype(out.dtype, jnp.inexact):
            raise ValueError(f"lags must return a tuple of float scalars or a float vector, got {out}")


def past_degree(solver: dfx.AbstractSolver) -> int:
    """The degree of the polynomials a past keeps of `solver`'s steps: max(3, its order), at least its dense
    output's."""
    order = solver.order(dfx.ODETerm(lambda t, y, args: y))
    return max(3, order or 1)


@functools.cache
def _chebyshev(degree: int) -> tuple[np.ndarray, np.ndarray]:
    """The degree + 1 Chebyshev points x_j = cos(πj/degree) on [-1, 1] and the inverse of their Vandermonde
    matrix (x_j^i): the monomial coefficients of the polynomial through values at them."""
    nodes = np.cos(np.pi * np.arange(degree + 1) / degree)
    return nodes, np.linalg.inv(np.vander(nodes, degree + 1, increasing=True))


class Piece(eqx.Module):
    """A step's dense output as one polynomial: on [start, end], y(s) = Σ_i coeffs_i x^i, x = 2 (s − start) /
    (end − start) − 1 (`coeffs` (d + 1, n + k); `Past.steps` holds a ring of them, each field with a leading
    axis)."""

    start: jax.Array
    end: jax.Array
    coeffs: jax.Array

    @classmethod
    def of(cls, interpolation, start, end, degree: int) -> "Piece":
        """The polynomial of `degree` through a diffrax interpolation of one step from `start` to `end` (of at
        most that degree: the same polynomial), from its values at the Chebyshev points."""
        nodes, inverse = _chebyshev(degree)
        theta = jnp.asarray((nodes + 1) / 2, start.dtype)
        values = jax.vmap(lambda th: interpolation.evaluate(start + th * (end - start)))(theta)
        return cls(start, end, jnp.asarray(inverse, values.dtype) @ values)

    @classmethod
    def zeros(cls, lead: tuple, degree: int, size: int, dtype) -> "Piece":
        """Pieces of zeros over no time (never evaluated where it counts), `lead` their leading axes."""
        never = jnp.full(lead, jnp.inf, dtype)
        return cls(never, never, jnp.zeros((*lead, degree + 1, size), dtype))

    def evaluate(self, s):
        span = self.end - self.start
        spanned = jnp.isfinite(span) & (span > 0)  # pieces of zeros and a vmapped batch's finished members
        x = 2 * (s - jnp.where(spanned, self.start, 0)) / jnp.where(spanned, span, 1) - 1
        y = self.coeffs[-1]
        for c in self.coeffs[-2::-1]:
            y = c + x.astype(y.dtype) * y
        return y


class Past(eqx.Module):
    """What a delay equation's steps read of the solve so far: its start (t0, the state y0 (n + k,)), the last
    `size` accepted steps' dense output as polynomials in a ring (`steps`, `count` steps recorded in all), the
    step being refined (`current`, where `refining`), and whether a lag reached past the steps kept (`short`)."""

    t0: jax.Array
    y0: jax.Array
    steps: Piece
    count: jax.Array
    current: Piece
    refining: jax.Array
    short: jax.Array

    @classmethod
    def empty(cls, solver, y0, t0, size: int) -> "Past":
        """The past of a solve by `solver` from y0 (n + k,) at t0, before its first step, keeping `size` steps as
        polynomials of degree max(3, the solver's order) (at least its interpolation's)."""
        degree = past_degree(solver)
        t0 = jnp.asarray(t0, y0.dtype)
        no = jnp.asarray(False)
        empty = Piece.zeros((size,), degree, y0.shape[0], y0.dtype)
        return cls(t0, y0, empty, jnp.asarray(0), Piece.zeros((), degree, y0.shape[0], y0.dtype), no, no)

    @property
    def size(self) -> int:
        return self.steps.start.shape[0]

    @property
    def degree(self) -> int:
        return self.steps.coeffs.shape[1] - 1

    def _index(self, s):
        """The ring slot of the newest kept step that starts at or before s (the oldest kept where none does)."""
        size, count = self.size, self.count
        first = jnp.maximum(count - size, 0)  # the oldest kept step (steps are numbered from the solve's first)

        def kept_before(j):  # whether the kept step `first + j` starts at or before s (j (F,))
            return (j < count - first) & (self.steps.start[(first + j) % size] <= s)

        # k = how many kept steps start at or before s, counted in two vectorised rounds of F probes (no loop):
        # every F-th step, then the F steps after the last one that starts at or before s
        fan = int(np.ceil(np.sqrt(size)))
        coarse = jnp.sum(kept_before(fan * jnp.arange(fan)))
        base = jnp.maximum(coarse - 1, 0) * fan
        k = jnp.where(coarse > 0, base + jnp.sum(kept_before(base + jnp.arange(fan))), 0)
        return (first + jnp.maximum(k - 1, 0)) % size

    def state(self, s):
        """y (n + k,) at s ≥ t0: the kept step that holds s; past the last kept step, the step being refined, or
        the last step's polynomial extrapolated (y0 before the first step)."""
        newest = (self.count - 1) % self.size
        beyond = (self.count == 0) | (s > self.steps.end[newest])
        index = jnp.where(beyond, newest, self._index(s))
        inside = beyond & self.refining
        step = jax.tree.map(lambda b, c: jnp.where(inside, c, b[index]), self.steps, self.current)
        return jnp.where((self.count == 0) & ~self.refining, self.y0, step.evaluate(s))

    def piece(self, interpolation, t_start, t_end) -> Piece:
        """A step's diffrax `interpolation` from t_start to t_end as this past keeps it."""
        return Piece.of(interpolation, t_start, t_end, self.degree)

    def recorded(self, piece: Piece, reach) -> "Past":
        """This past after an accepted step (its `piece`), with lags reaching back `reach` from its end: `short`
        where the kept steps no longer cover what they reach."""
        slot = self.count % self.size
        steps = jax.tree.map(lambda b, v: b.at[slot].set(v), self.steps, piece)
        count = self.count + 1
        oldest = steps.start[jnp.maximum(count - self.size, 0) % self.size]
        short = self.short | ((count > self.size) & (oldest > jnp.maximum(piece.end - reach, self.t0)))
        return dataclasses.replace(self, steps=steps, count=count, short=short)


class DDEField(AroundVectorField):
    """A delay equation as a kind of sciad's solve: `F` its rate (with an integrand beside it), f(u, p, t, past) on
    flat vectors, `past` its history; `lags` (static: a tuple, or the user's callable) and the problem's
    layouts. What the solve's `Setup` asks of its field, as `sciad._vector_field.VectorField`'s, and `terms`
    (the rate reading its past from the step's args), `stepping` (the loop's past, breakpoints and refinement)."""

    F: VectorField
    solver: dfx.AbstractSolver  # what the past's steps are interpolations of
    lags: Any = eqx.field(static=True)
    order: int = eqx.field(static=True)  # the derivatives whose jumps the breakpoints follow
    history_steps: int = eqx.field(static=True)
    rtol: float = eqx.field(static=True)
    atol: float = eqx.field(static=True)
    doses: _events.Plan | None = None  # the solve's PresetTimeCallbacks, applied between its steps
    # the sensitivity DDE, discretised by the solver on the same steps (the past's interpolation of S included),
    # is the forward-mode derivative of the steps: ForwardSensitivity takes it, its products from its engine
    sensitivities_through_steps: ClassVar[bool] = True
    host_engines_refused: ClassVar[str] = (
        "a delay equation's solve takes JAX engines for its products (the solution's past enters them)"
    )
    stiff_advice: ClassVar[str] = 'Pass solver="auto" or an implicit solver (solver="kvaerno3")'
    no_time_derivative: ClassVar[str] = (
        "a delay equation's solve is not differentiable in its times (tspan, saveat) yet: differentiate in u0, p "
        "(the lags and the history's parameters among them) with the times held (jax.lax.stop_gradient)"
    )
    through_steps_only: ClassVar[str] = (
        "a delay equation is differentiated through its steps (the solution's past enters each step): pass "
        "sensealg=sciad.ForwardDiffSensitivity(), sciad.ForwardSensitivity() or 'auto'"
    )

    @property
    def integrand_size(self) -> int:
        return self.F.integrand_size

    def with_closure(self, c, merged: bool) -> "DDEField":
        return dataclasses.replace(self, F=self.F.with_closure(c, merged))

    def with_products(self, backend) -> "DDEField":
        return dataclasses.replace(self, F=self.F.with_products(backend))

    def driving(self) -> tuple:
        """The doses' arrays (their times and owners: the inputs a custom rule takes them as), or nothing."""
        return tuple(jax.tree.leaves(eqx.filter(self.doses, eqx.is_array)))

    def driven(self, arrays, like: "DDEField") -> "DDEField":
        """This field with the doses of `like` made of `arrays` (`driving`'s), or with their arrays left out
        (`arrays` None)."""
        if like.doses is None:
            return self
        template, rest = eqx.partition(like.doses, eqx.is_array)
        leaves, treedef = jax.tree.flatten(template)
        doses = rest if arrays is None else eqx.combine(jax.tree.unflatten(treedef, list(arrays)), rest)
        return dataclasses.replace(self, doses=doses)

    def open(self) -> Callable:
        return self.F.open()

    def __call__(self, u, p, t, past: "Past | None" = None):
        """F(u, p, t) reading `past`; without one, the past held at u (a constant, not differentiated): the rate
        whose Jacobian in u is the instantaneous one (what the stability check of an explicit solver reads)."""
        if past is None:
            y = jax.lax.stop_gradient(jnp.concatenate([u, jnp.zeros((self.integrand_size,), u.dtype)]))
            past = Past.empty(self.solver, y, -jnp.inf, self.history_steps)
        return self.F(u, p, t, past)

    def terms(self, solver, vector_field, noise):
        """The rate as the solver's term, reading the past from the step's args (p, past)."""
        if vector_field is not None or noise is not None:
            raise ValueError(self.through_steps_only)
        n, k = self.u.size, self.integrand_size
        return dfx.ODETerm(lambda t, y, args: self.F(y[:n] if k else y, args[0], t, args[1]))

    def lags_at(self, y, p, t) -> jax.Array:
        """The lags (L,) at the state y (n + k,), flat parameters p, time t."""
        u = self.u.unravel(y[: self.u.size])
        params = eqx.combine(self.p.unravel(p[: self.p.size]), self.F.static_p)
        return lag_values(self.lags, u, params, t).astype(self.dtype)

    def breakpoints(self, tau, t0) -> jax.Array:
        """Where the solution's derivatives up to `order` may jump (J,), sorted: t0 + Σ kᵢ τᵢ with 1 ≤ Σ kᵢ ≤
        order, for lags τ (L,) that do not depend on the state."""
        combos = [k for k in itertools.product(range(self.order + 1), repeat=tau.shape[0]) if 1 <= sum(k) <= self.order]
        return jnp.sort(t0 + jnp.asarray(np.array(combos), tau.dtype) @ tau, axis=-1)

    def stepping(self, solver, y0, p, t0) -> "Stepping":
        """The loop's part of a solve from y0 (n + k,) at t0 with parameters p (m,) by `solver`: the empty past,
        how a step records itself into it, the breakpoints, and the fixed-point refinement of a step."""
        dtype = y0.dtype
        past = Past.empty(solver, y0, t0, self.history_steps)
        constant = lag_kind(self.lags) != "state"
        tau = self.lags_at(y0, p, t0) if constant else None  # lags fixed for the solve: their breakpoints and reach
        jump_ts, jumps = None, None
        if tau is not None:
            bad = jnp.any(~jnp.isfinite(tau) | (tau <= 0))
            past = dataclasses.replace(past, y0=error_if(past.y0, bad, "the lags must be positive and finite"))
            jump_ts = self.breakpoints(tau, t0)
        if self.doses is not None:  # each dose a jump, its breakpoints t_d + Σ kᵢ τᵢ (0 ≤ Σ kᵢ ≤ order) too
            plan, n = self.doses, self.u.size
            times = plan.preset[:-1]  # (its end marker dropped)
            # the doses first: a step that lands where a breakpoint meets a dose moves with the dose
            jumps_at = [times] + ([] if tau is None else [jump_ts, self.breakpoints(tau, times[:, None]).ravel()])
            jump_ts = jnp.concatenate(jumps_at)
            jump_ts = jnp.where(jump_ts > t0, jump_ts, jnp.inf)  # those at t0 apply before the first step
            jump_ts = jump_ts[jnp.argsort(jax.lax.stop_gradient(jump_ts), stable=True)]

            def affect(i, y, t):
                return jnp.concatenate([plan.affect(plan.preset_owners[i], y[:n], p, t), y[n:]])

            jumps = (times, affect)
        farthest = None if tau is None else jnp.max(tau)

        def record(past, t_start, t_end, y_end, interpolation):
            reach = farthest if tau is not None else jnp.max(self.lags_at(y_end, p, t_end))
            return past.recorded(past.piece(interpolation, t_start, t_end), reach)

        def refine(step, t0, t1, y, args, solver_state, made_jump):
            p, past = args
            shortest = jax.lax.stop_gradient(jnp.min(self.lags_at(y, p, t0)))
            scale = self.atol + self.rtol * jnp.abs(y)
            # iterate where the step reads a time inside itself (under vmap: while some member does)
            short = jax.lax.stop_gradient(t1 - t0) > shortest

            def more(carry):
                i, _, change = carry
                return (i == 0) | (short & (i <= FIXED_POINT_ITERATIONS) & (change > FIXED_POINT_TOLERANCE))

            def again(carry):  # the step, then again from the past with this step's own interpolation in it
                i, out, _ = carry
                this = past.piece(solver.interpolation_cls(t0=t0, t1=t1, **out[2]), t0, t1)
                guess = dataclasses.replace(past, current=this, refining=i > 0)
                new = step(t0, t1, y, (p, guess), solver_state, made_jump)
                change = jnp.max(jnp.abs(jax.lax.stop_gradient(new[0] - out[0])) / scale)
                return i + 1, new, change

            # one program of the step: its first pass reads the past alone (this step's interpolation of zeros unread)
            shape = eqx.filter_eval_shape(step, t0, t1, y, args, solver_state, made_jump)
            zeros = jax.tree.map(
                lambda x: jnp.zeros(x.shape, x.dtype) if isinstance(x, jax.ShapeDtypeStruct) else x, shape
            )
            return jax.lax.while_loop(more, again, (0, zeros, jnp.asarray(jnp.inf, dtype)))[1]

        def limit(past, t, y, t_next):
            s = t - self.lags_at(y, p, t)
            index = jax.vmap(past._index)(s)
            span = past.steps.end[index] - past.steps.start[index]
            resolved = jnp.where((s >= past.t0) & (past.count > 0), span, jnp.inf)
            return jnp.minimum(t_next, t + PAST_STEPS * jnp.min(resolved))

        return Stepping(past, record, jump_ts, jumps, refine, limit, self.history_steps)


class Stepping(eqx.Module):
    """A delay equation's part in one run of the loop (`DDEField.stepping`)."""

    past: Past
    record: Callable
    jump_ts: jax.Array | None
    jumps: tuple | None
    refine: Callable
    limit: Callable
    size: int = eqx.field(static=True)

    def controller(self, controller: dfx.AbstractStepSizeController) -> dfx.AbstractStepSizeController:
        """`controller` stepping to just before and restarting just after each breakpoint."""
        if self.jump_ts is None:
            return controller
        return dfx.ClipStepSizeController(controller, jump_ts=self.jump_ts)  # pyright: ignore[reportArgumentType]

    def checked(self, trajectory):
        """`trajectory`, raising a `SolveError` where a lag reached past the steps kept."""
        message = (
            f"the lags reach back past the {self.size} steps of the solution kept: pass a larger history_steps= "
            "to sciad.solve"
        )
        return eqx.tree_at(lambda s: s.ys, trajectory, error_if(trajectory.ys, trajectory.carried.short, message))


def history_rate(prob: DDEProblem) -> Callable:
    """f(u, p, t, past) on the user's PyTrees: the problem's f with h(s) reading `past` (history(p, s) before t0)."""
    f, history = prob.f, prob.history

    def rate(u, p, t, past: Past):
        layout = Layout.of(u, jnp.result_type(*jax.tree.leaves(u)))
        n = layout.size

        def h(s):
            if jnp.shape(s):
                raise ValueError(f"h(s) takes a scalar time s, got shape {jnp.shape(s)}: pass e.g. h(t - tau[0])")
            s = jnp.asarray(s, past.t0.dtype)
            # s = t0 reads the history: only a stage at the end of a step that ends on t0 + τ (t1 there) reads
            # t0 itself, and that step's interior reads the history (steps restart just after a breakpoint).
            # Clamped by `where`, not min/max: their derivative at a tie is half of each side's.
            before_t0 = s <= past.t0
            after = layout.unravel(past.state(jnp.where(before_t0, past.t0, s))[:n])
            before = layout.unravel(past.y0[:n]) if history is None else history(p, jnp.where(before_t0, s, past.t0))
            return jax.tree.map(lambda a, b: jnp.where(before_t0, b, a).astype(a.dtype), after, before)

        return f(u, h, p, t)

    return rate


@dataclasses.dataclass(frozen=True)
class _Instantaneous:
    """A delay equation as an ODE for the stiffness estimate: f with its past held at the current state (not
    differentiated), so that ∂f/∂u is the instantaneous Jacobian."""

    f: Callable
    u0: Any
    p: Any
    tspan: tuple
    mass_matrix: None = None


def auto_dde_solver(prob: DDEProblem, r: Request, rtol: float, atol: float) -> tuple[str, str]:
    """(the solver's name, why): Tsit5, or Kvaerno3 (its stages within the step) where an explicit method would
    spend its steps on stability (`sciad._solver_choice.auto_solver` on the instantaneous Jacobian ∂f/∂u)."""
    held = _Instantaneous(
        lambda u, p, t: prob.f(u, lambda s: jax.lax.stop_gradient(u), p, t), prob.u0, prob.p, prob.tspan
    )
    pick = auto_solver(held, r.u0, r.p, (r.t0, r.t1), rtol=rtol, atol=atol, jacobian="dense")
    if pick.name == "tsit5":
        return "tsit5", pick.reason
    return "kvaerno3", pick.reason.replace("Rodas5P, linearly implicit", "Kvaerno3, implicit")


def _stage_times(solver) -> list[float]:
    """A Runge-Kutta solver's stage times c (as fractions of its step)."""
    tableau = solver.tableau
    return [float(c) for t in getattr(tableau, "tableaus", (tableau,)) for c in np.atleast_1d(t.c)]


def _staged(prob: DDEProblem, r: Request) -> "_DDEStaged":
    """The DDE's solve: a Runge-Kutta solver stepping the method of steps, adaptive, from t0 forwards."""
    if any(not isinstance(c, _events.PresetTimeCallback) for c in r.callbacks or ()):
        raise ValueError(
            "a delay equation's solve takes PresetTimeCallbacks (doses at given times) only, not yet "
            "ContinuousCallbacks: give the event's times, or drop it"
        )
    if r.sign < 0:
        raise ValueError(f"tspan=({r.t0}, {r.t1}): delay equations run forwards in time: pass t1 > t0")
    o = r.options
    rtol, atol, controller, dt0 = check_steps(o["stepsize_controller"], r.dt0, r.rtol, r.atol, r.sign)
    check_tolerances(rtol, atol, r.max_steps)
    solver, solver_reason = r.solver, "given"
    if solver is None or (isinstance(solver, str) and solver == "auto"):
        solver, solver_reason = auto_dde_solver(prob, r, rtol, atol)
    solver = get_solver(solver)
    if not isinstance(solver, (dfx.AbstractERK, dfx.AbstractImplicitSolver)) or getattr(
        solver, "linearly_implicit", False
    ):
        raise ValueError(
            f"solver={type(solver).__name__}(): delay equations are stepped by Runge-Kutta solvers, explicit or "
            f"implicit (diffrax's Kvaerno3, ...), here: pass one of "
            f"{sorted(k for k, v in SOLVERS.items() if not getattr(v, 'linearly_implicit', False))} or diffrax's"
        )
    if not all(0 <= c <= 1 for c in _stage_times(solver)):
        raise ValueError(
            f"solver={type(solver).__name__}(): its stages reach past the step's end (c > 1), where a delay "
            "equation's past may jump (a breakpoint, a dose): pass a solver whose stages stay within the step, "
            "solver='kvaerno3' (implicit) or 'tsit5'"
        )
    dtype = jnp.result_type(*jax.tree.leaves(r.u0), *jax.tree.leaves(eqx.filter(r.p, eqx.is_array)))
    n = sum(int(np.size(x)) for x in jax.tree.leaves(r.u0))
    k = r.entries
    history_steps = o["history_steps"]
    if history_steps is None:
        step_bytes = (past_degree(solver) + 1) * (n + k) * np.dtype(dtype).itemsize
        history_steps = stored_steps(int(r.max_steps), step_bytes)
    if int(history_steps) < 1:
        raise ValueError(f"history_steps must be a positive integer, got {history_steps}")
    history_steps = int(history_steps)
    # f is traced (its closure hoisted) with a past of the solve's own shapes
    example = Past.empty(solver, jnp.zeros((n + k,), dtype), r.t0, history_steps)
    F = VectorField.of(history_rate(prob), r.u0, r.p, r.t0, host=False, integrand=r.integrand, extra=(example,))
    if callable(prob.lags):
        closed = eqx.filter_closure_convert(lambda u, p: lag_values(prob.lags, u, p, r.t0), r.u0, r.p)
        if jax.tree.leaves(eqx.filter(closed, lambda x: isinstance(x, jax.core.Tracer))):
            raise ValueError("lags closes over traced values (ones being differentiated): pass them in p")
    order = int(solver.order(dfx.ODETerm(lambda t, y, args: y))) + 1  # pyright: ignore[reportArgumentType]
    field = DDEField(F, solver, prob.lags, order, history_steps, float(rtol), float(atol))
    if r.callbacks:
        doses = _events.Plan.of(r.callbacks, F, r.u0, r.p, (r.t0, r.t1), 1, r.max_events, "none")
        t = jnp.asarray(r.t0, dtype)
        closures = [eqx.filter_closure_convert(c.affect, r.u0, r.p, t) for c in r.callbacks]
        if jax.tree.leaves(eqx.filter(closures, lambda x: isinstance(x, jax.core.Tracer))):
            raise ValueError(
                "a delay equation's dose (PresetTimeCallback) has an affect that closes over traced values: pass "
                "them in p (affect(u, p, t))"
            )
        field = dataclasses.replace(field, doses=doses)
    times = jnp.asarray(r.ts, dtype)
    if r.entries:  # q(t1) is saved last
        times = jnp.append(times, jnp.asarray(r.t1, dtype))
    setup = Setup(
        field,
        solver,
        jnp.asarray(r.t0, dtype),
        jnp.asarray(r.t1, dtype),
        times,
        float(rtol),
        float(atol),
        int(r.max_steps),
        stepsize_controller=controller,
        dt0=None if dt0 is None else jnp.asarray(dt0, dtype),
    )
    u0 = jnp.asarray(F.u.ravel(r.u0), dtype)
    p = jnp.asarray(F.p.ravel(eqx.filter(r.p, eqx.is_array)), dtype)
    return _DDEStaged(setup, u0, p, F.u, F.q, r, solver_reason)


@dataclasses.dataclass(frozen=True)
class _DDEStaged(Staged):
    setup: Setup
    u0: jax.Array
    p: jax.Array
    u: Layout
    q: Layout | None
    request: Request
    solver_reason: str

    def auto_sensealg(self) -> AbstractSensitivity:
        return self.choice().sensealg

    def choice(self):
        """ "auto"'s `sciad._auto.Choice` for this solve (its rule and why: `Choice.report()`)."""
        from sciad._auto import auto_dde_sensealg

        r, setup = self.request, self.setup
        lags = int(setup.f.lags_at(self.setup.state(self.u0), self.p, setup.t0).shape[0])
        return auto_dde_sensealg(
            r.u0,
            (r.p, setup.f.held),
            r.ts,
            solver=setup.solver,
            solver_reason=self.solver_reason,
            lags=lags,
            rtol=setup.rtol,
            atol=setup.atol,
        )

    events_in_steps = True

    def plan(self):
        return self.setup.f.doses
