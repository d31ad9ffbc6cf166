"""`ReversibleAdjoint`: the exact gradient of an algebraically reversible solver, its states
reconstructed backwards step by step, in memory independent of the number of steps: reversible Heun
(`diffrax.ReversibleHeun`, SDEs and ODEs), or McCallum & Foster's reversible method on an ODE solve's
explicit Runge–Kutta solver. Each is a `Reversal`: the solver the forward solve steps on sciad's loop
and one step's reconstruction and pullback; the loop back over the steps is shared."""

import abc
import typing

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp

import sciad.ad as ad
from sciad._errors import batch_any, error_if
from sciad.ad._linear import accumulate_pullback, value_and_accumulated_pullback
from sciad.adjoints._base import AbstractSensitivity, Setup, checked, stats_vector
from sciad.adjoints._loop import GridSteps, Stepper, Trajectory, integrate, stage_loop

# |y - z| at the end of a solve, in tolerances (atol + rtol |y|) per accepted step, past which the pair has
# drifted apart: the two differ by their steps' local errors (a few tolerances a step), and where the base
# solver's steps damp the solution by more than 1 - coupling the scheme's second mode grows exponentially.
PAIR_TOLERANCES = 100.0
DRIFTED = (
    "sensealg=ReversibleAdjoint: the reversible method's two states drifted apart in the forward solve (its "
    "second mode grows where the base solver's steps damp the solution by more than 1 - coupling each): pass "
    "a smaller coupling, e.g. ReversibleAdjoint(coupling=0.99), or sensealg=sciad.DiscreteAdjoint()"
)
UNRECONSTRUCTED = (
    "sensealg=ReversibleAdjoint: the backward pass did not reconstruct u0 to within the solve's tolerance (the "
    "reconstruction amplifies rounding by about 1/coupling per step, more over many steps): pass a coupling "
    "closer to 1, e.g. ReversibleAdjoint(coupling=0.9999), or sensealg=sciad.DiscreteAdjoint() (exact, memory "
    "~ steps) or sciad.InterpolatingAdjoint(checkpointing=True) (memory flat in the steps)"
)


