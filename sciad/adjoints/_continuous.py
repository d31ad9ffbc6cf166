"""Continuous adjoints: λ' = -(∂f/∂u)ᵀ λ solved backwards, ∂L/∂p = ∫ λᵀ ∂f/∂p dt.

For a loss of the saved states, λ starts at 0 at t1 and jumps by ∂L/∂u(t_k)
at every saveat time t_k. A loss of an integral Q = ∫ g(u, p, t) dt adds its
cotangent w_Q: λ' = -(∂f/∂u)ᵀ λ - (∂g/∂u)ᵀ w_Q and μ' = -(∂f/∂p)ᵀ λ - (∂g/∂p)ᵀ w_Q,
with no state of its own (w_Q is constant between breakpoints). The backward
pass runs interval by interval between breakpoints (t0, the saveat times, the
checkpoints, t1); the methods differ in where u(t) comes from on the way back.
"""

import abc
from typing import Callable

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import sciad.ad as ad
from sciad.adjoints._base import (
    AbstractSensitivity,
    Products,
    Setup,
    checked,
    interpolation_step_bytes,
    leading_seminorm,
    normalised,
    plain_forward,
    solver_pushforward,
    stats_vector,
    stored_steps,
)
from sciad.adjoints import _checkpoints as checkpoints
from sciad.adjoints._stepping import Marcher
from sciad._errors import batch_any, check, error_if, warn_if


class Recorded(eqx.Module):
    """What a continuous adjoint's forward pass keeps for the backward sweep: u0 (n,), p (m,), the
    breakpoints t (B,) (t0, the save times, checkpoints, t1; unused checkpoints sit at t1), the
    state y = (u, q) there (B, n + k), the stored interpolation of y (None where u is re-solved or backsolved), the forward solve's
    accepted steps, and `again`: whether it ran out of stored steps (None where it cannot, and then
    `resolved` says whether every interval is re-solved)."""

    u0: jax.Array
    p: jax.Array
    t: jax.Array
    u_at: jax.Array
    interpolation: object
    steps: jax.Array
    again: jax.Array | None
    resolved: bool = eqx.field(static=True, default=False)  # u re-solved on every interval (without `again`)


class Interval(eqx.Module):
    """What a backward system reads on one interval between breakpoints: p (m,), `u_of` with
    `u_of.evaluate(t)` giving the forward state y(t) (n + k,) (None where u is part of the system's
    state), and `w_q` (k,), the integral's cotangent (Σ ∂L/∂q at the breakpoints after the interval)."""

    p: jax.Array
    u_of: object
    w_q: jax.Array

    def u(self, t, n: int):
        """u(t) (n,) from the stored forward state."""
        return self.u_of.evaluate(t)[:n]


class BackwardSystem(eqx.Module):
    """An adjoint system stepped backwards from t1: its state y, right-hand side and error norm, and
    the places where losses and events enter it (λ's equation `adjoint_rhs`, λ's jump `adjoint_jump`,
    what is integrated besides y, `integrand`). `args`: the `Interval` being crossed."""

    prods: eqx.AbstractVar[Products]
    norm: eqx.AbstractVar[Callable | None]

    @abc.abstractmethod
    def start(self, u1, lam1, p):
        """y at t1 from u(t1), λ(t1) and p."""

    @abc.abstractmethod
    def rhs(self, t, y, args: Interval):
        """dy/dt."""

    @abc.abstractmethod
    def jump(self, y, w, u):
        """y after the jump at a breakpoint (w: ∂L/∂u there, u: the stored u(t))."""

    @abc.abstractmethod
    def gradients(self, y, quadrature):
        """(∂L/∂u0, ∂L/∂p) from y and the quadrature at t0."""

    @abc.abstractmethod
    def integrand(self, setup: Setup, args: Interval):
        """(initial quadrature, what each accepted step adds to it) on an interval, or (None, None)."""


def adjoint_rhs(prods: Products, u, p, t, lam, w_q):
    """(λ', μ') = (-(∂f/∂u)ᵀλ - (∂g/∂u)ᵀw_Q, -(∂f/∂p)ᵀλ - (∂g/∂p)ᵀw_Q) at u(t): the adjoint equations,
    for every continuous adjoint (w_Q (k,): the integral's cotangent, k = 0 without an integrand)."""
    _, vu, vp = prods.vjp(u, p, t, _with_integral(lam, w_q))
    return -vu, -vp


