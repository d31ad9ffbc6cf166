"""Events: callbacks that change the state at preset times (doses) or where a condition crosses zero
(impacts, resets), or stop the solve there, differentiated by every sensealg.

A solve with events is a chain of segments, each an ordinary solve from one event to the next,
differentiated by the sensealg's own rules (with respect to its start state, p, the values f closes
over, its start time and its end time); at an event the affect maps u(τ⁻) to u(τ⁺). An event time τ
is a preset time (an input, differentiable as such) or the first zero of a condition c(u, p, t),
located on the forward solve's own steps (`first_crossing`) and differentiated implicitly, not through
the root finder (`event_time`):

    dτ = -(∂c/∂u du(τ⁻) + ∂c/∂p dp) / (∂c/∂u f(u(τ⁻), p, τ) + ∂c/∂t).

A segment is solved to the located τ (held fixed), and τ's derivative comes from the state it
reached there; the saves at τ then move with it along u' = f, so nothing is solved twice. The chain
rule through the segments, the affects and τ is the adjoint's jump at an event with
SciMLSensitivity's event-time correction: λ(τ⁻) = (∂a/∂u)ᵀ λ(τ⁺) plus, for a state-dependent event,
(∂c/∂u)ᵀ (λ(τ⁺) · (f⁺ - ∂a/∂u f⁻ - ∂a/∂t)) / ċ; forward sensitivities jump by the transpose.
Segments run in a `jax.lax.scan` of `max_events + 1` steps, so one segment is traced and compiled.

With a mass matrix (M u' = f, a DAE where M is singular), u' above is the consistent u'
(`Setup.derivative`), and the state after an affect is re-initialised at τ in the solve's
`initialization` mode (`sciad._dae.initialise`: "consistent" re-solves its algebraic states, "check"
checks them, "none" takes the affect's state): the next segment starts consistent, and the chain rule
runs through the re-initialisation's implicit rule (its τ dependence included).
"""

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PyTree, Real

from sciad._custom_types import RealScalarLike
from sciad._dae import initialise, solver_mass
from sciad._errors import check, error_if
from sciad.ad._linear import linear_map
from sciad.adjoints._base import AbstractSensitivity, Setup
from sciad.adjoints._loop import Stepper, integrate

DIRECTIONS = {"up": 1, "down": -1, "both": 0}
# Segments of a solve with only continuous callbacks: events it may take before `max_events` must be raised.
DEFAULT_CONTINUOUS_EVENTS = 16


class AbstractCallback(eqx.Module):
    """Something that happens during a solve: `affect(u, p, t)` -> the new state (u's structure), or
    None for an event that stops the solve."""

    affect: eqx.AbstractVar[Callable | None]


class ContinuousCallback(AbstractCallback):
    """An event where `condition(u, p, t)` (a float scalar) crosses zero: `direction` "up" (from negative
    to positive), "down" or "both". Located to the solve's tolerances on its steps (the earliest of
    several in one step first). `affect(u, p, t)` returns the state after the event (it may depend on
    p, e.g. a coefficient of restitution); `affect=None` stops the solve there (`Solution.t_final`).
    A condition at zero where a segment starts (at t0, or just after an event) is not an event there."""

    condition: Callable[[PyTree[Array], PyTree[Any], RealScalarLike], Float[ArrayLike, ""]]
    affect: Callable[[PyTree[Array], PyTree[Any], RealScalarLike], PyTree[Array]] | None = None
    direction: str = eqx.field(static=True, default="both")

    def __check_init__(self):
        if not callable(self.condition):
            raise TypeError(
                f"ContinuousCallback(condition=...) must be callable condition(u, p, t), got {self.condition!r}"
            )
        if self.affect is not None and not callable(self.affect):
            raise TypeError(
                f"ContinuousCallback(affect=...) must be callable affect(u, p, t) or None (stop the "
                f"solve), got {self.affect!r}"
            )
        if self.direction not in DIRECTIONS:
            raise ValueError(
                f"ContinuousCallback(direction=...) must be one of {sorted(DIRECTIONS)}, got {self.direction!r}"
            )


