"""A gradient and the central differences it is checked against from one compiled program: the program of
`jax.value_and_grad(f)` gives the gradient at x and, run again at x ± h_i e_i, the values the differences take
(a separate program for f's values, or vmap over the points, would compile more than running this one 2n times
costs)."""

import jax
import jax.numpy as jnp
import numpy as np


def relative_steps(x, rel_step=1e-5, floor=1.0):
    """`helpers.central_differences`'s steps: rel_step · max(|x_i|, floor)."""
    return rel_step * np.maximum(np.abs(np.asarray(x, np.float64)), floor)


def gradient_and_central_differences(f, x, steps, value_and_grad=None):
    """(f(x), ∇f(x), the central differences of the scalar f at the vector x, stepping x_i by steps[i]), from
    the one program of `jax.jit(jax.value_and_grad(f))` (or `value_and_grad`, that program already built)."""
    value_and_grad = value_and_grad or jax.jit(jax.value_and_grad(f))
    x = np.asarray(x, np.float64)
    steps = np.broadcast_to(np.asarray(steps, np.float64), x.shape)
    value, grad = value_and_grad(jnp.asarray(x))
    differences = []
    for i, h in enumerate(steps):
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        differences.append(
            (float(value_and_grad(jnp.asarray(up))[0]) - float(value_and_grad(jnp.asarray(down))[0])) / (2 * h)
        )
    return value, grad, np.array(differences)
