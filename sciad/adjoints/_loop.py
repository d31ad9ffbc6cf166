"""sciad's loop over a solver's steps: a diffrax solver and its step-size controller, prepared once
(`Stepper`), stepped from a `Position` in one `lax.while_loop` (`integrate`) that does per step only what
its caller asks (saves, step states, dense output, an accumulator, a stop). Every solve sciad steps runs
through it: the forward solves, DiscreteAdjoint's segments, event location and the continuous adjoints'
backward sweeps (`sciad.adjoints._stepping`, in s = -t)."""

import functools
import typing

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sciad._custom_types import RealScalarLike
from sciad._diffrax_internals import WrapTerm, use_stepsize_tol
from sciad._equinox_internals import prevbefore, unvmap_any


class Stepper(eqx.Module):
    """A diffrax solver and its step-size controller for `terms`, prepared as `diffrax.diffeqsolve`
    prepares them (in `ForwardMode`): stages as a plain `lax.while_loop` where the solver has a choice (its
    default loop is a custom_vjp, which forward mode cannot enter; `forward_mode=False` keeps it, for
    the steps `restep` leaves to the solver, which reverse mode differentiates), and an implicit solver's root
    finder given the controller's rtol, atol and norm where it leaves them to the controller. Every
    loop sciad runs over a solver's steps itself (the backward sweep, event location) steps one.

    A solver may declare `rejects_itself = True` (a class variable): its step returns, on a step the controller
    rejects, the state to retry from (BDF's: its differences as they were, with the Jacobian and LU the failed
    attempt made), which the loop keeps, where it otherwise retries from the state the attempt started from."""

    terms: dfx.AbstractTerm
    solver: dfx.AbstractSolver
    controller: dfx.AbstractStepSizeController
    # A kind's step around the solver's, refine(step, t0, t1, y, args, solver_state, made_jump) -> `step`'s outputs,
    # `step` the solver's (a delay equation's fixed-point iteration where a lag is shorter than the step)
    refine: typing.Callable | None = None

    @classmethod
    def of(
        cls,
        terms,
        solver: dfx.AbstractSolver,
        controller: dfx.AbstractStepSizeController,
        forward_mode: bool = True,
        refine: typing.Callable | None = None,
    ) -> "Stepper":
        """`solver` on `terms` with steps by `controller` (`Setup.controller`), refined by `refine`."""
        if forward_mode:
            solver = stage_loop(solver, "lax")
        if isinstance(solver, dfx.AbstractImplicitSolver):  # a root finder to prepare (Rosenbrock: none)
            for name in ("rtol", "atol", "norm"):
                if getattr(solver.root_finder, name, None) is use_stepsize_tol:  # pyright: ignore[reportAttributeAccessIssue]
                    solver = eqx.tree_at(lambda s: getattr(s.root_finder, name), solver, getattr(controller, name))
        return cls(terms, solver, controller, refine)

    @property
    def error_order(self) -> RealScalarLike:
        """The order the controller's step-size rule takes for the solver's error estimate."""
        return self.solver.error_order(self.terms)  # pyright: ignore[reportReturnType]

    def begin(self, t0, t1, y0, args, dt0=None) -> "Position":
        """The position of a solve of y0 from t0 towards t1 before its first step (dt0: the first step, None:
        the controller's choice)."""
        # On the term as diffrax.diffeqsolve hands it over (the first step size differs on the bare term).
        t_next, controller_state = self.controller.init(
            WrapTerm(self.terms, 1), t0, t1, y0, dt0, args, self.solver.func, self.error_order
        )
        t_next = jnp.minimum(t_next, t1)
        solver_state = self.solver.init(self.terms, t0, t_next, y0, args)
        position = Position(t0, t_next, y0, solver_state, controller_state, jnp.asarray(False), t_next - t0)
        return jax.tree.map(jnp.asarray, position)

    def step(self, t0, t1, y, args, solver_state, made_jump) -> tuple:
        """One step from t0 to t1: (y1, error estimate, dense info, solver state, result), as `diffrax`'s. An
        ODE's explicit Runge-Kutta tableau has its stages written out one after the other (`explicit_rk_step`):
        the same step as the solver's, in one straight-line program, where diffrax loops over the stages. (An
        SDE's steps stay in diffrax's loop: adaptive steps on a Brownian path follow the last bit of each step's
        arithmetic, and XLA rounds a straight-line step differently where it fuses it with the tangents'.)"""
        if self.refine is None:
            return self.solver_step(t0, t1, y, args, solver_state, made_jump)
        return self.refine(self.solver_step, t0, t1, y, args, solver_state, made_jump)

    def solver_step(self, t0, t1, y, args, solver_state, made_jump) -> tuple:
        """The solver's step alone (`step` before the kind's refinement)."""
        tableau = getattr(self.solver, "tableau", None)
        if (
            isinstance(self.solver, dfx.AbstractERK)
            and isinstance(tableau, dfx.ButcherTableau)
            and isinstance(self.terms, dfx.ODETerm)
        ):
            return explicit_rk_step(tableau, self.terms, t0, t1, y, args, solver_state, made_jump)
        return self.solver.step(self.terms, t0, t1, y, args, solver_state, made_jump)

    def restep(self, t0, t1, y, args) -> tuple:
        """(y1, dense info): the step from t0 to t1 recomputed from y alone (first stage evaluated, as
        after a jump), for reverse mode to pull back: the arithmetic of `step`'s."""
        y1, _, dense, _, _ = self.step(t0, t1, y, args, self.zero_state(t0, t1, y, args), True)
        return y1, dense

    def restartable(self, t0, t1, y, args) -> bool:
        """Whether a step from y alone (`restep`: as after a jump) is the step the solve took: the solver
        keeps no state between steps, or a Runge-Kutta solver's first stage, which a jump re-evaluates
        (not so for reversible Heun, whose state carries a second solution)."""
        state = eqx.filter_eval_shape(self.solver.init, self.terms, t0, t1, y, args)
        return state is None or isinstance(self.solver, dfx.AbstractRungeKutta)

    def zero_state(self, t0, t1, y, args):
        """A solver state of zeros (what a step after a jump ignores)."""
        shape = eqx.filter_eval_shape(self.solver.init, self.terms, t0, t1, y, args)
        return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shape)

    def adapt(self, t0, t1, y0, y1, args, error, controller_state) -> tuple:
        """(keep, next t0, next t1, made_jump, controller state, result): the controller's verdict on a step."""
        return self.controller.adapt_step_size(t0, t1, y0, y1, args, error, self.error_order, controller_state)

    def interpolation(self, t0, t1, dense_info):
        """The step's dense output on [t0, t1]."""
        return self.solver.interpolation_cls(t0=t0, t1=t1, **dense_info)