class PresetTimeCallback(AbstractCallback):
    """`affect(u, p, t)` applied at each of `times` (P,) (concrete or traced; differentiable), which
    must lie in tspan, t0 and t1 included: a dose. The state saved at such a time is the state after
    it. A time outside tspan is an error naming it (concrete times: a ValueError at the solve's call;
    traced ones: a `SolveError` when it runs), never silently skipped."""

    times: Real[ArrayLike, " k"] | Sequence[RealScalarLike]
    affect: Callable[[PyTree[Array], PyTree[Any], RealScalarLike], PyTree[Array]]

    def __check_init__(self):
        if not callable(self.affect):
            raise TypeError(f"PresetTimeCallback(affect=...) must be callable affect(u, p, t), got {self.affect!r}")


class Plan(eqx.Module):
    """The callbacks on the flat state: continuous `conditions` (closure-converted, so the values they
    close over are differentiable inputs of the event-time rule), their `directions` (+1 up, -1 down, 0
    both) and `owners` (callback indices); the callbacks' `affects` (None: stop); the preset times (P,)
    in the solve's forward time s, sorted, with their owners; the time `sign` (s = sign t)."""

    conditions: tuple
    directions: tuple = eqx.field(static=True)
    owners: tuple = eqx.field(static=True)
    affects: tuple
    preset: jax.Array
    preset_owners: jax.Array
    layouts: Any
    sign: int = eqx.field(static=True)
    max_events: int = eqx.field(static=True)
    initialization: str = eqx.field(static=True, default="none")

    @classmethod
    def of(
        cls, callbacks, field, u0, p, tspan: tuple, sign: int, max_events: int | None, initialization: str = "none"
    ) -> "Plan":
        """The plan of `callbacks` (a sequence of `ContinuousCallback`, `PresetTimeCallback`) for a solve of
        `field` from u0, p (the user's PyTrees) over tspan = (t0, t1) (user time, sign(t1 - t0) = `sign`),
        checked: affects and conditions by tracing them now; preset times finite and inside tspan, now
        where they and tspan are concrete (ValueError), else when the solve runs (`SolveError`).
        `initialization`: the solve's mode (`sciad._dae.initialise`), applied to the state after each affect."""
        if isinstance(callbacks, AbstractCallback) or not all(isinstance(c, AbstractCallback) for c in callbacks):
            raise TypeError(
                f"callbacks must be a list of sciad.ContinuousCallback / sciad.PresetTimeCallback, got {callbacks!r}"
            )
        dtype = field.dtype
        t0, t1 = tspan
        t = jnp.asarray(t0, dtype)
        conditions, directions, owners, times, time_owners = [], [], [], [], []
        for i, callback in enumerate(callbacks):
            if callback.affect is not None:
                _check_affect(callback.affect, u0, p, t, i)
            if isinstance(callback, ContinuousCallback):
                _check_condition(callback.condition, u0, p, t, i)
                conditions.append(eqx.filter_closure_convert(callback.condition, u0, p, t))
                directions.append(DIRECTIONS[callback.direction])
                owners.append(i)
            else:
                ts = jnp.asarray(callback.times)
                if ts.ndim > 1 or not jnp.issubdtype(ts.dtype, jnp.number) or jnp.iscomplexobj(ts):
                    raise ValueError(
                        f"callbacks[{i}]: PresetTimeCallback(times=...) must be a 1-D array of times, "
                        f"got {callback.times!r}"
                    )
                ts = check(ts, ~jnp.all(jnp.isfinite(ts)), f"callbacks[{i}]: PresetTimeCallback times must be finite")
                ts = _inside(ts, t0, t1, sign, i)
                times.append(sign * jnp.atleast_1d(ts).astype(dtype))
                time_owners.append(np.full(ts.size, i))
        preset = jnp.concatenate([*times, jnp.full((1,), jnp.inf, dtype)])  # an end marker after the last
        owners_of_times = np.concatenate([*time_owners, [-1]]).astype(np.int32)
        order = jnp.argsort(preset, stable=True)  # simultaneous ones in the order given
        presets = int(preset.shape[0]) - 1
        if max_events is None:
            max_events = presets + (DEFAULT_CONTINUOUS_EVENTS if conditions else 0)
        if not isinstance(max_events, (int, np.integer)) or max_events < 0:
            raise ValueError(f"max_events must be a non-negative integer (static under jax.jit), got {max_events!r}")
        affects = tuple(c.affect for c in callbacks)
        layouts = (field.u, field.p, field.static_p)
        return cls(
            tuple(conditions),
            tuple(directions),
            tuple(owners),
            affects,
            preset[order],
            jnp.asarray(owners_of_times)[order],
            layouts,
            sign,
            int(max_events),
            initialization,
        )

    @property
    def callbacks(self) -> int:
        return len(self.affects)

    def user(self, u, p, s):
        """(u, p, t) as the user's callbacks take them, from flat u (n,), p (m,) and forward time s."""
        u_layout, p_layout, static_p = self.layouts
        return u_layout.unravel(u), eqx.combine(p_layout.unravel(p), static_p), self.sign * s

    def values(self, conditions, u, p, s):
        """The conditions' values (J,) at flat u (n,), p (m,), time s."""
        user = self.user(u, p, s)
        return jnp.stack([jnp.asarray(c(*user), u.dtype) for c in conditions])

    def affect(self, owner, u, p, s):
        """u after the event of callback `owner` (traced; -1 or a stopping callback: unchanged)."""
        u_layout = self.layouts[0]

        def apply(fn):
            return lambda u: u if fn is None else u_layout.ravel(fn(*self.user(u, p, s))).astype(u.dtype)

        return jax.lax.switch(owner + 1, [lambda u: u, *(apply(fn) for fn in self.affects)], u)

    def stops(self, owner) -> jax.Array:
        """Whether callback `owner` (traced, -1 for none) stops the solve."""
        return jnp.asarray([False, *(fn is None for fn in self.affects)])[owner + 1]


