"""Choosing the sensitivity algorithm and VJP engine for a problem: a
heuristic from cheap features, optional autotuning, and an explanation."""

import dataclasses
import hashlib
import json
import pathlib
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

import sciad.ad as ad
from sciad.adjoints.base import is_implicit
from sciad.adjoints import (
    AbstractSensitivity,
    BacksolveAdjoint,
    DiscreteAdjoint,
    ForwardDiffSensitivity,
    ForwardSensitivity,
    InterpolatingAdjoint,
    QuadratureAdjoint,
)
from sciad.problem import ODEProblem, check_saveat
from sciad.solve import get_solver, solve

# Parameters up to which forward sensitivities win. Forward mode carries one tangent per
# parameter, so its cost grows with m whatever the number of states; an adjoint costs a few
# solves whatever m is. Measured (paper/tables/scaling.md, lotka-volterra.md): forward wins
# with 3-4 parameters up to 9,800 states, adjoints win with 252 parameters.
FORWARD_MODE_PARAMETERS = 8
# Below this many forward steps per saveat interval the continuous adjoints' restarts (λ jumps at
# every save point) cost more than differentiating the steps (spiral: 1.9x, paper/tables/selection.md).
FEW_STEPS_PER_SAVE = 3
STIFF_LIMIT = 1e3  # |λ_max| (t1 - t0) above which the problem is treated as stiff


