"""`SDEProblem`: du = a(u, p, t) dt + σ(u, p, t) dW, and what it adds to the solve: fixed steps on a grid or
adaptive ones, its Brownian path from a key, its solver (diffrax's SDE solvers), differentiable pathwise by
every sensealg."""

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import diffrax as dfx
import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, PyTree

from sciad import _events
from sciad._brownian import BrownianPath
from sciad._custom_types import RealScalarLike
from sciad._errors import error_if
from sciad._events import PresetTimeCallback, _check_affect
from sciad._problem import (
    AbstractProblem,
    Request,
    Staged,
    _traced,
    check_params,
    check_state,
    check_tolerances,
    check_tspan,
)
from sciad._pytrees import Layout, leaf_names
from sciad._sde_solvers import SDE_SOLVERS, DiagonalMilstein, Noise, SDEField, System, calculus_of
from sciad._vector_field import VectorField
from sciad.adjoints._base import AbstractSensitivity, Setup
from sciad.adjoints._loop import GridSteps

NOISES = ("diagonal", "scalar")  # or an int m: general noise of m Brownian motions
CALCULI = ("ito", "stratonovich")
ON_GRID = 1e-9  # a save time is on the grid within this fraction of a step
SDE_TOLERANCE = 1e-3  # adaptive steps' default rtol and atol (a strong error: Heun's is O(h))
TREE_TOLERANCE = 2.0**-16  # the VirtualBrownianTree of adaptive steps resolves times to this fraction of tspan


class SDEProblem(AbstractProblem):
    """du = drift(u, p, t) dt + diffusion(u, p, t) dW on tspan = (t0, t1), u(t0) = u0.

    `drift(u, p, t)` returns u's structure, as an ODE's f. `diffusion(u, p, t)` returns u's structure
    for `noise="diagonal"` (each entry of u its own Brownian motion: σᵢ dWᵢ) and `noise="scalar"`
    (one Brownian motion for all: σ dW), or, for `noise=m` (an int: general noise, m Brownian
    motions), an (n, m) array over the flattened state (u0's leaves raveled in order). `calculus`:
    "ito" (default) or "stratonovich". `u0` and `p` are PyTrees as for `ODEProblem` (p's non-array
    leaves are static); drift and diffusion may close over values being differentiated.

    Checked here, each error naming the argument and the fix: callables, u0's and p's leaves (float,
    finite where concrete), tspan (finite, t1 > t0), noise and calculus, and the shapes drift and
    diffusion return at (u0, p, t0) (traced by `jax.eval_shape`, not run)."""

    drift: Callable[[PyTree[Array], PyTree[Any], RealScalarLike], PyTree[Array]]
    diffusion: Callable[[PyTree[Array], PyTree[Any], RealScalarLike], PyTree[Array]]
    u0: PyTree[Array]
    tspan: tuple[float, float] = eqx.field(static=True)
    p: PyTree[Any] = None
    noise: str | int = eqx.field(static=True, default="diagonal")
    calculus: str = eqx.field(static=True, default="ito")
    options: ClassVar[dict[str, Any]] = {"key": None, "brownian": None}

    def __init__(
        self,
        drift: Callable[[PyTree[Array], PyTree[Any], RealScalarLike], PyTree[Array]],
        diffusion: Callable[[PyTree[Array], PyTree[Any], RealScalarLike], PyTree[Array]],
        u0: PyTree[ArrayLike],
        tspan: tuple[RealScalarLike, RealScalarLike],
        p: PyTree[Any] = None,
        noise: str | int = "diagonal",
        calculus: str = "ito",
    ):
        for name, fn in (("drift", drift), ("diffusion", diffusion)):
            if not callable(fn):
                raise TypeError(f"SDEProblem({name}=...): {name} must be callable {name}(u, p, t), got {fn!r}")
        if not (
            noise in NOISES or (isinstance(noise, (int, np.integer)) and not isinstance(noise, bool) and noise >= 1)  # pyright: ignore[reportOperatorIssue]  # an integer here
        ):
            raise ValueError(
                f"SDEProblem(noise=...) must be 'diagonal', 'scalar' or a positive int m (general "
                f"noise: diffusion returns an (n, m) matrix), got {noise!r}"
            )
        if calculus not in CALCULI:
            raise ValueError(f"SDEProblem(calculus=...) must be 'ito' or 'stratonovich', got {calculus!r}")
        self.drift, self.diffusion = drift, diffusion
        self.u0 = check_state("u0", u0)
        self.p = check_params("p", np.zeros((0,)) if p is None else p)
        self.tspan = check_tspan(tspan)
        if self.tspan[1] < self.tspan[0]:
            raise ValueError(f"SDEProblem(tspan={tspan!r}): SDEs run forwards in time here: pass t1 > t0")
        self.noise = noise if isinstance(noise, str) else int(noise)
        self.calculus = calculus
        check_sde_functions(self)

    def staged(self, request: Request) -> "Staged":
        return _staged(self, request)


