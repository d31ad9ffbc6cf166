"""Continuous adjoints: λ' = -(∂f/∂u)ᵀ λ solved backwards, ∂L/∂p = ∫ λᵀ ∂f/∂p dt.

For a loss of the saved states, λ starts at 0 at t1 and jumps by ∂L/∂u(t_k)
at every saveat time t_k. A loss of an integral Q = ∫ g(u, p, t) dt adds its
cotangent w_Q: λ' = -(∂f/∂u)ᵀ λ - (∂g/∂u)ᵀ w_Q and μ' = -(∂f/∂p)ᵀ λ - (∂g/∂p)ᵀ w_Q,
with no state of its own (w_Q is constant between breakpoints). The backward
pass runs interval by interval between breakpoints (t0, the saveat times, the
checkpoints, t1).

With a mass matrix M (M u' = f, a DAE where M is singular), λ solves the adjoint DAE
Mᵀλ' = -(∂f/∂u)ᵀλ - (∂g/∂u)ᵀw_Q by the forward solve's Rosenbrock solver, made consistent at every
breakpoint, and ∂L/∂u0 = Mᵀλ(t0) (`Jumps`; the form is derived in `sciad._dae`).

Every continuous adjoint is one `ContinuousAdjoint` of two pieces: where u(t) comes from on the
way back (an `AbstractSource`: `Stored` interpolation, `Checkpointed` re-solves, or `Backsolved`
with the adjoint) and what is integrated backwards (an `AbstractBackward`: `LambdaMu`, λ and μ, or
`LambdaGauss`, λ with ∂L/∂p by Gauss quadrature). The sensealgs are its constructors.
"""

import abc
from collections.abc import Callable

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

import sciad.ad as ad
from sciad import _dae as dae
from sciad._errors import batch_any, check, error_if, warn_if
from sciad.adjoints import _checkpoints as checkpoints
from sciad.adjoints._base import (
    AbstractSensitivity,
    Members,
    Products,
    Setup,
    checked,
    interpolation_step_bytes,
    normalised,
    plain_forward,
    solver_pushforward,
    stats_vector,
    stored_steps,
)
from sciad.adjoints._loop import GridSteps
from sciad.adjoints._stepping import Marcher


class Recorded(eqx.Module):
    """What a continuous adjoint's forward pass keeps for the backward sweep: u0 (n,), p (m,), the
    breakpoints t (B,) (t0, the save times, checkpoints, t1; unused checkpoints sit at t1), the
    state y = (u, q) there (B, n + k), the stored interpolation of y (None where u is re-solved or
    backsolved), the forward solve's accepted steps (int32), and `again`: whether a stored solve ran
    out of stored steps (None where it cannot)."""

    u0: jax.Array
    p: jax.Array
    t: jax.Array
    u_at: jax.Array
    interpolation: object
    steps: jax.Array
    again: jax.Array | None


class Interval(eqx.Module):
    """What the backward system reads on one interval between breakpoints: p (m,), `u_of` with
    `u_of.evaluate(t)` giving the forward solve's u(t) (n,) (None where u is part of the march's
    state), and `w_q` (k,), the integral's cotangent (Σ ∂L/∂q at the breakpoints after the interval)."""

    p: jax.Array
    u_of: object
    w_q: jax.Array


def adjoint_rhs(prods: Products, u, p, t, lam, w_q):
    """(F, λ', μ') = (F(u, p, t), -(∂f/∂u)ᵀλ - (∂g/∂u)ᵀw_Q, -(∂f/∂p)ᵀλ - (∂g/∂p)ᵀw_Q) at u(t): the
    adjoint equations, for every continuous adjoint (w_Q (k,): the integral's cotangent, k = 0
    without an integrand), with F = [f; g] (n + k,) from the same product."""
    rate, vu, vp = prods.vjp(u, p, t, _with_integral(lam, w_q))
    return rate, -vu, -vp


def _with_integral(lam, w_q):
    """The cotangent of F = [f; g]: (λ, w_Q) (n + k,)."""
    return jnp.concatenate([lam, w_q]) if w_q.shape[0] else lam


def adjoint_jump(lam, w):
    """λ after a breakpoint where the loss has ∂L/∂u = w."""
    return lam + w


class Jumps(eqx.Module):
    """λ after each breakpoint, and ∂L/∂u0 from λ(t0): for u' = f (`mass` None), λ + w and λ; for
    M u' = f, the adjoint DAE's (`sciad._dae`, where the form is derived): Mᵀλ jumps, λ's algebraic
    part solves the adjoint's algebraic equations, ∂L/∂p gains a direct increment, ∂L/∂u0 = Mᵀλ."""

    mass: dae.MassMatrix | None = eqx.field(static=True)

    def after(self, prods: Products, u, p, t, lam, w, w_q) -> tuple:
        """(λ after the breakpoint at t where the loss has ∂L/∂u = w, λ arriving from later times; the
        increment of ∂L/∂p (m,), or None), u = u(t), w_Q the integral's cotangent before t."""
        if self.mass is None:
            return adjoint_jump(lam, w), None
        zero = jnp.zeros_like(w_q)
        return dae.adjoint_jump(
            self.mass,
            lam,
            w,
            lambda v: prods.vjp(u, p, t, _with_integral(v, zero))[1:],
            lambda lam: prods.vjp(u, p, t, _with_integral(lam, w_q))[1],
        )

    def cotangent_u0(self, lam):
        """∂L/∂u0 from λ(t0)."""
        return lam if self.mass is None else dae.cotangent_u0(self.mass, lam)


# --- what is integrated backwards ----------------------------------------------------------------