@dataclasses.dataclass
class Choice:
    """The chosen `sensealg`, the `features` that drove it and the
    `candidates` considered (dicts: name, reason, and when autotuned
    median_s, compile_s, rel_error, ok)."""

    sensealg: AbstractSensitivity
    features: dict
    candidates: list[dict]
    autotuned: bool = False

    @property
    def name(self) -> str:
        """The chosen sensealg with its engine, e.g. `BacksolveAdjoint(jax-reverse)`."""
        return describe(self.sensealg)

    def report(self) -> str:
        """A Markdown explanation: the features, then one row per candidate."""
        lines = [f"chosen: {describe(self.sensealg)} ({'autotuned' if self.autotuned else 'heuristic'})", ""]
        lines += [f"- {k}: {v}" for k, v in self.features.items()]
        lines += ["", "| candidate | why considered | median (s) | compile (s) | rel. error | ok |",
                  "|---|---|---|---|---|---|"]
        for c in self.candidates:
            cells = [_fmt(c.get(k)) for k in ("median_s", "compile_s", "rel_error", "ok")]
            lines.append(f"| {c['name']} | {c['reason']} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def _fmt(x) -> str:
    if x is None:
        return "–"
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def describe(sensealg: AbstractSensitivity) -> str:
    """`Name(engine)`, e.g. `InterpolatingAdjoint(jax-reverse, checkpointing)`."""
    parts = [getattr(sensealg, k).name for k in ("vjp", "jvp") if hasattr(sensealg, k)]
    if getattr(sensealg, "checkpointing", False):
        parts.append("checkpointing")
    return f"{type(sensealg).__name__}({', '.join(parts)})"


def features(prob: ODEProblem, saveat, *, solver="tsit5", rtol=1e-6, atol=1e-6, memory_budget=None) -> dict:
    """Cheap facts about the problem: sizes, stiffness, steps, memory, device."""
    n, m = prob.u0.shape[0], prob.p.shape[0]
    t0, t1 = prob.tspan
    jac = jax.jacfwd(lambda u: prob.f(u, prob.p, jnp.asarray(t0, u.dtype)))(jnp.asarray(prob.u0))
    spectral = float(np.max(np.abs(np.linalg.eigvals(np.asarray(jac, dtype=float))), initial=0.0))
    sol = solve(prob, saveat=saveat, solver=solver, rtol=rtol, atol=atol, sensealg=DiscreteAdjoint())
    steps = int(sol.stats["steps"])
    stages = getattr(getattr(get_solver(solver), "tableau", None), "num_stages", 7)
    dense_bytes = steps * (stages + 1) * n * np.dtype(prob.u0.dtype).itemsize
    return {
        "states": n,
        "parameters": m,
        "stiffness |λ|·T": round(spectral * (t1 - t0), 3),
        "implicit solver": is_implicit(get_solver(solver)),
        "forward steps": steps,
        "save points": int(np.size(saveat)),
        "interpolation bytes": dense_bytes,
        "memory budget": memory_budget,
        "device": jax.default_backend(),
    }


def heuristic(feat: dict) -> tuple[AbstractSensitivity, str]:
    """The rule-based pick and its reason, from `features`."""
    m = feat["parameters"]
    stiff = feat["implicit solver"] or feat["stiffness |λ|·T"] > STIFF_LIMIT
    over_budget = feat["memory budget"] is not None and feat["interpolation bytes"] > feat["memory budget"]
    if m <= FORWARD_MODE_PARAMETERS and not over_budget:
        return ForwardSensitivity(), (f"m = {m} ≤ {FORWARD_MODE_PARAMETERS} parameters: forward mode "
                                      "(one tangent per parameter) is cheapest")
    if over_budget:
        return InterpolatingAdjoint(checkpointing=True), "stored interpolation exceeds the memory budget: checkpoint"
    steps_per_save = feat["forward steps"] / max(feat["save points"], 1)
    if steps_per_save < FEW_STEPS_PER_SAVE:
        return DiscreteAdjoint(), (f"{steps_per_save:.1f} steps per save point: a continuous adjoint would "
                                   "restart at nearly every step; discretise-then-optimise does not")
    if stiff:
        return InterpolatingAdjoint(), "stiff: no backsolve; adjoint on the stored interpolation"
    return BacksolveAdjoint(), ("non-stiff: backsolve with compiled reverse-mode VJPs (u is reset at every "
                                "saveat time, so backward error growth stays within one interval)")


def candidates(feat: dict) -> list[tuple[AbstractSensitivity, str]]:
    """The plausible (sensealg, reason) pairs for a problem with these `features`."""
    stiff = feat["implicit solver"] or feat["stiffness |λ|·T"] > STIFF_LIMIT
    out = [
        (ForwardDiffSensitivity(), "forward mode through the solver"),
        (ForwardSensitivity(jvp="jax-forward"), "forward sensitivity equations"),
        (InterpolatingAdjoint(), "adjoint on the stored interpolation"),
        (InterpolatingAdjoint(checkpointing=True), "checkpointed adjoint (bounded memory)"),
        (QuadratureAdjoint(), "quadrature adjoint"),
        (DiscreteAdjoint(), "discretise-then-optimise"),
    ]
    if not stiff:
        out.append((BacksolveAdjoint(), "backsolve (non-stiff)"))
    if "enzyme" in ad.available():
        out.append((InterpolatingAdjoint(vjp="enzyme"), "compiler-level VJPs"))
    if feat["memory budget"] is not None and feat["interpolation bytes"] > feat["memory budget"]:
        out = [(s, r) for s, r in out if not isinstance(s, (InterpolatingAdjoint, QuadratureAdjoint))
               or getattr(s, "checkpointing", False)]
    return out


_CACHE: dict[str, dict] = {}


def _key(prob: ODEProblem, saveat, solver, rtol, atol) -> str:
    f = prob.f
    ident = [getattr(f, "__module__", ""), getattr(f, "__qualname__", repr(type(f))),
             prob.u0.shape, str(prob.u0.dtype), prob.p.shape, str(prob.p.dtype),
             prob.tspan, np.asarray(saveat).tolist() if saveat is not None else None,
             str(solver), rtol, atol, jax.default_backend()]
    return hashlib.sha256(repr(ident).encode()).hexdigest()[:16]


def select_sensealg(prob: ODEProblem, *, saveat=None, loss: Callable | None = None, autotune=False,
                    memory_budget=None, budget=20.0, solver="tsit5", rtol=1e-6, atol=1e-6,
                    cache_dir=None) -> Choice:
    """Choose a sensealg (with its engine) for gradients with respect to p of
    `loss(us)` (default Σ us) of `prob` saved at `saveat`.

    The heuristic uses sizes (forward sensitivities up to 8 parameters),
    stiffness (Jacobian spectral radius × horizon, implicit solver: no
    backsolve), the memory of the stored interpolation against
    `memory_budget` bytes (checkpointing), and the device. With
    `autotune=True` the plausible candidates are timed on this problem within
    `budget` seconds of timed runs (compile time recorded apart, not counted), their gradients checked
    against `DiscreteAdjoint`, and the fastest correct one chosen; decisions
    are cached by the problem's structure in memory and, with `cache_dir`, on
    disk.
    """
    if not isinstance(prob, ODEProblem):
        raise TypeError(f"prob must be a sciad.ODEProblem, got {type(prob).__name__}")
    ts = check_saveat(saveat, *prob.tspan)
    loss = loss or (lambda us: jnp.sum(us))
    key = _key(prob, ts, solver, rtol, atol) + ("-tuned" if autotune else "")
    if key not in _CACHE and cache_dir is not None and (pathlib.Path(cache_dir) / f"{key}.json").exists():
        _CACHE[key] = json.loads((pathlib.Path(cache_dir) / f"{key}.json").read_text())
    if key in _CACHE and memory_budget is None:
        entry = _CACHE[key]
        return Choice(_from_name(entry["chosen"]), entry["features"], entry["candidates"], entry["autotuned"])

    feat = features(prob, ts, solver=solver, rtol=rtol, atol=atol, memory_budget=memory_budget)
    pick, why = heuristic(feat)
    if not autotune:
        choice = Choice(pick, feat, [{"name": describe(pick), "reason": why}])
    else:
        choice = _autotune(prob, ts, loss, feat, budget, solver, rtol, atol)
    _CACHE[key] = {"chosen": describe(choice.sensealg), "features": feat,
                   "candidates": choice.candidates, "autotuned": choice.autotuned}
    if cache_dir is not None:
        pathlib.Path(cache_dir).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(cache_dir) / f"{key}.json").write_text(json.dumps(_CACHE[key], default=str))
    return choice