def explicit_rk_step(tableau: dfx.ButcherTableau, terms, t0, t1, y, args, solver_state, made_jump) -> tuple:
    """diffrax's explicit Runge-Kutta step of `tableau` (its outputs, solver state and first-same-as-last reuse:
    `solver_state` (first step, f0) where the tableau is FSAL, else None), its stages unrolled: k_i = prod(f(t0
    + c_i h, y + Σ_j a_ij k_j), control)."""
    control = terms.contr(t0, t1)
    dt = t1 - t0
    a_lower, c = tableau.a_lower, np.concatenate([[0.0], tableau.c])

    def weighted(weights, ks):  # Σ_i w_i k_i, leafwise, as one dot (as diffrax sums them)
        return jax.tree.map(lambda *k: jnp.tensordot(jnp.asarray(weights, k[0].dtype), jnp.stack(k), axes=1), *ks)

    def vf(i, ks):
        yi = jax.tree.map(jnp.add, y, weighted(a_lower[i - 1], ks)) if i else y
        return terms.vf(t0 + float(c[i]) * dt, yi, args)

    if solver_state is None or made_jump is True:
        fs = [vf(0, [])]
    else:  # FSAL: the last stage of the step before, unless this is the first step or one after a jump
        first, f0 = solver_state
        fs = [jax.lax.cond(unvmap_any(first | made_jump), lambda: vf(0, []), lambda: f0)]
    ks = [terms.prod(fs[0], control)]
    for i in range(1, tableau.num_stages):
        fs.append(vf(i, ks))
        ks.append(terms.prod(fs[-1], control))
    y1 = jax.tree.map(jnp.add, y, weighted(tableau.b_sol, ks))
    error = weighted(tableau.b_error, ks)
    stacked = jax.tree.map(lambda *k: jnp.stack(k), *ks)
    state = None if solver_state is None else (jnp.asarray(False), fs[-1])
    return y1, error, dict(y0=y, y1=y1, k=stacked), state, dfx.RESULTS.successful