def _with_integral(lam, w_q):
    """The cotangent of F = [f; g]: (λ, w_Q) (n + k,)."""
    return jnp.concatenate([lam, w_q]) if w_q.shape[0] else lam


def adjoint_jump(lam, w):
    """λ after a breakpoint where the loss has ∂L/∂u = w."""
    return lam + w


class _LambdaMu(BackwardSystem):
    """y = (λ, μ), μ' = -(∂f/∂p)ᵀλ accumulating ∂L/∂p; `seminorm`: μ out of the error control."""

    prods: Products
    norm: Callable | None

    def start(self, u1, lam1, p):
        return lam1, jnp.zeros_like(p)

    def rhs(self, t, y, args):
        return adjoint_rhs(self.prods, args.u(t, y[0].shape[0]), args.p, t, y[0], args.w_q)

    def jump(self, y, w, u):
        return adjoint_jump(y[0], w), y[1]

    def gradients(self, y, quadrature):
        return y

    def integrand(self, setup, args):
        return None, None


class _LambdaGauss(BackwardSystem):
    """y = λ alone; ∂L/∂p = ∫ λᵀ∂f/∂p dt by Gauss–Legendre quadrature on each accepted step (λ at the
    nodes from the step's dense output)."""

    prods: Products
    norm: None = None

    def start(self, u1, lam1, p):
        return lam1

    def rhs(self, t, lam, args):
        return adjoint_rhs(self.prods, args.u(t, lam.shape[0]), args.p, t, lam, args.w_q)[0]

    def jump(self, lam, w, u):
        return adjoint_jump(lam, w)

    def gradients(self, lam, mu):
        return lam, mu

    def integrand(self, setup, args):
        nodes, weights = np.polynomial.legendre.leggauss(_gauss_nodes(setup))

        def integrate(mu, t_start, t_end, lam_of):
            ts = t_end + (t_start - t_end) * jnp.asarray((nodes + 1) / 2, mu.dtype)
            vp = jax.vmap(lambda t: -adjoint_rhs(self.prods, args.u(t, setup.n), args.p, t, lam_of.evaluate(t),
                                                 args.w_q)[1])(ts)
            return mu + (t_start - t_end) / 2 * jnp.tensordot(jnp.asarray(weights, mu.dtype), vp, axes=1)

        return jnp.zeros_like(args.p), integrate


class _ULambdaMu(BackwardSystem):
    """y = (u, λ, μ): u re-solved backwards with the adjoint (`args.u_of` is None); at a breakpoint u
    is reset to the stored u(t); `seminorm`: μ out of the error control."""

    prods: Products
    norm: Callable | None

    def start(self, u1, lam1, p):
        return u1, lam1, jnp.zeros_like(p)

    def rhs(self, t, y, args):
        u, lam, _ = y
        rate = self.prods.vjp(u, args.p, t, _with_integral(lam, args.w_q))[0]  # the same product as λ's
        return rate[: u.shape[0]], *adjoint_rhs(self.prods, u, args.p, t, lam, args.w_q)

    def jump(self, y, w, u):
        _, lam, mu = y
        return u, adjoint_jump(lam, w), mu

    def gradients(self, y, quadrature):
        return y[1:]

    def integrand(self, setup, args):
        return None, None