def _inside(ts, t0, t1, sign: int, i: int):
    """Callback i's preset times `ts`, which must lie in [t0, t1] (in [t1, t0] backwards, `sign` -1):
    a ValueError naming those outside now where all are concrete, else a run-time check."""
    outside = (sign * (ts - t0) < 0) | (sign * (t1 - ts) < 0)
    span = f"tspan ({t0}, {t1})" if not any(isinstance(t, jax.core.Tracer) for t in (t0, t1)) else "tspan"
    fix = "drop them or widen tspan (a time outside it would never fire)"
    if isinstance(outside, jax.core.Tracer):
        return error_if(ts, outside, f"callbacks[{i}]: PresetTimeCallback times lie outside {span}: {fix}")
    if np.any(outside):  # concrete (under an eager jax.grad too: the primal times, without their tangents)
        times = np.atleast_1d(jax.lax.stop_gradient(ts))[np.atleast_1d(outside)].tolist()
        raise ValueError(f"callbacks[{i}]: PresetTimeCallback times {times} lie outside {span}: {fix}")
    return ts


def _check_affect(affect: Callable, u0, p, t, i: int) -> None:
    out = eqx.filter_eval_shape(affect, u0, p, t)
    if jax.tree.structure(out) != jax.tree.structure(u0) or any(
        tuple(a.shape) != tuple(np.shape(b)) for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(u0))
    ):
        raise ValueError(
            f"callbacks[{i}]: affect(u, p, t) must return the new state with u0's structure and "
            f"shapes, got {jax.tree.structure(out)} for u0 {jax.tree.structure(u0)}"
        )


