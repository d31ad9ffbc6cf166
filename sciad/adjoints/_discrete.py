"""Differentiating through the solver's steps: discretise-then-optimise."""

import functools
from typing import Callable

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sciad.adjoints._base import (AbstractSensitivity, Setup, checked, plain_forward, solver_pushforward, stats_vector,
                                 stored_steps)
from sciad.adjoints._stepping import Stepper
from sciad._errors import batch_any

STORE_ALL_BYTES = 2**28  # auto's `stored-steps` rule: DiscreteAdjoint where max_steps states fit (256 MiB)
STATE_COPIES = 1  # the stored reverse pass keeps each accepted step's state once (recomputing its stages)


def stored_steps_bytes(max_steps: int, states: int, itemsize: int) -> int:
    """The bytes of the stored steps (`stored_steps(max_steps)`) of a state of `states` entries of `itemsize` bytes."""
    return stored_steps(max_steps) * STATE_COPIES * states * itemsize


def _solution(setup: Setup, adjoint=None, throw=True):
    """(u0, p) -> (us, (us, stats, result)): a solve shaped for jax.vjp / jax.jacfwd with has_aux."""

    def solve(u0, p):
        sol = setup.forward(u0, p, adjoint=adjoint, throw=throw)
        return sol.ys, (sol.ys, stats_vector(sol), sol.result)

    return solve


class DiscreteAdjoint(AbstractSensitivity):
    """Reverse-mode AD through the solver's steps: the exact gradient of the
    discrete solution, as diffrax's `RecursiveCheckpointAdjoint` gives it.
    The baseline every other sensealg is checked against. The forward pass
    records the reverse pass's residuals (no re-solve).

    `stored_steps=None` stores the state after every accepted step, once: up
    to `STORED_STEPS` steps and at most `STORED_BYTES` of them (at least
    `MIN_STORED` steps); the reverse pass then runs back over them, each
    step's stages recomputed from its start and transposed (one plain loop:
    no checkpointing machinery per step). A solve that takes more steps than
    that (a `max_steps` raised above it, a large state) is solved again and,
    in the reverse pass, differentiated with diffrax's recursive checkpoints
    (O(√max_steps) states, the steps recomputed); nothing sized by
    `max_steps` is built or filled unless it ran out, so the cost follows the
    steps taken. An int sets the number of steps stored (diffrax's
    `checkpoints`; memory ≈ stored_steps × the solver's state).

    Differentiated again (Hessians, forward-over-reverse), the reverse pass
    is replayed through diffrax's `DirectAdjoint`, which forward mode can
    enter: the same discrete derivative, at more memory."""

    stores_interpolation = False

    stored_steps: int | None = None

    def __post_init__(self):
        if self.stored_steps is not None and not (isinstance(self.stored_steps, int) and self.stored_steps > 0):
            raise ValueError(f"DiscreteAdjoint(stored_steps=...) must be a positive int or None, got "
                             f"{self.stored_steps!r}")

    def recording(self, setup: Setup, u0) -> Callable:
        """How the forward pass records its reverse pass (`_recorded`): the stored steps, recomputed
        with recursive checkpoints where the solve needs more, or the user's number of checkpoints."""
        if self.stored_steps is not None:
            return _checkpointed(self.stored_steps)
        count = stored_steps(setup.max_steps, STATE_COPIES * u0.size * u0.dtype.itemsize)
        return _stored(count) if count >= setup.max_steps else _or_recomputed(_stored(count, throw=False))

    def forward(self, setup: Setup, u0, p, active):
        if active is None:
            return plain_forward(setup, u0, p)
        us, stats, result, pb = _recorded(setup, self.recording(setup, u0))(u0, p)
        return checked(setup, result, us), stats, Tape(u0, p, pb, result)

    def pushforward(self, setup: Setup, tape: "Tape", du0, dp):
        return solver_pushforward(setup, tape.u0, tape.p, du0, dp)

    def pullback(self, setup: Setup, tape: "Tape", w):
        return checked(setup, tape.result, _replayed(setup)(tape.u0, tape.p, tape.pullback, w))


class Tape(eqx.Module):
    """DiscreteAdjoint's residuals: u0 (n,), p (m,), the pullback of the recorded solve through the
    solver's steps, and the solve's diffrax result."""

    u0: jax.Array
    p: jax.Array
    pullback: Callable
    result: dfx.RESULTS


