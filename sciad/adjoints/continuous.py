"""Continuous adjoints: λ' = -(∂f/∂u)ᵀ λ solved backwards, ∂L/∂p = ∫ λᵀ ∂f/∂p dt.

For a loss of the saved states, λ starts at 0 at t1 and jumps by ∂L/∂u(t_k)
at every saveat time t_k. The backward pass runs interval by interval
between breakpoints (t0, the saveat times, the checkpoints, t1); the
methods differ in where u(t) comes from on the way back.
"""


import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import sciad.ad as ad
from sciad.adjoints.base import (
    AbstractSensitivity,
    Products,
    Setup,
    checked,
    leading_seminorm,
    plain_forward,
    stats_vector,
    stored_steps,
)
from sciad.adjoints import checkpoints
from sciad.adjoints.stepping import Marcher
from sciad.errors import batch_any, error_if, warn_if


class _ContinuousAdjoint(AbstractSensitivity):
    """The backward sweep shared by the continuous adjoints; `vjp` is the engine
    for the vector-Jacobian products λᵀ∂f/∂u, λᵀ∂f/∂p.

    One `Marcher` runs the whole sweep: it steps to each breakpoint, where the
    subclass applies λ's jump (and resets what it resets), and continues with
    the same solver state and step size."""

    vjp: ad.AbstractBackend

    def __init__(self, vjp="jax-reverse"):
        self.vjp = ad.get(vjp)

    def engines(self) -> tuple:
        return (self.vjp,)

    def checkpoint_times(self, setup: Setup) -> np.ndarray:
        return np.zeros((0,))

    resolves = False  # whether u(t) is re-solved interval by interval on the way back (checkpointing)

    def forward(self, setup: Setup, u0, p, active):
        if active is None:
            return plain_forward(setup, u0, p)
        bps = setup.breakpoints(self.checkpoint_times(setup))
        sol = setup.forward(u0, p, ts=bps, dense=self.stores_interpolation)
        us = sol.ys[setup.saved(bps)]
        interpolation = sol.interpolation if self.stores_interpolation else None
        stats = stats_vector(sol, u0.dtype)
        return us, stats, (u0, p, bps, sol.ys, interpolation, stats[1], None)

    def pullback(self, setup: Setup, residuals, w):
        """The backward sweep; where the forward pass ran out of stored steps (`residuals[-1]`, for
        any member of a vmap batch), the sweep that re-solves each interval."""
        *residuals, again = residuals
        if again is None:
            return self.sweep(setup, residuals, w, self.resolves)
        return jax.lax.cond(batch_any(again), lambda: self.sweep(setup, residuals, w, True),
                            lambda: self.sweep(setup, residuals, w, False))

    def sweep(self, setup: Setup, residuals, w, resolve: bool):
        """(∂L/∂u0, ∂L/∂p) from the breakpoints t (B,), u there (B, n), the stored interpolation
        (`resolve=False`) or the intervals re-solved (`resolve=True`). Breakpoints after the first
        at t1 (unused checkpoints: zero-length intervals) are not walked."""
        u0, p, bps, u_at, interpolation, steps = residuals
        jumps = jnp.zeros((len(bps), u0.shape[0]), w.dtype).at[setup.saved(bps)].add(w)
        t = bps.astype(u0.dtype)
        last = jnp.searchsorted(t, t[-1])
        prods = Products(setup.f, self.vjp)
        marcher = self.marcher(setup, prods)
        # The forward pass's mean step is the first one tried: no step-size search.
        dt0 = (setup.t1 - setup.t0) / jnp.maximum(steps, 1)
        march = marcher.start(self.initial(u_at[last], jumps[last], p),
                              self.start_args(setup, p, u_at, interpolation, t, resolve), t[-1], dt0,
                              self.quadrature(p))

        def interval(carry):
            j, march, drift = carry
            j = jnp.maximum(j, 0)  # under vmap, members done walk their first interval again, discarded
            march, drift = self.backward(setup, prods, marcher, march, p, t[j + 1], t[j], u_at[j], interpolation,
                                         drift, resolve, steps)
            return j - 1, march.jumped(self.jump(march.y, jumps[j], u_at[j])), drift

        _, march, drift = jax.lax.while_loop(lambda carry: carry[0] >= 0, interval,
                                             (last - 1, march, jnp.zeros((), w.dtype)))
        # A failed backward solve (out of steps between two breakpoints, or the solver's own
        # failure) raises, unless the drift check reports it (BacksolveAdjoint's instability).
        result = dfx.RESULTS.where(drift <= self.drift_limit(), march.result, dfx.RESULTS.successful)
        return self.check_drift(checked(setup, result, self.cotangents(march)), drift)

    def marcher(self, setup: Setup, prods: Products) -> Marcher:
        """The backward system, stepped with `setup`'s solver."""
        raise NotImplementedError

    def initial(self, u1, lam1, p):
        """The backward system's state at t1, from u(t1), λ(t1) and p."""
        raise NotImplementedError

    def args(self, p, interpolation, t_to, t_from):
        """The backward system's `args` on [t_to, t_from]: p, and where u(t) comes from."""
        return p, _Held(interpolation, t_to, t_from)

    def start_args(self, setup, p, u_at, interpolation, t, resolve):
        """`args` of the last interval, or their structure (what the march starts from)."""
        return self.args(p, interpolation, t[-2], t[-1])

    def quadrature(self, p):
        """What the march accumulates over its steps besides its state (None: nothing)."""
        return None

    def jump(self, y, w, u):
        """The state after the jump at a breakpoint: λ += w (w: ∂L/∂u there, u: the stored u(t))."""
        lam, mu = y
        return lam + w, mu

    def cotangents(self, march):
        """(∂L/∂u0, ∂L/∂p) from the march at t0."""
        return march.y

    def backward(self, setup, prods, marcher, march, p, t_from, t_to, u_start, interpolation, drift, resolve,
                 steps):
        """(march at t_to, drift) from the march at t_from > t_to; `drift` ≥ 0, the largest so far,
        measures how far a state re-solved backwards ends from the stored u(t_to) (u_start);
        `steps`: the forward solve's accepted steps."""
        args = self.args(p, interpolation, t_to, t_from)
        return marcher.advance(march, args, t_to, setup.max_steps, self.on_step(setup, prods, args)), drift

    def on_step(self, setup, prods, args):
        """What each accepted backward step adds to the march's quadrature (None: nothing)."""
        return None

    def drift_limit(self) -> float:
        return np.inf

    def check_drift(self, cotangents, drift):
        """The cotangents, checked against the largest `drift` of the backward pass (no check by default)."""
        return cotangents