class ReversibleAdjoint(AbstractSensitivity):
    """The exact gradient of an algebraically reversible solver: the backward pass reconstructs each
    step's state from the next one algebraically and pulls the cotangent back through the step; the
    forward pass keeps only the final state and the step times: memory independent of the number of
    steps. Reconstruction is exact in exact arithmetic; in floating point it follows the forward states
    to rounding.

    A solve by reversible Heun (`solver="reversible_heun"` or `diffrax.ReversibleHeun()`; Kidger et al.
    2021), an SDE's or an ODE's: its own steps reversed, one vector-Jacobian product of the field per step
    backwards (drift and diffusion together for an SDE).

    Other explicit solvers of an ODE (McCallum & Foster 2024): the solve's solver Ψ (Tsit5, Dopri5, ...;
    Ψ_h(x) the increment of its step of size h from x) made reversible on a pair (y, z), y0 = z0 = u0:
    y_{n+1} = λ y_n + (1 − λ) z_n + Ψ_h(z_n), z_{n+1} = z_n − Ψ_{−h}(y_{n+1}) (λ = `coupling`, in (0, 1]),
    steps adapted on Ψ's error estimate and landing on the save times, y linear between steps. Two steps
    of Ψ per step forwards, four and their pullbacks backwards (JAX's, through the solver's steps, as
    DiscreteAdjoint's). Implicit solvers and mass matrices are refused. The scheme has two limits, each
    checked when the program runs and raised rather than returned as a wrong number: its second mode
    grows forwards where Ψ's steps damp the solution by more than 1 − λ (y and z drift apart), and the
    reconstruction amplifies rounding by about 1/λ per step (u0 not recovered to the solve's tolerance):
    long solves of thousands of steps may meet one or the other.

    `vjp`: a `sciad.ad` JAX engine or its name (the pullbacks run through JAX). Forward mode (`jax.jvp`)
    runs through the steps, also in flat memory."""

    stores_interpolation = False
    follows_steps = True

    vjp: ad.AbstractBackend
    coupling: float

    def __init__(self, vjp: str | ad.AbstractBackend = "jax-reverse", coupling: float = 0.999):
        if not 0.0 < coupling <= 1.0:
            raise ValueError(f"ReversibleAdjoint(coupling=...) must be in (0, 1], got {coupling!r}")
        self.vjp = ad.get(vjp)
        self.coupling = float(coupling)

    def refusal(self, setup: Setup) -> str | None:
        if not all(e.traced for e in self.engines()):
            return (
                "sensealg=ReversibleAdjoint pulls back through the solver's steps with JAX: pass a JAX engine "
                "(vjp='jax-reverse'), or sensealg=sciad.InterpolatingAdjoint(vjp=...) for another engine"
            )
        if isinstance(setup.solver, dfx.ReversibleHeun):
            return None
        if setup.f.driving():  # a path drives the solve: the reversible method's backward steps meet its noise at
            # the step's end, which converges to another SDE
            return (
                f"sensealg=ReversibleAdjoint needs an algebraically reversible solver for an SDE solve, got "
                f"{type(setup.solver).__name__}: pass solver='reversible_heun', or keep this solver with "
                "sensealg=sciad.DiscreteAdjoint() (exact, memory ~ steps) or sciad.InterpolatingAdjoint()"
            )
        if setup.implicit:  # a mass matrix comes with a (linearly implicit) Rosenbrock solver
            return (
                f"sensealg=ReversibleAdjoint needs an explicit solver for an ODE solve, got "
                f"{type(setup.solver).__name__}; for this solver pass sensealg=sciad.DiscreteAdjoint() (exact, "
                "memory ~ steps) or sciad.InterpolatingAdjoint(checkpointing=True) (memory flat in the steps)"
            )
        return None

    def forward(self, setup: Setup, u0, p, active):
        reversal = _reversal(setup, self.coupling, True)
        sol = _solve(setup, reversal, u0, p)
        count = sol.stats["num_accepted_steps"]
        residuals = _Steps(sol.carried, count, reversal.final(sol), u0, p, sol.result, active)
        ys = reversal.checked_pair(setup, reversal.saved(sol.ys), residuals.state, jnp.maximum(count, 1))
        return checked(setup, sol.result, ys), stats_vector(sol), residuals

    def pushforward(self, setup: Setup, res: "_Steps", du0, dp):
        reversal = _reversal(setup, self.coupling, True)
        solve = lambda u0, p: reversal.saved(_solve(setup, reversal, u0, p).ys)  # noqa: E731
        return jax.jvp(solve, (res.u0, res.p), (du0, dp))[1]

    def pullback(self, setup: Setup, res: "_Steps", w):
        u_bar, p_bar = _pullback(setup, _reversal(setup, self.coupling, False), res, w)
        u_bar = checked(setup, res.result, u_bar)
        return (u_bar if res.active.u0 else None), (p_bar if res.active.p else None)


class Reversal(eqx.Module):
    """An algebraically reversible solve: the `solver` its forward solve steps, and what the loop back over
    its steps (`_pullback`) asks of it. A step's `state` is what reconstructs the one before it; its
    cotangent `bar` is a PyTree like the state's differentiated part."""

    solver: eqx.AbstractVar[dfx.AbstractSolver]

    def start(self, y0):
        """The forward solve's initial state from y0 (n + k,)."""
        return y0

    def saved(self, ys):
        """The saves of y (T, n + k) from the forward solve's saves."""
        return ys

    def final(self, sol: Trajectory):
        """The state at the end of the forward solve, which the backward pass reconstructs from."""
        return sol.end.y

    def checked_pair(self, setup: Setup, ys, state, steps):
        """ys, with a run-time check of the final state (none by default)."""
        return ys

    @abc.abstractmethod
    def last(self, terms, time, count, state, y_bar, p, slots) -> tuple:
        """(state, bar, p_bar) at the end of `count` steps (`time(i)`: the end of step i, t0 at 0) from the
        cotangent y_bar of the final y."""

    @abc.abstractmethod
    def back(self, terms, time, i, state, bar, p, p_bar, saves_at, slots) -> tuple:
        """(state, bar, p_bar plus the step's) at the start of step i (from time(i) to time(i + 1)) from those
        at its end; `saves_at(i)`: the saves' cotangent of y at time(i). p's cotangent accumulates by
        `accumulate_pullback` (`slots`: p's inputs), one sum for a `jax.vmap` batch sharing p."""

    @abc.abstractmethod
    def initial(self, state, bar) -> tuple:
        """(the reconstructed initial states, each like y0, and the cotangent of y0) from the state and
        cotangent at the start of the first step."""