def _check_condition(condition: Callable, u0, p, t, i: int) -> None:
    out = eqx.filter_eval_shape(condition, u0, p, t)
    if not (hasattr(out, "shape") and out.shape == () and jnp.issubdtype(out.dtype, jnp.floating)):
        raise ValueError(
            f"callbacks[{i}]: condition(u, p, t) must return a float scalar (an event where it "
            f"crosses zero), got {out!r}; a boolean cannot be located: return e.g. u[0] - level"
        )


class Events(eqx.Module):
    """What a solve with events gives besides its saves: `t_final` (s), the `times` (K,) of the K =
    max_events + 1 segments' ends and their `owners` (K,) (the callback that fired, -1 for none), the
    number of events `count`."""

    t_final: jax.Array
    times: jax.Array
    owners: jax.Array
    count: jax.Array


def solve(setup: Setup, sensealg: AbstractSensitivity, plan: Plan, u0, p):
    """-> (us (T, n) at setup.ts, integral (k,), stats (3,) int32, `Events`): the solve of `setup` from u0 (n,)
    with p (m,) through the events of `plan`, differentiable by `sensealg` in u0, p, f's closure values,
    the times and the values the callbacks close over. A save time after a stopping event holds the
    state there; one at an event time holds the state after it."""
    n, k = setup.n, setup.f.integrand_size
    ts, s1 = setup.ts, setup.t1
    mass = solver_mass(setup.solver, n)
    start = jnp.sum(plan.preset < setup.t0).astype(jnp.int32)  # preset times before t0 never fire
    bare = setup.bare()
    frame = _Frame(bare, _fixed(plan))  # the conditions' own values enter the rule as arguments

    def segment(carry, _):
        u, s, stopped, pointer, us, taken, integral, stats, count = carry
        preset = plan.preset[pointer]
        end = jnp.where(stopped, s, jnp.minimum(preset, s1))
        if plan.conditions:
            located, j = first_crossing(
                *_fixed((bare.bound(setup.f.held, None, s, end, dt0=setup.dt0), plan, u, p, s, end))
            )
            continuous = (j >= 0) & ~stopped
            end = jnp.where(continuous, located, end)  # a located time is not differentiated: `event_time` is
            owner = jnp.where(continuous, jnp.asarray(plan.owners)[jnp.maximum(j, 0)], -1)
        else:
            continuous, owner = jnp.asarray(False), jnp.asarray(-1)
        fires_preset = ~continuous & ~stopped & (preset <= s1) & (preset == end)
        owner = jnp.where(fires_preset, plan.preset_owners[pointer], owner)
        saves = jnp.concatenate([jnp.clip(ts, s, end), end[None]])
        ys, seg_stats = sensealg.solve(setup.bound(setup.f.held, saves, s, end, dt0=setup.dt0), u, p)
        tau = end
        if plan.conditions:
            # τ's derivative from the state reached at the located time (no second solve of the segment); the
            # saves at τ (its end, the save times past it) move with it along y' = F: zero here, exact derivatives.
            shift = jnp.where(
                continuous,
                event_time(located, j, ys[-1, :n], p, setup.f.held, plan.conditions, frame=frame) - located,
                0.0,
            )
            at_end = (saves >= end)[:, None]
            ys = ys + jnp.where(at_end, setup.derivative(ys[-1], p, end) * shift, 0.0)
            tau = end + shift
        goes_on = (owner >= 0) & ~plan.stops(owner)
        take = ~taken & (ts >= s) & (~goes_on | (ts < tau))
        us = jnp.where(take[:, None], ys[:-1, :n], us)
        after = plan.affect(owner, ys[-1, :n], p, tau)
        if mass is not None and mass.singular and plan.initialization != "none":
            after = jax.lax.cond(
                goes_on,
                lambda u: initialise(plan.initialization, setup.f, mass, u, p, tau, setup.rtol, setup.atol, AFFECTED),
                lambda u: u,
                after,
            )
        carry = (
            after,
            tau,
            stopped | plan.stops(owner),
            pointer + fires_preset.astype(jnp.int32),
            us,
            taken | take,
            integral + ys[-1, n:],
            stats + seg_stats,
            count + (owner >= 0).astype(jnp.int32),
        )
        return carry, (tau, owner)

    init = (
        u0,
        setup.t0,
        jnp.asarray(False),
        start,
        jnp.zeros((ts.shape[0], n), u0.dtype),
        jnp.zeros(ts.shape, bool),
        jnp.zeros((k,), u0.dtype),
        jnp.zeros((3,), jnp.int32),
        jnp.asarray(0, jnp.int32),
    )
    carry, (times, owners) = jax.lax.scan(segment, init, None, length=plan.max_events + 1)
    _, t_final, _, _, us, _, integral, stats, count = carry
    us = error_if(
        us,
        count > plan.max_events,
        f"more than max_events={plan.max_events} events in the solve: pass a larger max_events to "
        "sciad.solve (a bouncing ball coming to rest has infinitely many: stop it with a terminating "
        "ContinuousCallback(condition, affect=None))",
    )
    return us, integral, stats, Events(t_final, times, owners, count)


