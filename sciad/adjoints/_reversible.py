"""`ReversibleAdjoint`: the exact gradient of an algebraically reversible solver, its states
reconstructed backwards step by step, in memory independent of the number of steps: for SDEs reversible
Heun; for ODEs McCallum & Foster's reversible method on the solve's explicit Runge–Kutta solver."""

import typing

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp

import sciad.ad as ad
from sciad._errors import error_if
from sciad.adjoints._base import AbstractSensitivity, Setup, checked, stats_vector
from sciad.adjoints._loop import Stepper, integrate, stage_loop

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
    forward pass keeps only the final state (and, for ODEs, the step times): memory independent of the
    number of steps. Reconstruction is exact in exact arithmetic; in floating point it follows the
    forward states to rounding.

    ODEs (McCallum & Foster 2024): the solve's explicit solver Ψ (Tsit5, Dopri5, ...; Ψ_h(x) the
    increment of its step of size h from x) made reversible on a pair (y, z), y0 = z0 = u0:
    y_{n+1} = λ y_n + (1 − λ) z_n + Ψ_h(z_n), z_{n+1} = z_n − Ψ_{−h}(y_{n+1}) (λ = `coupling`, in (0, 1]),
    steps adapted on Ψ's error estimate and landing on the save times, y linear between steps. Two steps
    of Ψ per step forwards, four and their pullbacks backwards (JAX's, through the solver's steps, as
    DiscreteAdjoint's: `vjp` must be a JAX engine). Implicit solvers and mass matrices are refused. The
    scheme has two limits, each checked when the program runs and raised rather than returned as a wrong
    number: its second mode grows forwards where Ψ's steps damp the solution by more than 1 − λ (y and z
    drift apart), and the reconstruction amplifies rounding by about 1/λ per step (u0 not recovered to
    the solve's tolerance): long solves of thousands of steps may meet one or the other.

    SDEs (Kidger et al. 2021): reversible Heun (`solver="reversible_heun"`), one vector-Jacobian product
    of drift and diffusion per step (`vjp`: a `sciad.ad` JAX engine or its name).

    Forward mode (`jax.jvp`) runs through the steps, also in flat memory."""

    stores_interpolation = False
    follows_steps = True

    vjp: ad.AbstractBackend
    coupling: float

    def __init__(self, vjp: str | ad.AbstractBackend = "jax-reverse", coupling: float = 0.999):
        if not 0.0 < coupling <= 1.0:
            raise ValueError(f"ReversibleAdjoint(coupling=...) must be in (0, 1], got {coupling!r}")
        self.vjp = ad.get(vjp)
        self.coupling = float(coupling)

    def forward(self, setup: Setup, u0, p, active):
        sol = _solve(setup, self.coupling, u0, p, self.engines())
        ys, _ = sol.ys
        (y_end, z_end), (_, times) = sol.end.y, sol.carried
        residuals = _Steps(times, sol.stats["num_accepted_steps"], y_end, z_end, u0, p, sol.result, active)
        apart = jnp.max(jnp.abs(y_end - z_end) / (setup.atol + setup.rtol * jnp.abs(y_end)))
        steps = jnp.maximum(residuals.count, 1)
        ys = error_if(checked(setup, sol.result, ys), apart > PAIR_TOLERANCES * steps, DRIFTED)
        return ys, stats_vector(sol), residuals

    def pushforward(self, setup: Setup, res: "_Steps", du0, dp):
        return jax.jvp(lambda u0, p: _solve(setup, self.coupling, u0, p).ys[0], (res.u0, res.p), (du0, dp))[1]

    def pullback(self, setup: Setup, res: "_Steps", w):
        u_bar, p_bar = _pullback(setup, self.coupling, res, w)
        u_bar = checked(setup, res.result, u_bar)
        return (u_bar if res.active.u0 else None), (p_bar if res.active.p else None)


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


def _reversible(setup: Setup, coupling: float, forward_mode: bool, engines=()) -> _Reversible:
    """The reversible method on the setup's solver, its stages in a plain loop where `forward_mode`, else in
    one that reverse and forward mode both enter (the pullback, and its derivative); refuses what it cannot
    serve (`engines`: the sensealg's)."""
    if not all(e.traced for e in engines):
        raise ValueError(
            "sensealg=ReversibleAdjoint on an ODE solve pulls back through the solver's steps with JAX: pass "
            "a JAX engine (vjp='jax-reverse'), or sensealg=sciad.InterpolatingAdjoint(vjp=...) for another engine"
        )
    if setup.implicit or setup.mass is not None:
        raise ValueError(
            f"sensealg=ReversibleAdjoint needs an explicit solver for an ODE solve, got {type(setup.solver).__name__}"
            "; for this solver pass sensealg=sciad.DiscreteAdjoint() (exact, memory ~ steps) or "
            "sciad.InterpolatingAdjoint(checkpointing=True) (memory flat in the steps)"
        )
    return _Reversible(stage_loop(setup.solver, "lax" if forward_mode else "bounded"), coupling)


def _solve(setup: Setup, coupling: float, u0, p, engines=()):
    """The reversible solve of (y, z) from (u0, u0) (`Trajectory`; saves (y, z)), steps landing on the
    save times, its accepted steps' end times carried ((count, times (max_steps + 1,))); refuses what it
    cannot serve (`engines`: the sensealg's)."""
    y0 = setup.state(setup.initialised(u0, p))
    ts = jnp.asarray(setup.ts, y0.dtype)
    controller = dfx.ClipStepSizeController(typing.cast(dfx.PIDController, setup.controller()), step_ts=ts)
    stepper = Stepper(setup.term(), _reversible(setup, coupling, True, engines), controller)
    times = jnp.full((setup.max_steps + 1,), jnp.inf, ts.dtype).at[0].set(setup.t0)

    def record(carried, t_start, t_end, y_end, interpolation):
        count, times = carried
        return count + 1, times.at[count + 1].set(t_end)

    return integrate(
        stepper,
        (y0, y0),
        p,
        setup.t0,
        setup.t1,
        max_steps=setup.max_steps,
        dt0=setup.dt0,
        ts=ts,
        on_step=record,
        carried=(jnp.asarray(0), times),
    )


class _Steps(eqx.Module):
    """ReversibleAdjoint's residuals for an ODE solve: the accepted steps' end `times` (max_steps + 1,) from
    t0 (inf after the last), their `count`, the final (y, z), u0, p, the solve's result and which of u0
    and p are differentiated."""

    times: jax.Array
    count: jax.Array
    y: jax.Array
    z: jax.Array
    u0: jax.Array
    p: jax.Array
    result: dfx.RESULTS
    active: typing.Any = eqx.field(static=True)


def _pullback(setup: Setup, coupling: float, res: _Steps, w):
    """wᵀ ∂ys/∂(u0, p) (n,), (m,) for the cotangent w (T, n + k) of the saves: back over the steps, each
    state reconstructed from the next, the saves' cotangents entering through the steps' linear
    interpolation, each step pulled back from its reconstructed start."""
    solver = _reversible(setup, coupling, forward_mode=False)
    terms, p, times = setup.term(), res.p, res.times
    ts = jnp.asarray(setup.ts, times.dtype)

    def back(carry):
        i, state, (y_bar, z_bar), p_bar = carry
        t0, t1 = times[i], times[i + 1]
        # the step saved ts[lo:hi]: those in (t0, t1], and the first step those at t0 too
        lo = jnp.where(i > 0, jnp.searchsorted(ts, t0, side="right"), 0)
        hi = jnp.searchsorted(ts, t1, side="right")
        start = solver.reconstruct(terms, t0, t1, state, p)

        def save(k, bars):
            theta = (ts[k] - t0) / (t1 - t0)
            return bars[0] + (1 - theta) * w[k], bars[1] + theta * w[k]

        zero = jnp.zeros_like(y_bar)
        at_start, at_end = jax.lax.fori_loop(lo, hi, save, (zero, zero))
        step = lambda start, p: solver.step(terms, t0, t1, start, p, None, False)[0]  # noqa: E731
        (y_bar, z_bar), p_step = jax.vjp(step, start, p)[1]((y_bar + at_end, z_bar))
        return i - 1, start, (y_bar + at_start, z_bar), p_bar + p_step

    zero = jnp.zeros_like(res.y)
    carry = (res.count - 1, (res.y, res.z), (zero, zero), jnp.zeros_like(p))
    _, start, (y_bar, z_bar), p_bar = jax.lax.while_loop(lambda c: c[0] >= 0, back, carry)
    # a solve of no steps saved y0 at every save time
    y_bar = y_bar + jnp.where(res.count == 0, jnp.sum(w, axis=0), 0.0)
    y0 = setup.state(res.u0)
    missed = jnp.max(jnp.abs(jnp.stack(start) - y0) / (setup.atol + setup.rtol * jnp.abs(y0)))
    return error_if(((y_bar + z_bar)[: setup.n], p_bar), missed > 1.0, UNRECONSTRUCTED)


class _Final(eqx.Module):
    """ReversibleAdjoint's residuals: the solver's final state (y, ŷ, a(ŷ), σ(ŷ)), y0 and θ."""

    state: tuple
    y0: jax.Array
    theta: jax.Array


def through_steps(setup, res, vs):
    """The tangent of the saves by forward mode through the steps, from the residuals' y0 and θ."""
    return jax.jvp(lambda y0, theta: setup.run(y0, theta), (res.y0, res.theta), vs)[1]


def reversible_rules(sensealg):
    """(forward, pushforward, pullback), each taking the solve's setup (a reversible-Heun
    `sciad._sde_solvers.SDESetup`) first, for `sciad.ad.custom_linear_rules` over (y0, θ)."""

    def forward(setup, y0, theta, active):
        ys, state = setup.run(y0, theta, final_state=True)
        return ys, _Final(state, y0, theta)

    def pullback(setup, res, w):
        system = setup.system
        saves = jnp.asarray(setup.save_steps)
        dt = setup.dt
        y_N, yh_N, a_N, sigma_N = res.state
        theta = res.theta
        n, N = system.n, setup.steps

        def jump(k):
            return (saves == k).astype(w.dtype) @ w

        def pulled(yh, t, cot_a, cot_sigma):
            """(a, σ) at ŷ and the cotangent (ŷ̄, θ̄) of (cot_a, cot_σ) through them."""
            rates, pb = jax.vjp(lambda x, th: system.rates(x, th, t), yh, theta)
            return rates, pb((cot_a, cot_sigma))

        def later_use(ybar, k):
            """The cotangent on (a, σ)(ŷ_k) from y_k = y_{k-1} + ... + ½ Δ_{k-1}(ŷ_k) (none for k = 0)."""
            c2 = jnp.where(k > 0, 0.5, 0.0) * ybar
            dW = setup.increment(jnp.maximum(k - 1, 0)).astype(w.dtype)
            return c2 * dt, system.noise_cotangent(c2[:n], dW)

        ybar_N = jump(N)
        cot = later_use(ybar_N, N)
        _, (ghat_N, theta_bar) = pulled(yh_N, setup.time(N), *cot)

        def body(carry, _):  # the step index rides in the carry (memory flat in the steps)
            (y1, yh1, a1, s1), ybar1, ghat1, theta_bar, k = carry
            k = k - 1
            t = jnp.asarray(setup.time(k), y1.dtype)
            dW = setup.increment(k).astype(y1.dtype)
            second = system.increment(a1, s1, dt, dW)
            yh = 2 * y1 - yh1 - second
            c1 = 0.5 * ybar1 + ghat1
            ybar = ybar1 + 2 * ghat1 + jump(k)
            later_a, later_sigma = later_use(ybar, k)
            (a, s), (xbar, tbar) = pulled(yh, t, c1 * dt + later_a, system.noise_cotangent(c1[:n], dW) + later_sigma)
            y = y1 - 0.5 * (system.increment(a, s, dt, dW) + second)
            return ((y, yh, a, s), ybar, -ghat1 + xbar, theta_bar + tbar, k), None

        carry = ((y_N, yh_N, a_N, sigma_N), ybar_N, ghat_N, theta_bar, jnp.asarray(N, jnp.int32))
        (_, ybar0, ghat0, theta_bar, _), _ = jax.lax.scan(body, carry, None, length=N)
        return ybar0 + ghat0, theta_bar

    return forward, through_steps, pullback