class AbstractBackward(eqx.Module):
    """What a continuous adjoint integrates backwards from t1, given u(t): its adjoint state z (λ
    first), where losses and events enter it (λ's equation `adjoint_rhs`, λ itself at breakpoints:
    `lam`, `with_lam`) and what is integrated besides z along the steps (`quadrature`)."""

    @abc.abstractmethod
    def start(self, lam, p):
        """z at t1 from λ(t1) (n,) and p (m,)."""

    @abc.abstractmethod
    def mass(self, lam_mass, p) -> tuple:
        """z's mass matrix in parts (`sciad._dae.with_mass`'s blocks) from λ's, `lam_mass` (Mᵀ)."""

    @abc.abstractmethod
    def rhs(self, prods: Products, t, z, u, p, w_q) -> tuple:
        """(F(u, p, t) (n + k,), dz/dt) at u = u(t) (F: the same product's primal)."""

    @abc.abstractmethod
    def noise(self, vu, vp):
        """An SDE's noise part of dz/dt from λᵀ∂(σ dW)/∂u (n,) and λᵀ∂(σ dW)/∂p (m,) (rhs's sign)."""

    @abc.abstractmethod
    def lam(self, z):
        """λ (n,) in z."""

    @abc.abstractmethod
    def with_lam(self, z, lam):
        """z with λ replaced by `lam` (a jump at a breakpoint)."""

    @abc.abstractmethod
    def error_control(self) -> Callable | None:
        """z -> the parts of z the step-size control sees (a tuple), or None for all of z."""

    @abc.abstractmethod
    def quadrature(self, setup: Setup, prods: Products) -> tuple | None:
        """None, or (q(t1) from p, `add(q, t_start, t_end, at, args) -> q`): what each accepted step
        from t_start back to t_end adds to the quadrature, `at(t) -> (u(t), z(t))` inside the step."""

    @abc.abstractmethod
    def gradients(self, z, quadrature) -> tuple:
        """(∂L/∂u0, ∂L/∂p) from z and the quadrature at t0."""


class LambdaMu(AbstractBackward):
    """z = (λ, μ), μ' = -(∂f/∂p)ᵀλ accumulating ∂L/∂p; `seminorm`: μ out of the error control
    (Kidger et al. 2021)."""

    seminorm: bool

    def start(self, lam, p):
        return lam, jnp.zeros_like(p)

    def mass(self, lam_mass, p):
        return lam_mass, p.shape[0]

    def rhs(self, prods, t, z, u, p, w_q):
        rate, vu, vp = adjoint_rhs(prods, u, p, t, z[0], w_q)
        return rate, (vu, vp)

    def noise(self, vu, vp):
        return -vu, -vp

    def lam(self, z):
        return z[0]

    def with_lam(self, z, lam):
        return lam, z[1]

    def error_control(self):
        return (lambda z: z[:1]) if self.seminorm else None

    def quadrature(self, setup, prods):
        return None

    def gradients(self, z, quadrature):
        return z


class LambdaGauss(AbstractBackward):
    """z = λ alone; ∂L/∂p = ∫ λᵀ∂f/∂p dt by Gauss–Legendre quadrature on each accepted step (λ at the
    nodes from the step's dense output): μ is in neither the solver's stages nor its error control."""

    def start(self, lam, p):
        return lam

    def mass(self, lam_mass, p):
        return lam_mass

    def rhs(self, prods, t, lam, u, p, w_q):
        rate, vu, _ = adjoint_rhs(prods, u, p, t, lam, w_q)
        return rate, vu

    def noise(self, vu, vp):
        return -vu

    def lam(self, lam):
        return lam

    def with_lam(self, lam, new):
        return new

    def error_control(self):
        return None

    def quadrature(self, setup, prods):
        nodes, weights = np.polynomial.legendre.leggauss(_gauss_nodes(setup))
        noisy = getattr(setup.f, "noise_pullback", None)  # an SDE's noise

        def add(mu, t_start, t_end, at, args):
            ts = t_end + (t_start - t_end) * jnp.asarray((nodes + 1) / 2, mu.dtype)

            def vp_at(t):
                u, lam = at(t)
                return -adjoint_rhs(prods, u, args.p, t, lam, args.w_q)[2]

            vp = jax.vmap(vp_at)(ts)
            mu = mu + (t_start - t_end) / 2 * jnp.tensordot(jnp.asarray(weights, mu.dtype), vp, axes=1)
            return mu if noisy is None else mu + _noise_quadrature(noisy, setup.f.path, at, args.p, t_start, t_end)

        return jnp.zeros_like, add

    def gradients(self, lam, mu):
        return lam, mu


def _noise_quadrature(noise_pullback: Callable, path, at, p, t_start, t_end):
    """An SDE's ∫ λᵀ∂σ/∂p ∘dW over the step from t_start back to t_end (`at(t) -> (u(t), λ(t))`): the
    trapezoid, the Stratonovich integral's consistent quadrature."""
    dW = path.evaluate(t_end, t_start)

    def at_end(t):
        u, lam = at(t)
        return noise_pullback(u, p, t, dW, lam)[2]

    return 0.5 * (at_end(t_start) + at_end(t_end))


def _adjoint_noise(noise_pullback: Callable, source: "AbstractSource", backward: AbstractBackward) -> Callable:
    """The adjoint SDE's noise term in the march's state: noise(t, y, args, dW) (rhs's sign), u's own noise
    σ dW where u is part of the state."""

    def noise(t, y, args, dW):
        z = source.adjoint(y)
        value, vu, vp = noise_pullback(source.u(t, y, args), args.p, t, dW, backward.lam(z))
        return source.state(value, backward.noise(vu, vp))

    return noise


