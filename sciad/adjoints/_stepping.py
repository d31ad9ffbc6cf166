"""Adaptive stepping backwards in time across breakpoints, with the solver carried over them.

The continuous adjoints solve their backward systems on intervals between
breakpoints (save times, checkpoints), where the adjoint state jumps. A new
diffrax solve per interval would restart the solver there: a new first step,
a reset step-size controller, a fresh FSAL evaluation. `Marcher` instead
keeps one solver state, one controller state and the current step size over
the whole backward pass: it steps to each breakpoint (clipping the last step
of an interval, then resuming with the step size it had proposed), applies
the jump, and continues with `made_jump` set (FSAL solvers re-evaluate their
first stage, nothing else restarts).

Time runs backwards: the system is stepped in s = -t, so the solver and the
controller see an ordinary forward solve. Everything here is plain JAX
(`lax.while_loop`), so it can be differentiated in forward mode again
(Hessians) and batched.
"""

from collections.abc import Callable

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp

from sciad.adjoints._base import Setup
from sciad.adjoints._loop import Position, Stepper, integrate


class March(eqx.Module):
    """Where a backward pass stands: time t, state y, the step size dt (> 0) to try next,
    the solver's and controller's states, whether y just jumped, the running `quadrature`
    (see `Marcher.advance`) and the diffrax `result` (out of steps, or the solver's own failure)."""

    t: jax.Array
    y: object
    dt: jax.Array
    solver_state: object
    controller_state: object
    made_jump: jax.Array
    quadrature: object
    result: dfx.RESULTS

    def jumped(self, y) -> "March":
        """This march with its state replaced by `y` (a jump at the current time)."""
        return eqx.tree_at(lambda m: (m.y, m.made_jump), self, (y, jnp.asarray(True)))


class Marcher(eqx.Module):
    """Steps `rhs(t, y, args)` backwards in time with `setup`'s solver at its adjoint tolerances
    (`norm`: the controller's norm, None for the RMS norm over all of y); an SDE's `noise(t, y, args, dW)`
    beside it, the state's increment from the noise over a step whose forward increment is dW (rhs's sign)."""

    setup: Setup
    rhs: Callable
    norm: Callable | None = None
    noise: Callable | None = None  # an SDE's: noise(t, y, args, dW), the increment's rate form beside rhs's

    def _stepper(self) -> Stepper:
        rhs, noise = self.rhs, self.noise
        backwards = None if noise is None else lambda s, y, args, dW: jax.tree.map(jnp.negative, noise(-s, y, args, dW))
        terms = self.setup.term(lambda s, y, args: jax.tree.map(jnp.negative, rhs(-s, y, args)), backwards)
        return Stepper.of(terms, self.setup.solver, self.setup.controller(*self.setup.adjoint_tolerances, self.norm))

    def start(self, y, args, t, dt0, quadrature=None) -> March:
        """A march at time t from state y, first trying the step dt0 > 0. `args` may be abstract
        (`jax.ShapeDtypeStruct` leaves): the march starts as after a jump, so the solver's first
        step computes what its state would hold (e.g. an FSAL stage)."""
        stepper = self._stepper()
        # Step sizes carry no derivative (as in diffrax's controllers); times do (second derivatives in time).
        dt0 = jax.lax.stop_gradient(jnp.asarray(dt0, jnp.result_type(t)))
        s = -jnp.asarray(t, dt0.dtype)
        _, controller_state = stepper.controller.init(
            stepper.terms, s, s + dt0, y, dt0, None, stepper.solver.func, stepper.error_order
        )
        return March(
            -s,
            y,
            dt0,
            stepper.zero_state(s, s + dt0, y, args),
            controller_state,
            jnp.asarray(True),
            quadrature,
            dfx.RESULTS.successful,
        )

    def advance(self, march: March, args, t_to, max_steps: int, on_step: Callable | None = None) -> March:
        """`march` stepped back to time t_to ≤ march.t in at most `max_steps` steps (sciad's loop,
        `integrate`, in s = -t). `on_step(quadrature, t_start, t_end, interpolation) -> quadrature` runs on
        each accepted step (t_end < t_start; `interpolation.evaluate(t)` gives y inside it) and accumulates
        into `march.quadrature`."""
        s = -march.t
        s_to = -jnp.asarray(t_to, march.dt.dtype)  # differentiable: λ at a breakpoint moves with it (Hessians in time)
        start = Position(
            s,
            jnp.minimum(s + march.dt, s_to),
            march.y,
            march.solver_state,
            march.controller_state,
            march.made_jump,
            march.dt,
        )
        hook = None
        if on_step is not None:
            hook = lambda q, s0, s1, _, interpolation: on_step(q, -s0, -s1, _Reversed(interpolation))  # noqa: E731
        sol = integrate(
            self._stepper(),
            None,
            args,
            s,
            s_to,
            max_steps=max_steps,
            start=start,
            on_step=hook,
            carried=march.quadrature,
            result=march.result,
        )
        end = sol.end
        # Step sizes carry no derivative (as in diffrax's controllers); times do (second derivatives in time).
        dt = jax.lax.stop_gradient(end.proposed)
        return March(-end.t, end.y, dt, end.solver_state, end.controller_state, end.made_jump, sol.carried, sol.result)


class _Reversed(eqx.Module):
    """A step's interpolation in s = -t, evaluated at t."""

    interpolation: dfx.AbstractLocalInterpolation

    def evaluate(self, t):
        return self.interpolation.evaluate(-t)