AFFECTED = "the state an event's affect returned"


def _fixed(tree):
    """`tree` with its float JAX arrays held constant (what locates an event is not differentiated; NumPy
    arrays, such as a Rosenbrock solver's mass matrix, read at trace time, stay NumPy)."""
    dynamic, static = eqx.partition(tree, lambda x: isinstance(x, jax.Array) and eqx.is_inexact_array(x))
    return eqx.combine(jax.lax.stop_gradient(dynamic), static)


class _Frame(eqx.Module):
    """What the event-time rule holds fixed: the setup without its traced parts, the plan."""

    setup: Setup
    plan: Plan


@eqx.filter_custom_jvp
def event_time(tau, j, u, p, c, conditions, *, frame: _Frame):
    """τ (located, undifferentiated), the first zero of condition `j`, with u (n,) the state the segment
    reached there (its derivatives those of a solve to a fixed end time), p (m,) and f's closure values c:
    its derivatives are the implicit function's (see the module)."""
    return tau


SECOND_ORDER = (
    "second derivatives through the time of a state-dependent event (a ContinuousCallback) are not "
    "available yet: take first derivatives (jax.grad, jax.jvp, jax.jacfwd, jax.jacrev) there; Hessians "
    "through PresetTimeCallback events work"
)


@event_time.def_jvp
def _event_time_jvp(primals, tangents, *, frame: _Frame):
    tau, j, u, p, c, conditions = primals
    dynamic, static = eqx.partition(conditions, eqx.is_inexact_array)
    leaves, tree = jax.tree.flatten(dynamic)
    d_leaves = jax.tree.leaves(
        jax.tree.map(
            lambda x, v: x if x is None else jnp.zeros_like(x) if v is None else v,
            dynamic,
            tangents[5],
            is_leaf=lambda x: x is None,
        )
    )
    lin = [jnp.zeros_like(x) if v is None else v for x, v in zip(primals[2:4], tangents[2:4])] + d_leaves

    held, rest = eqx.partition(frame, eqx.is_array)  # the rules take every traced value as an input

    def pushforward(res, lin):
        """dτ = -(∂c/∂u du(τ⁻) + ∂c/∂p dp + ∂c/∂k dk) / ċ, k the values the condition closes over."""
        (tau, j, u, p, c, *leaves), frame = res[:-1], eqx.combine(res[-1], rest)
        d_u, d_p, *d_leaves = lin

        def value(u, p, s, leaves):
            return frame.plan.values(eqx.combine(jax.tree.unflatten(tree, leaves), static), u, p, s)[j]

        _, moved = jax.jvp(lambda u, p, k: value(u, p, tau, k), (u, p, leaves), (d_u, d_p, d_leaves))
        rate = frame.setup.bound(c, None, tau, tau).derivative(u, p, tau)[: u.shape[0]]
        _, along = jax.jvp(lambda u, s: value(u, p, s, leaves), (u, tau), (rate, jnp.ones_like(tau)))
        return -moved / jnp.where(along == 0, 1, along)  # along = 0: a grazing event, not differentiable

    def pullback(res, w):
        return jax.linear_transpose(lambda lin: pushforward(res, lin), lin)(w)[0]

    res = [tau, j, u, p, c, *leaves, held]

    def tangent():
        return linear_map(pushforward, pullback, res, lin, nondifferentiable=SECOND_ORDER)

    return tau, jax.lax.cond(j >= 0, tangent, lambda: jnp.zeros_like(tau))