def noise_of(prob: SDEProblem, n: int) -> Noise:
    """The problem's `Noise` for a state of n entries."""
    if isinstance(prob.noise, int):
        return Noise("general", n, prob.noise)
    return Noise(prob.noise, n, n if prob.noise == "diagonal" else 1)


def check_sde_functions(prob: SDEProblem) -> None:
    """drift returns u0's structure and shapes; diffusion u0's (diagonal, scalar noise) or (n, m)
    (general noise), all float: checked by tracing them at (u0, p, t0); errors name the function."""
    u0, p, t0 = prob.u0, prob.p, prob.tspan[0]
    n = sum(int(np.size(x)) for x in jax.tree.leaves(u0))
    for name, fn in (("drift", prob.drift), ("diffusion", prob.diffusion)):
        call = f"{name}(u, p, t)"
        out = _traced(call, fn, u0, p, t0)
        if name == "diffusion" and isinstance(prob.noise, int):
            leaves = jax.tree.leaves(out)
            if len(leaves) != 1 or tuple(leaves[0].shape) != (n, prob.noise):
                got = tuple(leaves[0].shape) if len(leaves) == 1 else jax.tree.structure(out)
                raise ValueError(
                    f"{call} must return one (n, m) = ({n}, {prob.noise}) array for noise={prob.noise} "
                    f"(general noise: column j multiplies dW_j), got {got}"
                )
            _check_float(call, leaves[0])
            continue
        if jax.tree.structure(out) != jax.tree.structure(u0):
            kind = "" if name == "drift" else f" for noise={prob.noise!r} (for an (n, m) matrix pass noise=m)"
            raise ValueError(
                f"{call} must return u0's structure {jax.tree.structure(u0)}{kind}, got {jax.tree.structure(out)}"
            )
        for (label, y), (_, u) in zip(leaf_names(out, call), leaf_names(u0, "u0")):
            _check_float(label, y)
            if tuple(y.shape) != tuple(np.shape(u)):
                raise ValueError(
                    f"{label} returns shape {tuple(y.shape)} but u0{label[len(call) :]} has shape "
                    f"{tuple(np.shape(u))}: they must match"
                )


def _check_float(label: str, y) -> None:
    if not (hasattr(y, "dtype") and jnp.issubdtype(y.dtype, jnp.inexact)):
        raise ValueError(
            f"{label} must return float arrays, got {getattr(y, 'dtype', type(y).__name__)}: "
            "return an expression in u, or x.astype(u.dtype)"
        )


# diffrax's SDE solvers that step `SDEField.terms` (their stages take the noise term's products); the rest say why not
LOOP_SOLVER_TYPES = (
    dfx.Euler,
    dfx.EulerHeun,
    dfx.Heun,
    dfx.Midpoint,
    dfx.Ralston,
    dfx.ReversibleHeun,
    DiagonalMilstein,
)
WHY_NOT = {
    dfx.AbstractSRK: "it needs the Brownian path's space-time Lévy areas, which sciad's paths do not give yet",
    dfx.ItoMilstein: "it materialises the diffusion as diffrax's structured matrix: pass solver='milstein'",
    dfx.StratonovichMilstein: "it materialises the diffusion as diffrax's structured matrix: pass solver='heun'",
}