class _ContinuousAdjoint(AbstractSensitivity):
    """The backward sweep shared by the continuous adjoints; `vjp` is the engine for the
    vector-Jacobian products λᵀ∂f/∂u, λᵀ∂f/∂p.

    One `Marcher` runs the whole sweep: it steps the `system` to each breakpoint, where λ jumps
    (and what is reset there is reset), and continues with the same solver state and step size.
    A sensealg says what its backward system is (`system`) and where u comes from: what its
    forward pass keeps (`record`), how one interval is crossed on the way back (`cross`, from
    `args_structure`), and what the sweep's outcome means (`verdict`)."""

    vjp: eqx.AbstractVar[ad.AbstractBackend]

    @abc.abstractmethod
    def system(self, setup: Setup, prods: Products) -> BackwardSystem:
        """The backward system."""

    @abc.abstractmethod
    def record(self, setup: Setup, u0, p) -> tuple:
        """(us (T, n), stats (3,), `Recorded`): the forward pass of a differentiated solve."""

    @abc.abstractmethod
    def args_structure(self, setup: Setup, rec: Recorded, resolve: bool) -> Interval:
        """The system's `args` on the last interval, or their structure (what the march starts from)."""

    @abc.abstractmethod
    def cross(self, setup: Setup, marcher: Marcher, system: BackwardSystem, march, rec: Recorded, j, w_q, drift,
              resolve: bool):
        """(march at t[j], drift) from the march at t[j + 1] > t[j], with the integral's cotangent
        `w_q` (k,) there; `drift` ≥ 0, the largest so far, measures how far a state re-solved
        backwards ends from the stored u(t[j])."""

    @abc.abstractmethod
    def verdict(self, setup: Setup, system: BackwardSystem, march, drift):
        """(∂L/∂u0, ∂L/∂p) from the march at t0, checked: a failed backward solve raises (or what
        the drift says)."""

    def forward(self, setup: Setup, u0, p, active):
        if active is None:
            return plain_forward(setup, u0, p)
        return self.record(setup, u0, p)

    def pullback(self, setup: Setup, rec: Recorded, w):
        """The backward sweep of the cotangent w divided by its largest entry, scaled back: the adjoint
        systems are linear in w, and their error control (relative to λ's own size) then does not
        depend on the loss's scale. Where the forward pass ran out of stored steps (`rec.again`, for
        any member of a vmap batch), the sweep that re-solves each interval."""
        scale, w = normalised(w)
        if rec.again is None:
            cotangents = self._sweep(setup, rec, w, rec.resolved)
        else:
            cotangents = jax.lax.cond(batch_any(rec.again), lambda: self._sweep(setup, rec, w, True),
                                      lambda: self._sweep(setup, rec, w, False))
        return jax.tree.map(lambda g: g * scale, cotangents)

    def pushforward(self, setup: Setup, rec: Recorded, du0, dp):
        return solver_pushforward(setup, rec.u0, rec.p, du0, dp)

    def _sweep(self, setup: Setup, rec: Recorded, w, resolve: bool):
        """(∂L/∂u0, ∂L/∂p) from `rec`, with the stored interpolation (`resolve=False`) or the intervals
        re-solved (`resolve=True`). Breakpoints after the first at t1 (unused checkpoints:
        zero-length intervals) are not walked."""
        n = rec.u0.shape[0]
        jumps = jnp.zeros((len(rec.t), w.shape[1]), w.dtype).at[setup.saved(rec.t)].add(w)
        w_q = jnp.cumsum(jumps[::-1, n:], axis=0)[::-1]  # the integral's cotangent after each breakpoint
        t = rec.t.astype(rec.u0.dtype)
        last = jnp.searchsorted(t, t[-1])
        system = self.system(setup, Products(setup.f, self.vjp))
        marcher = Marcher(setup, system.rhs, system.norm)
        # The forward pass's mean step is the first one tried: no step-size search.
        dt0 = (setup.t1 - setup.t0) / jnp.maximum(rec.steps, 1)
        args = self.args_structure(setup, rec, resolve)
        march = marcher.start(system.start(rec.u_at[last, :n], jumps[last, :n], rec.p), args, t[-1], dt0,
                              system.integrand(setup, args)[0])

        def interval(carry):
            j, march, drift = carry
            j = jnp.maximum(j, 0)  # under vmap, members done walk their first interval again, discarded
            march, drift = self.cross(setup, marcher, system, march, rec, j, w_q[j + 1], drift, resolve)
            return j - 1, march.jumped(system.jump(march.y, jumps[j, :n], rec.u_at[j, :n])), drift

        _, march, drift = jax.lax.while_loop(lambda carry: carry[0] >= 0, interval,
                                             (last - 1, march, jnp.zeros((), w.dtype)))
        return self.verdict(setup, system, march, drift)


def _no_integral(setup: Setup, rec: Recorded):
    """A zero cotangent of the integral (k,)."""
    return jnp.zeros((setup.f.integrand_size,), rec.u_at.dtype)


def _march_interval(setup: Setup, marcher: Marcher, system: BackwardSystem, march, args, t_to, max_steps):
    """The march stepped back to t_to with `args`, accumulating the system's integrand."""
    return marcher.advance(march, args, t_to, max_steps, system.integrand(setup, args)[1])


