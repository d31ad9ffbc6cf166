"""`diffrax_adjoint`: sciad's sensealgs as a diffrax adjoint, `diffrax.diffeqsolve(..., adjoint=...)`."""

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sciad._diffrax_internals import WrapTerm
from sciad._events import ContinuousCallback
from sciad._ode import ODEProblem
from sciad.adjoints._base import AbstractSensitivity

_DIRECTIONS = {None: "both", True: "up", False: "down"}


def diffrax_adjoint(sensealg: str | AbstractSensitivity = "auto") -> "DiffraxAdjoint":
    """A `diffrax.AbstractAdjoint` that differentiates `diffrax.diffeqsolve` by `sensealg` (as
    `sciad.solve` takes it: "auto", a name, or an instance such as `sciad.GaussAdjoint()`).

    `diffrax.diffeqsolve(terms, solver, t0, t1, dt0, y0, args, adjoint=sciad.diffrax_adjoint(...), ...)`
    then solves `terms` (an `ODETerm`) with `solver`, `stepsize_controller` (a `PIDController`), `dt0`
    and `max_steps` exactly as diffrax does (the same steps), saving as `saveat` says (`t0`, `ts`,
    `t1`, `fn`, `subs`), stopping at an `Event`'s first zero crossing (float conditions, located to the
    solve's tolerances), and returns diffrax's `Solution` (`ts`, `ys`, `stats`, `result`, `event_mask`);
    its derivatives in y0, `args` (their float arrays: the parameters), the arrays `terms` hold (a
    neural network's weights), t0, t1 and the save times are `sensealg`'s. A solve that fails (more
    than `max_steps` steps) raises `sciad.SolveError`, whatever `throw` says.

    Not served (each a `NotImplementedError` at the call): SDE terms, `SaveAt(steps=True)`,
    `SaveAt(dense=True)`, saving the solver's or controller's state, constant or clipped step sizes,
    boolean event conditions, and a passed solver or controller state."""
    return DiffraxAdjoint(sensealg)


class DiffraxAdjoint(dfx.AbstractAdjoint):
    """sciad's `sensealg` as a diffrax adjoint (`diffrax_adjoint`)."""

    sensealg: str | AbstractSensitivity = eqx.field(static=True, default="auto")

    def loop(
        self,
        *,
        args,
        terms,
        solver,
        stepsize_controller,
        event,
        saveat,
        t0,
        t1,
        dt0,
        max_steps,
        throw,
        init_state,
        passed_solver_state,
        passed_controller_state,
        progress_meter,
    ):
        from sciad._solve import solve

        del throw, progress_meter
        subs = jax.tree.leaves(saveat.subs, is_leaf=lambda x: isinstance(x, dfx.SubSaveAt))
        _check(
            terms, saveat, subs, stepsize_controller, event, max_steps, passed_solver_state or passed_controller_state
        )
        # diffeqsolve's time s = direction * t runs forward (a float: f's traced closure values are its parameters)
        direction = jnp.asarray(terms.direction, jnp.result_type(t0))
        # the parameters: args' float arrays and the term's (a network's weights), passed, not closed over
        p, static = eqx.partition((terms.term, args), eqx.is_inexact_array)
        arguments = lambda p: eqx.combine(p, static)[1]  # noqa: E731

        def f(u, p, s):
            rate, args = eqx.combine(p, static)
            return jax.tree.map(lambda v: direction * v, rate.vf(direction * s, u, args))

        context = dict(
            terms=terms,
            solver=solver,
            t0=t0,
            t1=t1,
            dt0=dt0,
            saveat=saveat,
            stepsize_controller=stepsize_controller,
            max_steps=max_steps,
        )
        conditions = [] if event is None else jax.tree.leaves(event.cond_fn, is_leaf=callable)
        directions = [] if event is None else jax.tree.leaves(event.direction, is_leaf=lambda x: x is None)
        callbacks = tuple(
            ContinuousCallback(condition=_condition(c, arguments, context), affect=None, direction=_DIRECTIONS[d])
            for c, d in zip(conditions, directions)
        )
        for i, condition in enumerate(callbacks):
            value = jax.eval_shape(condition.condition, init_state.y, p, t0)
            if not jnp.issubdtype(value.dtype, jnp.floating):
                raise NotImplementedError(
                    f"event condition {i} returns {value.dtype}: sciad locates events where a "
                    "float condition crosses zero; return a float (e.g. the distance to the "
                    "boundary) instead of a boolean"
                )

        # every sub's times, then t1 (the final state), in one sorted saveat; which of them are t1's
        pieces = [[t0[None]] * s.t0 + ([] if s.ts is None else [s.ts]) + [t1[None]] * s.t1 for s in subs]
        sizes = [sum(x.shape[0] for x in piece) for piece in pieces]
        times = jnp.concatenate([x for piece in pieces for x in piece] + [t1[None]])
        finals = np.concatenate([np.arange(size) >= size - s.t1 for s, size in zip(subs, sizes)] + [[True]])
        order = jnp.argsort(times)
        prob = ODEProblem(f, init_state.y, (0.0, 1.0), p)
        sol = solve(
            prob,
            saveat=times[order],
            tspan=(t0, t1),
            solver=solver,
            sensealg=self.sensealg,
            stepsize_controller=stepsize_controller,
            dt0=dt0,
            max_steps=max_steps,
            callbacks=callbacks,
        )
        ts, ys = _unsorted(order, (sol.ts, sol.us))
        late = (times > sol.t_final) & ~finals if callbacks else jnp.zeros(times.shape, bool)

        states, start = [], 0
        for sub, state, size in zip(subs, jax.tree.leaves(init_state.save_state, is_leaf=_is_save_state), sizes):
            t, y = _after_stop(
                late[start : start + size],
                ts[start : start + size],
                jax.tree.map(lambda x: x[start : start + size], ys),
            )
            y = jax.vmap(lambda t, y: sub.fn(t, y, args))(t, y)
            states.append(
                eqx.tree_at(
                    lambda s: (s.saveat_ts_index, s.ts, s.ys, s.save_index),
                    state,
                    (jnp.asarray(0 if sub.ts is None else sub.ts.shape[0]), t, y, jnp.asarray(size)),
                )
            )
            start += size
        save_state = jax.tree.unflatten(jax.tree.structure(init_state.save_state, is_leaf=_is_save_state), states)
        fired = (
            None
            if event is None
            else jax.tree.unflatten(jax.tree.structure(event.cond_fn, is_leaf=callable), list(sol.event_counts > 0))  # pyright: ignore[reportOptionalOperand]  # an event: counted
        )
        result = (
            dfx.RESULTS.successful
            if event is None
            else dfx.RESULTS.where(
                jnp.any(sol.event_counts > 0),  # pyright: ignore[reportOptionalOperand]  # an event: counted
                dfx.RESULTS.event_occurred,
                dfx.RESULTS.successful,
            )
        )
        final = jax.tree.map(lambda x: x[-1], ys)
        steps = sol.stats
        final_state = eqx.tree_at(
            lambda s: (
                s.y,
                s.tprev,
                s.save_state,
                s.num_steps,
                s.num_accepted_steps,
                s.num_rejected_steps,
                s.result,
                s.event_mask,
            ),
            init_state,
            (
                final,
                sol.t_final,
                save_state,
                steps["steps"],
                steps["accepted_steps"],
                steps["rejected_steps"],
                result,
                fired,
            ),
            is_leaf=lambda x: x is None,
        )
        return final_state, {}


