"""Continuous adjoints: λ' = -(∂f/∂u)ᵀ λ solved backwards, ∂L/∂p = ∫ λᵀ ∂f/∂p dt.

For a loss of the saved states, λ starts at 0 at t1 and jumps by ∂L/∂u(t_k)
at every saveat time t_k. The backward pass runs interval by interval
between breakpoints (t0, the saveat times, the checkpoints, t1); the
methods differ in where u(t) comes from on the way back.
"""

import warnings

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

import sciad.ad as ad
from sciad.adjoints.base import AbstractSensitivity, Products, Setup, plain_forward, stats_vector
from sciad.errors import error_if


class _ContinuousAdjoint(AbstractSensitivity):
    """The backward sweep shared by the continuous adjoints; `vjp` is the engine
    for the vector-Jacobian products λᵀ∂f/∂u, λᵀ∂f/∂p."""

    vjp: ad.AbstractBackend

    def __init__(self, vjp="jax-reverse"):
        self.vjp = ad.get(vjp)

    def engines(self) -> tuple:
        return (self.vjp,)

    def checkpoint_times(self, setup: Setup) -> np.ndarray:
        return np.zeros((0,))

    def forward(self, setup: Setup, u0, p, active):
        if active is None:
            return plain_forward(setup, u0, p)
        bps = setup.breakpoints(self.checkpoint_times(setup))
        sol = setup.forward(u0, p, ts=bps, dense=self.stores_interpolation)
        us = sol.ys[setup.saved(bps)]
        interpolation = sol.interpolation if self.stores_interpolation else None
        stats = stats_vector(sol, u0.dtype)
        return us, stats, (u0, p, sol.ys, interpolation, stats[1])

    def pullback(self, setup: Setup, residuals, w):
        u0, p, u_at, interpolation, steps = residuals
        # The forward pass's mean step starts every interval's solve: no step-size search per restart.
        dt = (setup.t1 - setup.t0) / jnp.maximum(steps, 1)
        bps = setup.breakpoints(self.checkpoint_times(setup))
        jumps = jnp.zeros((len(bps), u0.shape[0]), w.dtype).at[setup.saved(bps)].add(w)
        prods = Products(setup.f, self.vjp)
        t = bps.astype(u0.dtype)

        def interval(carry, j):
            lam, mu, drift = carry
            dt0 = jnp.minimum(dt, t[j + 1] - t[j])
            lam, mu, drift = self.backward(setup, prods, p, t[j + 1], t[j], dt0, u_at[j], u_at[j + 1],
                                           interpolation, lam, mu, drift)
            return (lam + jumps[j], mu, drift), None

        carry = (jumps[-1], jnp.zeros_like(p), jnp.zeros((), w.dtype))
        (lam, mu, drift), _ = jax.lax.scan(interval, carry, jnp.arange(len(bps) - 2, -1, -1))
        return self.check_drift((lam, mu), drift)

    def backward(self, setup, prods, p, t_from, t_to, dt0, u_start, u_end, interpolation, lam, mu, drift):
        """(λ, μ, drift) at t_to from λ, μ at t_from > t_to on one interval, first step size dt0 > 0;
        `drift` ≥ 0, the largest so far, measures how far a state re-solved backwards ends from the
        stored u(t_to)."""
        raise NotImplementedError

    def check_drift(self, cotangents, drift):
        """The cotangents, checked against the largest `drift` of the backward pass (no check by default)."""
        return cotangents

    def _lambda_mu(self, setup, prods, p, t_from, t_to, dt0, u_of, lam, mu, norm=None):
        """Solve (λ, μ) backwards with u(t) = u_of(t) on [t_to, t_from] (held there: implicit
        solvers evaluate stages slightly past the interval, where an interpolation is undefined)."""

        def rhs(t, y, p):
            lam, _ = y
            _, vu, vp = prods.vjp(u_of(jnp.clip(t, t_to, t_from)), p, t, lam)
            return -vu, -vp

        sol = setup.diffeqsolve(setup.term(rhs), (lam, mu), p, t_from, t_to, norm=norm, dt0=-dt0)
        return sol.ys[0][-1], sol.ys[1][-1]


DRIFT_TOLERANCE = 100.0
UNSTABLE = ("BacksolveAdjoint: the state re-solved backwards in time departs from the forward solution "
            "(or the backward solve failed), so this problem is unstable backwards in time (stiff or "
            "dissipative) and the gradient would be wrong. Use InterpolatingAdjoint (checkpointing=True "
            "bounds its memory) or QuadratureAdjoint.")


def _warn_unstable(unstable, drift, tolerance):
    if unstable:
        warnings.warn(f"{UNSTABLE} (drift {float(drift):.3g} × tolerance, limit {tolerance:g})", RuntimeWarning,
                      stacklevel=2)