class _Held(eqx.Module):
    """u(t) from an interpolation, held at the ends of [t_to, t_from] (implicit solvers evaluate
    stages slightly past the interval, where an interpolation is undefined)."""

    interpolation: object
    t_to: jax.Array
    t_from: jax.Array

    def evaluate(self, t):
        return self.interpolation.evaluate(jnp.clip(t, self.t_to, self.t_from))


INTERVAL_STEPS = 128  # re-solved steps per interval with checkpoints by step count (one every 64)
# BacksolveAdjoint's self-check, set on a calibration corpus (tests/backsolve_corpus.py) and tested on a
# held-out one (tests/backsolve_heldout.py); experiments/backsolve_calibration.py prints the margins.
# The drift allowed per forward step, in tolerances (`BacksolveAdjoint.drift`): right gradients reach
# 83 and wrong ones start at 1650 in the calibration corpus (held out: 108 and 3800); and the backward
# steps per forward step (+ 8) after which an interval is refused (stiff backwards; right gradients
# take at most 1.4 in both).
DRIFT_TOLERANCE = 300.0
BACKWARD_STEPS = 4
UNSTABLE = ("BacksolveAdjoint: the state re-solved backwards in time departs from the forward solution "
            f"(or the backward solve failed, or took more than {BACKWARD_STEPS} steps per forward step), so this problem is "
            "unstable backwards in time (stiff or dissipative) and the gradient would be wrong. Use "
            "InterpolatingAdjoint (checkpointing=True bounds its memory) or GaussAdjoint.")


class BacksolveAdjoint(_ContinuousAdjoint):
    """Continuous adjoint that re-solves u backwards with λ and μ (O(1) memory
    per interval). At every saveat time u is reset to the stored forward value
    (SciML's checkpointed backsolve). `seminorm=True` leaves μ out of the error
    control (Kidger et al. 2021): the steps are set by (u, λ), 2n values, not 2n + m.

    Wrong on problems that are unstable backwards in time (stiff or
    dissipative ones), so it checks itself at no extra cost. The signal is
    exponential departure: where u is reset, the u re-solved backwards ends
    some drift from the stored forward value, measured in the tolerances the
    forward solve holds at the interval's ends (`drift`): atol + rtol |u| at
    its start, and at its end the same error relative to u (a problem whose u
    decays below atol / rtol is held to what its forward solve achieves, not
    refused). Two accurate solves differ by their global error, which
    accumulates at most about one tolerance per step; an unstable backward
    solve amplifies its errors exponentially (its gradient stays right a while
    where they grow along directions the loss hardly sees, as a limit cycle's
    radius). So the drift per forward step must stay within
    `drift_tolerance` (default 300: right gradients of the calibration corpus
    reach 83, wrong ones start at 1650; held out, 108 and 3800), and an
    interval that takes more than `BACKWARD_STEPS` (4) backward steps per forward
    step is refused as it goes (stiff backwards: the refusal costs a few forward
    solves, not max_steps). Beyond either, or when the backward solve fails,
    `on_instability="raise"` (default) raises an error recommending
    InterpolatingAdjoint; `"warn"` warns and returns the gradient anyway."""

    stores_interpolation = False
    vjp: ad.AbstractBackend
    on_instability: str
    drift_tolerance: float
    seminorm: bool

    def __init__(self, vjp="jax-reverse", on_instability="raise", drift_tolerance=DRIFT_TOLERANCE, seminorm=False):
        if on_instability not in ("raise", "warn"):
            raise ValueError(f"BacksolveAdjoint(on_instability=...) must be 'raise' or 'warn', got {on_instability!r}")
        if not drift_tolerance > 0:
            raise ValueError(f"BacksolveAdjoint(drift_tolerance=...) must be positive, got {drift_tolerance!r}")
        self.vjp = ad.get(vjp)
        self.on_instability = on_instability
        self.drift_tolerance = float(drift_tolerance)
        self.seminorm = bool(seminorm)

    def system(self, setup, prods):
        return _ULambdaMu(prods, leading_seminorm(2) if self.seminorm else None)

    def record(self, setup, u0, p):
        return _record_at_breakpoints(setup, u0, p, setup.breakpoints(), dense=False)

    def args_structure(self, setup, rec, resolve):
        return Interval(rec.p, None, _no_integral(setup, rec))

    def cross(self, setup, marcher, system, march, rec, j, w_q, drift, resolve):
        def solve():
            budget = jnp.minimum(BACKWARD_STEPS * (rec.steps + 8), setup.max_steps).astype(jnp.int32)
            m = _march_interval(setup, marcher, system, march, Interval(rec.p, None, w_q), rec.t[j], budget)
            d = self.drift(setup, m.y[0], rec.u_at[j, : setup.n], rec.u_at[j + 1, : setup.n], rec.steps)
            d = jnp.where(dfx.is_successful(m.result), d, jnp.inf)
            return m, jnp.maximum(drift, jax.lax.stop_gradient(d))

        # Once unstable, the result is refused: the remaining intervals are not solved (a stiff
        # problem's backward solve can take max_steps in every one of them).
        return jax.lax.cond(drift > self.drift_tolerance, lambda: (march, drift), solve)

    @staticmethod
    def drift(setup: Setup, u_back, u_at, u_from, steps):
        """The drift of one interval in tolerances per forward step: `u_back`, u re-solved backwards
        from `u_from` (the stored u at the interval's end) to its start, against `u_at` (the stored
        u there); `steps`, the forward solve's accepted steps. A tolerance is the larger of the two
        the forward solve holds at the interval's ends: atol + rtol |u| at the start, and at the end
        carried to the start by u's own growth, (atol + rtol |u_from|) ‖u_at‖ / ‖u_from‖ (RMS norms),
        the same error relative to u."""
        rtol, atol = setup.adjoint_tolerances  # u is re-solved at the adjoint's tolerances
        rms = lambda x: jnp.sqrt(jnp.mean(x**2))  # noqa: E731
        growth = rms(u_at) / jnp.maximum(rms(u_from), jnp.finfo(u_at.dtype).tiny)
        scale = jnp.maximum(atol + rtol * jnp.abs(u_at), growth * (atol + rtol * jnp.abs(u_from)))
        return rms((u_back - u_at) / scale) / jnp.maximum(steps, 1)

    def verdict(self, setup, system, march, drift):
        # A failed backward solve reports itself through the drift (inf).
        unstable = drift > self.drift_tolerance
        cotangents = system.gradients(march.y, march.quadrature)
        if self.on_instability == "raise":
            return error_if(cotangents, unstable, UNSTABLE + " Or pass BacksolveAdjoint(on_instability='warn').")
        return warn_if(cotangents, unstable,
                       f"{UNSTABLE} (drift {{:.3g}} tolerances per forward step, limit {self.drift_tolerance:g})",
                       drift)