class _Held(eqx.Module):
    """u(t) from an interpolation, held at the ends of [t_to, t_from] (implicit solvers evaluate
    stages slightly past the interval, where an interpolation is undefined)."""

    interpolation: object
    t_to: jax.Array
    t_from: jax.Array

    def evaluate(self, t):
        return self.interpolation.evaluate(jnp.clip(t, self.t_to, self.t_from))


def _lambda_mu_rhs(prods: Products):
    """(λ, μ)' = -(λᵀ∂f/∂u, λᵀ∂f/∂p) with u(t) from args = (p, u_of)."""

    def rhs(t, y, args):
        p, u_of = args
        _, vu, vp = prods.vjp(u_of.evaluate(t), p, t, y[0])
        return -vu, -vp

    return rhs


INTERVAL_STEPS = 128  # re-solved steps per interval with checkpoints by step count (one every 64)
# BacksolveAdjoint's self-check (tests/test_backsolve_check.py holds the corpus it is calibrated on):
# the drift allowed per forward step, in tolerances (right gradients: at most 1.1; wrong: from 124),
# and the backward steps per forward step (+ 8) after which an interval is refused (stiff backwards;
# right gradients take at most 2).
DRIFT_TOLERANCE = 10.0
BACKWARD_STEPS = 4
UNSTABLE = ("BacksolveAdjoint: the state re-solved backwards in time departs from the forward solution "
            f"(or the backward solve failed, or took more than {BACKWARD_STEPS} steps per forward step), so this problem is "
            "unstable backwards in time (stiff or dissipative) and the gradient would be wrong. Use "
            "InterpolatingAdjoint (checkpointing=True bounds its memory) or QuadratureAdjoint.")


