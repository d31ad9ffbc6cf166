"""Run-time checks inside compiled solves, raised as one `SolveError` naming the cause and the fix.

Every check is equinox's `branched_error_if`: a `lax.cond` that makes no host call unless the check
fires, transparent to differentiation, one check for a whole `jax.vmap` batch, resolved at trace
time where the predicate is known, and `EQX_ON_ERROR` honoured (`nan`: NaN in place of the checked
values; `breakpoint`: the message printed and a debugger opened; `off`: no check).

equinox raises its run-time error as `f"{msg}\\n\\n\\n<a paragraph asking for equinox.filter_jit>"`
(equinox/_errors.py, `_error`), so under a user's `jax.jit` that paragraph was the last line. Each
message here is a `_Raising` string, whose formatting raises the `SolveError` itself: the host call
ends with it, and JAX's runtime error ends with `SolveError: <message>` under `jax.jit` and
`equinox.filter_jit` alike (tests/test_private_surfaces.py pins that equinox formats it). What else
runs on the host (a foreign engine's products, the host LU) raises its failures as a SolveError too
(`host_call`). The error cannot start with the SolveError under a user's `jax.jit`: jaxlib writes
its message in C++, as "INTERNAL: CpuCallback error calling callback: " and the Python traceback of
the host call, raised at the user's call of the compiled function, where no sciad code runs; where
sciad's own call runs eagerly, `raising_solve_errors` raises the SolveError itself.

JAX logs an exception raised in a host callback before re-raising it; a SolveError is kept out of
that log (equinox.filter_jit does the same for its own), from the first check sciad builds (not at
import: importing sciad leaves logging as it was).

`warn_if` is a warning, not an error (equinox has none): a host callback in a `lax.cond`. With
`EQX_ON_ERROR` `nan` or `off` (the checks make no host call) the warnings are left out too, so a
program then holds no host callback at all, which JAX's persistent compilation cache requires.
"""

import functools
import logging
import os
import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from sciad._equinox_internals import unvmap_any, unvmap_max
from sciad._jax_internals import callback_logger


class SolveError(RuntimeError):
    """A check sciad makes while a (possibly compiled) solve runs: non-finite inputs, too many
    steps, an unstable BacksolveAdjoint, an interval budget, no steady state, an engine's derivative
    that is wrong (enzyme's NaN), a host engine's or the host LU's failure.

    Where sciad's own call runs eagerly (not inside a user's `jax.jit`) it is raised as itself
    and `except sciad.SolveError` catches it: from `sciad.solve`, `sciad.steady_state` and
    `Solution.interpolation`, and from the backward pass of an eager `jax.grad` / `jax.vjp`
    (except the backward pass of a solve with callbacks, whose segments run in a compiled
    `jax.lax.scan`). Inside a user's `jax.jit` (or a `jax.lax` loop) it is raised when the
    compiled program runs, wrapped in JAX's runtime error (`jax.errors.JaxRuntimeError`) whose
    last line is `SolveError: <the message>`: catch that, and `sciad.errors.summary(error)`
    returns the line."""


_MARKER = "SolveError: "  # how a SolveError's line starts in JAX's runtime error


def summary(error: Exception) -> str:
    """The line of `error` that says what went wrong: `SolveError: <message>` for a SolveError or a
    JAX runtime error that wraps one, else the last line naming an error type, else the first line."""
    message = str(error) if isinstance(error, SolveError) else carried(error)
    if message is not None:
        return f"SolveError: {message}"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line and not line.startswith("File")]
    return (named[-1:] or lines[:1] or [type(error).__name__])[0]


def carried(error: Exception) -> str | None:
    """The message of the `SolveError` that a JAX runtime error carries (raised in a host callback
    of a compiled program: JAX appends its traceback, the SolveError last), or None."""
    lines = str(error).splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(_MARKER)]
    return "\n".join(lines[starts[-1] :])[len(_MARKER) :].strip() if starts else None


