"""Choosing the sensitivity algorithm for a problem outside `jit`: the trace-time heuristic
(`sciad._auto`) on an `ODEProblem`, or autotuning: the plausible candidates timed on the
problem within a time budget, their gradients checked, the fastest correct one chosen."""

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import time
import typing
from collections.abc import Callable, Sequence

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PyTree, Real, Shaped

import sciad.ad as ad
from sciad._auto import THRESHOLDS, Choice, Features, auto_sensealg, heuristic
from sciad._auto import features as trace_features
from sciad._custom_types import RealScalarLike
from sciad._dae import dae_solver
from sciad._dae_problem import DAEProblem
from sciad._ode import ODEProblem, get_solver
from sciad._problem import check_saveat
from sciad._solve import solve
from sciad._solver_choice import choose
from sciad._stiff import AbstractStageJacobian, is_implicit, with_stage_jacobian
from sciad._timing import compare, fastest
from sciad.adjoints import (
    AbstractSensitivity,
    BacksolveAdjoint,
    DiscreteAdjoint,
    ForwardDiffSensitivity,
    ForwardSensitivity,
    GaussAdjoint,
    InterpolatingAdjoint,
    describe,
    parse,
)


def features(
    prob: ODEProblem,
    saveat: Real[ArrayLike, " T"] | Sequence[RealScalarLike] | None,
    *,
    solver: str | dfx.AbstractSolver | None = "auto",
    rtol: float = 1e-6,
    atol: float = 1e-6,
    max_steps: int = 4096,
    memory_budget: int | None = None,
) -> Features:
    """`sciad._auto.features` of `prob` saved at `saveat` with `solver` (a name, a diffrax solver, or
    "auto" as in `sciad.solve`)."""
    solver, why, stiff = _chosen(prob, solver, rtol, atol, "auto")
    return trace_features(
        prob.u0,
        prob.p,
        check_saveat(saveat, *prob.tspan),
        solver=_solver(prob, solver),
        rtol=rtol,
        atol=atol,
        max_steps=max_steps,
        memory_budget=memory_budget,
        mass_matrix=prob.mass_matrix is not None,
        solver_reason=why,
        stiff=stiff,
    )


def _chosen(prob: ODEProblem, solver, rtol, atol, jacobian) -> tuple:
    """(`solver`, why, stiff): "auto" (or None) resolved to a name as `sciad.solve` resolves it, from the
    problem's values (`sciad._solver_choice.auto_solver`, stage solves by `jacobian`); anything else as
    given; and for an explicit solver whether the problem is stiff for it, as `sciad.solve` estimates it
    (`sciad._solver_choice.stiff_for_explicit`; None: not estimated)."""
    return choose(
        prob,
        solver,
        prob.u0,
        prob.p,
        prob.tspan,
        rtol=rtol,
        atol=atol,
        jacobian=jacobian,
        implicit=lambda solver: is_implicit(_solver(prob, solver)),
    )


def _solver(prob: ODEProblem, solver):
    """The solver `sciad.solve` steps `prob` with for `solver` (as `_chosen` resolves it), given its mass matrix."""
    return dae_solver(get_solver(solver), prob.mass_matrix)