def stage_loop(solver: dfx.AbstractSolver, kind: str) -> dfx.AbstractSolver:
    """A Runge-Kutta `solver` whose stages run in diffrax's loop `kind` where it leaves the choice to diffrax
    ("lax": forward mode enters it; "bounded": forward and reverse mode both do); other solvers as they are."""
    if isinstance(solver, dfx.AbstractRungeKutta) and solver.scan_kind is None:
        return eqx.tree_at(lambda s: s.scan_kind, solver, kind, is_leaf=lambda x: x is None)
    return solver


class GridSteps(dfx.AbstractStepSizeController):
    """Fixed steps of dt0 from the solve's start t0: step k ends at t0 + k dt0, each time computed from k, never
    accumulated (the last at t1, where the loop clips it), so that a pass back over the steps computes their
    times (`time`) instead of storing them."""

    def wrap(self, direction):
        return self

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        if dt0 is None:
            raise ValueError("fixed steps take their step size dt0: pass dt0=...")
        return t0 + dt0, (jnp.asarray(1), t0, dt0)

    def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state):
        k, start, dt = controller_state
        return True, t1, start + (k + 1) * dt, False, (k + 1, start, dt), dfx.RESULTS.successful

    @staticmethod
    def time(t0, t1, dt0, k, steps):
        """The end of step k (the start of the solve at k = 0) of a solve from t0 to t1 that took `steps` steps."""
        return jnp.where(k >= steps, t1, t0 + k * dt0)


class Position(eqx.Module):
    """Where a solve stands between steps: time t, the end `t_next` of the step it tries next, the state
    y, the solver's and the controller's states, whether y just jumped, and the step size `proposed` to try
    past the end of this solve (the controller's last proposal before it was clipped to the end). A solve
    stopped at a position (after a number of steps) resumes from it exactly as if it had not stopped; one
    that reached its end continues past it with the step it proposed there (the backward march's intervals)."""

    t: jax.Array
    t_next: jax.Array
    y: typing.Any
    solver_state: typing.Any
    controller_state: typing.Any
    made_jump: jax.Array
    proposed: jax.Array


class Trajectory(eqx.Module):
    """What `integrate` returns: the saves `ts` (T,) and `ys` (T, ...) (a pair of each with step states),
    the step counts `stats`, diffrax's `result`, the dense `interpolation` (or None), the `end` position and
    what `on_step` `carried`."""

    ts: typing.Any
    ys: typing.Any
    stats: dict
    result: dfx.RESULTS
    interpolation: dfx.DenseInterpolation | None
    end: Position
    carried: typing.Any = None


def time_dtype(*times):
    """The floating dtype diffrax solves times in: the times' common type (integers: the default float)."""
    with jax.numpy_dtype_promotion("standard"):
        dtype = jnp.result_type(*(t for t in times if t is not None))
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.result_type(float)


