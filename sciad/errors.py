"""Run-time checks inside compiled solves, raised as one `SolveError` naming the cause and the fix.

`equinox.error_if` would do, but outside `equinox.filter_jit` it appends a
paragraph asking for `filter_jit` and JAX logs the callback's traceback a
second time; under a user's `jax.jit` the useful line drowned in them. Here JAX's
log of a `SolveError` is filtered out, from the first check sciad builds on
(not at import: importing sciad leaves logging as it was).
"""

import functools
import logging
import warnings

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np

from sciad._equinox_internals import enumeration_messages, item_index, unvmap_any, unvmap_max
from sciad._jax_internals import callback_logger


class SolveError(RuntimeError):
    """A check sciad makes while a (possibly compiled) solve runs: non-finite inputs, too many
    steps, an unstable BacksolveAdjoint, an interval budget. Under `jax.jit` it reaches the
    user wrapped in JAX's runtime error; its message is the last line there."""


def summary(error: Exception) -> str:
    """The line of `error` that says what went wrong: the `SolveError` line of a JAX runtime error
    that wraps one, else the last line naming an error type, else the first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line and not line.startswith("File")]
    solve = [line for line in named if line.startswith("SolveError")]
    return (solve or named[-1:] or lines[:1] or [type(error).__name__])[0]


def error_if(x, pred, message: str):
    """`x` (a PyTree of arrays), raising `SolveError(message)` when the program runs with `pred` true
    (under `jax.vmap`: for any batch member). Transparent to differentiation; no host call unless
    `pred` holds."""
    return _report(x, jnp.any(pred).astype(jnp.int32), 0.0, (message,), False)


def check(x, pred, message: str):
    """`x`, raising `ValueError(message)` now where `pred` is known (concrete values), else a
    `SolveError` when the program runs with `pred` true (`error_if`)."""
    if isinstance(pred, jax.core.Tracer):
        return error_if(x, pred, message)
    if np.any(pred):
        raise ValueError(message)
    return x


def warn_if(x, pred, message: str, value):
    """`x` (a PyTree of arrays), warning `message.format(value)` (a `RuntimeWarning`) when the
    program runs with `pred` true; under `jax.vmap` once for the whole batch, with its largest
    `value` (a scalar). Transparent to differentiation; no host call unless `pred` holds."""
    return _report(x, jnp.any(pred).astype(jnp.int32), value, (message,), True)


def batch_any(pred) -> jax.Array:
    """Whether `pred` holds anywhere, over every member of a `jax.vmap` batch too: unbatched, so a
    `lax.cond` on it stays a cond under vmap (one branch runs for the whole batch)."""
    return unvmap_any(jnp.any(pred))


def solver_failure(x, result: dfx.RESULTS, max_steps: int):
    """`x`, raising a `SolveError` when the diffrax solve that gave `result` failed (e.g. ran out of steps)."""
    messages = tuple(_failure(i, m, max_steps) for i, m in enumerate(enumeration_messages(dfx.RESULTS)[1:], 1))
    return _report(x, item_index(result), 0.0, messages, False)


def _failure(index: int, diffrax_message: str, max_steps: int) -> str:
    if index == item_index(dfx.RESULTS.max_steps_reached):
        return (f"the maximum number of solver steps was reached: the ODE solve needed more than "
                f"max_steps={max_steps} steps; pass a larger max_steps to sciad.solve (or looser rtol/atol; a "
                "stiff problem needs an implicit solver, e.g. solver='kvaerno5')")
    return f"the ODE solver failed: {diffrax_message}"


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _report(x, index, value, messages: tuple, warn: bool):
    """`x`; `index` > 0 raises `messages[index - 1]` when the program runs, or with `warn`, warns it
    formatted with `value`. A pure callback whose result feeds `x`: an unordered host call, so it
    costs nothing when `index` is 0 (a debug callback would order every call of the program)."""

    def report(index, value):
        if index > 0:
            message = messages[int(index) - 1]
            if not warn:
                raise SolveError(message)
            warnings.warn(message.format(float(value)), RuntimeWarning, stacklevel=2)
        return np.zeros((), np.int32)

    index = unvmap_max(index)  # one check for a whole batch: the cond stays a cond under vmap
    value = unvmap_max(jax.lax.stop_gradient(jnp.asarray(value, jnp.result_type(float))))
    callback_logger.addFilter(_QUIET)  # with the first check, not at import (a logger keeps a filter once)

    def check():
        return jax.pure_callback(report, jax.ShapeDtypeStruct((), jnp.int32), index, value)

    token = jax.lax.cond(index > 0, check, lambda: jnp.zeros((), jnp.int32))
    return jax.tree.map(lambda leaf: leaf + token.astype(leaf.dtype) if jnp.issubdtype(leaf.dtype, jnp.inexact)
                        else leaf, x)


@_report.defjvp
def _report_jvp(messages, warn, primals, tangents):
    x, index, value = primals
    return _report(x, index, value, messages, warn), tangents[0]


class _QuietSolveErrors(logging.Filter):
    """JAX logs an exception raised in a callback before re-raising it: not ours, which reach the user once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], SolveError))


_QUIET = _QuietSolveErrors()