def loop_solver(solver, calculus: str, noise: Noise, adaptive: bool) -> dfx.AbstractSolver:
    """The diffrax solver that steps the solve: `solver` itself (one of diffrax's SDE solvers that serve), by
    its name in `SDE_SOLVERS`, or the default (adaptive steps: Heun, which has an error estimate; fixed
    steps: `default_sde_solver`'s); a clear error for an ODE solver, one that does not serve the noise, and
    for adaptive steps one without an error estimate."""
    if solver is None:
        solver = default_sde_solver(calculus, noise, adaptive)
    if isinstance(solver, str):
        if solver not in SDE_SOLVERS:
            raise ValueError(f"unknown SDE solver {solver!r}; choose one of {sorted(SDE_SOLVERS)} or pass diffrax's")
        solver = SDE_SOLVERS[solver]()
    if not isinstance(solver, dfx.AbstractSolver):
        raise TypeError(f"solver= must be a name in {sorted(SDE_SOLVERS)} or a diffrax solver, got {solver!r}")
    name = type(solver).__name__
    if calculus_of(solver) is None:
        raise ValueError(
            f"solver={name}() is an ODE solver (diffrax declares no calculus for it): pass an SDE solver, "
            f"one of {sorted(SDE_SOLVERS)} or diffrax's Euler, Heun, ReversibleHeun, ..."
        )
    if not isinstance(solver, LOOP_SOLVER_TYPES):
        why = next((why for cls, why in WHY_NOT.items() if isinstance(solver, cls)), "it is not one sciad steps")
        raise ValueError(
            f"solver={name}() does not step sciad's SDE solves: {why}. Pass one of diffrax's "
            f"{', '.join(cls.__name__ for cls in LOOP_SOLVER_TYPES[:-1])}, or a name in {sorted(SDE_SOLVERS)}"
        )
    if isinstance(solver, DiagonalMilstein) and noise.kind not in ("diagonal", "scalar"):
        raise ValueError(
            "solver 'milstein' serves diagonal and scalar noise (general noise needs its iterated integrals): "
            "pass solver='euler' (Itô) or 'heun' (Stratonovich)"
        )
    if adaptive and _error_estimate(solver) is None:
        raise ValueError(
            f"solver={name}() has no error estimate, so it takes fixed steps: pass dt0=... (the step), or "
            "an adaptive solver (solver='heun', diffrax.ReversibleHeun())"
        )
    return solver


def default_sde_solver(calculus: str, noise: Noise, adaptive: bool) -> str:
    """The name of the default solver: adaptive steps, Heun (it has an error estimate); fixed steps, Itô: Milstein
    for diagonal and scalar noise (strong order 1), Euler–Maruyama for general noise; Stratonovich: Heun."""
    if adaptive or calculus == "stratonovich":
        return "heun"
    return "milstein" if noise.kind in ("diagonal", "scalar") else "euler"


def _error_estimate(solver: dfx.AbstractSolver):
    """The structure of `solver`'s error estimate on a one-state SDE (None: it has none)."""
    terms = dfx.MultiTerm(dfx.ODETerm(lambda t, y, args: -y), dfx.ControlTerm(lambda t, y, args: y[:, None], _NoPath()))
    y = jnp.zeros((1,))
    state = eqx.filter_eval_shape(solver.init, terms, 0.0, 1.0, y, None)
    return eqx.filter_eval_shape(solver.step, terms, 0.0, 1.0, y, None, state, False)[1]


class _NoPath(dfx.AbstractPath):
    """A Brownian path's shape alone (for `_error_estimate`'s abstract step)."""

    t0 = 0.0
    t1 = 1.0

    def evaluate(self, t0, t1=None, left=True):
        return jnp.zeros((1,))


def grid(t0: float, t1: float, dt0) -> tuple[int, float]:
    """(steps, dt): the fewest steps of at most `dt0` (an exact divisor where dt0 divides the span)."""
    if isinstance(dt0, jax.core.Tracer):
        raise ValueError("dt0 must be a concrete number (it sets the grid's steps), not a traced value")
    dt0 = float(dt0)
    if not (np.isfinite(dt0) and dt0 > 0):
        raise ValueError(f"dt0 must be a positive number, got {dt0}")
    ratio = (t1 - t0) / dt0
    steps = max(1, int(np.ceil(ratio - ON_GRID * max(1.0, ratio))))
    return steps, (t1 - t0) / steps