def _gauss_nodes(setup: Setup) -> int:
    """Gauss–Legendre nodes per step: k nodes integrate degree 2k - 1 exactly, k from the solver's order."""
    order = setup.solver.order(setup.term()) or 4
    return max(2, (order + 2) // 2)


# --- where u comes from --------------------------------------------------------------------------


class AbstractSource(eqx.Module):
    """Where the backward sweep gets u(t) from: what the forward pass keeps (`record`), how u sits
    in the march's state y (`state`, `adjoint`, `u`, `norm`), how one interval is crossed (`cross`,
    from `args_structure`, with what this source tracks over the sweep, from `initial_carry`) and
    what the sweep's outcome means (`verdict`)."""

    stores_interpolation: eqx.AbstractClassVar[bool]  # the forward pass keeps a dense interpolation

    @abc.abstractmethod
    def record(self, setup: Setup, u0, p) -> tuple:
        """(us (T, n), stats (3,) int32, `Recorded`): the forward pass of a differentiated solve."""

    @abc.abstractmethod
    def crossing(self, setup: Setup, rec: Recorded, sweep: Callable):
        """`sweep(source, rec)`, the backward sweep with `source` crossing the intervals of `rec`: this
        one, or where `rec` says it cannot serve, the source it falls back on with what that keeps."""

    @abc.abstractmethod
    def state(self, u, z):
        """The march's state y from u and the adjoint state z (and its rate from u' and z')."""

    @abc.abstractmethod
    def adjoint(self, y):
        """The adjoint state z in the march's state y."""

    @abc.abstractmethod
    def u(self, t, y, args: Interval):
        """u(t) (n,) on the interval being crossed, the march at state y."""

    @abc.abstractmethod
    def norm(self, parts: Callable | None) -> Callable | None:
        """The step-size control's norm of y, seeing what `parts(z)` keeps of z (None: all of y)."""

    @abc.abstractmethod
    def args_structure(self, setup: Setup, rec: Recorded) -> Interval:
        """The `Interval` of the last interval, or its structure (what the march starts from)."""

    @abc.abstractmethod
    def initial_carry(self, dtype):
        """What this source tracks over the sweep, at t1."""

    @abc.abstractmethod
    def cross(self, setup: Setup, advance: Callable, march, carry, rec: Recorded, j, w_q) -> tuple:
        """(march at t[j], carry) from the march at t[j + 1] > t[j], with the integral's cotangent `w_q`
        (k,) there; `advance(march, args, t_to, max_steps)` steps the march back to t_to."""

    @abc.abstractmethod
    def verdict(self, setup: Setup, cotangents, march, carry):
        """`cotangents` (∂L/∂u0, ∂L/∂p), checked against the march at t0 and the carry: a failed
        backward solve raises."""


class AbstractInterpolated(AbstractSource):
    """u(t) from a dense interpolation of the forward solve (stored, or re-solved on each interval);
    the march's state is the adjoint state alone."""

    def state(self, u, z):
        return z

    def adjoint(self, y):
        return y

    def u(self, t, y, args):
        return args.u_of.evaluate(t)  # pyright: ignore[reportAttributeAccessIssue]  # an interpolation: diffrax's

    def norm(self, parts):
        return None if parts is None else lambda y: optx.rms_norm(parts(y))

    def initial_carry(self, dtype):
        return None

    def verdict(self, setup, cotangents, march, carry):
        # A failed backward solve (out of steps between two breakpoints, or the solver's own failure) raises.
        return checked(setup, march.result, cotangents)


class _Held(eqx.Module):
    """u(t) (n,) from an interpolation of y = (u, q), held at the ends of [t_to, t_from] (implicit
    solvers evaluate stages slightly past the interval, where an interpolation is undefined)."""

    interpolation: object
    t_to: jax.Array
    t_from: jax.Array
    n: int = eqx.field(static=True)

    def evaluate(self, t):
        return self.interpolation.evaluate(jnp.clip(t, self.t_to, self.t_from))[: self.n]  # pyright: ignore[reportAttributeAccessIssue]  # an interpolation: diffrax's


INTERVAL_STEPS = 128  # re-solved steps per interval with checkpoints by step count (one every 64), at most
CHECKPOINT_SLOTS = 64  # checkpoints per level of re-solves (checkpoints by step count)


class Checkpointed(AbstractInterpolated):
    """u kept at checkpoints and re-solved on each interval between them, with dense output, during
    the backward sweep, in at most `interval_max_steps` steps. By default (`checkpoints=None`) the
    checkpoints go by step count, every `interval_max_steps // 2` accepted steps (default
    `INTERVAL_STEPS` = 128, fewer where 128 dense steps exceed `STORED_BYTES`: `stored_steps`), in
    levels of at most `CHECKPOINT_SLOTS` (64) each: the forward solve keeps u every
    k·64^(L-1) steps, and on the way back each such interval is re-solved keeping u every
    k·64^(L-2) steps, and so on down to the dense re-solves. L grows as log₆₄(max_steps / k) (1 up to
    64k steps, 2 up to 4,096k): memory is L × 128 states plus one interval's dense steps, however large
    `max_steps` is, and a solve of S steps re-solves about L × S steps. Given `checkpoints` (times), u
    is kept there and at the saveat times, and `interval_max_steps` defaults to 4 × max_steps /
    intervals (at least 64, at most max_steps)."""

    stores_interpolation = False
    checkpointing = True
    checkpoints: tuple | None
    interval_max_steps: int | None

    def steps_per_interval(self, setup: Setup) -> int:
        """interval_max_steps, or by default `INTERVAL_STEPS` (at most `STORED_BYTES` of dense steps)
        with checkpoints by step count, and 4 × max_steps / intervals (at least 64, at most max_steps)
        with checkpoint times given."""
        if self.interval_max_steps is not None:
            return self.interval_max_steps
        if self.checkpoints is None:
            step_bytes = interpolation_step_bytes(
                setup.solver, setup.n + setup.f.integrand_size, jnp.dtype(setup.f.u.dtype).itemsize
            )
            return min(INTERVAL_STEPS, stored_steps(setup.max_steps, step_bytes))
        intervals = len(setup.breakpoints(_checkpoint_times(setup, self.checkpoints))) - 1
        return int(min(setup.max_steps, max(64, 4 * setup.max_steps // intervals)))

    def strides(self, setup: Setup) -> tuple[int, ...]:
        """The accepted steps between checkpoints at each level, outermost (the forward solve's) first:
        the innermost `steps_per_interval // 2`, each outer one `CHECKPOINT_SLOTS` times the next,
        as many as cover `max_steps` (checkpoints by step count)."""
        strides = [max(1, self.steps_per_interval(setup) // 2)]
        while strides[0] * CHECKPOINT_SLOTS < setup.max_steps:
            strides.insert(0, strides[0] * CHECKPOINT_SLOTS)
        return tuple(strides)

    def record(self, setup, u0, p):
        if self.checkpoints is not None:
            bps = setup.breakpoints(_checkpoint_times(setup, self.checkpoints))
            return _record_at_breakpoints(setup, u0, p, bps, dense=False)
        t, u_at, stats = checkpoints.forward(setup, u0, p, self.strides(setup)[0])
        return u_at[setup.saved(t)], stats, Recorded(u0, p, t, u_at, None, stats[1], None)

    def crossing(self, setup, rec, sweep):
        return sweep(self, rec)

    def args_structure(self, setup, rec):
        t = rec.t.astype(rec.u0.dtype)
        return eqx.filter_eval_shape(
            lambda: Interval(
                rec.p,
                _Held(
                    self._resolved(setup, rec.p, t[-1], t[-2], rec.u_at[-2], t[-1] - t[-2])[0], t[-2], t[-1], setup.n
                ),
                _no_integral(setup, rec),
            )
        )

    def cross(self, setup, advance, march, carry, rec, j, w_q):
        strides = self.strides(setup) if self.checkpoints is None else (self.steps_per_interval(setup) // 2,)
        return self._cross(setup, advance, march, carry, rec.p, rec.t.astype(rec.u0.dtype), rec.u_at, j, w_q, strides)

    def _cross(self, setup, advance, march, carry, p, t, u_at, j, w_q, strides):
        """The march across [t[j], t[j + 1]], an interval of at most `strides[0]` accepted steps (twice
        that with the margin re-solves take) starting from u_at[j]: re-solved with dense output
        (one stride left), or re-solved keeping checkpoints every `strides[1]` steps, whose intervals
        are crossed in turn."""
        t_from, t_to = t[j + 1], t[j]

        def resolve_and_march():
            interpolation, ok = self._resolved(setup, p, t_from, t_to, u_at[j], jnp.minimum(march.dt, t_from - t_to))
            checked_march = error_if(
                march,
                jnp.invert(ok),
                "a continuous adjoint's checkpointing: an interval between checkpoints "
                f"needed more than interval_max_steps={self.steps_per_interval(setup)} steps; pass the sensealg a "
                "larger interval_max_steps or more checkpoints",
            )
            args = Interval(p, _Held(interpolation, t_to, t_from, setup.n), w_q)
            return advance(checked_march, args, t_to, setup.max_steps), carry

        def recheckpoint_and_march():
            sub_t, sub_u, ok = _checkpointed_interval(
                setup, p, t_to, t_from, u_at[j], strides[1], 2 * strides[0], jnp.minimum(march.dt, t_from - t_to)
            )
            checked_march = error_if(
                march,
                jnp.invert(ok),
                "a continuous adjoint's checkpointing: re-solving an interval between checkpoints failed",
            )

            def interval(c):
                i, m, watched = c
                i = jnp.maximum(i, 0)  # under vmap, members done cross their first interval again, discarded
                m, watched = self._cross(setup, advance, m, watched, p, sub_t, sub_u, i, w_q, strides[1:])
                return i - 1, m, watched

            last = jnp.searchsorted(sub_t, sub_t[-1])
            _, m, watched = jax.lax.while_loop(lambda c: c[0] >= 0, interval, (last - 1, checked_march, carry))
            return m, watched

        # Zero-length intervals (unused checkpoints, a save time at t0 or t1) are not re-solved.
        cross = resolve_and_march if len(strides) == 1 else recheckpoint_and_march
        return jax.lax.cond(t_from > t_to, cross, lambda: (march, carry))

    def _resolved(self, setup, p, t_from, t_to, u_start, dt0):
        """(interpolation, ok): this interval re-solved forward from u_start with dense output."""
        sol = setup.diffeqsolve(
            setup.term(),
            u_start,
            p,
            t_to,
            t_from,
            dense=True,
            max_steps=self.steps_per_interval(setup),
            dt0=dt0,
            throw=False,
        )
        return sol.interpolation, dfx.is_okay(sol.result)


def _checkpointed_interval(setup: Setup, p, t_to, t_from, y_start, every: int, max_steps: int, dt0):
    """(t (B,), y (B, n + k), ok): [t_to, t_from] re-solved from y_start keeping y every `every` accepted
    steps, in at most `max_steps` steps; unused checkpoints sit at t_from with y(t_from) (B = 2 +
    max_steps // every)."""
    sol = setup.diffeqsolve(
        setup.term(),
        y_start,
        p,
        t_to,
        t_from,
        ts=jnp.stack([t_to, t_from]),
        steps=every,
        max_steps=max_steps,
        dt0=dt0,
        throw=False,
    )
    unused = jnp.isinf(sol.ts)  # pyright: ignore[reportArgumentType]  # saved: not None
    y1 = sol.ys[jnp.sum(~unused) - 1]  # pyright: ignore[reportOptionalSubscript]  # saved: not None
    t = jnp.where(unused, t_from, sol.ts)  # pyright: ignore[reportArgumentType]  # saved: not None
    return t, jnp.where(unused[:, None], y1, sol.ys), dfx.is_okay(sol.result)  # pyright: ignore[reportArgumentType]  # saved: not None


class Stored(AbstractInterpolated):
    """u(t) from the stored dense interpolation of the whole forward solve, up to `STORED_STEPS`
    steps and `STORED_BYTES` (2 MiB, at least `MIN_STORED` steps: the buffer is allocated and filled
    at its full size on every call, so it is kept small; see `sciad.adjoints._base`). A solve that
    takes more (a `max_steps` raised above it, a large state) finishes without dense output, and the
    backward pass runs `fallback`'s forward pass (checkpoints in levels) and sweep instead, inside a
    `lax.cond`: their buffers cost nothing where the stored steps serve, and the cost follows the
    steps taken, not `max_steps`."""

    stores_interpolation = True
    checkpointing = False
    checkpoints = None
    fallback: Checkpointed

    @property
    def interval_max_steps(self) -> int | None:
        return self.fallback.interval_max_steps

    def record(self, setup, u0, p):
        stored = stored_steps(
            setup.max_steps, interpolation_step_bytes(setup.solver, u0.size + setup.f.integrand_size, u0.dtype.itemsize)
        )
        bps = setup.breakpoints()
        if stored == setup.max_steps:
            return _record_at_breakpoints(setup, u0, p, bps, dense=True)
        # Every step stored up to `stored`; past it (any member of a vmap batch), the solve again
        # without dense output, and the sweep re-solves from checkpoints (`crossing`).
        sol = setup.forward(u0, p, ts=bps, dense=True, max_steps=stored, throw=False)
        again = batch_any(sol.result == dfx.RESULTS.max_steps_reached)

        def plain():
            whole = setup.forward(u0, p, ts=bps)
            return whole.ys, stats_vector(whole)

        ys, stats = jax.lax.cond(again, plain, lambda: (checked(setup, sol.result, sol.ys), stats_vector(sol)))
        return ys[setup.saved(bps)], stats, Recorded(u0, p, bps, ys, sol.interpolation, stats[1], again)

    def crossing(self, setup, rec, sweep):
        # Where the forward pass ran out of stored steps (any member of a vmap batch), the fallback's
        # forward pass (its checkpoints) and its re-solving sweep: their buffers exist only in this branch.
        if rec.again is None:
            return sweep(self, rec)

        def again():
            return sweep(self.fallback, self.fallback.record(setup, rec.u0, rec.p)[2])

        return jax.lax.cond(batch_any(rec.again), again, lambda: sweep(self, rec))

    def args_structure(self, setup, rec):
        t = rec.t.astype(rec.u0.dtype)
        return Interval(rec.p, _Held(rec.interpolation, t[-2], t[-1], setup.n), _no_integral(setup, rec))

    def cross(self, setup, advance, march, carry, rec, j, w_q):
        t = rec.t.astype(rec.u0.dtype)
        args = Interval(rec.p, _Held(rec.interpolation, t[j], t[j + 1], setup.n), w_q)
        return advance(march, args, t[j], setup.max_steps), carry


# BacksolveAdjoint's self-check, set on a calibration corpus (tests/helpers/backsolve_corpus.py) and tested on a
# held-out one (tests/helpers/backsolve_heldout.py); experiments/backsolve_calibration.py prints the margins.
# The drift allowed per forward step, in tolerances (`Backsolved.drift`): right gradients reach
# 83 and wrong ones start at 1650 in the calibration corpus (held out: 108 and 3800); and the backward
# steps per forward step (+ 8) after which an interval is refused (stiff backwards; right gradients
# take at most 1.4 in both).
DRIFT_TOLERANCE = 300.0
BACKWARD_STEPS = 4
UNSTABLE = (
    "BacksolveAdjoint: the state re-solved backwards in time departs from the forward solution "
    f"(or the backward solve failed, or took more than {BACKWARD_STEPS} steps per forward step), so this problem is "
    "unstable backwards in time (stiff or dissipative) and the gradient would be wrong. Use "
    "InterpolatingAdjoint (checkpointing=True bounds its memory) or GaussAdjoint."
)


class Backsolved(AbstractSource):
    """u re-solved backwards with the adjoint state, y = (u, z), and reset to the stored forward
    value at every breakpoint; checked by its drift (see `BacksolveAdjoint`), which it carries over
    the sweep: the largest so far, in tolerances per forward step."""

    stores_interpolation = False
    on_instability: str
    drift_tolerance: float

    def record(self, setup, u0, p):
        return _record_at_breakpoints(setup, u0, p, setup.breakpoints(), dense=False)

    def crossing(self, setup, rec, sweep):
        return sweep(self, rec)

    def state(self, u, z):
        return u, z

    def adjoint(self, y):
        return y[1]

    def u(self, t, y, args):
        return y[0]

    def norm(self, parts):
        return None if parts is None else lambda y: optx.rms_norm((y[0], *parts(y[1])))

    def args_structure(self, setup, rec):
        return Interval(rec.p, None, _no_integral(setup, rec))

    def initial_carry(self, dtype):
        return jnp.zeros((), dtype)

    def cross(self, setup, advance, march, drift, rec, j, w_q):
        def solve():
            budget = jnp.minimum(BACKWARD_STEPS * (rec.steps + 8), setup.max_steps)
            m = advance(march, Interval(rec.p, None, w_q), rec.t[j], budget)
            d = _largest(
                setup.members,
                lambda *u: self.drift(setup, *u, rec.steps),  # pyright: ignore[reportCallIssue]  # u: the state's parts
                m.y[0],
                rec.u_at[j, : setup.n],
                rec.u_at[j + 1, : setup.n],
            )
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
        return rms((u_back - u_at) / scale) / jnp.maximum(steps, 1).astype(u_at.dtype)

    def verdict(self, setup, cotangents, march, drift):
        # A failed backward solve reports itself through the drift (inf).
        unstable = drift > self.drift_tolerance
        if self.on_instability == "raise":
            return error_if(cotangents, unstable, UNSTABLE + " Or pass BacksolveAdjoint(on_instability='warn').")
        return warn_if(
            cotangents,
            unstable,
            f"{UNSTABLE} (drift {{:.3g}} tolerances per forward step, limit {self.drift_tolerance:g})",
            drift,
        )


def _largest(members: Members | None, fn, *us):
    """fn(*us) of states u (n,); for a batch as one state (`members`), the largest over its members."""
    if members is None:
        return fn(*us)
    return jnp.max(jax.vmap(fn)(*(u.reshape(members.size, members.n) for u in us)))


def _no_integral(setup: Setup, rec: Recorded):
    """A zero cotangent of the integral (k,)."""
    return jnp.zeros((setup.f.integrand_size,), rec.u_at.dtype)


def _checkpoint_times(setup: Setup, times: tuple) -> jax.Array:
    c = jnp.asarray(times, jnp.result_type(setup.ts))
    return check(c, jnp.any((c < setup.t0) | (c > setup.t1)), f"checkpoints must lie inside tspan, got {times}")


def _record_at_breakpoints(setup: Setup, u0, p, bps, *, dense: bool):
    """The forward pass saving u at the breakpoints `bps` (with the dense interpolation if `dense`)."""
    sol = setup.forward(u0, p, ts=bps, dense=dense)
    stats = stats_vector(sol)
    return (
        sol.ys[setup.saved(bps)],  # pyright: ignore[reportOptionalSubscript]  # saved: not None
        stats,
        Recorded(u0, p, bps, sol.ys, sol.interpolation if dense else None, stats[1], None),  # pyright: ignore[reportArgumentType]  # saved: not None
    )


# --- the sensealg --------------------------------------------------------------------------------


class ContinuousAdjoint(AbstractSensitivity):
    """A continuous adjoint: `backward` (what is integrated backwards) solved from t1 to t0 with u(t)
    from `source` (where u comes from); `vjp` is the engine for the vector-Jacobian products
    λᵀ∂f/∂u, λᵀ∂f/∂p. The sensealgs' options read the pieces.

    One `Marcher` runs the whole sweep: it steps the march to each breakpoint, where λ jumps (and
    where the source resets u, u is reset), and continues with the same solver state and step size."""

    vjp: ad.AbstractBackend
    source: AbstractSource
    backward: AbstractBackward

    @property
    def stores_interpolation(self) -> bool:
        return self.source.stores_interpolation

    @property
    def checkpointing(self) -> bool:
        return self.source.checkpointing  # pyright: ignore[reportAttributeAccessIssue]  # where the source has it

    @property
    def checkpoints(self) -> tuple | None:
        return self.source.checkpoints  # pyright: ignore[reportAttributeAccessIssue]  # where the source has it

    @property
    def interval_max_steps(self) -> int | None:
        return self.source.interval_max_steps  # pyright: ignore[reportAttributeAccessIssue]  # where the source has it

    @property
    def on_instability(self) -> str:
        return self.source.on_instability  # pyright: ignore[reportAttributeAccessIssue]  # where the source has it

    @property
    def drift_tolerance(self) -> float:
        return self.source.drift_tolerance  # pyright: ignore[reportAttributeAccessIssue]  # where the source has it

    @property
    def seminorm(self) -> bool:
        return self.backward.seminorm  # pyright: ignore[reportAttributeAccessIssue]  # where the source has it

    def refusal(self, setup: Setup) -> str | None:
        if setup.f.driving() and not isinstance(setup.stepsize_controller, GridSteps):
            return (
                f"sensealg={type(self).__name__} solves the adjoint SDE on a fixed grid (backward steps of its "
                "own would not meet the forward steps the stored path interpolates between): pass dt0=..., or "
                "sensealg=sciad.DiscreteAdjoint() or sciad.ForwardDiffSensitivity() for adaptive steps"
            )
        return super().refusal(setup)

    def forward(self, setup: Setup, u0, p, active):
        if active is None:
            return plain_forward(setup, u0, p)
        return self.source.record(setup, u0, p)

    def pullback(self, setup: Setup, rec: Recorded, w):
        """The backward sweep of the cotangent w divided by its largest entry, scaled back: the adjoint
        systems are linear in w, and their error control (relative to λ's own size) then does not
        depend on the loss's scale."""
        scale, w = normalised(w)
        cotangents = self.source.crossing(setup, rec, lambda source, rec: self._sweep(setup, rec, w, source))
        return jax.tree.map(lambda g: g * scale, cotangents)

    def pullback_batch(self, setup: Setup, rec: Recorded, axes: Recorded, w, size: int):
        """The batch's members as one state (`Setup.batched`): one backward sweep, its steps held to
        the largest of the members' errors, p's cotangent one sum over the batch at every product.
        Where the members kept their own interpolations or checkpoint times, the batch's u is recorded
        again, as one state, first (one forward solve: the members' own cost more to read). For
        explicit solvers without a mass matrix, and JAX engines."""
        n = setup.n
        if not self.vjp.traced or setup.implicit or setup.consistent or dae.solver_mass(setup.solver, n) is not None:
            return None
        members, batched = Members(size, n, setup.f.integrand_size, None), setup.batched(size)  # pyright: ignore[reportArgumentType]  # no norm read here

        def each(x, batched):
            return x if batched else jnp.broadcast_to(x, (size, *x.shape))

        u0 = each(rec.u0, axes.u0).reshape(-1)
        if rec.interpolation is not None or axes.t:
            batch = self.source.record(batched, u0, rec.p)[2]
        else:
            u_at = members.flat(jnp.swapaxes(each(rec.u_at, axes.u_at), 0, 1))
            batch = Recorded(u0, rec.p, rec.t, u_at, None, jnp.max(rec.steps), None)
        g_u0, g_p = self.pullback(batched, batch, members.flat(jnp.swapaxes(w, 0, 1)))
        return g_u0.reshape(size, n), g_p

    def pushforward(self, setup: Setup, rec: Recorded, du0, dp):
        return solver_pushforward(setup, rec.u0, rec.p, du0, dp)

    def _sweep(self, setup: Setup, rec: Recorded, w, source: AbstractSource):
        """(∂L/∂u0, ∂L/∂p) from `rec`, with u from `source`. Breakpoints after the first at t1 (unused
        checkpoints: zero-length intervals) are not walked."""
        n = rec.u0.shape[0]
        jumps = jnp.zeros((len(rec.t), w.shape[1]), w.dtype).at[setup.saved(rec.t)].add(w)
        w_q = jnp.cumsum(jumps[::-1, n:], axis=0)[::-1]  # the integral's cotangent after each breakpoint
        t = rec.t.astype(rec.u0.dtype)
        last = jnp.searchsorted(t, t[-1])
        march_setup = setup.backward()  # with a mass matrix M: u's M, λ's Mᵀ (the adjoint DAE), the rest's identity
        prods, backward = Products(march_setup.f, self.vjp), self.backward
        mass = dae.solver_mass(setup.solver, n)
        jumps_at = Jumps(mass)

        def rhs(t, y, args):
            rate, dz = backward.rhs(prods, t, source.adjoint(y), source.u(t, y, args), args.p, args.w_q)
            return source.state(rate[:n], dz)

        noisy = getattr(march_setup.f, "noise_pullback", None)  # an SDE's noise: the adjoint SDE's noise term
        noise = None if noisy is None else _adjoint_noise(noisy, source, backward)

        if mass is not None:
            blocks = jax.tree.leaves(source.state(mass.matrix, backward.mass(mass.transposed, rec.p)))
            march_setup = eqx.tree_at(lambda s: s.solver, setup, dae.with_mass(setup.solver, blocks))
        norm = source.norm(backward.error_control())
        if setup.members is not None:  # a batch as one state: u and λ are the members', the rest (μ) shared
            shapes = jax.eval_shape(
                lambda u, p: source.state(u, backward.start(u, p)),
                jax.ShapeDtypeStruct((1,), w.dtype),
                jax.ShapeDtypeStruct((2,), w.dtype),
            )
            own = jax.tree.map(lambda x: x.shape == (1,), shapes)
            norm = setup.members.largest(norm or setup.members.norm, own)
        marcher = Marcher(march_setup, rhs, norm, noise)
        quadrature = backward.quadrature(march_setup, prods)

        def advance(march, args, t_to, max_steps):
            def on_step(q, t_start, t_end, y_of):  # y_of: the march's state inside the step
                def at(t):
                    y = y_of.evaluate(t)
                    return source.u(t, y, args), source.adjoint(y)

                return quadrature[1](q, t_start, t_end, at, args)  # pyright: ignore[reportOptionalSubscript]  # on_step: with a quadrature

            return marcher.advance(march, args, t_to, max_steps, None if quadrature is None else on_step)

        # The forward pass's mean step is the first one tried: no step-size search.
        dt0 = (setup.t1 - setup.t0) / jnp.maximum(rec.steps, 1).astype(rec.u0.dtype)
        # `direct`: what the jumps add to ∂L/∂p themselves (None without a mass matrix).
        lam1, direct = jumps_at.after(
            prods, rec.u_at[last, :n], rec.p, t[last], jnp.zeros((n,), w.dtype), jumps[last, :n], w_q[last]
        )
        y1 = source.state(rec.u_at[last, :n], backward.start(lam1, rec.p))
        march = marcher.start(
            y1, source.args_structure(setup, rec), t[-1], dt0, None if quadrature is None else quadrature[0](rec.p)
        )

        def interval(carry):
            j, march, watched, direct = carry
            j = jnp.maximum(j, 0)  # under vmap, members done walk their first interval again, discarded
            march, watched = source.cross(setup, advance, march, watched, rec, j, w_q[j + 1])
            z = source.adjoint(march.y)
            lam, more = jumps_at.after(prods, rec.u_at[j, :n], rec.p, t[j], backward.lam(z), jumps[j, :n], w_q[j])
            z = backward.with_lam(z, lam)
            return j - 1, march.jumped(source.state(rec.u_at[j, :n], z)), watched, _added(direct, more)

        _, march, watched, direct = jax.lax.while_loop(
            lambda carry: carry[0] >= 0, interval, (last - 1, march, source.initial_carry(w.dtype), direct)
        )
        g_u0, g_p = backward.gradients(source.adjoint(march.y), march.quadrature)
        return source.verdict(setup, (jumps_at.cotangent_u0(g_u0), _added(g_p, direct)), march, watched)


def _added(x, y):
    """x + y, or x where y is None."""
    return x if y is None else x + y


def _interpolated(name: str, checkpointing, checkpoints, interval_max_steps) -> AbstractInterpolated:
    """The source of `name`'s checkpointing options, checked: `Checkpointed`, or `Stored` falling back on it."""
    if checkpoints is not None and not checkpointing:
        raise ValueError(f"{name}(checkpoints=...) needs checkpointing=True")
    if interval_max_steps is not None and not int(interval_max_steps) >= 2:
        raise ValueError(f"{name}(interval_max_steps=...) must be at least 2, got {interval_max_steps!r}")
    interval_max_steps = None if interval_max_steps is None else int(interval_max_steps)
    if not checkpointing:
        return Stored(Checkpointed(None, interval_max_steps))  # pyright: ignore[reportCallIssue]  # equinox fields read as properties
    return Checkpointed(  # pyright: ignore[reportCallIssue]  # equinox fields read as properties
        None if checkpoints is None else tuple(float(c) for c in np.ravel(checkpoints)), interval_max_steps
    )


class InterpolatingAdjoint(ContinuousAdjoint):
    """Continuous adjoint solving (λ, μ) backwards with u(t) from a dense interpolation of the
    forward solve. `seminorm=True` leaves μ out of the error control (Kidger et al. 2021):
    λ alone (n values) sets the steps.

    `checkpointing=False` stores the interpolation of the whole forward solve (`Stored`: up to
    `STORED_STEPS` steps and `STORED_BYTES`, then checkpoints); `checkpointing=True` keeps u at
    `checkpoints` (times; default: every `interval_max_steps // 2` accepted steps) and re-solves
    each interval between them during the reverse pass (`Checkpointed`)."""

    def __init__(
        self, vjp="jax-reverse", checkpointing=False, checkpoints=None, interval_max_steps=None, seminorm=False
    ):
        self.vjp = ad.get(vjp)
        self.source = _interpolated("InterpolatingAdjoint", checkpointing, checkpoints, interval_max_steps)
        self.backward = LambdaMu(bool(seminorm))


def QuadratureAdjoint(
    vjp="jax-reverse", checkpointing=False, checkpoints=None, interval_max_steps=None
) -> InterpolatingAdjoint:
    """SciMLSensitivity's name for λ solved backwards with ∂L/∂p = ∫ λᵀ ∂f/∂p dt as a quadrature
    along λ's steps, the parameter integral left out of the error control (its steps set by λ
    alone, n values, not n + m): `InterpolatingAdjoint(seminorm=True)` with the same checkpointing
    options, which is what it returns (λ's own quadrature nodes: `GaussAdjoint`)."""
    return InterpolatingAdjoint(vjp, checkpointing, checkpoints, interval_max_steps, seminorm=True)


class GaussAdjoint(ContinuousAdjoint):
    """Continuous adjoint that solves λ alone backwards (n values; u(t) from the forward
    interpolation, with InterpolatingAdjoint's checkpointing options) and integrates
    ∂L/∂p = ∫ λᵀ ∂f/∂p dt by Gauss–Legendre quadrature on each accepted λ step, as
    SciMLSensitivity's GaussAdjoint: μ is in neither the solver's stages nor its error
    control. Each step costs one more batched VJP at the quadrature nodes (λ there from the
    step's own dense output)."""

    def __init__(self, vjp="jax-reverse", checkpointing=False, checkpoints=None, interval_max_steps=None):
        self.vjp = ad.get(vjp)
        self.source = _interpolated("GaussAdjoint", checkpointing, checkpoints, interval_max_steps)
        self.backward = LambdaGauss()


class BacksolveAdjoint(ContinuousAdjoint):
    """Continuous adjoint that re-solves u backwards with λ and μ (O(1) memory
    per interval). At every saveat time u is reset to the stored forward value
    (SciML's checkpointed backsolve). `seminorm=True` leaves μ out of the error
    control (Kidger et al. 2021): the steps are set by (u, λ), 2n values, not 2n + m.

    Wrong on problems that are unstable backwards in time (stiff or
    dissipative ones), so it checks itself at no extra cost. The signal is
    exponential departure: where u is reset, the u re-solved backwards ends
    some drift from the stored forward value, measured in the tolerances the
    forward solve holds at the interval's ends (`Backsolved.drift`): atol + rtol |u| at
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

    def __init__(self, vjp="jax-reverse", on_instability="raise", drift_tolerance=DRIFT_TOLERANCE, seminorm=False):
        if on_instability not in ("raise", "warn"):
            raise ValueError(f"BacksolveAdjoint(on_instability=...) must be 'raise' or 'warn', got {on_instability!r}")
        if not drift_tolerance > 0:
            raise ValueError(f"BacksolveAdjoint(drift_tolerance=...) must be positive, got {drift_tolerance!r}")
        self.vjp = ad.get(vjp)
        self.source = Backsolved(on_instability, float(drift_tolerance))  # pyright: ignore[reportCallIssue]  # equinox fields read as properties
        self.backward = LambdaMu(bool(seminorm))