def raising_solve_errors(fn):
    """`fn`, made to raise the `SolveError`s met while it runs eagerly as themselves: a JAX runtime
    error that carries one is raised again as `SolveError(message)` (JAX's wrapper and traceback
    dropped), and `fn`'s concrete results (arrays that are not tracers) are waited for first, so an
    error of a program still running asynchronously surfaces here, not at a later use of the result.
    Where `fn` is traced (under a user's `jax.jit`) it changes nothing. sciad's public calls and
    the eager execution of its custom rules (`sciad.ad._linear`) go through it."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            out = fn(*args, **kwargs)
            jax.block_until_ready(
                [x for x in jax.tree.leaves(out) if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)]
            )
        except (jax.errors.JaxRuntimeError, ValueError) as e:  # JAX's dispatch of a jit raises the latter
            message = carried(e)
            if message is None:
                raise
            raise SolveError(message) from None
        return out

    return call


def host_call(fn: Callable, failure: Callable[[Exception], str]) -> Callable:
    """`fn`, a function a compiled program calls on the host, raising what it raises as a `SolveError`
    with the message `failure(exception)` (a SolveError as itself): the host call then ends with the
    SolveError, as sciad's checks do, so it is JAX's runtime error's last line under a user's
    `jax.jit` and is raised as itself where sciad's call runs eagerly (`raising_solve_errors`)."""
    callback_logger.addFilter(_QUIET)  # JAX would log it before raising it

    @functools.wraps(fn)
    def call(*args):
        try:
            return fn(*args)
        except SolveError:
            raise
        except Exception as e:
            raise SolveError(failure(e)) from e

    return call


def error_if(x, pred, message: str):
    """`x` (a PyTree of arrays), raising `SolveError(message)` when the program runs with `pred` true
    (under `jax.vmap`: for any batch member)."""
    return error_where(x, [pred], [message])


def error_where(x, preds, messages):
    """`x` (a PyTree of arrays), raising `SolveError(messages[i])` for the first `preds[i]` that holds
    when the program runs (under `jax.vmap`: for some batch member), in one check."""
    held = jnp.stack([jnp.any(pred) for pred in preds])
    keys, values = eqx.partition(x, lambda y: eqx.is_array(y) and jnp.issubdtype(y.dtype, jax.dtypes.prng_key))
    return eqx.combine(keys, branched_check(values, jnp.any(held), jnp.argmax(held), messages))  # keys pass as they are


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
    `value` (a scalar). Transparent to differentiation; no host call unless `pred` holds. Left out
    (`x` itself) where `EQX_ON_ERROR` is `nan` or `off`, read when the program is traced."""
    if os.environ.get("EQX_ON_ERROR", "raise") in ("nan", "off"):
        return x
    return _warn(x, jnp.any(pred), value, message)


def batch_any(pred) -> jax.Array:
    """Whether `pred` holds anywhere, over every member of a `jax.vmap` batch too: unbatched, so a
    `lax.cond` on it stays a cond under vmap (one branch runs for the whole batch)."""
    return unvmap_any(jnp.any(pred))


def branched_check(x, pred, index, messages):
    """`x`, raising `SolveError(messages[index])` when the program runs with `pred` true: equinox's
    check, with messages that raise the SolveError themselves (this module's docstring)."""
    callback_logger.addFilter(_QUIET)  # with the first check, not at import (a logger keeps a filter once)
    return eqx.branched_error_if(x, pred, index, tuple(_Raising(message) for message in messages))


class _Raising(str):
    """A message that raises `SolveError(message)` when formatted: equinox formats the message of a
    check that fires into its own run-time error (`f"{msg}..."`), which then ends with the SolveError."""

    def __format__(self, spec: str) -> str:
        raise SolveError(str(self))


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _warn(x, pred, value, message: str):
    """`x`; warns `message.format(value)` when the program runs with `pred` true. A pure callback
    whose result feeds `x`: an unordered host call in a `lax.cond` (a debug callback would be an effect,
    which the rules' jaxprs and custom derivatives refuse)."""

    def warn(value):
        warnings.warn(message.format(float(value)), RuntimeWarning, stacklevel=2)
        return np.zeros((), np.int32)

    value = unvmap_max(jax.lax.stop_gradient(jnp.asarray(value, jnp.result_type(float))))
    token = jax.lax.cond(
        unvmap_any(pred),
        lambda: jax.pure_callback(warn, jax.ShapeDtypeStruct((), jnp.int32), value),
        lambda: jnp.zeros((), jnp.int32),
    )  # one check for a whole batch: the cond stays a cond
    return jax.tree.map(
        lambda leaf: leaf + token.astype(leaf.dtype) if jnp.issubdtype(leaf.dtype, jnp.inexact) else leaf, x
    )


@_warn.defjvp
def _warn_jvp(message, primals, tangents):
    x, pred, value = primals
    return _warn(x, pred, value, message), tangents[0]


class _QuietSolveErrors(logging.Filter):
    """JAX logs an exception raised in a callback before re-raising it: not ours, which reach the user once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], SolveError))


_QUIET = _QuietSolveErrors()