class _Pair(Reversal):
    """McCallum & Foster's reversible method on an explicit solver: the state (y, z) (`_Reversible`)."""

    solver: "_Reversible"

    def start(self, y0):
        return y0, y0

    def saved(self, ys):
        return ys[0]

    def checked_pair(self, setup: Setup, ys, state, steps):
        y_end, z_end = state
        apart = jnp.max(jnp.abs(y_end - z_end) / (setup.atol + setup.rtol * jnp.abs(y_end)))
        return error_if(ys, apart > PAIR_TOLERANCES * steps, DRIFTED)

    def last(self, terms, time, count, state, y_bar, p, slots):
        return state, (y_bar, jnp.zeros_like(y_bar)), jnp.zeros_like(p)

    def back(self, terms, time, i, state, bar, p, p_bar, saves_at, slots):
        t0, t1 = time(i), time(i + 1)
        start = self.solver.reconstruct(terms, t0, t1, state, p)
        step = lambda start, p: self.solver.step(terms, t0, t1, start, p, None, False)[0]  # noqa: E731
        (y_bar, z_bar), p_bar = accumulate_pullback(step, start, p, bar, p_bar, slots)
        return start, (y_bar + saves_at(i), z_bar), p_bar

    def initial(self, state, bar):
        return state, bar[0] + bar[1]


class _Heun(Reversal):
    """Reversible Heun's own steps: with V = vf(ŷ) (the field at the second state ŷ) and P_n the product
    with the control of step n, ŷ_{n+1} = 2 y_n − ŷ_n + P_n V_n, y_{n+1} = y_n + ½ P_n (V_n + V_{n+1}).
    Backwards the state is (y, ŷ, V, the control of the step before), and each step's V_n and its
    pullback come from one vector-Jacobian product at the reconstructed ŷ_n."""

    solver: dfx.ReversibleHeun

    def final(self, sol: Trajectory):
        return (sol.end.y, *sol.end.solver_state)

    def last(self, terms, time, count, state, y_bar, p, slots):
        y, yh, v = state
        control = terms.contr(time(jnp.maximum(count - 1, 0)), time(count))
        field = lambda y, p: terms.vf(time(count), y, p)  # noqa: E731
        v_bar = _transposed(terms, control, v, 0.5 * y_bar)
        yh_bar, p_bar = accumulate_pullback(field, yh, p, v_bar, jnp.zeros_like(p), slots)
        return (y, yh, v, control), (y_bar, yh_bar), p_bar

    def back(self, terms, time, i, state, bar, p, p_bar, saves_at, slots):
        y1, yh1, v1, control = state
        y_bar1, yh_bar1 = bar
        t0 = time(i)
        yh0 = 2 * y1 - yh1 - terms.prod(v1, control)
        y_bar0 = y_bar1 + 2 * yh_bar1 + saves_at(i)
        # the step before (none at i = 0: the first step's, weighted 0; a path's increment over no time can be NaN in
        # forward mode)
        before = terms.contr(time(jnp.maximum(i - 1, 0)), time(jnp.maximum(i, 1)))
        v_bar = jax.tree.map(  # V's structure is V_{n+1}'s
            jnp.add,
            _transposed(terms, control, v1, 0.5 * y_bar1 + yh_bar1),
            _transposed(terms, before, v1, jnp.where(i > 0, 0.5, 0.0) * y_bar0),
        )
        field = lambda y, p: terms.vf(t0, y, p)  # noqa: E731
        v0, yh_bar, p_bar = value_and_accumulated_pullback(field, yh0, p, v_bar, p_bar, slots)
        y0 = y1 - 0.5 * terms.prod(jax.tree.map(jnp.add, v0, v1), control)
        return (y0, yh0, v0, before), (y_bar0, yh_bar - yh_bar1), p_bar

    def initial(self, state, bar):
        return state[:2], bar[0] + bar[1]  # ŷ_0 = y_0


