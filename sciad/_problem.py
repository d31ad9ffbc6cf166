"""What every problem kind shares: `AbstractProblem` (a kind's place in the one solve: `Request` in,
`Staged` out) and the checks every call makes of a problem's parts at its boundary (`check_*`), each
raising an error that names the argument (and the PyTree leaf) and the fix."""

import abc
import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import diffrax as dfx
import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, PyTree

from sciad import _events as events
from sciad._errors import error_if, error_where
from sciad._pytrees import Layout, leaf_names
from sciad.adjoints._base import AbstractSensitivity, Setup


class AbstractProblem(eqx.Module):
    """A problem kind: u(t0) = u0 on tspan = (t0, t1) with parameters p, and what the kind adds to the one
    solve (`sciad.solve`): the options it takes beside the shared ones (`options`, their defaults) and
    `staged`, its system, solver, steps and save times as the pipeline's `Setup`. Every sensealg serves every
    kind through that `Setup` (a sensealg that cannot says why: `AbstractSensitivity.refusal`)."""

    u0: eqx.AbstractVar[PyTree[Array]]
    p: eqx.AbstractVar[PyTree[Any]]
    tspan: eqx.AbstractVar[tuple[float, float]]
    options: ClassVar[dict[str, Any]]  # the solve options of this kind alone: name -> default

    @abc.abstractmethod
    def staged(self, request: "Request") -> "Staged":
        """This problem's solve for `request`, checked (errors name the argument and the fix)."""


@dataclasses.dataclass(frozen=True)
class Request:
    """What a solve asks, its shared arguments checked: u0, p (PyTrees like the problem's), t0, t1 (user time,
    concrete or traced) and `sign` = sign(t1 - t0), the save times `ts` (T,) (user time), the `integrand` with
    its `entries`, `solver` as given, `auto`: whether the sensealg is "auto"'s choice, `rtol`, `atol` (None:
    the kind's default), `max_steps`, `dt0` (None: the kind's default), the `callbacks` and `max_events`, and the
    kind's own `options`."""

    u0: Any
    p: Any
    t0: Any
    t1: Any
    sign: int
    ts: Any
    integrand: Callable | None
    entries: int
    solver: Any
    auto: bool
    rtol: float | None
    atol: float | None
    max_steps: int
    dt0: Any
    callbacks: Sequence
    max_events: int | None
    options: dict[str, Any]


class Staged(abc.ABC):
    """A problem's solve as the pipeline runs it: `setup` (its field, solver, steps and save times in the
    solve's forward time), the flat `u0` (n,) and `p` (m,), the layouts of u and of the integral `q` (None
    without an integrand), and what depends on the sensealg."""

    setup: Setup
    u0: jax.Array
    p: jax.Array
    u: Layout
    q: Layout | None
    # whether the kind applies its callbacks (preset times only) between its own steps, in one solve, rather than
    # the pipeline solving from event to event (`sciad._events.solve`)
    events_in_steps: ClassVar[bool] = False

    @abc.abstractmethod
    def auto_sensealg(self) -> AbstractSensitivity:
        """ "auto"'s sensealg for this solve."""

    def prepared(self, sensealg: AbstractSensitivity) -> tuple[Setup, jax.Array]:
        """(the setup, u0 (n,)) that `sensealg` solves from (a DAE's u0 initialised; a host engine's field)."""
        return self.setup, self.u0

    @abc.abstractmethod
    def plan(self) -> events.Plan:
        """The checked `sciad._events.Plan` of the request's callbacks."""

    def extras(self, setup: Setup, sensealg: AbstractSensitivity, u0: jax.Array) -> dict[str, Any]:
        """The `Solution` fields of this kind (a dense interpolation, a Brownian path): none."""
        return {}


NON_FINITE = (
    "{} contains non-finite values (NaN or inf): pass finite values (a NaN parameter often comes "
    "from an optimisation step that diverged: a smaller learning rate, or clipped gradients)"
)