def ulps_below(t, ulps: int):
    """t moved `ulps` units in the last place towards -inf (as many `jnp.nextafter` steps), for finite t."""
    itype = jnp.dtype(f"int{8 * jnp.dtype(t.dtype).itemsize}")
    lowest = jnp.iinfo(itype).min
    bits = jax.lax.bitcast_convert_type(t, itype)
    ordered = jnp.where(bits < 0, lowest - bits, bits) - ulps  # the floats in order as integers (-0 = +0 = 0)
    return jax.lax.bitcast_convert_type(jnp.where(ordered < 0, lowest - ordered, ordered), t.dtype)


def begin(stepper: Stepper, y0, args, t0, t1, dt0=None, ts=None) -> Position:
    """The position before the first step of a solve of y0 from t0 to t1 (dt0: the first step, None: the
    controller's choice), times and y0 in the dtypes diffrax solves them in."""
    dtype = time_dtype(t0, t1, dt0, ts)
    y0 = jax.tree.map(lambda y: jnp.asarray(y, jnp.result_type(y, dtype)), y0)
    dt0 = None if dt0 is None else jnp.asarray(dt0, dtype)
    return stepper.begin(jnp.asarray(t0, dtype), jnp.asarray(t1, dtype), y0, args, dt0)


def integrate(
    stepper: Stepper,
    y0,
    args,
    t0,
    t1,
    *,
    max_steps: int,
    dt0=None,
    ts=None,
    every: int = 0,
    step_states: bool | str = False,
    dense: bool = False,
    start: Position | None = None,
    on_step: typing.Callable | None = None,
    carried=None,
    until: typing.Callable | None = None,
    carried_args: bool = False,
    limit: typing.Callable | None = None,
    jump_ts=None,
    jumps: tuple | None = None,
    result=dfx.RESULTS.successful,
) -> Trajectory:
    """Steps y0 from t0 to t1 > t0 (or from `start`, a position of an earlier call) in at most `max_steps`
    steps, as `diffrax.diffeqsolve` steps it (the same steps, step-size control and clipping to t1), in one
    `lax.while_loop` that does per step only what is asked:
    - `ts` (T,) increasing: y interpolated at each save time a step passes (T, ...); None: y at t1 (1, ...);
    - `every` = k > 0: y after every k-th accepted step too, merged with the saves in time order
      (T + max_steps // k entries, inf after the last);
    - `step_states`: (t, y) at the start and after every accepted step as well (max_steps + 1 entries, inf after
      the last): `ts` and `ys` are then pairs (saves, step states); "solver": y as the pair (y, the solver's state)
      (what a step starts from, for a solver that carries more than y between steps: for each step, the state
      its accepted attempt started from);
    - `dense`: the steps' dense output, `Trajectory.interpolation`;
    - `on_step(carried, t_start, t_end, y_end, interpolation) -> carried` on each accepted step, from
      `carried`; the solve stops after the step where `until(carried)` holds; `carried_args`: the solver's steps
      take (args, carried) as their args (what they read of the solve so far: a delay equation's past), and
      `limit(carried, t, y, t_next) -> t_next` bounds the step the controller proposes next from (t, y);
    - `jump_ts` (J,): the times the controller steps to just before and restarts just after
      (`diffrax.ClipStepSizeController`'s), differentiable: a step clipped to one moves with it (with the first
      given of several that coincide);
    - `jumps` = (times (P,) sorted, in [t0, t1], affect(i, y, t) -> y): y jumps at times[i] (a dose), between the step
      that ends before it and the next (each of them among `jump_ts`), at t0 before the first step and at t1
      after the last (a save at such a time holds the state after it).
    A solve whose `result` already failed takes no step.
    Forward-mode differentiable and batchable; failures (max_steps) are reported in `result`, not raised."""
    dtype = time_dtype(t0, t1, dt0, ts)
    t0, t1 = jnp.asarray(t0, dtype), jnp.asarray(t1, dtype)
    stepping = (lambda carried: (args, carried)) if carried_args else (lambda carried: args)  # noqa: E731
    jumped = functools.partial(_jumped, jumps)
    if start is None:
        y0 = jumped(y0, -jnp.inf, t0)[0]
    start = begin(stepper, y0, stepping(carried), t0, t1, dt0) if start is None else start
    y0 = start.y
    ts = None if ts is None else jnp.asarray(ts, dtype)
    # t1 - 100 ULPs, as diffrax (times past it end at t1); t1 itself may be differentiated, its floor is not.
    floor = ulps_below(jax.lax.stop_gradient(t1), 100)
    full = lambda size, x: jnp.full((size, *jnp.shape(x)), jnp.inf, jnp.result_type(x))  # noqa: E731
    saves = 1 if ts is None else ts.shape[0]
    buffers: dict[str, typing.Any] = {"saves": (0, jax.tree.map(lambda y: full(saves, y), y0))}
    if every:
        buffers["every"] = (0, full(max_steps // every, t0), jax.tree.map(lambda y: full(max_steps // every, y), y0))
    stepped = (lambda at: (at.y, at.solver_state)) if step_states == "solver" else (lambda at: at.y)
    began = (lambda at: at.solver_state) if step_states == "solver" else (lambda at: None)
    if step_states:
        buffers["states"] = (
            full(max_steps + 1, t0).at[0].set(start.t),
            jax.tree.map(lambda y: full(max_steps + 1, y).at[0].set(y), stepped(start)),
        )
    info = eqx.filter_eval_shape(
        stepper.step, start.t, start.t_next, y0, stepping(carried), start.solver_state, start.made_jump
    )[2]
    info_zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), info)
    if dense:
        buffers["dense"] = (
            full(max_steps + 1, t0).at[0].set(start.t),
            jax.tree.map(lambda x: full(max_steps, x), info),
        )
    counts = (jnp.asarray(0), jnp.asarray(0), jnp.asarray(0))  # steps, accepted, rejected

    def going(carry):
        at, counts, result, _, carried, _ = carry
        on = (at.t < t1) & dfx.is_successful(result) & (counts[0] < max_steps)
        return on if until is None else on & ~until(carried)

    def advance(at, counts, result, carried):
        """One attempted step (its args from `carried`): the new position, counts, result and what the buffers
        take of it."""
        steps, accepted, rejected = counts
        y1, error, info, solver_state, solver_result = stepper.step(
            at.t, at.t_next, at.y, stepping(carried), at.solver_state, at.made_jump
        )
        error = jax.tree.map(lambda e: jnp.where(jnp.isnan(e), jnp.inf, e), error)
        keep, t_prev, t_next, made_jump, controller_state, controller_result = stepper.adapt(
            at.t, at.t_next, at.y, y1, stepping(carried), error, at.controller_state
        )
        t_prev = jnp.minimum(t_prev, t1)
        select = lambda a, b: jax.tree.map(lambda x, z: jnp.where(keep, x, z), a, b)  # noqa: E731
        if limit is not None:
            t_next = limit(carried, t_prev, select(y1, at.y), t_next)
        # Step sizes carry no derivative (times do: a step moves with its start, and the last one with t1, or
        # with the jump time it is clipped to).
        t_next = t_prev + jax.lax.stop_gradient(t_next - t_prev)
        if jump_ts is not None:
            fixed = jax.lax.stop_gradient(jump_ts)
            landed = jax.lax.stop_gradient(t_next) == prevbefore(fixed)
            # where several coincide, the first of them (jump_ts in the order given among equal times)
            moved = (jump_ts - fixed)[jnp.argmax(landed)]
            t_next = jnp.where(jnp.any(landed), jax.lax.stop_gradient(t_next) + moved, t_next)
        # After a step that reached t1, the larger of the step it had before and the one proposed after it.
        proposed = t_next - t_prev
        proposed = jnp.where(keep & (at.t_next >= t1), jnp.maximum(proposed, at.proposed), proposed)
        t_next = jnp.where(t_next > floor, jnp.where(keep, t1, t_prev + 0.5 * (t1 - t_prev)), t_next)
        y = select(y1, at.y)
        if not getattr(stepper.solver, "rejects_itself", False):
            solver_state = select(solver_state, at.solver_state)
        solver_result = dfx.RESULTS.where(keep, solver_result, dfx.RESULTS.successful)
        result = dfx.RESULTS.where(dfx.is_okay(result), solver_result, result)
        result = dfx.RESULTS.where(dfx.is_okay(result), controller_result, result)
        after = Position(
            t_prev,
            t_next,
            y,
            solver_state,
            controller_state,
            jnp.where(keep, made_jump, at.made_jump),
            proposed,
        )
        counts = (steps + 1, accepted + jnp.where(keep, 1, 0), rejected + jnp.where(keep, 0, 1))
        return after, counts, result, (keep, (at.t, at.t_next, info, began(at)))

    put = lambda b, v, i: jax.lax.dynamic_update_index_in_dim(b, v, i, 0)  # noqa: E731

    def record(buffers, carried, state, accepted, step, y_end, t_next):
        """The buffers, `carried`, and y and whether it jumped (`jumps`) after an accepted step (the `accepted`-th;
        `step`: its start, end and dense info, and with step_states "solver" the solver state its accepted attempt
        started from) to `state` (t, y) (`y_end`: its y; `t_next`: where the next step starts)."""
        t_start, t_end, info, began = step
        buffers = dict(buffers)
        if on_step is not None:
            carried = on_step(carried, t_start, t_end, y_end, stepper.interpolation(t_start, t_end, info))
        if ts is not None:
            times, last = ts, ts.shape[0] - 1

            def passing(c):
                return (c[0] <= last) & (times[jnp.minimum(c[0], last)] <= t_end)

            def evaluated(i):
                return stepper.interpolation(t_start, t_end, info).evaluate(times[i])

            def write(i, ys):
                # the interpolation's kernels in a branch of their own, beside the writes to the buffers
                value = jax.lax.cond(i <= last, evaluated, lambda i: jax.tree.map(lambda b: b[0], ys), i)
                return jax.tree.map(lambda b, v: put(b, v, i), ys, value)

            def saved(c):
                i, ys = c
                return i + 1, jax.lax.cond(i <= last, write, lambda i, ys: ys, i, ys)

            buffers["saves"] = jax.lax.while_loop(passing, saved, buffers["saves"])
        if every:
            k, bt, by = buffers["every"]
            on = accepted % every == 0
            at_k = jnp.minimum(k, bt.shape[0] - 1)
            keep = lambda b, v: put(b, jnp.where(on, v, b[at_k]), at_k)  # noqa: E731
            y = state[1][0] if step_states == "solver" else state[1]
            buffers["every"] = (k + jnp.where(on, 1, 0), keep(bt, state[0]), jax.tree.map(keep, by, y))
        if step_states:
            bt, by = buffers["states"]
            t, y = state
            by = jax.tree.map(lambda b, v: put(b, v, accepted), by, y)
            if began is not None:  # the state the step's accepted attempt started from (`rejects_itself`)
                by = (by[0], jax.tree.map(lambda b, v: put(b, v, accepted - 1), by[1], began))
            buffers["states"] = (put(bt, t, accepted), by)
        if dense:
            bt, binfo = buffers["dense"]
            buffers["dense"] = (
                put(bt, t_end, accepted),
                jax.tree.map(lambda b, v: put(b, v, accepted - 1), binfo, info),
            )
        return buffers, carried, jumped(y_end, t_end, jnp.minimum(t_next, ulps_below(t1, 1)))

    def trying(state):
        at, counts, result, (keep, _) = state
        return ~keep & (at.t < t1) & dfx.is_successful(result) & (counts[0] < max_steps)

    def body(carry):
        at, counts, result, buffers, carried, step = carry
        # Steps are attempted in a loop of their own until one is accepted, and the buffers are written in a
        # branch of their own: XLA:CPU runs a sequence of more than 8 kernels on its thread pool (several µs
        # per step on small problems) when any of them touches a buffer over 512 bytes, as the buffers do;
        # the step's own state is small. `on_step` runs there too, on the accepted step alone.
        attempted = (at, counts, result, (jnp.asarray(False), step))
        after, counts, result, (keep, step) = jax.lax.while_loop(
            trying, lambda state: advance(*state[:3], carried), attempted
        )
        state = (after.t, stepped(after)) if every or step_states else None  # what the buffers take of the new state
        buffers, carried, (y, jumped_here) = jax.lax.cond(
            keep,
            record,
            lambda buffers, carried, state, accepted, step, y, t: (buffers, carried, (y, jnp.asarray(False))),
            buffers,
            carried,
            state,
            counts[1],
            step,
            after.y,
            after.t,
        )
        if jumps is not None:
            after = eqx.tree_at(lambda a: (a.y, a.made_jump), after, (y, after.made_jump | jumped_here))
        return after, counts, result, buffers, carried, step

    carry = (start, counts, result, buffers, carried, (start.t, start.t_next, info_zeros, began(start)))
    end, (steps, accepted, rejected), result, buffers, carried, _ = jax.lax.while_loop(going, body, carry)
    result = dfx.RESULTS.where((end.t < t1) & dfx.is_successful(result), dfx.RESULTS.max_steps_reached, result)
    if jumps is not None:  # at t1, after the last step
        end = eqx.tree_at(lambda e: e.y, end, jumped(end.y, ulps_below(t1, 1), jnp.where(end.t >= t1, t1, -jnp.inf))[0])
        if ts is not None:
            at_end = (ts >= t1) & (end.t >= t1)
            saves = jax.tree.map(
                lambda b, y: jnp.where(at_end.reshape((-1,) + (1,) * y.ndim), y, b), buffers["saves"][1], end.y
            )
            buffers["saves"] = (buffers["saves"][0], saves)
    if ts is None:
        save_t, ys = end.t[None], jax.tree.map(lambda y: y[None], end.y)
    else:
        save_t = ts
        none = t0 >= t1  # no step taken: every save is y0
        ys = jax.tree.map(lambda b, y: jnp.where(none, jnp.broadcast_to(y, b.shape), b), buffers["saves"][1], y0)
        reached = jnp.arange(ts.shape[0]) < jnp.where(none, ts.shape[0], buffers["saves"][0])
        save_t = jnp.where(reached, ts, jnp.inf)
    if every:
        _, bt, by = buffers["every"]
        times = jnp.concatenate([save_t, bt])
        order = jnp.argsort(times, stable=True)
        save_t = times[order]
        ys = jax.tree.map(lambda a, b: jnp.concatenate([a, b])[order], ys, by)
    interpolation = None
    if dense:
        bt, binfo = buffers["dense"]
        interpolation = dfx.DenseInterpolation(
            ts=bt,
            ts_size=accepted + 1,
            infos=binfo,
            interpolation_cls=stepper.solver.interpolation_cls,
            direction=1,
            t0_if_trivial=t0,
            y0_if_trivial=y0,
        )
    stats = {"num_steps": steps, "num_accepted_steps": accepted, "num_rejected_steps": rejected}
    if step_states:
        save_t, ys = (save_t, buffers["states"][0]), (ys, buffers["states"][1])
    return Trajectory(save_t, ys, stats, result, interpolation, end, carried)


def _jumped(jumps: tuple | None, y, after, until) -> tuple:
    """(y after the `jumps` (times (P,) sorted, affect(i, y, t)) at the times in (after, until], in order, whether
    any): a loop over those alone (none between most steps), found by bisection."""
    if jumps is None:
        return y, jnp.asarray(False)
    times, affect = jumps
    fixed = jax.lax.stop_gradient(times)
    first = jnp.searchsorted(fixed, jax.lax.stop_gradient(after), side="right")
    last = jnp.searchsorted(fixed, jax.lax.stop_gradient(until), side="right")
    y = jax.lax.fori_loop(first, last, lambda i, y: affect(i, y, times[i]), y)
    return y, last > first
