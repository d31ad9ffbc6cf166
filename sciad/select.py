"""Choosing the sensitivity algorithm for a problem outside `jit`: the trace-time heuristic
(`sciad.auto`) on an `ODEProblem`, or autotuning: the plausible candidates timed on the
problem, their gradients checked, the fastest correct one chosen."""

import hashlib
import json
import pathlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

import sciad.ad as ad
from sciad.adjoints import (
    AbstractSensitivity,
    BacksolveAdjoint,
    DiscreteAdjoint,
    ForwardDiffSensitivity,
    ForwardSensitivity,
    GaussAdjoint,
    InterpolatingAdjoint,
    QuadratureAdjoint,
    describe,
    parse,
)
from sciad.auto import Choice, auto_sensealg
from sciad.auto import features as trace_features
from sciad.errors import summary
from sciad.problem import ODEProblem, check_saveat
from sciad.solve import get_solver, solve
from sciad.timing import fastest, interleaved, timed


def features(prob: ODEProblem, saveat, *, solver="tsit5", rtol=1e-6, atol=1e-6, max_steps=4096,
             memory_budget=None) -> dict:
    """`sciad.auto.features` of `prob` saved at `saveat` with `solver` (a name or a diffrax solver)."""
    return trace_features(prob.u0, prob.p, check_saveat(saveat, *prob.tspan), solver=get_solver(solver),
                          rtol=rtol, atol=atol, max_steps=max_steps, memory_budget=memory_budget)


def candidates(feat: dict) -> list[tuple[AbstractSensitivity, str]]:
    """The plausible (sensealg, reason) pairs for a problem with these `features`."""
    out = [
        (ForwardDiffSensitivity(), "forward mode through the solver"),
        (ForwardSensitivity(jvp="jax-forward"), "forward sensitivity equations"),
        (ForwardSensitivity(seminorm=True), "forward sensitivities, S out of the error control"),
        (InterpolatingAdjoint(), "adjoint on the stored interpolation"),
        (InterpolatingAdjoint(checkpointing=True), "checkpointed adjoint (bounded memory)"),
        (QuadratureAdjoint(), "quadrature adjoint"),
        (GaussAdjoint(), "λ alone, ∂L/∂p by Gauss–Legendre on each step"),
        (DiscreteAdjoint(), "discretise-then-optimise"),
    ]
    if not feat["implicit solver"]:
        out.append((BacksolveAdjoint(), "backsolve (explicit solver)"))
        out.append((BacksolveAdjoint(seminorm=True), "backsolve, μ out of the error control"))
    if "enzyme" in ad.available():
        out.append((InterpolatingAdjoint(vjp="enzyme"), "compiler-level VJPs"))
    if feat["memory budget"] is not None and feat["interpolation bytes"] > feat["memory budget"]:
        out = [(s, r) for s, r in out if not getattr(s, "stores_interpolation", False)]
    return out


def select_sensealg(prob: ODEProblem, *, saveat=None, loss: Callable | None = None, autotune=False,
                    memory_budget=None, budget=20.0, solver="tsit5", rtol=1e-6, atol=1e-6, max_steps=4096,
                    cache_dir=None) -> Choice:
    """Choose a sensealg (with its engine) for gradients with respect to p of
    `loss(us)` (default: the sum of every saved value) of `prob` saved at `saveat`.

    Without `autotune`, the trace-time rule of `sciad.auto` (what
    `sensealg="auto"` uses): sizes, the number of save points, whether the
    solver is implicit, the stored interpolation's bytes against
    `memory_budget`. With `autotune=True` the plausible candidates are timed
    on this problem in interleaved rounds within `budget` seconds (compile
    time recorded apart, not counted), their gradients checked against
    `DiscreteAdjoint`, and the fastest correct one chosen. With `cache_dir`,
    autotuned choices are kept on disk, keyed on everything that changes
    them: f, loss, u0, p, tspan, saveat, solver, tolerances, max_steps,
    memory budget, timing budget and device.
    """
    if not isinstance(prob, ODEProblem):
        raise TypeError(f"prob must be a sciad.ODEProblem, got {type(prob).__name__}")
    ts = check_saveat(saveat, *prob.tspan)
    kw = dict(solver=get_solver(solver), rtol=rtol, atol=atol, max_steps=max_steps, memory_budget=memory_budget)
    if not autotune:
        return auto_sensealg(prob.u0, prob.p, ts, **kw)
    loss = loss or (lambda us: sum(jnp.sum(x) for x in jax.tree.leaves(us)))
    path = None if cache_dir is None else pathlib.Path(cache_dir) / f"{_key(prob, ts, loss, solver, kw, budget)}.json"
    if path is not None and path.exists():
        entry = json.loads(path.read_text())
        return Choice(parse(entry["chosen"]), entry["features"], entry["candidates"], autotuned=True)
    choice = _autotune(prob, ts, loss, trace_features(prob.u0, prob.p, ts, **kw), budget, solver, rtol, atol, max_steps)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"chosen": choice.name, "features": choice.features,
                                    "candidates": choice.candidates}, default=str))
    return choice