def first_crossing(setup: Setup, plan: Plan, u0, p, s0, s1):
    """(τ, j): the earliest time in (s0, s1] at which condition j crosses zero in its direction, on the
    steps of `setup`'s solver and controller from u0 (n,) at s0 (sciad's loop, stopped at the first step
    where an event fires; each crossing in a step located by bisection on the step's interpolant; ties to
    the lower j); (s1, -1) if none. Not differentiated."""
    n = setup.n
    directions = jnp.asarray(plan.directions)

    def values(y, s):
        return plan.values(plan.conditions, y[:n], p, s)

    def on_step(carried, s, s_end, y_end, interpolant):
        signs = carried[0]
        crossed = values(y_end, s_end) * signs <= 0
        fires = crossed & ((directions == 0) | (directions == -signs))

        def locate():  # only in the step where an event fires
            return jax.vmap(lambda j, sign: _bisect(lambda t: values(interpolant.evaluate(t), t)[j] * sign, s, s_end))(
                jnp.arange(signs.shape[0]), signs
            )

        roots = jax.lax.cond(jnp.any(fires), locate, lambda: jnp.full_like(signs, jnp.inf))
        roots = jnp.where(fires, roots, jnp.inf)
        return jnp.where(crossed, -signs, signs), jnp.min(roots), jnp.where(jnp.any(fires), jnp.argmin(roots), -1)

    carried = (_armed_signs(setup, plan, u0, p, s0), jnp.asarray(s1), jnp.asarray(-1))
    stepper = Stepper.of(setup.term(), setup.solver, setup.controller())
    sol = integrate(
        stepper,
        setup.state(u0),
        p,
        s0,
        s1,
        max_steps=setup.max_steps,
        dt0=setup.dt0,
        on_step=on_step,
        carried=carried,
        until=lambda carried: carried[2] >= 0,
    )
    _, root, j = sol.carried
    return jnp.where(j >= 0, root, s1), j


def _bisect(fn: Callable, a, b):
    """The point where fn (> 0 at a, <= 0 at b) changes sign, to the last bit of a's dtype."""
    bits = jnp.finfo(jnp.result_type(a)).nmant + 2

    def halve(_, ab):
        a, b = ab
        m = 0.5 * (a + b)
        before = fn(m) > 0
        return jnp.where(before, m, a), jnp.where(before, b, m)

    return jax.lax.fori_loop(0, bits, halve, (a, b))[1]


def _armed_signs(setup: Setup, plan: Plan, u, p, s):
    """Each condition's sign (+1 or -1) where a segment starts: its value's, or, within the solve's
    error of zero (10 |∂c/∂u| (atol + rtol |u|)), the sign it is heading to (ċ's), so a condition left at
    zero by an event is not an event again."""

    def values(u, s):
        return plan.values(plan.conditions, u, p, s)

    value, heading = jax.jvp(values, (u, s), (setup.derivative(u, p, s)[: u.shape[0]], jnp.ones_like(s)))
    slope = jax.jacrev(values)(u, s)
    near = jnp.abs(value) <= 10 * jnp.abs(slope) @ (setup.atol + setup.rtol * jnp.abs(u))
    sign = jnp.sign(jnp.where(near, heading, value))
    return jnp.where(sign == 0, 1.0, sign).astype(u.dtype)