def candidates(feat: Features) -> list[tuple[AbstractSensitivity, str]]:
    """The plausible (sensealg, reason) pairs for a problem with `feat`, most plausible first:
    forward modes before the adjoints up to the heuristic's `forward_mode_parameters` parameters, after beyond."""
    forward: list[tuple[AbstractSensitivity, str]] = [
        (ForwardDiffSensitivity(), "forward mode through the solver"),
        (ForwardSensitivity(jvp="jax-forward"), "forward sensitivity equations"),
        (ForwardSensitivity(seminorm=True), "forward sensitivities, S out of the error control"),
    ]
    adjoints: list[tuple[AbstractSensitivity, str]] = [
        (InterpolatingAdjoint(), "adjoint on the stored interpolation"),
        (InterpolatingAdjoint(checkpointing=True), "checkpointed adjoint (bounded memory)"),
        (InterpolatingAdjoint(seminorm=True), "adjoint with μ out of the error control (SciML's QuadratureAdjoint)"),
        (GaussAdjoint(), "λ alone, ∂L/∂p by Gauss–Legendre on each step"),
        (DiscreteAdjoint(), "discretise-then-optimise"),
    ]
    if not feat.implicit_solver:
        adjoints.append((BacksolveAdjoint(), "backsolve (explicit solver)"))
        adjoints.append((BacksolveAdjoint(seminorm=True), "backsolve, μ out of the error control"))
    if "enzyme" in ad.available():
        adjoints.append((InterpolatingAdjoint(vjp="enzyme"), "compiler-level VJPs"))
    out: list[tuple[AbstractSensitivity, str]] = (
        forward + adjoints if feat.parameters <= THRESHOLDS.forward_mode_parameters else adjoints + forward
    )
    if feat.memory_budget is not None and feat.interpolation_bytes > feat.memory_budget:
        out = [(s, r) for s, r in out if not s.stores_interpolation]
    return out


def select_sensealg(
    prob: ODEProblem | DAEProblem,
    *,
    saveat: Real[ArrayLike, " T"] | Sequence[RealScalarLike] | None = None,
    loss: Callable[[PyTree[Shaped[Array, "T ..."]]], Float[ArrayLike, ""]] | None = None,
    autotune: bool = False,
    memory_budget: int | None = None,
    budget: float = 20.0,
    solver: str | dfx.AbstractSolver | None = "auto",
    rtol: float = 1e-6,
    atol: float = 1e-6,
    max_steps: int = 4096,
    jacobian: str | AbstractStageJacobian = "auto",
    cache_dir: str | os.PathLike | None = None,
) -> Choice:
    """Choose a sensealg (with its engine) for gradients with respect to p (its
    floating-point array leaves: any PyTree, an equinox model) of `loss(us)`
    (a scalar; default: the sum of every saved value) of `prob` saved at `saveat`.

    Without `autotune`, the trace-time rule of `sciad._auto` (what
    `sensealg="auto"` uses): sizes, the number of save points, whether the
    solver is implicit and how its stages are solved (`jacobian`, as in
    `sciad.solve`), the stored interpolation's bytes against
    `memory_budget`. `solver` as in `sciad.solve` (default "auto", resolved as
    it resolves it, from the problem's values); the report's features
    say which solver and why (`solver`, `solver_reason`). With `autotune=True` the candidates are measured on this
    problem within `budget` seconds for the whole call, compilation included:
    the heuristic's pick is compiled first, whatever the budget (so
    autotuning never does worse than the heuristic for lack of it), then the
    `DiscreteAdjoint` reference the gradients are checked against, then the
    other `candidates` in order of plausibility; one whose compilation would
    start past the budget is skipped ("not measured: budget"). Interleaved
    timed rounds of the compiled candidates not found wrong fill what
    remains, at least one after a warm-up round: the call ends within
    `budget` plus the compilation under way then and two rounds. The fastest correct candidate
    is chosen; candidates whose timings' interquartile ranges overlap its own
    tie with it (`sciad.timing.ties`), and a tie is settled for the
    heuristic's pick when it is among them. If the budget ran out before the
    reference, the pick is chosen unchecked. With `cache_dir`,
    autotuned choices are kept on disk, keyed on the content of everything
    that changes them: f and loss (their programs and the values they
    close over), u0, p, tspan, saveat, solver, tolerances, max_steps,
    memory budget, timing budget and device.

    A `DAEProblem` (F(u', u, p, t) = 0) is chosen for by its own rule (`implicit-dae`, not autotuned).
    """
    own = getattr(prob, "sensealg_choice", None)  # a kind with a rule of its own (a fully implicit DAE's)
    if own is not None and not autotune:
        return own(check_saveat(saveat, *prob.tspan), rtol=rtol, atol=atol)
    if not isinstance(prob, ODEProblem):
        raise TypeError(f"prob must be a sciad.ODEProblem, got {type(prob).__name__}")
    ts = check_saveat(saveat, *prob.tspan)
    solver, why, stiff = _chosen(prob, solver, rtol, atol, jacobian)
    stages = with_stage_jacobian(_solver(prob, solver), jacobian, prob.f, prob.u0, prob.p, prob.tspan[0])[1]
    kw: dict[str, typing.Any] = dict(
        solver=_solver(prob, solver),
        rtol=rtol,
        atol=atol,
        max_steps=max_steps,
        memory_budget=memory_budget,
        jacobian=stages,
        mass_matrix=prob.mass_matrix is not None,
        solver_reason=why,
        stiff=stiff,
    )
    if not autotune:
        return auto_sensealg(prob.u0, prob.p, ts, **kw)
    if not budget > 0:
        raise ValueError(f"autotune budget must be a positive number of seconds, got {budget}")
    deadline = time.perf_counter() + budget
    loss = loss or (lambda us: sum(jnp.sum(x) for x in jax.tree.leaves(us)))
    path = None if cache_dir is None else pathlib.Path(cache_dir) / f"{_key(prob, ts, loss, solver, kw, budget)}.json"
    cached = None if path is None else _cached(path)
    if cached is not None:
        return cached
    choice = _autotune(
        prob, ts, loss, trace_features(prob.u0, prob.p, ts, **kw), deadline, solver, rtol, atol, max_steps
    )
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {
                    "chosen": choice.name,
                    "features": dataclasses.asdict(choice.features),
                    "candidates": choice.candidates,
                },
                default=str,
            )
        )
    return choice


