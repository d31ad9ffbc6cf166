"""`Solution.interpolation`: u(t) anywhere in tspan, from the one forward solve, differentiated by
the solve's sensealg."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PyTree, Real

from sciad._errors import raising_solve_errors
from sciad.adjoints._base import AbstractSensitivity, Setup


class DenseOutput(eqx.Module):
    """`dense(t)`: u(t) (u0's structure, with t's shape in front) for t in tspan, concrete or traced.
    The value is the forward solve's dense interpolant (no new solve; Rodas's own for a problem with a
    mass matrix); its derivatives, in t (u'(t): f, or a DAE's consistent u'), u0, p, the values f
    closes over and the time span, are the sensealg's, as for a solve saved at t: each differentiated
    evaluation runs that sensealg's rules on [t0, t]."""

    setup: Setup
    u0: Float[Array, " n"]
    p: Float[Array, " m"]
    frame: "_Frame"
    direction: int = eqx.field(static=True)

    @classmethod
    def of(cls, setup: Setup, sensealg: AbstractSensitivity, u0, p, direction: int) -> "DenseOutput":
        """The dense output of the solve of `setup` from u0 (n,) with p (m,), computed once, undifferentiated."""
        # NumPy arrays (a Rosenbrock solver's mass matrix, read at trace time) stay NumPy.
        fixed = jax.lax.stop_gradient(
            eqx.filter((setup, u0, p), lambda x: isinstance(x, jax.Array) and eqx.is_inexact_array(x))
        )
        fixed_setup, fixed_u0, fixed_p = eqx.combine(fixed, (setup, u0, p))
        interpolation = fixed_setup.forward(fixed_u0, fixed_p, dense=True).interpolation
        return cls(setup, u0, p, _Frame(setup.bare(), sensealg, interpolation), direction)

    @raising_solve_errors  # its derivatives run the sensealg's rules: their run-time checks raise as SolveError
    def __call__(self, t: Real[ArrayLike, "*t"]) -> PyTree[Array]:  # leaves: t's shape, then each u0 leaf's shape
        s = self.direction * jnp.asarray(t, self.u0.dtype)
        args = (self.u0, self.p, self.setup.f.held, self.setup.t0, self.setup.t1)
        values = jnp.vectorize(lambda s: _at(s, *args, frame=self.frame), signature="()->(n)")(s)
        flat = values.reshape(-1, values.shape[-1])
        return jax.tree.map(lambda x: x.reshape(s.shape + x.shape[1:]), jax.vmap(self.setup.f.u.unravel)(flat))


class _Frame(eqx.Module):
    """What the derivative rules of `_at` hold fixed: the setup without its traced parts, the
    sensealg and the (undifferentiated) interpolant."""

    setup: Setup
    sensealg: AbstractSensitivity
    interpolation: Any


@eqx.filter_custom_jvp
def _at(s, u0, p, c, t0, t1, *, frame: _Frame):
    return frame.interpolation.evaluate(s)[: frame.setup.n]


@_at.def_jvp
def _at_jvp(primals, tangents, *, frame: _Frame):
    tangents = tuple(jnp.zeros_like(x) if v is None else v for x, v in zip(primals, tangents))

    def saved_at(s, u0, p, c, t0, t1):
        setup = frame.setup.bound(c, s[None], t0, t1)
        return frame.sensealg.solve(setup, u0, p)[0][0, : frame.setup.n]

    _, tangent = jax.jvp(saved_at, primals, tangents)
    return _at(*primals, frame=frame), tangent