class _Interpolated(_ContinuousAdjoint):
    """A continuous adjoint with u(t) from a dense interpolation of the forward solve.
    `checkpointing=False` stores the interpolation of the whole forward solve, up to
    `STORED_STEPS` steps and `STORED_BYTES` (memory grows with the steps taken); a solve that takes
    more (a `max_steps` raised above it, a large state) is run again keeping checkpoints, as `checkpointing=True`, so the
    cost follows the steps taken, not `max_steps`. `checkpointing=True` keeps only u at
    checkpoints and re-solves each interval between them with dense output during the reverse
    pass, in at most `interval_max_steps` steps. By default (`checkpoints=None`) the forward
    solve keeps u after every `interval_max_steps // 2` accepted steps (default 128 // 2):
    memory is max_steps / 64 states plus 128 dense steps, flat in the horizon. Given
    `checkpoints` (times), u is kept there and at the saveat times, and `interval_max_steps`
    defaults to 4 × max_steps / intervals (at least 64, at most max_steps)."""

    vjp: ad.AbstractBackend
    checkpointing: bool
    checkpoints: tuple | None
    interval_max_steps: int | None

    def __init__(self, vjp="jax-reverse", checkpointing=False, checkpoints=None, interval_max_steps=None):
        self.vjp = ad.get(vjp)
        self.checkpointing, self.checkpoints, self.interval_max_steps = _checkpointing(
            type(self).__name__, checkpointing, checkpoints, interval_max_steps)

    @property
    def stores_interpolation(self):
        return not self.checkpointing

    def record(self, setup, u0, p):
        if self.checkpoints is not None:
            bps = setup.breakpoints(_checkpoint_times(setup, self.checkpoints))
            return _record_at_breakpoints(setup, u0, p, bps, dense=False, resolved=True)
        every = self._steps_per_interval(setup) // 2
        if self.checkpointing:
            t, u_at, stats = checkpoints.forward(setup, u0, p, every)
            return u_at[setup.saved(t)], stats, Recorded(u0, p, t, u_at, None, stats[1], None, resolved=True)
        stored = stored_steps(setup.max_steps, interpolation_step_bytes(
            setup.solver, u0.size + setup.f.integrand_size, u0.dtype.itemsize))
        if stored == setup.max_steps:
            return _record_at_breakpoints(setup, u0, p, setup.breakpoints(), dense=True)
        # Every step stored up to `stored`; past it, the solve again with checkpoints every `every` steps.
        bps = setup.breakpoints()
        sol = setup.forward(u0, p, ts=bps, dense=True, max_steps=stored, throw=False)
        again = batch_any(sol.result == dfx.RESULTS.max_steps_reached)
        recheckpointed = lambda: checkpoints.forward(setup, u0, p, every)  # noqa: E731
        size = jax.eval_shape(recheckpointed)[0].shape[0]

        def kept():  # the breakpoints padded as unused checkpoints are: at t1, with u(t1)
            pad = size - bps.shape[0]
            return (jnp.concatenate([bps.astype(u0.dtype), jnp.full((pad,), setup.t1, u0.dtype)]),
                    checked(setup, sol.result, jnp.concatenate([sol.ys, jnp.repeat(sol.ys[-1:], pad, 0)])),
                    stats_vector(sol, u0.dtype))

        t, u_at, stats = jax.lax.cond(again, recheckpointed, kept)
        return u_at[setup.saved(t)], stats, Recorded(u0, p, t, u_at, sol.interpolation, stats[1], again)

    def args_structure(self, setup, rec, resolve):
        t = rec.t.astype(rec.u0.dtype)
        w_q = _no_integral(setup, rec)
        if resolve:  # the structure of a re-solved interval's args
            return eqx.filter_eval_shape(lambda: Interval(rec.p, _Held(
                self._resolved(setup, rec.p, t[-1], t[-2], rec.u_at[-2], t[-1] - t[-2])[0], t[-2], t[-1]), w_q))
        return Interval(rec.p, _Held(rec.interpolation, t[-2], t[-1]), w_q)

    def cross(self, setup, marcher, system, march, rec, j, w_q, drift, resolve):
        t = rec.t.astype(rec.u0.dtype)
        t_from, t_to = t[j + 1], t[j]
        if not resolve:
            args = Interval(rec.p, _Held(rec.interpolation, t_to, t_from), w_q)
            return _march_interval(setup, marcher, system, march, args, t_to, setup.max_steps), drift

        def resolve_and_march():
            interpolation, ok = self._resolved(setup, rec.p, t_from, t_to, rec.u_at[j],
                                               jnp.minimum(march.dt, t_from - t_to))
            checked_march = error_if(
                march, jnp.invert(ok), f"{type(self).__name__}(checkpointing=True): an interval between checkpoints "
                f"needed more than interval_max_steps={self._steps_per_interval(setup)} steps; pass a larger "
                "interval_max_steps or more checkpoints")
            args = Interval(rec.p, _Held(interpolation, t_to, t_from), w_q)
            return _march_interval(setup, marcher, system, checked_march, args, t_to, setup.max_steps), drift

        # Zero-length intervals (unused checkpoints, a save time at t0 or t1) are not re-solved.
        return jax.lax.cond(t_from > t_to, resolve_and_march, lambda: (march, drift))

    def verdict(self, setup, system, march, drift):
        # A failed backward solve (out of steps between two breakpoints, or the solver's own failure) raises.
        return checked(setup, march.result, system.gradients(march.y, march.quadrature))

    def _resolved(self, setup, p, t_from, t_to, u_start, dt0):
        """(interpolation, ok): this interval re-solved forward from u_start with dense output."""
        sol = setup.diffeqsolve(setup.term(), u_start, p, t_to, t_from, dense=True,
                                max_steps=self._steps_per_interval(setup), dt0=dt0, throw=False)
        return sol.interpolation, dfx.is_okay(sol.result)

    def _steps_per_interval(self, setup: Setup) -> int:
        """interval_max_steps, or by default `INTERVAL_STEPS` with checkpoints by step count, and
        4 × max_steps / intervals (at least 64, at most max_steps) with checkpoint times given."""
        if self.interval_max_steps is not None:
            return self.interval_max_steps
        if self.checkpoints is None:
            return INTERVAL_STEPS
        intervals = len(setup.breakpoints(_checkpoint_times(setup, self.checkpoints))) - 1
        return int(min(setup.max_steps, max(64, 4 * setup.max_steps // intervals)))


def _checkpointing(name: str, checkpointing, checkpoints, interval_max_steps) -> tuple:
    """The checkpointing options of `name`, checked: (checkpointing, checkpoints, interval_max_steps)."""
    if checkpoints is not None and not checkpointing:
        raise ValueError(f"{name}(checkpoints=...) needs checkpointing=True")
    if interval_max_steps is not None and not int(interval_max_steps) >= 2:
        raise ValueError(f"{name}(interval_max_steps=...) must be at least 2, got {interval_max_steps!r}")
    return (bool(checkpointing), None if checkpoints is None else tuple(float(c) for c in np.ravel(checkpoints)),
            None if interval_max_steps is None else int(interval_max_steps))


def _checkpoint_times(setup: Setup, times: tuple) -> jax.Array:
    c = jnp.asarray(times, jnp.result_type(setup.ts))
    return check(c, jnp.any((c < setup.t0) | (c > setup.t1)), f"checkpoints must lie inside tspan, got {times}")


def _record_at_breakpoints(setup: Setup, u0, p, bps, *, dense: bool, resolved: bool = False):
    """The forward pass saving u at the breakpoints `bps` (with the dense interpolation if `dense`)."""
    sol = setup.forward(u0, p, ts=bps, dense=dense)
    stats = stats_vector(sol, u0.dtype)
    return (sol.ys[setup.saved(bps)], stats,
            Recorded(u0, p, bps, sol.ys, sol.interpolation if dense else None, stats[1], None, resolved=resolved))


class InterpolatingAdjoint(_Interpolated):
    """Continuous adjoint solving (λ, μ) backwards with u(t) from a dense interpolation of the
    forward solve. `seminorm=True` leaves μ out of the error control (Kidger et al. 2021):
    λ alone (n values) sets the steps. Checkpointing options: see `_Interpolated`."""

    seminorm: bool

    def __init__(self, vjp="jax-reverse", checkpointing=False, checkpoints=None, interval_max_steps=None,
                 seminorm=False):
        super().__init__(vjp, checkpointing, checkpoints, interval_max_steps)
        self.seminorm = bool(seminorm)

    def system(self, setup, prods):
        return _LambdaMu(prods, leading_seminorm() if self.seminorm else None)


def QuadratureAdjoint(vjp="jax-reverse", checkpointing=False, checkpoints=None,
                      interval_max_steps=None) -> InterpolatingAdjoint:
    """SciMLSensitivity's name for λ solved backwards with ∂L/∂p = ∫ λᵀ ∂f/∂p dt as a quadrature
    along λ's steps, the parameter integral left out of the error control (its steps set by λ
    alone, n values, not n + m): `InterpolatingAdjoint(seminorm=True)` with the same checkpointing
    options, which is what it returns (λ's own quadrature nodes: `GaussAdjoint`)."""
    return InterpolatingAdjoint(vjp, checkpointing, checkpoints, interval_max_steps, seminorm=True)


class GaussAdjoint(_Interpolated):
    """Continuous adjoint that solves λ alone backwards (n values; u(t) from the forward
    interpolation, with InterpolatingAdjoint's checkpointing options) and integrates
    ∂L/∂p = ∫ λᵀ ∂f/∂p dt by Gauss–Legendre quadrature on each accepted λ step, as
    SciMLSensitivity's GaussAdjoint: μ is in neither the solver's stages nor its error
    control. Each step costs one more batched VJP at the quadrature nodes (λ there from the
    step's own dense output)."""

    def system(self, setup, prods):
        return _LambdaGauss(prods)


def _gauss_nodes(setup: Setup) -> int:
    """Gauss–Legendre nodes per step: k nodes integrate degree 2k - 1 exactly, k from the solver's order."""
    order = setup.solver.order(setup.term()) or 4
    return max(2, (order + 2) // 2)
