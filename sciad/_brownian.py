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

    def _at(self, t) -> jax.Array:
        """W(t) - W(t0): the whole steps before t, then a bridge inside t's step."""
        t = jnp.asarray(t, self.dtype)
        position = (t - self.t0) / self.dt
        k = jnp.clip(jnp.floor(position), 0, self.steps - 1).astype(jnp.int32)
        fraction = jnp.clip(position - k, 0.0, 1.0)  # where in step k, in [0, 1]
        before = jnp.arange(self.steps) < k
        increments = self.increments()
        w_k = jnp.tensordot(before.astype(self.dtype), increments, axes=1)
        z = jax.random.normal(self._key(_BRIDGES, k), self.shape, self.dtype)
        bridge = fraction * increments[k] + jnp.sqrt(fraction * (1 - fraction) * self.dt) * z
        return w_k + bridge

    def evaluate(self, t0, t1=None) -> jax.Array:
        """W(t1) - W(t0) (`shape`), or W(t0) - W(path start) without t1; times inside the path's span
        (traced allowed). Exact on the grid (a sum of the steps' increments); a Brownian bridge
        between its step's ends for a time off it."""
        if t1 is None:
            return self._at(t0)
        return self._at(t1) - self._at(t0)


def grid_increment(path, t0: float, dt: float, k) -> jax.Array:
    """Step k's increment of `path` on the grid t_k = t0 + k dt: `path.increment(k)` for a
    `BrownianPath` (no descent), else `path.evaluate(t_k, t_k + dt)` (a diffrax Brownian path)."""
    if isinstance(path, BrownianPath):
        return path.increment(k)
    tk = t0 + k * dt
    return jnp.asarray(path.evaluate(tk, tk + dt))