def _zero_tangents(tree):
    """Zero tangents for a PyTree of arrays (float0 for integer leaves)."""
    return jax.tree.map(lambda x: jnp.zeros_like(x) if jnp.issubdtype(x.dtype, jnp.inexact)
                        else np.zeros(x.shape, jax.dtypes.float0), tree)


def _checkpointed(checkpoints: int | None) -> Callable:
    """(setup, u0, p) -> (pb, us, stats, result): the solve under `jax.vjp` with diffrax's
    `RecursiveCheckpointAdjoint(checkpoints)` and the pullback `pb` it makes."""

    def recording(setup: Setup, u0, p):
        _, pb, (us, stats, result) = jax.vjp(_solution(setup, dfx.RecursiveCheckpointAdjoint(checkpoints)),
                                             u0, p, has_aux=True)
        return pb, us, stats, result

    return recording


def _stored(count: int, throw: bool = True) -> Callable:
    """(setup, u0, p) -> (pb, us, stats, result): the solve in at most `count` steps, keeping the state
    at t0 and after each accepted step, and the pullback `pb` (`_reverse_steps`) that runs back over them."""

    def recording(setup: Setup, u0, p):
        sol = setup.forward(u0, p, max_steps=count, step_states=True, throw=throw)
        (us, _), (_, t_steps), (_, y_steps) = sol.ys, sol.ts, sol.ys
        arrays, rest = eqx.partition(setup, eqx.is_array)
        accepted = sol.stats["num_accepted_steps"]
        pb = jax.tree_util.Partial(functools.partial(_reverse_steps, rest), arrays, t_steps, y_steps, accepted, p)
        return pb, us, stats_vector(sol), sol.result

    return recording


def _reverse_steps(rest, arrays, t, y, accepted, p, w):
    """wᵀ ∂ys/∂(u0, p) (n,), (m,) for the cotangent w (T, n + k) of the saves: back over the stored
    accepted steps (t (S + 1,) and y (S + 1, n + k) from t0; the first `accepted` of them), each step
    from its start recomputed under `jax.vjp` (diffrax's step, as the forward solve took it: its
    first stage re-evaluated instead of carried) and given the cotangents of its end state and of
    the saves its dense output gave."""
    setup = eqx.combine(arrays, rest)
    stepper = Stepper.of(setup.term(), setup.solver, setup.rtol, setup.atol, forward_mode=False)
    saves = jnp.asarray(setup.ts, t.dtype)
    first = jnp.searchsorted(saves, t, side="right").at[0].set(0)  # step i gave saves[first[i]:first[i + 1]]
    state = jax.tree.map(jnp.zeros_like, eqx.filter_eval_shape(stepper.solver.init, stepper.terms, t[0], t[1],
                                                                y[0], p))

    def back(carry):
        i, y_bar, p_bar = carry
        i = jnp.maximum(i, 0)  # a finished member of a vmap batch runs on, its result discarded
        t0, t1 = t[i], t[i + 1]

        def step(y0, p):
            y1, _, dense, _, _ = stepper.step(t0, t1, y0, p, state, True)
            return y1, dense

        (_, dense), pullback = jax.vjp(step, y[i], p)
        zero = jax.tree.map(jnp.zeros_like, dense)

        def save(k, dense_bar):
            _, of_save = jax.vjp(lambda d: stepper.interpolation(t0, t1, d).evaluate(saves[k]), dense)
            return jax.tree.map(jnp.add, dense_bar, of_save(w[k])[0])

        lo, hi = first[i], first[i + 1]
        dense_bar = jax.lax.cond(hi > lo, lambda: jax.lax.fori_loop(lo, hi, save, zero), lambda: zero)
        y_bar, g = pullback((y_bar, dense_bar))
        return i - 1, y_bar, p_bar + g

    # A solve of no steps (t0 = t1) saved y0 at every save time.
    y_bar = jnp.where(accepted == 0, jnp.sum(w, axis=0), jnp.zeros_like(y[0]))
    _, y_bar, p_bar = jax.lax.while_loop(lambda carry: carry[0] >= 0, back, (accepted - 1, y_bar, jnp.zeros_like(p)))
    return y_bar[: setup.n], p_bar