def save_steps(ts, t0: float, dt: float):
    """The grid steps (T,) int32 of the save times `ts`, each within `ON_GRID` steps of a grid point:
    NumPy, checked now, for concrete times; traced, checked when the program runs, for traced ones."""
    if isinstance(ts, jax.core.Tracer):
        position = (ts - t0) / dt
        steps = jnp.rint(position)
        off = jnp.abs(position - steps) > ON_GRID * jnp.maximum(1.0, position)
        message = (
            f"saveat times must be on the step grid t0 + k dt (dt = {dt:g}): pass save times on it, or a dt0 "
            "that divides them"
        )
        return error_if(steps, jnp.any(off), message).astype(jnp.int32)
    position = (np.asarray(ts, float) - t0) / dt
    steps = np.rint(position)
    off = np.abs(position - steps) > ON_GRID * np.maximum(1.0, position)
    if np.any(off):
        raise ValueError(
            f"saveat time {float(np.asarray(ts)[np.argmax(off)])} is not on the step grid t0 + k dt "
            f"(dt = {dt:g}): pass save times on it, or a dt0 that divides them"
        )
    return steps.astype(np.int32)


def check_preset_times(callbacks, u0, p, t0: float, t1: float, dt: float) -> None:
    """Checks the preset events of a fixed grid: concrete times inside tspan and on the grid, affects returning
    u0's structure (checked by tracing)."""
    for i, callback in enumerate(callbacks):
        if any(isinstance(t, jax.core.Tracer) for t in jax.tree.leaves(callback.times)):
            raise ValueError(
                f"callbacks[{i}]: the preset times of an SDE solve on a fixed grid must be concrete grid times, "
                "Python or NumPy numbers (or pass no dt0: adaptive steps land on traced times)"
            )
        times = np.atleast_1d(np.asarray(callback.times, float))
        if np.any((times < t0) | (times > t1)):
            raise ValueError(
                f"callbacks[{i}]: PresetTimeCallback times {times[(times < t0) | (times > t1)].tolist()} "
                f"lie outside tspan ({t0}, {t1}): drop them or widen tspan"
            )
        _check_affect(callback.affect, u0, p, jnp.asarray(t0), i)
        save_steps(times, t0, dt)


def brownian_path(brownian, key, t0: float, t1: float, dt: float | None, steps: int, shape: tuple, dtype):
    """The Brownian path of a solve: `brownian` (a `BrownianPath` on this grid, or a diffrax Brownian
    path covering tspan), else a new path from `key`: a `BrownianPath` on the grid of `steps` steps of dt, or for
    adaptive steps (dt None) a `diffrax.VirtualBrownianTree` resolving times to `TREE_TOLERANCE` of tspan."""
    if brownian is None:
        if key is None:
            raise ValueError(
                "an SDE solve draws its Brownian path from a key: pass key=jax.random.key(0) (or "
                "brownian=sol.brownian to reuse a path)"
            )
        if dt is None:
            return dfx.VirtualBrownianTree(t0, t1, TREE_TOLERANCE * (t1 - t0), shape, key)
        return BrownianPath(key, float(t0), float(dt), int(steps), shape, np.dtype(dtype))
    if key is not None:
        raise ValueError("pass key= or brownian=, not both (a path carries its own key)")
    if isinstance(brownian, BrownianPath):
        if dt is None:
            raise ValueError(
                "brownian= is a sciad BrownianPath, exact on its grid's steps: pass dt0=... (its step), or a "
                "diffrax.VirtualBrownianTree for adaptive steps"
            )
        if (
            (brownian.steps, brownian.shape) != (steps, shape)
            or not np.isclose(brownian.dt, dt)
            or not np.isclose(brownian.t0, t0)
        ):
            raise ValueError(
                f"brownian= is a path on another grid or shape ({brownian.steps} steps of "
                f"{brownian.dt:g} from {brownian.t0:g}, shape {brownian.shape}); this solve needs "
                f"{steps} steps of {dt:g} from {t0:g}, shape {shape}: pass the same tspan and dt0"
            )
        return brownian
    if isinstance(brownian, dfx.AbstractBrownianPath):
        got = jax.tree.leaves(brownian.shape)  # pyright: ignore[reportAttributeAccessIssue]  # diffrax's paths declare shape
        if len(got) != 1 or tuple(got[0].shape) != shape:
            raise ValueError(
                f"brownian= has shape {brownian.shape}; this problem's noise needs one array of shape {shape}"  # pyright: ignore[reportAttributeAccessIssue]  # diffrax's paths declare shape
            )
        return brownian
    raise TypeError(
        f"brownian= must be a sciad BrownianPath (Solution.brownian) or a diffrax Brownian path, got "
        f"{type(brownian).__name__}"
    )


