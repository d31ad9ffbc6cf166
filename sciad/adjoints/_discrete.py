"""Differentiating through the solver's steps: discretise-then-optimise."""

import functools
import typing
from collections.abc import Callable

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sciad._errors import batch_any
from sciad.ad._linear import accumulate_pullback
from sciad.adjoints._base import (
    AbstractSensitivity,
    Setup,
    checked,
    plain_forward,
    solver_pushforward,
    stats_vector,
    stored_steps,
)
from sciad.adjoints._loop import Position, Stepper, begin, integrate, stage_loop

STORE_ALL_BYTES = 2**28  # auto's `stored-steps` rule: DiscreteAdjoint where max_steps states fit (256 MiB)
STATE_COPIES = 1  # the stored reverse pass keeps each accepted step's state once (recomputing its stages)
# The steps a segment of the recorded solve keeps at most: every call allocates, fills and reads its buffers
# at their full size (a vmapped batch of small solves pays for them per member), and a longer solve re-solves
# its earlier segments once on the way back (a forward pass's steps more).
SEGMENT_STEPS = 256


def segment_steps(max_steps: int, states: int, itemsize: int) -> int:
    """The steps a segment keeps for a solve of at most `max_steps` steps of `states` entries of `itemsize` bytes."""
    return min(SEGMENT_STEPS, stored_steps(max_steps, STATE_COPIES * states * itemsize))


def stored_steps_bytes(max_steps: int, states: int, itemsize: int) -> int:
    """The bytes of the steps' states a segment keeps (`segment_steps`)."""
    return segment_steps(max_steps, states, itemsize) * STATE_COPIES * states * itemsize


def _solution(setup: Setup):
    """(u0, p) -> (us, (us, stats, result)): a solve shaped for jax.vjp / jax.jacfwd with has_aux."""

    def solve(u0, p):
        sol = setup.forward(u0, p)
        return sol.ys, (sol.ys, stats_vector(sol), sol.result)

    return solve


class DiscreteAdjoint(AbstractSensitivity):
    """Reverse-mode AD through the solver's steps: the exact gradient of the
    discrete solution, as diffrax's `RecursiveCheckpointAdjoint` gives it.
    The baseline every other sensealg is checked against. The forward pass
    records the reverse pass's residuals (no re-solve).

    `stored_steps=None` stores the state after every accepted step, once: up
    to `SEGMENT_STEPS` steps and at most `STORED_BYTES` of them (at least
    `MIN_STORED` steps); the reverse pass then runs back over them, each
    step's stages recomputed from its start and transposed (one plain loop:
    no checkpointing machinery per step). A solve that takes more steps than
    that (a `max_steps` raised above it, a large state) continues in segments
    of as many steps, each resuming exactly where the last stopped, and the
    reverse pass re-solves each earlier segment from its start (kept, at most
    `CHECKPOINT_BYTES` of them) before running back over it. The program is
    the same whatever `max_steps`: more steps add segments at run time, not
    code to compile. An int sets the steps a segment stores (memory ≈
    stored_steps × the state, plus one position per segment).

    Differentiated again (Hessians, forward-over-reverse), the solve is
    recorded again and its reverse pass run under forward mode: the same
    discrete derivative, at the tangents' memory more."""

    stores_interpolation = False
    follows_steps = True
    reverses_the_steps = True

    stored_steps: int | None = None

    def __post_init__(self):
        if self.stored_steps is not None and not (isinstance(self.stored_steps, int) and self.stored_steps > 0):
            raise ValueError(
                f"DiscreteAdjoint(stored_steps=...) must be a positive int or None, got {self.stored_steps!r}"
            )

    def recording(self, setup: Setup, u0, p) -> Callable:
        """How the forward pass records its reverse pass (`_recorded`): the solve in segments of stored
        steps (`_segmented`), as many as the user's `stored_steps` or `segment_steps` (sized by what a step
        stores: y, and the solver's state where `_keeps_state`)."""
        y0 = setup.state(u0)
        stored = y0.size
        if _keeps_state(setup, y0, p):
            state = eqx.filter_eval_shape(_stepper(setup).solver.init, setup.term(), setup.t0, setup.t1, y0, p)
            stored += sum(x.size for x in jax.tree.leaves(state))
        return _segmented(self.stored_steps or segment_steps(setup.max_steps, stored, u0.dtype.itemsize))

    def forward(self, setup: Setup, u0, p, active):
        if active is None:
            return plain_forward(setup, u0, p)
        us, stats, result, pb = _recorded(setup, self.recording(setup, u0, p))(u0, p)
        return checked(setup, result, us), stats, Tape(u0, p, pb, result)

    def pushforward(self, setup: Setup, tape: "Tape", du0, dp):
        return solver_pushforward(setup, tape.u0, tape.p, du0, dp)

    def pullback(self, setup: Setup, tape: "Tape", w):
        replayed = _replayed(setup, self.recording(setup, tape.u0, tape.p))
        return checked(setup, tape.result, replayed(tape.u0, tape.p, tape.pullback, w))