def _or_recomputed(recording: Callable) -> Callable:
    """`recording` (a solve in fewer steps than max_steps, not raising where it runs out), or where it
    runs out of steps (any member of a vmap batch), the solve again and, in the reverse pass, its
    pullback with recursive checkpoints (`_recomputed`): their buffers, sized by max_steps, are built
    only on that branch."""

    def either(setup: Setup, u0, p):
        stored, us, stats, result = recording(setup, u0, p)
        overflow = batch_any(result == dfx.RESULTS.max_steps_reached)

        def again():
            sol = setup.forward(u0, p, throw=False)
            return sol.ys, stats_vector(sol), sol.result

        us, stats, result = jax.lax.cond(overflow, again, lambda: (us, stats, result))
        arrays, rest = eqx.partition(setup, eqx.is_array)
        recomputed = jax.tree_util.Partial(functools.partial(_recomputed, rest), arrays, u0, p)
        return _Either(stored, recomputed, overflow), us, stats, result

    return either


def _recomputed(rest, arrays, u0, p, w):
    """wᵀ ∂us/∂(u0, p) by the solve under `jax.vjp` with diffrax's recursive checkpoints."""
    _, pullback, _ = jax.vjp(_solution(eqx.combine(arrays, rest), dfx.RecursiveCheckpointAdjoint(), throw=False),
                             u0, p, has_aux=True)
    return pullback(w)


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


class _Either(eqx.Module):
    """The pullback of the stored solve, or where it ran out of steps (`again_used`), the recomputing one (`again`)."""

    stored: Callable
    again: Callable
    again_used: jax.Array

    def __call__(self, w):
        return jax.lax.cond(self.again_used, self.again, self.stored, w)


def _replayed(setup: Setup):
    """(u0, p, pb, w) -> pb(w) = wᵀ ∂us/∂(u0, p); its derivative in (u0, p, w) is forward mode
    through the reverse pass of a `DirectAdjoint` solve (recursive checkpoints admit no jvp)."""
    arrays, rest = eqx.partition(setup, eqx.is_array)

    @jax.custom_jvp
    def replay(u0, p, pb, w, arrays):
        return pb(w)

    @replay.defjvp
    def replay_jvp(primals, tangents):
        u0, p, pb, w, arrays = primals
        du0, dp, _, dw, d_arrays = tangents

        def pullback(u0, p, w, arrays):  # arrays: the setup's traced parts (times), which move it too
            setup = eqx.combine(arrays, rest)
            return jax.vjp(lambda u0, p: setup.forward(u0, p, adjoint=dfx.DirectAdjoint()).ys, u0, p)[1](w)

        _, tangent = jax.jvp(pullback, (u0, p, w, arrays), (du0, dp, dw, d_arrays))
        return pb(w), tangent

    return lambda u0, p, pb, w: replay(u0, p, pb, w, arrays)


class ForwardDiffSensitivity(AbstractSensitivity):
    """Forward-mode AD through the solver (diffrax `ForwardMode`), dual numbers
    carried through every step, as SciMLSensitivity's ForwardDiffSensitivity.
    The forward pass carries one tangent per differentiated input (n for u0,
    m for p) and keeps the Jacobian d us / d(u0, p); jvps and gradients are
    then products with it. Best when n + m is small."""

    stores_interpolation = False
    initialises = True

    def forward(self, setup: Setup, u0, p, active):
        if active is None:
            return plain_forward(setup, u0, p)
        argnums = tuple(i for i, on in ((0, active.u0), (1, active.p)) if on)
        if not argnums:  # only the times are differentiated: their derivatives need no Jacobian
            ys, stats, _ = plain_forward(setup, u0, p)
            return ys, stats, Jacobians(None, None, ys.shape)
        jacs, (us, stats, result) = jax.jacfwd(
            _solution(setup), argnums=argnums, has_aux=True)(u0, p)
        full = [None, None]
        for i, jac in zip(argnums, jacs):
            full[i] = checked(setup, result, jac)
        return us, stats, Jacobians(*full, us.shape)

    def pullback(self, setup: Setup, jacs: "Jacobians", w):
        return tuple(None if jac is None else jnp.tensordot(w, jac, axes=2) for jac in (jacs.u0, jacs.p))

    def pushforward(self, setup: Setup, jacs: "Jacobians", du0, dp):
        return sum((jnp.tensordot(jac, v, axes=1) for jac, v in zip((jacs.u0, jacs.p), (du0, dp)) if jac is not None),
                   start=jnp.zeros(jacs.shape, du0.dtype))


class Jacobians(eqx.Module):
    """ForwardDiffSensitivity's residuals: ∂y(tᵢ)/∂u0 (T, n + k, n) and ∂y(tᵢ)/∂p (T, n + k, m) (None where
    not differentiated), and the `shape` (T, n + k) of the saves."""

    u0: jax.Array | None
    p: jax.Array | None
    shape: tuple = eqx.field(static=True)