class BacksolveAdjoint(_ContinuousAdjoint):
    """Continuous adjoint that re-solves u backwards with λ and μ (O(1) memory
    per interval). At every saveat time u is reset to the stored forward value
    (SciML's checkpointed backsolve). `seminorm=True` leaves μ out of the error
    control (Kidger et al. 2021): the steps are set by (u, λ), 2n values, not 2n + m.

    Wrong on problems that are unstable backwards in time (stiff or
    dissipative ones), so it checks itself at no extra cost. The signal is
    exponential departure: where u is reset, the u re-solved backwards ends
    some drift from the stored forward value, measured in tolerances
    (atol + rtol |u|, RMS over states). Two accurate solves differ by their
    global error, which accumulates at most about one tolerance per step; an
    unstable backward solve amplifies its errors exponentially. So the drift
    per forward step must stay within `drift_tolerance` (default 10: right
    gradients of the corpus stay below 1.1, wrong ones start at 124), and an
    interval that takes more than `BACKWARD_STEPS` (4) backward steps per forward
    step is refused as it goes (stiff backwards: the refusal costs a few forward
    solves, not max_steps). Beyond either, or when the backward solve fails,
    `on_instability="raise"` (default) raises an error recommending
    InterpolatingAdjoint; `"warn"` warns and returns the gradient anyway."""

    stores_interpolation = False
    on_instability: str
    drift_tolerance: float
    seminorm: bool

    def __init__(self, vjp="jax-reverse", on_instability="raise", drift_tolerance=DRIFT_TOLERANCE, seminorm=False):
        super().__init__(vjp)
        if on_instability not in ("raise", "warn"):
            raise ValueError(f"BacksolveAdjoint(on_instability=...) must be 'raise' or 'warn', got {on_instability!r}")
        if not drift_tolerance > 0:
            raise ValueError(f"BacksolveAdjoint(drift_tolerance=...) must be positive, got {drift_tolerance!r}")
        self.on_instability = on_instability
        self.drift_tolerance = float(drift_tolerance)
        self.seminorm = bool(seminorm)

    def marcher(self, setup, prods):
        def rhs(t, y, p):
            u, lam, _ = y
            du, vu, vp = prods.vjp(u, p, t, lam)
            return du, -vu, -vp

        return Marcher(setup, rhs, leading_seminorm(2) if self.seminorm else None)

    def initial(self, u1, lam1, p):
        return u1, lam1, jnp.zeros_like(p)

    def args(self, p, interpolation, t_to, t_from):
        return p

    def jump(self, y, w, u):
        _, lam, mu = y
        return u, lam + w, mu

    def cotangents(self, march):
        return march.y[1:]

    def backward(self, setup, prods, marcher, march, p, t_from, t_to, u_start, interpolation, drift, resolve,
                 steps):
        def solve():
            budget = jnp.minimum(BACKWARD_STEPS * (steps + 8), setup.max_steps).astype(jnp.int32)
            m = marcher.advance(march, p, t_to, budget)
            scale = setup.atol + setup.rtol * jnp.abs(u_start)
            d = jnp.sqrt(jnp.mean(((m.y[0] - u_start) / scale) ** 2)) / jnp.maximum(steps, 1)
            d = jnp.where(dfx.is_successful(m.result), d, jnp.inf)
            return m, jnp.maximum(drift, jax.lax.stop_gradient(d))

        # Once unstable, the result is refused: the remaining intervals are not solved (a stiff
        # problem's backward solve can take max_steps in every one of them).
        return jax.lax.cond(drift > self.drift_tolerance, lambda: (march, drift), solve)

    def drift_limit(self) -> float:
        return self.drift_tolerance

    def check_drift(self, cotangents, drift):
        unstable = drift > self.drift_tolerance
        if self.on_instability == "raise":
            return error_if(cotangents, unstable, UNSTABLE + " Or pass BacksolveAdjoint(on_instability='warn').")
        warn_if(unstable, f"{UNSTABLE} (drift {{:.3g}} tolerances per forward step, limit {self.drift_tolerance:g})",
                drift)
        return cotangents