def _key(prob: ODEProblem, ts, loss, solver, kw, budget) -> str:
    """A digest of everything the autotuned answer depends on (functions by name, or by value repr)."""
    def ident(fn):
        return f"{fn.__module__}.{fn.__qualname__}" if hasattr(fn, "__code__") else repr(fn)

    values = [np.asarray(x).tobytes() for x in jax.tree.leaves((prob.u0, prob.p, ts))]
    parts = [ident(prob.f), ident(loss), values, jax.tree.structure((prob.u0, prob.p)), prob.tspan, str(solver),
             sorted((k, str(v)) for k, v in kw.items()), budget, jax.default_backend()]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def measure(prob: ODEProblem, ts, loss: Callable, candidates, *, budget: float, solver="tsit5",
            rtol=1e-6, atol=1e-6, max_steps=4096, max_rounds=50) -> list[dict]:
    """Time the gradient of `loss(us)` wrt p for each `(sensealg, reason)`.

    Each candidate is compiled and run once (`compile_s`), its gradient checked
    against `DiscreteAdjoint` (`rel_error`, `ok`), then the correct ones are
    timed by `sciad.timing.interleaved` until `budget` seconds of timed runs
    are spent (at least one round, at most `max_rounds`): `median_s`, `times_s`.
    """
    def gradient(sensealg):
        def value(p):
            out = loss(solve(prob, p=p, saveat=ts, solver=solver, rtol=rtol, atol=atol, max_steps=max_steps,
                             sensealg=sensealg).us)
            if jnp.shape(out) != ():
                raise ValueError(f"loss must return a scalar, got shape {jnp.shape(out)}")
            return out

        return jax.jit(jax.grad(value))

    ref = jax.tree.leaves(gradient(DiscreteAdjoint())(prob.p))
    scale = max(float(jnp.max(jnp.abs(r))) for r in ref) or 1.0
    tol = max(1e-4, 1e3 * rtol)
    rows, runnable = [], []
    for sensealg, why in candidates:
        row = {"name": describe(sensealg), "reason": why, "times_s": []}
        rows.append(row)
        try:
            grad = gradient(sensealg)
            g, row["compile_s"] = timed(lambda: grad(prob.p))
        except Exception as e:  # a candidate that cannot run here is reported, not fatal
            row["ok"] = f"failed: {summary(e)[:200]}"
            continue
        err = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(g), ref)) / scale
        row["rel_error"], row["ok"] = err, bool(np.isfinite(err) and err < tol)
        runnable.append((grad, row))
    times = interleaved([lambda grad=grad: grad(prob.p) for grad, _ in runnable], rounds=max_rounds, budget=budget)
    for (_, row), t in zip(runnable, times):
        row["times_s"], row["median_s"] = t, float(np.median(t))
    return rows


def _autotune(prob, ts, loss, feat, budget, solver, rtol, atol, max_steps) -> Choice:
    trial = candidates(feat)
    if budget / len(trial) < 0.01:
        raise ValueError(f"autotune budget={budget} s is too small to time {len(trial)} candidates: "
                         f"give at least {0.01 * len(trial):.2f} s (compile time is not counted)")
    rows = measure(prob, ts, loss, trial, budget=budget, solver=solver, rtol=rtol, atol=atol, max_steps=max_steps)
    best = fastest(rows)
    if best is None:
        raise ValueError("no candidate sensealg produced a correct gradient for this problem:\n"
                         + Choice(DiscreteAdjoint(), feat, rows, True).report())
    chosen = next(s for (s, _), r in zip(trial, rows) if r is best)
    return Choice(chosen, feat, rows, autotuned=True)