def _cached(path: pathlib.Path) -> Choice | None:
    """The autotuned `Choice` kept at `path`; None (a miss) when there is none, or its features are
    in another layout (an older sciad's)."""
    if not path.exists():
        return None
    entry = json.loads(path.read_text())
    if set(entry["features"]) != {f.name for f in dataclasses.fields(Features)}:
        return None
    return Choice(parse(entry["chosen"]), Features(**entry["features"]), entry["candidates"], autotuned=True)


def _key(prob: ODEProblem, ts, loss, solver, kw, budget) -> str:
    """A digest of the content of everything the autotuned answer depends on: array leaves by
    value; f and loss by their programs (jaxprs at u0, p, t0 and at the saved states, functions in
    p's non-array leaves, such as an activation, included) and the values they close over; the
    rest by value repr."""
    us = jax.tree.map(lambda x: jax.ShapeDtypeStruct((len(ts), *jnp.shape(x)), jnp.result_type(x)), prob.u0)
    arrays, static = eqx.partition((prob.u0, prob.p, ts), eqx.is_array)
    parts = [
        _program(lambda u, p, t: prob.f(u, p, t), prob.u0, prob.p, prob.tspan[0]),
        _program(loss, us),
        [np.asarray(x).tobytes() for x in jax.tree.leaves(arrays)],
        [repr(x) for x in jax.tree.leaves(static) if not callable(x)],
        jax.tree.structure((prob.u0, prob.p)),
        prob.tspan,
        None if prob.mass_matrix is None else np.asarray(prob.mass_matrix).tobytes(),
        str(solver),
        sorted((k, str(v)) for k, v in kw.items()),
        budget,
        jax.default_backend(),
    ]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _program(fn: Callable, *args) -> tuple:
    """`fn`'s content at `args` (arrays traced, other leaves static): its jaxpr's text and the dtype,
    shape and bytes of each value it closes over."""
    closed = eqx.filter_make_jaxpr(fn)(*args)[0]
    return str(closed.jaxpr), [(x.dtype.str, x.shape, x.tobytes()) for x in map(np.asarray, closed.consts)]