class _Interpolated(_ContinuousAdjoint):
    """A continuous adjoint with u(t) from a dense interpolation of the forward solve.
    `checkpointing=False` stores the interpolation of the whole forward solve, up to
    `STORED_STEPS` steps (memory grows with the steps taken); a solve that takes more (a
    `max_steps` raised above it) is run again keeping checkpoints, as `checkpointing=True`, so the
    cost follows the steps taken, not `max_steps`. `checkpointing=True` keeps only u at
    checkpoints and re-solves each interval between them with dense output during the reverse
    pass, in at most `interval_max_steps` steps. By default (`checkpoints=None`) the forward
    solve keeps u after every `interval_max_steps // 2` accepted steps (default 128 // 2):
    memory is max_steps / 64 states plus 128 dense steps, flat in the horizon. Given
    `checkpoints` (times), u is kept there and at the saveat times, and `interval_max_steps`
    defaults to 4 × max_steps / intervals (at least 64, at most max_steps)."""

    checkpointing: bool
    checkpoints: tuple | None
    interval_max_steps: int | None

    def __init__(self, vjp="jax-reverse", checkpointing=False, checkpoints=None, interval_max_steps=None):
        super().__init__(vjp)
        if checkpoints is not None and not checkpointing:
            raise ValueError(f"{type(self).__name__}(checkpoints=...) needs checkpointing=True")
        self.checkpointing = bool(checkpointing)
        self.checkpoints = None if checkpoints is None else tuple(float(c) for c in np.ravel(checkpoints))
        if interval_max_steps is not None and not int(interval_max_steps) >= 2:
            raise ValueError(f"{type(self).__name__}(interval_max_steps=...) must be at least 2, "
                             f"got {interval_max_steps!r}")
        self.interval_max_steps = None if interval_max_steps is None else int(interval_max_steps)

    @property
    def stores_interpolation(self):
        return not self.checkpointing

    @property
    def resolves(self):
        return self.checkpointing

    def checkpoint_times(self, setup: Setup) -> np.ndarray:
        if self.checkpoints is None:
            return np.zeros((0,))
        c = np.asarray(self.checkpoints)
        if np.any((c < setup.t0) | (c > setup.t1)):
            raise ValueError(f"checkpoints must lie inside tspan ({setup.t0}, {setup.t1}), got {self.checkpoints}")
        return c

    def forward(self, setup: Setup, u0, p, active):
        if active is None or self.checkpoints is not None:
            return super().forward(setup, u0, p, active)
        every = self.steps_per_interval(setup) // 2
        if self.checkpointing:
            t, u_at, stats = checkpoints.forward(setup, u0, p, every)
            return u_at[setup.saved(t)], stats, (u0, p, t, u_at, None, stats[1], None)
        stored = stored_steps(setup.max_steps)
        if stored == setup.max_steps:
            return super().forward(setup, u0, p, active)
        # Every step stored up to `stored`; past it, the solve again with checkpoints every `every` steps.
        bps = setup.breakpoints()
        sol = setup.diffeqsolve(setup.term(), u0, p, setup.t0, setup.t1, ts=bps.astype(u0.dtype), dense=True,
                                max_steps=stored, throw=False)
        again = batch_any(sol.result == dfx.RESULTS.max_steps_reached)
        recheckpointed = lambda: checkpoints.forward(setup, u0, p, every)  # noqa: E731
        size = jax.eval_shape(recheckpointed)[0].shape[0]

        def kept():  # the breakpoints padded as unused checkpoints are: at t1, with u(t1)
            pad = size - bps.shape[0]
            return (jnp.concatenate([bps.astype(u0.dtype), jnp.full((pad,), setup.t1, u0.dtype)]),
                    checked(setup, sol.result, jnp.concatenate([sol.ys, jnp.repeat(sol.ys[-1:], pad, 0)])),
                    stats_vector(sol, u0.dtype))

        t, u_at, stats = jax.lax.cond(again, recheckpointed, kept)
        return u_at[setup.saved(t)], stats, (u0, p, t, u_at, sol.interpolation, stats[1], again)

    def start_args(self, setup, p, u_at, interpolation, t, resolve):
        if resolve:  # the structure of a re-solved interval's args
            return eqx.filter_eval_shape(
                lambda: self.args(p, self.resolved(setup, p, t[-1], t[-2], u_at[-2], t[-1] - t[-2])[0],
                                  t[-2], t[-1]))
        return super().start_args(setup, p, u_at, interpolation, t, resolve)

    def resolved(self, setup, p, t_from, t_to, u_start, dt0):
        """(interpolation, ok): this interval re-solved forward from u_start with dense output."""
        sol = setup.diffeqsolve(setup.term(), u_start, p, t_to, t_from, dense=True,
                                max_steps=self.steps_per_interval(setup), dt0=dt0, throw=False)
        return sol.interpolation, dfx.is_okay(sol.result)

    def backward(self, setup, prods, marcher, march, p, t_from, t_to, u_start, interpolation, drift, resolve,
                 steps):
        if not resolve:
            return super().backward(setup, prods, marcher, march, p, t_from, t_to, u_start, interpolation, drift,
                                    resolve, steps)

        def resolve_and_march():
            interpolation, ok = self.resolved(setup, p, t_from, t_to, u_start, jnp.minimum(march.dt, t_from - t_to))
            checked_march = error_if(
                march, jnp.invert(ok), f"{type(self).__name__}(checkpointing=True): an interval between checkpoints "
                f"needed more than interval_max_steps={self.steps_per_interval(setup)} steps; pass a larger "
                "interval_max_steps or more checkpoints")
            return super(_Interpolated, self).backward(setup, prods, marcher, checked_march, p, t_from, t_to,
                                                       u_start, interpolation, drift, resolve, steps)

        # Zero-length intervals (unused checkpoints, a save time at t0 or t1) are not re-solved.
        return jax.lax.cond(t_from > t_to, resolve_and_march, lambda: (march, drift))

    def steps_per_interval(self, setup: Setup) -> int:
        """interval_max_steps, or by default `INTERVAL_STEPS` with checkpoints by step count, and
        4 × max_steps / intervals (at least 64, at most max_steps) with checkpoint times given."""
        if self.interval_max_steps is not None:
            return self.interval_max_steps
        if self.checkpoints is None:
            return INTERVAL_STEPS
        intervals = len(setup.breakpoints(self.checkpoint_times(setup))) - 1
        return int(min(setup.max_steps, max(64, 4 * setup.max_steps // intervals)))


class InterpolatingAdjoint(_Interpolated):
    """Continuous adjoint solving (λ, μ) backwards with u(t) from a dense interpolation of the
    forward solve. `seminorm=True` leaves μ out of the error control (Kidger et al. 2021):
    λ alone (n values) sets the steps. Checkpointing options: see `_Interpolated`."""

    seminorm: bool

    def __init__(self, vjp="jax-reverse", checkpointing=False, checkpoints=None, interval_max_steps=None,
                 seminorm=False):
        super().__init__(vjp, checkpointing, checkpoints, interval_max_steps)
        self.seminorm = bool(seminorm)

    def marcher(self, setup, prods):
        return Marcher(setup, _lambda_mu_rhs(prods), leading_seminorm() if self.seminorm else None)

    def initial(self, u1, lam1, p):
        return lam1, jnp.zeros_like(p)


class QuadratureAdjoint(_Interpolated):
    """Continuous adjoint that solves λ backwards with u from the stored
    interpolation and obtains ∂L/∂p = ∫ λᵀ ∂f/∂p dt as a quadrature along λ's
    steps: μ rides along with the solver's stages but is left out of error
    control, so the step count is set by λ alone (n states, not n + m). The same
    as `InterpolatingAdjoint(seminorm=True)`, under SciMLSensitivity's name, with its
    checkpointing options (`_Interpolated`)."""

    def marcher(self, setup, prods):
        return Marcher(setup, _lambda_mu_rhs(prods), leading_seminorm())

    def initial(self, u1, lam1, p):
        return lam1, jnp.zeros_like(p)


class GaussAdjoint(_Interpolated):
    """Continuous adjoint that solves λ alone backwards (n values; u(t) from the forward
    interpolation, with InterpolatingAdjoint's checkpointing options) and integrates
    ∂L/∂p = ∫ λᵀ ∂f/∂p dt by Gauss–Legendre quadrature on each accepted λ step, as
    SciMLSensitivity's GaussAdjoint: μ is in neither the solver's stages nor its error
    control. Each step costs one more batched VJP at the quadrature nodes (λ there from the
    step's own dense output)."""

    def marcher(self, setup, prods):
        def rhs(t, lam, args):
            p, u_of = args
            return -prods.vjp(u_of.evaluate(t), p, t, lam)[1]

        return Marcher(setup, rhs)

    def initial(self, u1, lam1, p):
        return lam1

    def quadrature(self, p):
        return jnp.zeros_like(p)

    def jump(self, y, w, u):
        return y + w

    def cotangents(self, march):
        return march.y, march.quadrature

    def on_step(self, setup, prods, args):
        p, u_of = args
        nodes, weights = np.polynomial.legendre.leggauss(_gauss_nodes(setup))

        def integrate(mu, t_start, t_end, lam_of):
            ts = t_end + (t_start - t_end) * jnp.asarray((nodes + 1) / 2, mu.dtype)
            vp = jax.vmap(lambda t: prods.vjp(u_of.evaluate(t), p, t, lam_of.evaluate(t))[2])(ts)
            return mu + (t_start - t_end) / 2 * jnp.tensordot(jnp.asarray(weights, mu.dtype), vp, axes=1)

        return integrate


def _gauss_nodes(setup: Setup) -> int:
    """Gauss–Legendre nodes per step: k nodes integrate degree 2k - 1 exactly, k from the solver's order."""
    order = setup.solver.order(setup.term()) or 4
    return max(2, (order + 2) // 2)
