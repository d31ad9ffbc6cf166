"""`BrownianPath`: an exact Brownian motion on a fixed step grid, drawn from a key step by step.

The increment over step k, W(t_{k+1}) - W(t_k) (t_k = t0 + k dt), is sqrt(dt) · N(0, I) drawn from
`jax.random.fold_in(key, k)`: any step's increment is one hash and one draw, with no tree to descend
and no array of increments to keep, so a solve's backward pass (reconstructing states, or stepping
an adjoint backwards) sees exactly the forward pass's increments, in memory independent of the
number of steps. Off the grid, W(t) is a Brownian bridge between the step's ends, seeded from the
same key (one point per step is distributed exactly; two points inside one step share the bridge's
draw: for finer times use a finer `dt0`, or pass a `diffrax.VirtualBrownianTree` as `brownian=`).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

# Stream tags: the increments and the bridges draw from independent keys derived from the user's key.
_INCREMENTS, _BRIDGES = 0, 1
ON_GRID = 1e-9  # a time within this fraction of a step of a grid point is on it


class BrownianPath(eqx.Module):
    """W on [t0, t0 + steps · dt] with `shape` (the Brownian motions: (n,) for diagonal noise, (1,)
    for scalar, (m,) for m general ones), W(t0) = 0, drawn from `key` (a JAX PRNG key).

    `increment(k)` is step k's increment (k may be traced); `evaluate(t0, t1)` is W(t1) - W(t0)
    (`evaluate(t)`: W(t) - W(path start)), as diffrax's Brownian paths; times off the grid use a
    Brownian bridge inside their step. `Solution.brownian` is the path a solve used: pass it back as
    `sciad.solve(..., brownian=sol.brownian)` (or the same key) for the same path."""

    key: jax.Array
    t0: float = eqx.field(static=True)
    dt: float = eqx.field(static=True)
    steps: int = eqx.field(static=True)
    shape: tuple = eqx.field(static=True)
    dtype: np.dtype = eqx.field(static=True)

    @property
    def t1(self) -> float:
        return self.t0 + self.steps * self.dt

    def _key(self, stream: int, k):
        return jax.random.fold_in(jax.random.fold_in(self.key, stream), k)

    def increment(self, k) -> jax.Array:
        """W(t_{k+1}) - W(t_k) (`shape`): sqrt(dt) · N(0, I) from `fold_in(key, k)`."""
        z = jax.random.normal(self._key(_INCREMENTS, k), self.shape, self.dtype)
        return jnp.asarray(np.sqrt(self.dt), self.dtype) * z

    def increments(self) -> jax.Array:
        """Every step's increment (steps, *shape) (what `increment(k)` gives for k = 0 .. steps - 1)."""
        return jax.vmap(self.increment)(jnp.arange(self.steps))

    def _step_of(self, t):
        """(k, fraction): t's grid step and where in it, in [0, 1]; a time within `ON_GRID` steps of a
        grid point is that point (the steps a solver takes on the grid meet it exactly)."""
        position = (jnp.asarray(t, self.dtype) - self.t0) / self.dt
        nearest = jnp.rint(position)
        position = jnp.where(jnp.abs(position - nearest) <= ON_GRID * jnp.maximum(1.0, nearest), nearest, position)
        k = jnp.clip(jnp.floor(position), 0, self.steps - 1).astype(jnp.int32)
        return k, jnp.clip(position - k, 0.0, 1.0)

    def _bridge(self, k, fraction):
        """W(t) - W(t_k) for t at `fraction` of step k: the Brownian bridge between its ends."""
        z = jax.random.normal(self._key(_BRIDGES, k), self.shape, self.dtype)
        return fraction * self.increment(k) + jnp.sqrt(fraction * (1 - fraction) * self.dt) * z

    def evaluate(self, t0, t1=None) -> jax.Array:
        """W(t1) - W(t0) (`shape`), or W(t0) - W(path start) without t1; times inside the path's span
        (traced allowed), in either order. Exact on the grid (a sum of the steps' increments: one draw for one
        step); a Brownian bridge between its step's ends for a time off it. Costs one draw per step
        between t0 and t1."""
        if t1 is None:
            t0, t1 = self.t0, t0
        t0, t1 = jax.lax.stop_gradient((t0, t1))  # a Brownian path has no derivative in time
        sign = jnp.where(jnp.asarray(t1) < jnp.asarray(t0), -1.0, 1.0).astype(self.dtype)  # W(t1) - W(t0) either way
        t0, t1 = jnp.minimum(t0, t1), jnp.maximum(t0, t1)
        (j, a), (k, b) = self._step_of(t0), self._step_of(t1)
        one_step = (a == 0) & (b == 1) & (k == j) | (a == 0) & (b == 0) & (k == j + 1)

        def general(_):
            whole = jax.lax.fori_loop(j, k, lambda i, w: w + self.increment(i), jnp.zeros(self.shape, self.dtype))
            return whole + self._bridge(k, b) - self._bridge(j, a)

        return sign * jax.lax.cond(one_step, lambda _: self.increment(j), general, None)