def _staged(prob: SDEProblem, r: Request) -> "_SDEStaged":
    """The SDE's solve: fixed steps on the grid of `dt0` along a `BrownianPath`, or adaptive ones (no dt0)
    along a `diffrax.VirtualBrownianTree`; its solver (`loop_solver`); the field `SDEField`."""
    if not all(isinstance(c, PresetTimeCallback) for c in r.callbacks):
        raise ValueError(
            "callbacks of an SDE solve: sciad.PresetTimeCallback only (state-dependent events, "
            "ContinuousCallback, are not supported for SDEs yet)"
        )
    adaptive = r.dt0 is None
    traced = any(isinstance(t, jax.core.Tracer) for t in (r.t0, r.t1))
    if traced and not adaptive:
        raise ValueError(
            "a traced tspan of an SDE solve takes adaptive steps (a fixed grid's steps are counted at trace time): "
            "pass no dt0, or a concrete tspan"
        )
    if r.sign < 0:
        raise ValueError(f"tspan=({r.t0}, {r.t1}): SDEs run forwards in time here: pass t1 > t0")
    rtol, atol = (SDE_TOLERANCE if tol is None else tol for tol in (r.rtol, r.atol))
    if adaptive:
        check_tolerances(rtol, atol, r.max_steps)
    t0, t1 = r.t0, r.t1
    steps, dt = (int(r.max_steps), 0.0) if adaptive else grid(t0, t1, r.dt0)
    integrand = r.integrand

    def extra(u, p, t):
        sigma = prob.diffusion(u, p, t)
        return sigma if integrand is None else (sigma, integrand(u, p, t))

    field = VectorField.of(prob.drift, r.u0, r.p, t0, host=False, integrand=extra)
    n, dtype = field.u.size, field.dtype
    noise = noise_of(prob, n)
    stepping = loop_solver(None if r.solver == "auto" else r.solver, prob.calculus, noise, adaptive)
    o = r.options
    path = brownian_path(o["brownian"], o["key"], t0, t1, None if adaptive else dt, steps, (noise.m,), dtype)
    system = System(field, noise, r.entries, prob.calculus).in_calculus(calculus_of(stepping))  # pyright: ignore[reportArgumentType]  # an SDE solver
    times = jnp.asarray(r.ts, dtype)
    controller = None  # adaptive: sciad's PID control at rtol, atol, steps landing on the save times
    if not adaptive:  # the saves on the grid, in its own arithmetic
        times = save_steps(r.ts, t0, dt).astype(dtype) * dtype.type(dt) + dtype.type(t0)
        controller = GridSteps()
        check_preset_times(r.callbacks, r.u0, r.p, t0, t1, dt)
    if r.entries and not r.callbacks:  # q(t1) is saved last
        times = jnp.append(times, dtype.type(t1))
    setup = Setup(
        SDEField(system, path),
        stepping,
        jnp.asarray(t0, dtype),
        jnp.asarray(t1, dtype),
        times,
        float(rtol),
        float(atol),
        steps,
        stepsize_controller=controller,
        dt0=None if adaptive else jnp.asarray(dt, dtype),
        steps_at_saves=adaptive,
    )
    u0 = jnp.asarray(field.u.ravel(r.u0), dtype)
    p = jnp.asarray(field.p.ravel(eqx.filter(r.p, eqx.is_array)), dtype)
    q = None
    if integrand is not None:
        q = Layout.of(eqx.filter_eval_shape(integrand, r.u0, r.p, jnp.asarray(t0, dtype)), dtype)
    return _SDEStaged(setup, u0, p, field.u, q, r, field, path)


@dataclasses.dataclass(frozen=True)
class _SDEStaged(Staged):
    setup: Setup
    u0: jax.Array
    p: jax.Array
    u: Layout
    q: Layout | None
    request: Request
    field: VectorField  # drift, diffusion and integrand side by side
    path: Any

    def auto_sensealg(self) -> AbstractSensitivity:
        from sciad._auto import auto_sde_sensealg

        r, setup = self.request, self.setup
        return auto_sde_sensealg(
            r.u0, r.p, r.ts, solver=setup.solver, steps=setup.max_steps, integral_entries=r.entries
        ).sensealg

    def plan(self):
        r = self.request
        return _events.Plan.of(r.callbacks, self.field, r.u0, r.p, (r.t0, r.t1), 1, r.max_events, "none")

    def extras(self, setup: Setup, sensealg: AbstractSensitivity, u0: jax.Array) -> dict[str, Any]:
        return {"brownian": self.path}