def _from_name(name: str) -> AbstractSensitivity:
    """Rebuild a sensealg from `describe`'s output."""
    cls_name, _, rest = name.partition("(")
    args = [a.strip() for a in rest.rstrip(")").split(",") if a.strip()]
    checkpointing = "checkpointing" in args
    engines = [a for a in args if a != "checkpointing"]
    from sciad.adjoints import SENSEALGS

    cls = SENSEALGS[cls_name]
    if cls is ForwardSensitivity:
        return cls(jvp=engines[0])
    if cls is InterpolatingAdjoint:
        return cls(vjp=engines[0], checkpointing=checkpointing)
    return cls(vjp=engines[0]) if engines else cls()


def measure(prob: ODEProblem, ts, loss: Callable, candidates, *, budget: float, solver="tsit5",
            rtol=1e-6, atol=1e-6, max_rounds=50) -> list[dict]:
    """Time the gradient of `loss(us)` wrt p for each `(sensealg, reason)`.

    Each candidate is compiled and run once (`compile_s`), its gradient checked
    against `DiscreteAdjoint` (`rel_error`, `ok`), then the candidates are run
    in interleaved rounds (so machine noise hits all alike) until `budget`
    seconds of timed runs are spent (at least one round): `median_s`, `times_s`.
    """
    def gradient(sensealg):
        def value(p):
            out = loss(solve(prob, p=p, saveat=ts, solver=solver, rtol=rtol, atol=atol, sensealg=sensealg).us)
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
            start = time.perf_counter()
            g = jax.block_until_ready(grad(prob.p))
            row["compile_s"] = time.perf_counter() - start
        except Exception as e:  # a candidate that cannot run here is reported, not fatal
            row["ok"] = f"failed: {_first_line(e)[:200]}"
            continue
        err = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(g), ref)) / scale
        row["rel_error"], row["ok"] = err, bool(np.isfinite(err) and err < tol)
        runnable.append((grad, row))
    deadline = time.perf_counter() + budget
    for _ in range(max_rounds):
        for grad, row in runnable:
            start = time.perf_counter()
            jax.block_until_ready(grad(prob.p))
            row["times_s"].append(time.perf_counter() - start)
        if time.perf_counter() > deadline:
            break
    for _, row in runnable:
        row["median_s"] = float(np.median(row["times_s"]))
    return rows


def _first_line(error: Exception) -> str:
    """The first line of an error's message that says what went wrong (JAX wraps run-time errors)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line and not line.startswith("File")]
    return (named or lines or [""])[-1 if named else 0]


def fastest(rows: list[dict]) -> dict | None:
    """The fastest row with a correct gradient (None if there is none)."""
    correct = [r for r in rows if r.get("ok") is True]
    return min(correct, key=lambda r: r["median_s"]) if correct else None


def _autotune(prob, ts, loss, feat, budget, solver, rtol, atol) -> Choice:
    trial = candidates(feat)
    if budget / len(trial) < 0.01:
        raise ValueError(f"autotune budget={budget} s is too small to time {len(trial)} candidates: "
                         f"give at least {0.01 * len(trial):.2f} s (compile time is not counted)")
    rows = measure(prob, ts, loss, trial, budget=budget, solver=solver, rtol=rtol, atol=atol)
    best = fastest(rows)
    if best is None:
        raise ValueError("no candidate sensealg produced a correct gradient for this problem:\n"
                         + Choice(DiscreteAdjoint(), feat, rows, True).report())
    chosen = next(s for (s, _), r in zip(trial, rows) if r is best)
    return Choice(chosen, feat, rows, autotuned=True)