def _leaf_error(name: str, x) -> str | None:
    """Why array leaf `name` = x cannot be a state or parameter (None if it can): not float, or,
    where its values are known now, not finite. They are for concrete arrays and under an eager
    `jax.grad` / `jax.jvp` (the primal, `jax.lax.stop_gradient(x)`, is concrete there); a leaf
    traced under `jax.jit` or `jax.vmap` is checked when the solve runs (`check_finite`)."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return f"{name} has dtype {x.dtype}; pass a float array, e.g. numpy.asarray({name}, dtype=float)"
    value = jax.lax.stop_gradient(x) if isinstance(x, jax.core.Tracer) else x
    if isinstance(value, jax.core.Tracer):
        return None
    value = np.asarray(value)
    if np.all(np.isfinite(value)):
        return None
    where = "" if value.ndim == 0 else f" (first at index {tuple(np.argwhere(~np.isfinite(value))[0].tolist())})"
    return NON_FINITE.format(name) + where


def check_state(name: str, tree):
    """`tree` (a state: every leaf an array or number) with float array leaves, concrete ones finite;
    a TypeError or ValueError naming the bad leaf, now."""

    def leaf(path, x):
        label = name + jax.tree_util.keystr(path)
        if not (eqx.is_array_like(x) and not isinstance(x, (bool, str))):
            raise TypeError(f"{label} is a {type(x).__name__}; every leaf of {name} must be a float array or number")
        x = x if isinstance(x, jax.Array) else np.asarray(x, dtype=float if isinstance(x, (int, float)) else None)
        error = _leaf_error(label, x)
        if error:
            raise (TypeError if "dtype" in error else ValueError)(error)
        return x

    return jax.tree_util.tree_map_with_path(leaf, tree)


def check_params(name: str, tree):
    """`tree` (parameters): array leaves must be float, concrete ones finite (a TypeError or ValueError
    naming the leaf, now); other leaves are static and left as they are."""
    for label, x in leaf_names(tree, name):
        if eqx.is_array(x):
            error = _leaf_error(label, x)
            if error:
                raise (TypeError if "dtype" in error else ValueError)(error)
    return tree


def check_like(name: str, tree, ref):
    """`tree` in place of the problem's `ref`: the same structure and leaf shapes, else a ValueError now."""
    if jax.tree.structure(tree) != jax.tree.structure(ref):
        raise ValueError(
            f"{name} has structure {jax.tree.structure(tree)} but the problem's {name} has structure "
            f"{jax.tree.structure(ref)}: pass a PyTree like the problem's"
        )
    for (label, x), (_, r) in zip(leaf_names(tree, name), leaf_names(ref, name)):
        if eqx.is_array_like(x) and np.shape(x) != np.shape(r):
            raise ValueError(
                f"{label} has shape {tuple(np.shape(x))} but the problem's {label} has shape {tuple(np.shape(r))}"
            )


def check_inputs(prob: AbstractProblem, u0, p) -> tuple:
    """(u0, p) for a solve of `prob`: the problem's own where None, else checked now to be like them
    (`check_like`, `check_state`, `check_params`: float leaves, finite where their values are known,
    under an eager `jax.grad` too); their traced leaves (under `jax.jit`, `jax.vmap`) carry a
    run-time check for non-finite values (`check_finite`), on which everything computed from them
    waits, so it is the first error a solve from them raises."""
    if u0 is None:
        u0 = prob.u0
    else:
        check_like("u0", u0, prob.u0)
        u0 = check_state("u0", u0)
    if p is None:
        p = prob.p
    else:
        check_like("p", p, prob.p)
        p = check_params("p", p)
    return check_finite("u0", u0), check_finite("p", p)


DEFAULT_TOLERANCE = 1e-6  # `solve`'s rtol and atol


def check_tolerances(rtol, atol, max_steps, prefix: str = "") -> None:
    """Positive finite `rtol`, `atol` (named with `prefix`) and a positive `max_steps`, else a ValueError now."""
    for name, tol in ((prefix + "rtol", rtol), (prefix + "atol", atol)):
        if not (np.isfinite(tol) and tol > 0):
            raise ValueError(f"{name} must be a positive number, got {tol}")
    if int(max_steps) < 1:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps}")


def check_steps(stepsize_controller, dt0, rtol, atol, sign: int) -> tuple:
    """(rtol, atol, the controller, dt0) in the solve's forward time s = sign * t: a
    `diffrax.PIDController` (its rtol and atol then the solve's: `rtol`, `atol` not given (None) or
    equal) or None, and a first step `dt0` (None, or a scalar of t1 - t0's sign); rtol and atol not
    given: `DEFAULT_TOLERANCE`."""
    if stepsize_controller is not None:
        if not isinstance(stepsize_controller, dfx.PIDController):
            raise TypeError(
                f"stepsize_controller must be a diffrax.PIDController (sciad's solves step adaptively, "
                f"without step or jump times), got {type(stepsize_controller).__name__}"
            )
        try:
            tolerances = tuple(float(x) for x in (stepsize_controller.rtol, stepsize_controller.atol))
        except (TypeError, jax.errors.ConcretizationTypeError) as e:
            raise ValueError("stepsize_controller's rtol and atol must be concrete numbers, not traced values") from e
        for name, given, own in (("rtol", rtol, tolerances[0]), ("atol", atol, tolerances[1])):
            if given is not None and given != own:
                raise ValueError(f"{name}={given} differs from stepsize_controller.{name}={own}: pass one of them")
        rtol, atol = tolerances
    rtol, atol = (DEFAULT_TOLERANCE if tol is None else tol for tol in (rtol, atol))
    if dt0 is not None:
        if jnp.shape(dt0):
            raise ValueError(f"dt0 must be a scalar, got shape {jnp.shape(dt0)}")
        if not isinstance(dt0, jax.core.Tracer) and not (np.isfinite(dt0) and sign * dt0 > 0):
            raise ValueError(
                f"dt0 must be a finite step of t1 - t0's sign (the first step's size and direction), got {dt0}"
            )
        dt0 = jax.lax.stop_gradient(sign * dt0)
    return rtol, atol, stepsize_controller, dt0


