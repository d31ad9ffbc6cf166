"""`sensealg="auto"`: a sensealg chosen from what is known at trace time.

Sizes and dtype of u0 and p (array leaves of any PyTree), the solver (asked
whether it is implicit), the number of save points, tolerances, `max_steps`,
the device and a memory budget. No solve and no values, so the choice works
under `jax.jit` / `eqx.filter_jit`; measuring is `sciad.select_sensealg(...,
autotune=True)`, outside `jit`.

The rule, calibrated on the committed measurements (paper/tables):

1. m ≤ 8 parameters → `ForwardSensitivity`: one tangent per parameter; fastest
   with m = 3 from 18 to 800 states (within 1.32× at 8; scaling.md), within 1.08×
   of the fastest with m = 4 (lotka-volterra.md); adjoints win at m = 252.
2. The stored interpolation (sized by `max_steps`: XLA's buffers are static)
   over `memory_budget` → `InterpolatingAdjoint(checkpointing=True)`.
3. At least 5 save points and m ≥ 4n → `DiscreteAdjoint`: a continuous adjoint
   restarts once per save point and integrates the m-vector μ with the solver
   (stages and error control over 2n + m values); discretise-then-optimise only
   sums the stages' products. Spiral (n = 2, m = 252 to 50,002, 30 save points):
   DiscreteAdjoint fastest by 2.5–35× (spiral-node.md, gpu-crossover.md); with
   m < n (Brusselator, 5 save points) BacksolveAdjoint beats it by 1.2–3×
   (scaling.md), and with m = 2n (Lotka–Volterra) by 1.75×.
4. Implicit solver → `InterpolatingAdjoint` (no backsolve through a stiff problem).
5. Otherwise → `BacksolveAdjoint` (u reset at every save time; it checks its own drift).
"""

import dataclasses

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sciad.adjoints import (
    AbstractSensitivity,
    BacksolveAdjoint,
    DiscreteAdjoint,
    ForwardSensitivity,
    InterpolatingAdjoint,
    describe,
)
from sciad.adjoints.base import is_implicit

FORWARD_MODE_PARAMETERS = 8
DENSE_SAVES = 5
PARAMETERS_PER_STATE = 4


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
        """The chosen sensealg with its engine and options, e.g. `BacksolveAdjoint(jax-reverse)`."""
        return describe(self.sensealg)

    def report(self) -> str:
        """A Markdown explanation: the features, then one row per candidate."""
        lines = [f"chosen: {self.name} ({'autotuned' if self.autotuned else 'heuristic'})", ""]
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


def size(tree) -> int:
    """The total number of entries in the array leaves of `tree`."""
    return sum(int(np.prod(jnp.shape(x))) for x in jax.tree.leaves(eqx.filter(tree, eqx.is_array)))


def features(u0, p, ts, *, solver: dfx.AbstractSolver, rtol: float, atol: float, max_steps: int = 4096,
             memory_budget: int | None = None) -> dict:
    """The facts the choice uses, from shapes and settings only (u0, p and `ts` (T,) may be traced)."""
    leaves = jax.tree.leaves(eqx.filter((u0, p), eqx.is_array))
    dtype = np.dtype(jnp.result_type(*leaves))
    n = size(u0)
    stages = getattr(getattr(solver, "tableau", None), "num_stages", 7)
    return {
        "states": n,
        "parameters": size(p),
        "dtype": str(dtype),
        "implicit solver": is_implicit(solver),
        "save points": int(np.prod(jnp.shape(ts))),
        "rtol, atol": (rtol, atol),
        "interpolation bytes": max_steps * (stages + 1) * n * dtype.itemsize,
        "memory budget": memory_budget,
        "device": jax.default_backend(),
    }


def heuristic(feat: dict) -> tuple[AbstractSensitivity, str]:
    """The rule-based pick and its reason, from `features`."""
    n, m, saves = feat["states"], feat["parameters"], feat["save points"]
    over_budget = feat["memory budget"] is not None and feat["interpolation bytes"] > feat["memory budget"]
    if m <= FORWARD_MODE_PARAMETERS and not over_budget:
        return ForwardSensitivity(), (f"m = {m} ≤ {FORWARD_MODE_PARAMETERS} parameters: forward mode "
                                      "(one tangent per parameter) is cheapest")
    if over_budget:
        return InterpolatingAdjoint(checkpointing=True), "stored interpolation exceeds the memory budget: checkpoint"
    if saves >= DENSE_SAVES and m >= PARAMETERS_PER_STATE * n:
        return DiscreteAdjoint(), (f"{saves} save points and m = {m} ≥ {PARAMETERS_PER_STATE}n: a continuous adjoint "
                                   "restarts once per save point and integrates μ (m) with the solver; "
                                   "discretise-then-optimise does not")
    if feat["implicit solver"]:
        return InterpolatingAdjoint(), "implicit solver (stiff): no backsolve; adjoint on the stored interpolation"
    return BacksolveAdjoint(), ("explicit solver: backsolve with compiled reverse-mode VJPs (u is reset at every "
                                "saveat time, and it checks its own drift)")


def auto_sensealg(u0, p, ts, *, solver: dfx.AbstractSolver, rtol: float, atol: float, max_steps: int = 4096,
                  memory_budget: int | None = None) -> Choice:
    """The heuristic's `Choice` for gradients of a solve from `u0` with parameters `p` saved at `ts`
    (T,) by `solver`; works on traced values (what `solve(..., sensealg="auto")` calls)."""
    feat = features(u0, p, ts, solver=solver, rtol=rtol, atol=atol, max_steps=max_steps, memory_budget=memory_budget)
    pick, why = heuristic(feat)
    return Choice(pick, feat, [{"name": describe(pick), "reason": why}])