class Tape(eqx.Module):
    """DiscreteAdjoint's residuals: u0 (n,), p (m,), the pullback of the recorded solve through the
    solver's steps, and the solve's diffrax result."""

    u0: jax.Array
    p: jax.Array
    pullback: Callable
    result: dfx.RESULTS


def _zero_tangents(tree):
    """Zero tangents for a PyTree of arrays (float0 for integer leaves)."""
    return jax.tree.map(
        lambda x: jnp.zeros_like(x) if jnp.issubdtype(x.dtype, jnp.inexact) else np.zeros(x.shape, jax.dtypes.float0),
        tree,
    )


# The segments' checkpoints at most (bytes): past it, one checkpoint serves several segments, each
# re-solved from it on the way back.
CHECKPOINT_BYTES = 2**25


def _segmented(count: int) -> Callable:
    """(setup, u0, p) -> (pb, us, stats, result): the solve in segments of at most `count` steps, each
    resuming exactly where the last stopped (a `Position`), keeping the state at t0 and after each accepted
    step of the last segment and each segment's start (`_Record`), and the pullback `pb` (`_pullback`)
    that runs back over them, re-solving the earlier segments from their starts. `count` and the
    checkpoints are sized by what a solve keeps, so a larger max_steps adds segments at run time, not
    code: one segment's solve and one step's reverse serve them all."""

    def recording(setup: Setup, u0, p):
        y0 = setup.state(setup.initialised(u0, p))
        ts = jnp.asarray(setup.ts, y0.dtype)
        start = _initial(setup, y0, p)
        segments = -(-setup.max_steps // count)
        stride = -(-segments // max(1, min(segments, CHECKPOINT_BYTES // _bytes(start))))
        checkpoints = jax.tree.map(lambda x: jnp.zeros((-(-segments // stride), *x.shape), x.dtype), start)
        stepped = (start.y, start.solver_state) if _keeps_state(setup, start.y, p) else start.y
        stored = jax.tree.map(lambda x: jnp.zeros((count + 1, *x.shape), x.dtype), stepped)
        steps = (jnp.zeros((count + 1,), start.t.dtype), stored, jnp.asarray(0))

        def going(carry):
            k, _, _, _, _, _, result = carry
            return (k == 0) | ((result == dfx.RESULTS.max_steps_reached) & (k < segments))

        def segment(carry):
            k, start, checkpoints, ys, _, stats, _ = carry
            checkpoints = jax.tree.map(
                lambda c, x: c.at[k // stride].set(jnp.where(k % stride == 0, x, c[k // stride])), checkpoints, start
            )
            saves, *steps, end, more, result = _segment(setup, start, p, count, jnp.maximum(ts, start.t))
            ys = jnp.where((ts >= start.t)[:, None], saves, ys)
            return k + 1, end, checkpoints, ys, tuple(steps), stats + more, result

        carry = (
            jnp.asarray(0),
            start,
            checkpoints,
            jnp.zeros((ts.shape[0], *start.y.shape), start.y.dtype),
            steps,
            jnp.zeros((3,), jnp.int32),
            dfx.RESULTS.successful,
        )
        k, _, checkpoints, ys, (t, y, accepted), stats, result = jax.lax.while_loop(going, segment, carry)
        result = dfx.RESULTS.where(stats[0] > setup.max_steps, dfx.RESULTS.max_steps_reached, result)
        arrays, rest = eqx.partition(setup, eqx.is_array)
        record = _Record(t, y, accepted, checkpoints, k - 1, stats[1] == 0, p)
        return jax.tree_util.Partial(functools.partial(_pullback, rest, stride), arrays, record), ys, stats, result

    return recording


def _bytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _stepper(setup: Setup) -> Stepper:
    return Stepper.of(setup.term(), setup.solver, setup.controller())


def _initial(setup: Setup, y0, p) -> Position:
    """The solve's position at t0, before its first step."""
    return begin(_stepper(setup), y0, p, setup.t0, setup.t1, setup.dt0, setup.ts)


def _keeps_state(setup: Setup, y, p) -> bool:
    """Whether a step starts from y and the solver's state (reversible Heun's second solution), not y alone
    (`Stepper.restartable`): the reverse pass then stores and pulls back both."""
    return not _stepper(setup).restartable(setup.t0, setup.t1, y, p)


def _segment(setup: Setup, start: Position, p, count: int, ts=None) -> tuple:
    """The solve from `start` towards t1 in at most `count` steps: (the saves at `ts` (inf where not
    reached; the end state without `ts`), t (count + 1,) and y (count + 1, n + k) at the start and after each
    accepted step (inf after the last; with the solver's state, a pair, where `_keeps_state`), the accepted
    steps, the next segment's start, stats (3,) int32, diffrax's result)."""
    states = "solver" if _keeps_state(setup, start.y, p) else True
    stepper = _stepper(setup)
    sol = integrate(stepper, None, p, start.t, setup.t1, max_steps=count, ts=ts, step_states=states, start=start)
    (_, t), (saves, y) = sol.ts, sol.ys
    return saves, t, y, sol.stats["num_accepted_steps"], sol.end, stats_vector(sol), sol.result


class _Record(eqx.Module):
    """What DiscreteAdjoint's reverse pass reads: the last segment's states (t (S + 1,), y (S + 1, n + k) at
    its start and after each of its `accepted` steps), each segment's (or every stride-th segment's)
    start (`checkpoints`), the index of the `last` segment, whether the solve took no step at all
    (`none`), and p."""

    t: jax.Array
    y: typing.Any
    accepted: jax.Array
    checkpoints: Position
    last: jax.Array
    none: jax.Array
    p: jax.Array


def _pullback(rest, stride: int, arrays, rec: _Record, w):
    """wᵀ ∂ys/∂(u0, p) (n,), (m,) for the cotangent w (T, n + k) of the saves: back over the segments,
    the last from its stored states, each earlier one re-solved from its checkpoint (`stride` - 1
    segments at most re-solved before it), each through `_reverse_steps`."""
    setup = eqx.combine(arrays, rest)
    stepper = Stepper.of(setup.term(), setup.solver, setup.controller(), forward_mode=False)
    saves = jnp.asarray(setup.ts, rec.t.dtype)
    stored = (rec.t, rec.y, rec.accepted)
    start = jax.tree.map(lambda c: c[0], rec.checkpoints)  # the solve's start
    keeps_state = _keeps_state(setup, start.y, rec.p)

    def resolved(k):
        def again(_, carry):
            _, t, y, accepted, end, _, _ = _segment(setup, carry[0], rec.p, rec.t.shape[0] - 1)
            return end, t, y, accepted

        start = jax.tree.map(lambda c: c[k // stride], rec.checkpoints)
        return jax.lax.fori_loop(0, k % stride + 1, again, (start, *stored))[1:]

    def back(carry):
        k, y_bar, p_bar = carry
        on = k >= 0
        k = jnp.maximum(k, 0)  # a finished member of a vmap batch runs on over no steps
        # Re-solving runs only where some member of a batch needs it.
        t, y, accepted = jax.lax.cond(
            batch_any(k != rec.last),
            lambda: jax.tree.map(lambda a, b: jnp.where(k == rec.last, a, b), stored, resolved(k)),
            lambda: stored,
        )
        accepted = jnp.where(on, accepted, 0)
        y_bar, p_bar = _reverse_steps(setup, stepper, saves, t, y, accepted, rec.p, w, y_bar, p_bar, keeps_state)
        return k - 1, y_bar, p_bar

    # A solve of no steps (t0 = t1) saved y0 at every save time.
    y_bar = jnp.where(rec.none, jnp.sum(w, axis=0), jnp.zeros_like(start.y))
    if keeps_state:
        y_bar = (y_bar, jax.tree.map(jnp.zeros_like, start.solver_state))
    # The loops run while any member of a batch has steps left (an unbatched condition), so that p's
    # cotangent, where the batch shares p, stays one sum over the batch (`accumulate_pullback`).
    _, y_bar, p_bar = jax.lax.while_loop(
        lambda carry: batch_any(carry[0] >= 0), back, (rec.last, y_bar, jnp.zeros_like(rec.p))
    )
    if keeps_state:  # the solver's first state from y0 (and p)
        y_bar, state_bar = y_bar
        initial = lambda y, p: stepper.solver.init(stepper.terms, start.t, start.t_next, y, p)  # noqa: E731
        from_state, p_bar = accumulate_pullback(initial, start.y, rec.p, state_bar, p_bar, setup.parameter_slots)
        y_bar = y_bar + from_state
    return y_bar[: setup.n], p_bar


def _reverse_steps(setup: Setup, stepper: Stepper, saves, t, y, accepted, p, w, y_bar, p_bar, keeps_state=False):
    """(the cotangent of y at t[0], p_bar plus the steps' wᵀ ∂ys/∂p) back over `accepted` stored steps (t (S + 1,)
    and y (S + 1, n + k) from t[0]) from `y_bar`, the cotangent of their end state: each step from its
    start recomputed and pulled back (`Stepper.restep`: the forward solve's step, its first stage
    re-evaluated instead of carried) from the cotangents of its end state and of the saves (at
    `saves`) its dense output gave: those in (t[i], t[i + 1]], and for a first step from t0, at t0 too.
    `keeps_state`: y and y_bar are pairs (y, the solver's state), each step taken from both (`_keeps_state`)."""
    first = jnp.searchsorted(saves, t, side="right")  # step i gave saves[first[i]:first[i + 1]]
    first = first.at[0].set(jnp.where(t[0] > setup.t0, first[0], 0))

    def back(carry):
        i, y_bar, p_bar = carry
        on = i >= 0
        i = jnp.maximum(i, 0)  # a finished member of a vmap batch runs on, its cotangents zero
        t0, t1 = t[i], t[i + 1]

        def step(y0, p):
            if not keeps_state:
                return stepper.restep(t0, t1, y0, p)
            (y0, state0) = y0
            y1, _, dense, state, _ = stepper.step(t0, t1, y0, p, state0, False)
            return (y1, state), dense

        y_i = jax.tree.map(lambda x: x[i], y)
        # A step's dense output is linear in its dense info: the saves' cotangents need no forward step.
        dense = eqx.filter_eval_shape(step, y_i, p)[1]
        zero = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), dense)

        def save(k, dense_bar):
            of_save = jax.linear_transpose(lambda d: stepper.interpolation(t0, t1, d).evaluate(saves[k]), dense)
            return jax.tree.map(jnp.add, dense_bar, of_save(w[k])[0])

        lo, hi = first[i], first[i + 1]
        dense_bar = jax.lax.cond(hi > lo, lambda: jax.lax.fori_loop(lo, hi, save, zero), lambda: zero)
        cotangent = jax.tree.map(lambda c: jnp.where(on, c, jnp.zeros_like(c)), (y_bar, dense_bar))
        y_bar_i, p_bar = accumulate_pullback(step, y_i, p, cotangent, p_bar, setup.parameter_slots)
        return i - 1, jax.tree.map(lambda a, b: jnp.where(on, a, b), y_bar_i, y_bar), p_bar

    _, y_bar, p_bar = jax.lax.while_loop(lambda carry: batch_any(carry[0] >= 0), back, (accepted - 1, y_bar, p_bar))
    return y_bar, p_bar


def _recorded(setup: Setup, recording: Callable):
    """(u0, p) -> (us, stats, result, pb): the forward solve and the pullback `pb` that `recording`
    (setup, u0, p) -> (pb, us, stats, result) makes. Forward mode sees the solution's tangent
    (through the solver's steps) and no tangent for `pb`, which `_replayed` recomputes instead of
    reading."""
    arrays, rest = eqx.partition(setup, eqx.is_array)  # traced parts enter the rule as arguments
    structure = []  # pb's PyTree structure: the rule returns its leaves (each trace builds a new structure)

    @jax.custom_jvp
    def record(u0, p, arrays):
        pb, us, stats, result = recording(eqx.combine(arrays, rest), u0, p)
        leaves, treedef = jax.tree.flatten(pb)
        structure[:] = [treedef]
        return us, stats, result, leaves

    @record.defjvp
    def record_jvp(primals, tangents):
        out = record(*primals)
        # the setup's traced parts (times) move the solution too: second derivatives in time
        _, dus = jax.jvp(lambda u0, p, arrays: eqx.combine(arrays, rest).forward(u0, p).ys, primals, tangents)
        return out, (dus, *_zero_tangents(out[1:]))

    def recorded(u0, p):
        us, stats, result, leaves = record(u0, p, arrays)
        return us, stats, result, jax.tree.unflatten(structure[0], leaves)

    return recorded


def _replayed(setup: Setup, recording: Callable):
    """(u0, p, pb, w) -> pb(w) = wᵀ ∂us/∂(u0, p); its derivative in (u0, p, w) is forward mode through the
    solve recorded again by `recording` and its pullback (the solver's stages in a loop both modes enter)."""
    arrays, rest = eqx.partition(_both_modes(setup), eqx.is_array)

    @jax.custom_jvp
    def replay(u0, p, pb, w, arrays):
        return pb(w)

    @replay.defjvp
    def replay_jvp(primals, tangents):
        u0, p, pb, w, arrays = primals
        du0, dp, _, dw, d_arrays = tangents

        def pullback(u0, p, w, arrays):  # arrays: the setup's traced parts (times), which move it too
            return recording(eqx.combine(arrays, rest), u0, p)[0](w)

        _, tangent = jax.jvp(pullback, (u0, p, w, arrays), (du0, dp, dw, d_arrays))
        return pb(w), tangent

    return lambda u0, p, pb, w: replay(u0, p, pb, w, arrays)


def _both_modes(setup: Setup) -> Setup:
    """`setup` with a Runge-Kutta solver's stages in a loop that forward and reverse mode both enter."""
    return eqx.tree_at(lambda s: s.solver, setup, stage_loop(setup.solver, "bounded"))


class ForwardDiffSensitivity(AbstractSensitivity):
    """Forward-mode AD through the solver (diffrax `ForwardMode`), dual numbers
    carried through every step, as SciMLSensitivity's ForwardDiffSensitivity.
    The forward pass carries one tangent per differentiated input (n for u0,
    m for p) and keeps the Jacobian d us / d(u0, p); jvps and gradients are
    then products with it. Best when n + m is small."""

    stores_interpolation = False
    follows_steps = True
    initialises = True
    through_the_steps = True

    def forward(self, setup: Setup, u0, p, active):
        if active is None:
            return plain_forward(setup, u0, p)
        argnums = tuple(i for i, on in ((0, active.u0), (1, active.p)) if on)
        if not argnums:  # only the times are differentiated: their derivatives need no Jacobian
            ys, stats, _ = plain_forward(setup, u0, p)
            return ys, stats, Jacobians(None, None, ys.shape)
        jacs, (us, stats, result) = jax.jacfwd(_solution(setup), argnums=argnums, has_aux=True)(u0, p)
        full = [None, None]
        for i, jac in zip(argnums, jacs):
            full[i] = checked(setup, result, jac)
        return us, stats, Jacobians(full[0], full[1], us.shape)

    def pullback(self, setup: Setup, jacs: "Jacobians", w):
        return tuple(None if jac is None else jnp.tensordot(w, jac, axes=2) for jac in (jacs.u0, jacs.p))

    def pushforward(self, setup: Setup, jacs: "Jacobians", du0, dp):
        return sum(
            (jnp.tensordot(jac, v, axes=1) for jac, v in zip((jacs.u0, jacs.p), (du0, dp)) if jac is not None),
            start=jnp.zeros(jacs.shape, du0.dtype),
        )


class Jacobians(eqx.Module):
    """ForwardDiffSensitivity's residuals: ∂y(tᵢ)/∂u0 (T, n + k, n) and ∂y(tᵢ)/∂p (T, n + k, m) (None where
    not differentiated), and the `shape` (T, n + k) of the saves."""

    u0: jax.Array | None
    p: jax.Array | None
    shape: tuple = eqx.field(static=True)