def check_finite(name: str, tree):
    """`tree` (u0 or p, any PyTree), its traced float leaves made to wait on a run-time check that
    raises `SolveError` naming the first leaf with non-finite values (instead of NaN gradients or a
    solver that runs out of steps) when the program runs. Concrete leaves are left as they are
    (`check_state` / `check_params` check them, and the primal values under an eager `jax.grad`)."""
    leaves, treedef = jax.tree.flatten(tree)
    names = [label for label, _ in leaf_names(tree, name)]
    traced = [
        i for i, x in enumerate(leaves) if isinstance(x, jax.core.Tracer) and jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    if not traced:
        return tree
    checked = error_where(
        [leaves[i] for i in traced],
        [~jnp.all(jnp.isfinite(leaves[i])) for i in traced],
        [NON_FINITE.format(names[i]) for i in traced],
    )
    for i, x in zip(traced, checked):
        leaves[i] = x
    return jax.tree.unflatten(treedef, leaves)


TRACED_TSPAN = (
    "ODEProblem(tspan=...) got traced times (made under jax.jit, jax.grad or jax.vmap), but a "
    "problem's tspan is static: make the problem with concrete times (in the same direction) and "
    "pass the traced ones to the solve, which takes them and differentiates them: "
    "sciad.solve(prob, tspan=(t0, t1))"
)


TRACED = "tspan must be concrete numbers (t0, t1) here, got traced values"


def check_tspan(tspan, traced: str = TRACED) -> tuple[float, float]:
    """`(t0, t1)` as floats, both finite and t1 ≠ t0 (t1 < t0 integrates backwards in time), else a
    ValueError now (`traced` where a time is a tracer)."""
    if any(isinstance(t, jax.core.Tracer) for t in jax.tree.leaves(tspan)):
        raise ValueError(traced)
    try:
        t0, t1 = (float(t) for t in tspan)
    except (TypeError, ValueError) as e:
        raise ValueError(f"tspan must be a pair of numbers (t0, t1), got {tspan!r}") from e
    if not (np.isfinite(t0) and np.isfinite(t1)):
        raise ValueError(f"tspan must be finite, got {tspan!r}")
    if t1 == t0:
        raise ValueError(f"tspan = {tspan!r} is empty: t1 must differ from t0")
    return t0, t1


def check_time_span(tspan, default: tuple[float, float]) -> tuple:
    """(t0, t1, direction): `tspan` (default: the problem's) checked, direction = sign(t1 - t0).
    Traced times (under `jax.jit`, `jax.grad`) keep the problem's direction, checked when the
    program runs."""
    if tspan is None:
        tspan = default
    try:
        t0, t1 = tspan
    except (TypeError, ValueError) as e:
        raise ValueError(f"tspan must be a pair of numbers (t0, t1), got {tspan!r}") from e
    if not any(isinstance(t, jax.core.Tracer) for t in (t0, t1)):
        t0, t1 = check_tspan((t0, t1))
        return t0, t1, 1 if t1 > t0 else -1
    sign = 1 if default[1] > default[0] else -1
    t0, t1 = (jnp.asarray(t, jnp.result_type(float)) for t in (t0, t1))
    if t0.shape or t1.shape:
        raise ValueError(f"tspan must be two scalars (t0, t1), got shapes {t0.shape} and {t1.shape}")
    bad = ~jnp.isfinite(t0) | ~jnp.isfinite(t1) | (sign * (t1 - t0) <= 0)
    order = "t1 > t0" if sign > 0 else "t1 < t0"
    return error_if(t0, bad, f"tspan must be finite with {order} (traced times keep the problem's direction)"), t1, sign


def check_integrand(g: Callable, u0, p, t0) -> int:
    """The entries of g(u, p, t), checked now by tracing g at (u0, p, t0), without running it: g must
    take (u, p, t) and return a float scalar or a PyTree of float arrays; errors name `integrand`."""
    if not callable(g):
        raise TypeError(f"integrand must be callable g(u, p, t), got {g!r}")
    out = _traced("integrand g(u, p, t)", g, u0, p, t0)
    leaves = jax.tree.leaves(out)
    if not leaves or not all(_is_float(x) for x in leaves):
        raise ValueError(
            f"integrand g(u, p, t) must return a float scalar or a PyTree of float arrays, got "
            f"{_describe(out)}{_float_fix(leaves)}"
        )
    return sum(int(np.prod(x.shape)) for x in leaves)


def check_rhs(f: Callable, u0, p, t0: float) -> None:
    """f must map (u0, p, t0) to float arrays with u0's structure and shapes, checked now by tracing f,
    without running it. Where it does not, and f is evidently diffrax's f(t, y, args) (its first
    parameter is named like a time, or f(t0, u0, p) traces to u0's structure), the error says so."""

    def hint() -> str:
        return f"; {DIFFRAX_ORDER}" if _diffrax_ordered(f, u0, p, t0) else ""

    out = _traced("f(u, p, t)", f, u0, p, t0, hint)
    if jax.tree.structure(out) != jax.tree.structure(u0):
        raise ValueError(
            f"f(u, p, t) returns {_describe(out)} but u0 is {_describe(u0)}: they must match "
            f"(return one array with xp.stack / xp.asarray for a vector state){hint()}"
        )
    check_leaves("f(u, p, t)", out, u0, "du/dt", hint)


def check_leaves(call: str, out, u0, what: str, hint: Callable[[], str] = lambda: "") -> None:
    """Each leaf of `out` (what `call` returned, traced; u0's structure) a float array of its u0 leaf's shape
    (`what` it is, `hint()` appended), else a ValueError naming the leaf."""
    for (label, y), (_, u) in zip(leaf_names(out, call), leaf_names(u0, "u0")):
        if not _is_float(y):
            got = f"{_describe(y)}{_float_fix([y])}{hint()}"
            raise ValueError(f"{label} must return float arrays ({what}, u0's structure), got {got}")
        if tuple(y.shape) != tuple(np.shape(u)):
            raise ValueError(
                f"{label} returns shape {tuple(y.shape)} but u0{label[len(call) :]} has shape "
                f"{tuple(np.shape(u))}: they must match{hint()}"
            )


def forward_times(r: Request, dtype) -> tuple:
    """(s0, s1, the save times (T,)) in the solve's forward time s = sign t, with s1 appended where an integrand
    is solved without callbacks (q(t1) is saved last)."""
    s0, s1 = (r.sign * jnp.asarray(t, dtype) for t in (r.t0, r.t1))
    saves = r.sign * jnp.asarray(r.ts, dtype)
    if r.integrand is not None and not r.callbacks:
        saves = jnp.concatenate([saves, s1[None]])
    return s0, s1, saves


DIFFRAX_ORDER = (
    "sciad's vector field is f(u, p, t) (state first), diffrax's is f(t, y, args): reorder the "
    "arguments, e.g. lambda u, p, t: f(t, u, p)"
)
TIME_NAMES = ("t", "time", "s", "tau")  # a first parameter named so makes f evidently f(t, y, args)


def _traced(call: str, fn: Callable, u0, p, t0, hint: Callable[[], str] | None = None):
    """The shapes and dtypes fn(u0, p, t0) returns (traced, not run); where tracing fails, an error
    naming `call` (the original chained), with `hint()` appended."""
    hint = hint or (lambda: "")

    def at(u, p):
        return fn(u, p, jnp.asarray(t0, jnp.result_type(*jax.tree.leaves(u))))

    try:
        return eqx.filter_eval_shape(at, u0, p)
    except jax.errors.ConcretizationTypeError as e:
        raise ValueError(
            f"{call} has value-dependent Python control flow, which JAX cannot trace into the "
            f"ODE solver: write branches with jnp.where / jax.lax.cond{hint()}"
        ) from e
    except Exception as e:
        raise (TypeError if isinstance(e, TypeError) else ValueError)(
            f"{call} failed when traced with u = u0, p = the problem's p, t = t0 ({type(e).__name__}: {e}): it "
            f"must take (u, p, t) in that order, u with u0's structure{hint()}"
        ) from e


def _diffrax_ordered(f: Callable, u0, p, t0) -> bool:
    """Whether f looks like diffrax's f(t, y, args): its first parameter is named like a time, or
    f(t0, u0, p) traces to u0's structure and shapes."""
    try:
        first = next(iter(inspect.signature(f).parameters), None)
    except (TypeError, ValueError):  # no signature (some builtins, C functions)
        first = None
    if first in TIME_NAMES:
        return True
    try:
        out = eqx.filter_eval_shape(lambda u, p: f(jnp.asarray(t0, jnp.result_type(*jax.tree.leaves(u))), u, p), u0, p)
    except Exception:
        return False
    return jax.tree.structure(out) == jax.tree.structure(u0) and all(
        _is_float(y) and tuple(y.shape) == tuple(np.shape(u)) for y, u in zip(jax.tree.leaves(out), jax.tree.leaves(u0))
    )


def _is_float(x) -> bool:
    """Whether a traced output `x` is a float array (not a Python number, string, or integer array)."""
    return hasattr(x, "dtype") and hasattr(x, "shape") and jnp.issubdtype(x.dtype, jnp.inexact)


def _float_fix(leaves) -> str:
    """How to make `leaves` (traced outputs) float arrays: the fix for the first that is not."""
    x = next((x for x in leaves if not _is_float(x)), None)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return f": return a float array, e.g. jnp.asarray({float(x)!r}), or an expression in u"
    if hasattr(x, "dtype"):
        return ": return floats, e.g. x.astype(u.dtype)"
    return ": return a float array"


def _describe(tree) -> str:
    leaves = jax.tree.leaves(tree)
    if len(leaves) == 1 and jax.tree.structure(tree).num_nodes == 1:
        x = leaves[0]
        if not hasattr(x, "dtype"):
            return f"a Python {type(x).__name__} ({x!r})"
        dtype = "" if jnp.issubdtype(x.dtype, jnp.inexact) else f" and dtype {x.dtype}"
        return f"an array of shape {tuple(np.shape(x))}{dtype}"
    if not leaves:
        return f"nothing ({tree!r})"
    return f"a PyTree {jax.tree.structure(tree)}"


def check_saveat(saveat, t0, t1, direction: int | None = None):
    """`saveat` as times (T,) from t0 towards t1, non-decreasing (non-increasing where t1 < t0) inside
    tspan (default: t0 and t1); a clear error otherwise. Repeated times are kept, as diffrax keeps them
    (e.g. a series padded by repeating its last time): their values repeat and their cotangents add
    up. `direction` (+1 or -1) is the sign of t1 - t0, needed where t0 or t1 are traced.

    Concrete times are checked now and returned as NumPy; traced ones (under `jax.jit`, `jax.vmap`)
    must be a non-empty 1-D array and are checked when the program runs."""
    sign = direction or (1 if t1 > t0 else -1)
    order = "non-decreasing" if sign > 0 else "non-increasing"
    traced = any(isinstance(x, jax.core.Tracer) for x in (saveat, t0, t1))
    if saveat is None:
        return jnp.stack([jnp.asarray(t0, float), jnp.asarray(t1, float)]) if traced else np.array([t0, t1])
    if traced:
        ts = jnp.asarray(saveat)
        if ts.ndim != 1 or ts.shape[0] == 0:
            raise ValueError(f"saveat must be a non-empty 1-D array of times, got shape {tuple(ts.shape)}")
        if not jnp.issubdtype(ts.dtype, jnp.floating):
            raise TypeError(f"saveat has dtype {ts.dtype}; pass float times")
        bad = (
            ~jnp.all(jnp.isfinite(ts))
            | jnp.any(sign * jnp.diff(ts) < 0)
            | (sign * (ts[0] - t0) < 0)
            | (sign * (t1 - ts[-1]) < 0)
        )
        return error_if(ts, bad, f"saveat must be finite times inside tspan, {order} from t0 to t1 (repeats allowed)")
    ts = np.atleast_1d(np.asarray(saveat, dtype=float))
    if ts.ndim != 1 or ts.size == 0:
        raise ValueError(f"saveat must be a non-empty 1-D sequence of times, got shape {ts.shape}")
    if not np.all(np.isfinite(ts)):
        raise ValueError("saveat contains non-finite times")
    if np.any(sign * np.diff(ts) < 0):
        first = int(np.argmax(sign * np.diff(ts) < 0))
        raise ValueError(
            f"saveat must be {order} from t0 to t1 (repeats allowed), got saveat[{first}] = "
            f"{ts[first]} before saveat[{first + 1}] = {ts[first + 1]}: sort the times"
        )
    if sign * (ts[0] - t0) < 0 or sign * (t1 - ts[-1]) < 0:
        raise ValueError(f"saveat must lie inside tspan ({t0}, {t1}), got [{ts[0]}, {ts[-1]}]")
    return ts