def _check(terms, saveat, subs, controller, event, max_steps, passed_state) -> None:
    """NotImplementedError for what `DiffraxAdjoint` does not serve, naming the alternative."""
    if not (isinstance(terms, WrapTerm) and isinstance(terms.term, dfx.ODETerm)):
        raise NotImplementedError(
            "sciad.diffrax_adjoint differentiates ODEs given as one diffrax.ODETerm; for an "
            "SDE use sciad.solve(sciad.SDEProblem(...)), or adjoint=diffrax."
            "RecursiveCheckpointAdjoint()"
        )
    if not isinstance(controller, dfx.PIDController):
        raise NotImplementedError(
            f"sciad.diffrax_adjoint steps adaptively: pass stepsize_controller="
            f"diffrax.PIDController(rtol=..., atol=...), not {type(controller).__name__}"
        )
    if saveat.dense or saveat.solver_state or saveat.controller_state or saveat.made_jump:
        raise NotImplementedError(
            "sciad.diffrax_adjoint saves the state (SaveAt(t0=..., ts=..., t1=..., fn=...)); "
            "for dense output use sciad.solve(..., dense=True)"
        )
    if any(s.steps for s in subs):
        raise NotImplementedError(
            "sciad.diffrax_adjoint does not save at every step (SaveAt(steps=True)): save at "
            "the times you need (SaveAt(ts=...))"
        )
    if max_steps is None:
        raise NotImplementedError(
            "sciad.diffrax_adjoint needs a bound on the steps: pass max_steps=... (diffrax's default is 4096)"
        )
    if passed_state:
        raise NotImplementedError(
            "sciad.diffrax_adjoint starts every solve afresh: do not pass solver_state or controller_state"
        )


def _condition(cond, arguments, context):
    """diffrax's `cond_fn(t, y, args, **context)` as sciad's `condition(u, p, t)`."""
    return lambda u, p, s: cond(s, u, arguments(p), **context)


def _unsorted(order, tree):
    """`tree`'s leaves (sorted along their first axis by `order`) back in their original order."""
    inverse = jnp.argsort(order)
    return jax.tree.map(lambda x: x[inverse], tree)


def _is_save_state(x) -> bool:
    return hasattr(x, "saveat_ts_index")  # diffrax's SaveState, one per SubSaveAt


def _after_stop(late, ts, ys):
    """One sub's saves as diffrax leaves them after a stopping event: those made, in order (t1's at the
    event), then the `late` ones (T,) (past the event) at inf."""
    ts = jnp.where(late, jnp.inf, ts)
    ys = jax.tree.map(lambda y: jnp.where(late.reshape((-1,) + (1,) * (y.ndim - 1)), jnp.inf, y), ys)
    made_first = jnp.argsort(late, stable=True)
    return ts[made_first], jax.tree.map(lambda y: y[made_first], ys)
