"""A forward solve that keeps a checkpoint every k accepted steps.

The checkpointed continuous adjoints re-solve u interval by interval on the way
back, each interval into a dense-output buffer of a fixed number of steps (XLA's
shapes are static). Checkpoints at the save times leave an interval's length to
the problem: with two save points over a long horizon, one interval is the whole
solve and its buffer is sized by `max_steps`. Here the forward solve also stores u
after every k-th accepted step (diffrax's `SaveAt(steps=k)`), so no interval holds
more than k forward steps: memory is max_steps / k states (n values each) plus a
buffer of a few k dense steps, not max_steps dense steps.
"""

import jax.numpy as jnp

from sciad.adjoints._base import Setup, stats_vector


def forward(setup: Setup, u0, p, every: int):
    """The forward solve from t0 to t1 with a checkpoint after every `every` accepted steps.

    Returns (t (B,): the breakpoints t0, the save times, the checkpoints and t1, sorted;
    u_at (B, n + k): the state y there; stats (3,) int32). B = T + 2 + max_steps // every: unused
    checkpoints sit at t1 with y(t1) (zero-length intervals). Raises, as any solve, where it fails."""
    sol = setup.forward(u0, p, ts=setup.breakpoints(), steps=every)
    unused = jnp.isinf(sol.ts)  # diffrax's fill, after the last save  # pyright: ignore[reportArgumentType]  # saved: not None
    u1 = sol.ys[jnp.sum(~unused) - 1]  # pyright: ignore[reportOptionalSubscript]  # saved: not None
    t = jnp.where(unused, jnp.asarray(setup.t1, sol.ts.dtype), sol.ts)  # pyright: ignore[reportArgumentType, reportOptionalMemberAccess]  # saved: not None
    return t, jnp.where(unused[:, None], u1, sol.ys), stats_vector(sol)  # pyright: ignore[reportArgumentType]  # saved: not None