def _transposed(terms, control, v, x):
    """Pᵀ x: the transpose of the product v ↦ terms.prod(v, control) (linear in v, at v's structure)."""
    return jax.linear_transpose(lambda v: terms.prod(v, control), v)(x)[0]


class _Reversible(dfx.AbstractSolver):
    """McCallum & Foster's reversible method on the explicit solver `base`, on states (y, z) (`ReversibleAdjoint`),
    its error estimate Ψ's on z's step, linear between steps."""

    base: dfx.AbstractSolver
    coupling: float = eqx.field(static=True)

    term_structure: typing.ClassVar = dfx.AbstractTerm
    interpolation_cls: typing.ClassVar = dfx.LocalLinearInterpolation

    def order(self, terms):
        return self.base.order(terms)

    def error_order(self, terms):
        return self.base.error_order(terms)

    def func(self, terms, t0, y0, args):
        return jax.tree.map(lambda x: self.base.func(terms, t0, x, args), y0)

    def init(self, terms, t0, t1, y0, args):
        return None

    def increment(self, terms, t0, t1, x, args):
        """(Ψ from t0 to t1 on x, its error estimate, result): the base solver's step, its first stage evaluated."""
        state = self.base.init(terms, t0, t1, x, args)
        x1, error, _, _, result = self.base.step(terms, t0, t1, x, args, state, True)
        return x1 - x, error, result

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        y, z = y0
        lam = self.coupling
        forwards, error, result = self.increment(terms, t0, t1, z, args)
        y1 = lam * y + (1 - lam) * z + forwards
        backwards, _, back_result = self.increment(terms, t1, t0, y1, args)
        z1 = z - backwards
        result = dfx.RESULTS.where(dfx.is_okay(result), back_result, result)
        return (y1, z1), (error, error), dict(y0=y0, y1=(y1, z1)), None, result

    def reconstruct(self, terms, t0, t1, y1, args):
        """The state (y, z) at t0 from the state y1 = (y, z) at t1 after a step from t0."""
        y, z = y1
        z0 = z + self.increment(terms, t1, t0, y, args)[0]
        return (y - (1 - self.coupling) * z0 - self.increment(terms, t0, t1, z0, args)[0]) / self.coupling, z0


def _reversal(setup: Setup, coupling: float, forward_mode: bool) -> Reversal:
    """The reversal of the setup's solve (`ReversibleAdjoint.refusal` has refused what it cannot serve):
    reversible Heun's own where it steps it, else the reversible method on an ODE's explicit solver (its stages
    in a plain loop where `forward_mode`, else in one that reverse and forward mode both enter: the pullback,
    and its derivative)."""
    if isinstance(setup.solver, dfx.ReversibleHeun):
        return _Heun(setup.solver)
    return _Pair(_Reversible(stage_loop(setup.solver, "lax" if forward_mode else "bounded"), coupling))


def _solve(setup: Setup, reversal: Reversal, u0, p) -> Trajectory:
    """The reversible solve from u0 (`Trajectory`), steps landing on the save times, its accepted steps' end
    times (max_steps + 1,) carried (None where they are computed: fixed steps, `GridSteps`)."""
    y0 = setup.state(setup.initialised(u0, p))
    ts = jnp.asarray(setup.ts, y0.dtype)
    controller = setup.controller()
    if isinstance(controller, dfx.PIDController):
        controller = dfx.ClipStepSizeController(controller, step_ts=ts)
    recorded = not isinstance(controller, GridSteps)

    def record(carried, t_start, t_end, y_end, interpolation):
        count, times = carried
        return count + 1, times.at[count + 1].set(t_end)

    carried = None
    if recorded:
        carried = (jnp.asarray(0), jnp.full((setup.max_steps + 1,), jnp.inf, ts.dtype).at[0].set(setup.t0))
    sol = integrate(
        Stepper(setup.term(), reversal.solver, controller),
        reversal.start(y0),
        p,
        setup.t0,
        setup.t1,
        max_steps=setup.max_steps,
        dt0=setup.dt0,
        ts=ts,
        on_step=record if recorded else None,
        carried=carried,
    )
    return eqx.tree_at(lambda s: s.carried, sol, sol.carried[1] if recorded else None, is_leaf=lambda x: x is None)


