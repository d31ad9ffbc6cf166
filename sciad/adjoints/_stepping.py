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
from sciad.adjoints._loop import Stepper


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
    (`norm`: the controller's norm, None for the RMS norm over all of y)."""

    setup: Setup
    rhs: Callable
    norm: Callable | None = None

    def _stepper(self) -> Stepper:
        rhs = self.rhs
        terms = self.setup.term(lambda s, y, args: jax.tree.map(jnp.negative, rhs(-s, y, args)))
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
        """`march` stepped back to time t_to ≤ march.t in at most `max_steps` steps.
        `on_step(quadrature, t_start, t_end, interpolation) -> quadrature` runs on each accepted
        step (t_end < t_start; `interpolation.evaluate(t)` gives y inside it) and accumulates
        into `march.quadrature`."""
        stepper = self._stepper()
        s_to = -jnp.asarray(t_to, march.dt.dtype)  # differentiable: λ at a breakpoint moves with it (Hessians in time)

        def cond(carry):
            m, steps = carry
            return (-m.t < s_to) & dfx.is_successful(m.result)

        def body(carry):
            m, steps = carry
            s = -m.t
            clipped = m.dt >= s_to - s
            s1 = jnp.where(clipped, s_to, s + m.dt)
            y1, y_error, dense_info, solver_state, result = stepper.step(s, s1, m.y, args, m.solver_state, m.made_jump)
            y_error = jax.tree.map(lambda e: jnp.where(jnp.isnan(e), jnp.inf, e), y_error)
            keep, next_s, next_s1, _, controller_state, _ = stepper.adapt(
                s, s1, m.y, y1, args, y_error, m.controller_state
            )
            # After a step clipped to a breakpoint, resume with the step size proposed before it.
            dt = jax.lax.stop_gradient(jnp.where(keep & clipped, jnp.maximum(next_s1 - next_s, m.dt), next_s1 - next_s))
            select = lambda a, b: jax.tree.map(lambda x, y: jnp.where(keep, x, y), a, b)
            quadrature = m.quadrature
            if on_step is not None:
                interpolation = stepper.interpolation(s, s1, dense_info)
                quadrature = select(on_step(quadrature, -s, -s1, _Reversed(interpolation)), quadrature)
            steps = steps + 1
            result = dfx.RESULTS.where(keep, result, dfx.RESULTS.successful)
            out_of_steps = (steps >= max_steps) & ~(keep & clipped) & dfx.is_successful(result)
            result = dfx.RESULTS.where(out_of_steps, dfx.RESULTS.max_steps_reached, result)
            m = March(
                jnp.where(keep, -s1, m.t),
                select(y1, m.y),
                dt,
                select(solver_state, m.solver_state),
                controller_state,
                jnp.where(keep, False, m.made_jump),
                quadrature,
                result,
            )
            return m, steps

        march, _ = jax.lax.while_loop(cond, body, (march, jnp.asarray(0)))
        return march


class _Reversed(eqx.Module):
    """A step's interpolation in s = -t, evaluated at t."""

    interpolation: dfx.AbstractLocalInterpolation

    def evaluate(self, t):
        return self.interpolation.evaluate(-t)