def measure(
    prob: ODEProblem,
    ts: Real[ArrayLike, " T"],
    loss: Callable[[PyTree[Shaped[Array, "T ..."]]], Float[ArrayLike, ""]],
    candidates: Sequence[tuple[AbstractSensitivity, str]],
    *,
    budget: float | None = None,
    deadline: float | None = None,
    solver: str | dfx.AbstractSolver | None = "auto",
    rtol: float = 1e-6,
    atol: float = 1e-6,
    max_steps: int = 4096,
    max_rounds: int = 50,
) -> list[dict]:
    """Time the gradient of `loss(us)` (a scalar) wrt p's floating-point array leaves for each
    `(sensealg, reason)`: one dict per candidate, in their order, `name` (`describe`), `reason` and
    what `sciad.timing.compare` measures.

    Each is compiled and run once (`compile_s`) in the order given, except that the `DiscreteAdjoint`
    reference comes second (compiled apart when not a candidate); with `deadline` (a
    `time.perf_counter()` value) a compilation that would start past it is skipped (`ok`:
    "not measured: budget"), the first candidate's never. Gradients are checked against the
    reference (`rel_error`, relative in the max norm, `ok` within max(1e-4, 1000 × rtol): both
    discretisations err by about rtol; "unchecked: budget" when the reference was skipped), and
    all but the wrong ones timed in interleaved rounds until `budget` seconds of rounds are spent
    or `deadline` is past (at least one round, at most `max_rounds`): `times_s`, `median_s` and
    `spread`, the interquartile range over the median (None from one round).
    """
    _check_loss(loss, prob.u0, ts)
    params, static = eqx.partition(prob.p, eqx.is_inexact_array)

    def gradient(sensealg):
        def value(params):
            return loss(
                solve(
                    prob,
                    p=eqx.combine(params, static),
                    saveat=ts,
                    solver=solver,
                    rtol=rtol,
                    atol=atol,
                    max_steps=max_steps,
                    sensealg=sensealg,
                ).us
            )

        return lambda: functools.partial(jax.jit(jax.grad(value)), params)

    builds = [gradient(s) for s, _ in candidates]
    reference = next((b for (s, _), b in zip(candidates, builds) if s == DiscreteAdjoint()), None)
    rows = compare(
        builds,
        reference or gradient(DiscreteAdjoint()),
        tolerance=max(1e-4, 1e3 * rtol),
        rounds=max_rounds,
        budget=budget,
        deadline=deadline,
    )
    return [{"name": describe(s), "reason": why, **row} for (s, why), row in zip(candidates, rows)]


def _check_loss(loss: Callable, u0, ts) -> None:
    """Raise unless `loss` maps a solution's `us` (u0's structure, leading axis len(ts)) to a scalar."""
    us = jax.tree.map(lambda x: jax.ShapeDtypeStruct((len(ts), *jnp.shape(x)), jnp.result_type(x)), u0)
    out = jax.eval_shape(loss, us)
    if not (isinstance(out, jax.ShapeDtypeStruct) and out.shape == ()):
        shape = out.shape if isinstance(out, jax.ShapeDtypeStruct) else type(out).__name__
        raise ValueError(f"loss must return a scalar, got {shape}")


def _autotune(prob, ts, loss, feat, deadline, solver, rtol, atol, max_steps) -> Choice:
    pick = heuristic(feat).sensealg
    trial = sorted(candidates(feat), key=lambda c: c[0] != pick)  # the heuristic's pick first
    if trial[0][0] != pick:
        trial.insert(0, (pick, "the heuristic's pick"))
    rows = measure(prob, ts, loss, trial, deadline=deadline, solver=solver, rtol=rtol, atol=atol, max_steps=max_steps)
    best = fastest(rows, prefer=describe(pick))
    if best is None and "median_s" in rows[0]:  # the budget ran out before the reference
        best = rows[0]
    if best is None:
        raise ValueError(
            "no candidate sensealg produced a correct gradient for this problem (raise budget to "
            "measure those not measured):\n" + "\n".join(f"- {r['name']}: {r['ok']}" for r in rows)
        )
    chosen = next(s for (s, _), r in zip(trial, rows) if r is best)
    return Choice(chosen, feat, rows, autotuned=True)