class _Steps(eqx.Module):
    """ReversibleAdjoint's residuals: the accepted steps' end `times` (max_steps + 1,) from t0 (inf after the
    last; None where computed), their `count`, the final `state` (`Reversal.final`), u0, p, the solve's result
    and which of u0 and p are differentiated."""

    times: jax.Array | None
    count: jax.Array
    state: typing.Any
    u0: jax.Array
    p: jax.Array
    result: dfx.RESULTS
    active: typing.Any = eqx.field(static=True)


def _pullback(setup: Setup, reversal: Reversal, res: _Steps, w):
    """wᵀ ∂ys/∂(u0, p) (n,), (m,) for the cotangent w (T, n + k) of the saves: back over the steps, each
    state reconstructed from the next and the step pulled back from it (`Reversal.back`), the saves'
    cotangents entering through the steps' linear interpolation."""
    terms, p, count = setup.term(), res.p, res.count
    ts = jnp.asarray(setup.ts, jnp.result_type(setup.t0, res.u0))
    times = res.times
    if times is None:
        time = lambda i: GridSteps.time(setup.t0, setup.t1, setup.dt0, i, count)  # noqa: E731
    else:
        time = lambda i: times[jnp.clip(i, 0, times.shape[0] - 1)]  # noqa: E731

    def part(i, weight):
        """Σ weight(θ) w over the saves step i (from time(i); none past the last) interpolated at θ: those in
        (time(i), time(i + 1)], and for the first step those at t0 too."""
        t0, t1 = time(i), time(i + 1)
        lo = jnp.where(i > 0, jnp.searchsorted(ts, t0, side="right"), 0)
        hi = jnp.where((i >= 0) & (i < count), jnp.searchsorted(ts, t1, side="right"), lo)
        add = lambda k, bar: bar + weight((ts[k] - t0) / (t1 - t0)) * w[k]  # noqa: E731
        return jax.lax.fori_loop(lo, hi, add, jnp.zeros_like(w[0]))

    def saves_at(i):
        """The saves' cotangent of y at time(i): the end of step i - 1 and the start of step i."""
        return part(i - 1, lambda theta: theta) + part(i, lambda theta: 1 - theta)

    slots = setup.parameter_slots
    state, bar, p_bar = reversal.last(terms, time, count, res.state, saves_at(count), p, slots)

    def back(carry):
        i, state, bar, p_bar = carry
        on = i >= 0  # a member of a vmap batch that is back at its start runs on, its cotangents zero
        masked = lambda k: jnp.where(on, saves_at(k), 0.0)  # noqa: E731
        zeroed = jax.tree.map(lambda b: jnp.where(on, b, jnp.zeros_like(b)), bar)
        i_on = jnp.maximum(i, 0)
        earlier, bar_earlier, p_bar = reversal.back(terms, time, i_on, state, zeroed, p, p_bar, masked, slots)
        keep = lambda a, b: jax.tree.map(lambda a, b: jnp.where(on, a, b), a, b)  # noqa: E731
        return i - 1, keep(earlier, state), keep(bar_earlier, bar), p_bar

    # While any member of a batch has steps left (an unbatched condition), so that p's cotangent, where the batch
    # shares p, stays one sum over the batch (`accumulate_pullback`).
    carry = (count - 1, state, bar, p_bar)
    _, state, bar, p_bar = jax.lax.while_loop(lambda c: batch_any(c[0] >= 0), back, carry)
    starts, u_bar = reversal.initial(state, bar)
    u_bar = u_bar + jnp.where(count == 0, jnp.sum(w, axis=0), 0.0)  # a solve of no steps saved y0 throughout
    y0 = setup.state(res.u0)
    missed = jnp.max(jnp.abs(jnp.stack(starts) - y0) / (setup.atol + setup.rtol * jnp.abs(y0)))
    return error_if((u_bar[: setup.n], p_bar), missed > 1.0, UNRECONSTRUCTED)