class BacksolveAdjoint(_ContinuousAdjoint):
    """Continuous adjoint that re-solves u backwards with λ and μ (O(1) memory
    per interval). At every saveat time u is reset to the stored forward value
    (SciML's checkpointed backsolve).

    Wrong on problems that are unstable backwards in time (stiff or
    dissipative ones), so it checks itself at no extra cost: where u is reset,
    the u re-solved backwards must match the stored forward value within
    `drift_tolerance` × (atol + rtol |u|) (RMS over states). Beyond it, or when
    the backward solve fails, `on_instability="raise"` (default) raises an
    error recommending InterpolatingAdjoint; `"warn"` warns and returns the
    gradient anyway."""

    stores_interpolation = False
    on_instability: str
    drift_tolerance: float

    def __init__(self, vjp="jax-reverse", on_instability="raise", drift_tolerance=DRIFT_TOLERANCE):
        super().__init__(vjp)
        if on_instability not in ("raise", "warn"):
            raise ValueError(f"BacksolveAdjoint(on_instability=...) must be 'raise' or 'warn', got {on_instability!r}")
        if not drift_tolerance > 0:
            raise ValueError(f"BacksolveAdjoint(drift_tolerance=...) must be positive, got {drift_tolerance!r}")
        self.on_instability = on_instability
        self.drift_tolerance = float(drift_tolerance)

    def backward(self, setup, prods, p, t_from, t_to, dt0, u_start, u_end, interpolation, lam, mu, drift):
        def rhs(t, y, p):
            u, lam, _ = y
            du, vu, vp = prods.vjp(u, p, t, lam)
            return du, -vu, -vp

        def solve():
            sol = setup.diffeqsolve(setup.term(rhs), (u_end, lam, mu), p, t_from, t_to, dt0=-dt0, throw=False)
            scale = setup.atol + setup.rtol * jnp.abs(u_start)
            d = jnp.sqrt(jnp.mean(((sol.ys[0][-1] - u_start) / scale) ** 2))
            d = jnp.where(dfx.is_okay(sol.result), d, jnp.inf)
            return sol.ys[1][-1], sol.ys[2][-1], jnp.maximum(drift, jax.lax.stop_gradient(d))

        # Once unstable, the result is refused: the remaining intervals are not solved (a stiff
        # problem's backward solve can take max_steps in every one of them).
        return jax.lax.cond(drift > self.drift_tolerance, lambda: (lam, mu, drift), solve)

    def check_drift(self, cotangents, drift):
        unstable = drift > self.drift_tolerance
        if self.on_instability == "raise":
            return error_if(cotangents, unstable, UNSTABLE + " Or pass BacksolveAdjoint(on_instability='warn').")
        jax.debug.callback(_warn_unstable, unstable, drift, self.drift_tolerance)
        return cotangents


class InterpolatingAdjoint(_ContinuousAdjoint):
    """Continuous adjoint with u(t) from the forward solution's dense
    interpolation. `checkpointing=False` stores the interpolation of the whole
    forward solve (memory grows with the number of steps, bounded by
    `max_steps`). `checkpointing=True` keeps only u at the checkpoints
    (default: the saveat times) and re-solves each interval with dense output
    during the reverse pass (at most `interval_max_steps` steps each; default
    4 × max_steps / intervals, at least 64), so memory does not grow with the
    horizon."""

    checkpointing: bool
    checkpoints: tuple | None
    interval_max_steps: int | None

    def __init__(self, vjp="jax-reverse", checkpointing=False, checkpoints=None, interval_max_steps=None):
        super().__init__(vjp)
        if checkpoints is not None and not checkpointing:
            raise ValueError("InterpolatingAdjoint(checkpoints=...) needs checkpointing=True")
        self.checkpointing = bool(checkpointing)
        self.checkpoints = None if checkpoints is None else tuple(float(c) for c in np.ravel(checkpoints))
        self.interval_max_steps = None if interval_max_steps is None else int(interval_max_steps)

    @property
    def stores_interpolation(self):
        return not self.checkpointing

    def checkpoint_times(self, setup: Setup) -> np.ndarray:
        if self.checkpoints is None:
            return np.zeros((0,))
        c = np.asarray(self.checkpoints)
        if np.any((c < setup.t0) | (c > setup.t1)):
            raise ValueError(f"checkpoints must lie inside tspan ({setup.t0}, {setup.t1}), got {self.checkpoints}")
        return c

    def backward(self, setup, prods, p, t_from, t_to, dt0, u_start, u_end, interpolation, lam, mu, drift):
        if self.checkpointing:  # re-solve this interval forward with dense output
            max_steps = self.steps_per_interval(setup)
            sol = setup.diffeqsolve(
                setup.term(), u_start, p, t_to, t_from, dense=True, max_steps=max_steps, dt0=dt0, throw=False)
            lam = error_if(lam, jnp.invert(dfx.is_okay(sol.result)),
                               f"InterpolatingAdjoint(checkpointing=True): an interval between checkpoints needed "
                               f"more than interval_max_steps={max_steps} steps; pass a larger "
                               "interval_max_steps or more checkpoints")
            interpolation = sol.interpolation
        return *self._lambda_mu(setup, prods, p, t_from, t_to, dt0, interpolation.evaluate, lam, mu), drift

    def steps_per_interval(self, setup: Setup) -> int:
        """interval_max_steps, or by default 4 × max_steps / intervals (at least 64, at most max_steps)."""
        if self.interval_max_steps is not None:
            return self.interval_max_steps
        intervals = len(setup.breakpoints(self.checkpoint_times(setup))) - 1
        return int(min(setup.max_steps, max(64, 4 * setup.max_steps // intervals)))


class QuadratureAdjoint(_ContinuousAdjoint):
    """Continuous adjoint that solves λ backwards with u from the stored
    interpolation and obtains ∂L/∂p = ∫ λᵀ ∂f/∂p dt as a quadrature along λ's
    steps: μ rides along with the solver's stages but is left out of error
    control, so the step count is set by λ alone (n states, not n + m)."""

    stores_interpolation = True

    def backward(self, setup, prods, p, t_from, t_to, dt0, u_start, u_end, interpolation, lam, mu, drift):
        return *self._lambda_mu(setup, prods, p, t_from, t_to, dt0, interpolation.evaluate, lam, mu,
                                norm=lambda y: optx.rms_norm(y[0])), drift
