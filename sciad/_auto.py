"""`sensealg="auto"`: a sensealg chosen from what is known at trace time.

Sizes and dtype of u0 and p (array leaves of any PyTree), the solver (asked
whether it is implicit), the number of save points, tolerances, `max_steps`,
the device and a memory budget. No solve and no values, so the choice works
under `jax.jit` / `eqx.filter_jit`; measuring is `sciad.select_sensealg(...,
autotune=True)`, outside `jit`.

The rule, calibrated on the committed measurements (paper/tables); each step is named
(`Pick.rule`) and its thresholds are `THRESHOLDS` (`sciad_bench.selection` refits them):

0. `sparse-stages`: an implicit solver whose stages go by a sparse (or matrix-free) Newton
   (`stage_jacobian`, from `sciad._stiff.auto_jacobian` or the user's `jacobian`) →
   `GaussAdjoint`: its backward solve of λ alone (n) steps the same Newton; forward mode through
   the steps and DiscreteAdjoint would differentiate every Newton solve with a dense n × n
   Jacobian (optimistix's implicit rule). Brusselator PDE, 2,048 states (one run each): gradient
   3.9 s, InterpolatingAdjoint 5.9 s, ForwardSensitivity 16.4 s. Checkpointed over `memory_budget`
   (at 8,192 states the 1 GiB cap, `STORED_BYTES`, holds 2,048 steps of 8 n-vectors; more are recomputed).
1. `few-parameters`: m ≤ 8 parameters → forward mode, one tangent per parameter; adjoints win
   at m = 252. `ForwardSensitivity(seminorm=True)` with an explicit solver and n > m: forward
   sensitivities fastest with m = 3 from 18 to 800 states (within 1.32× at 8; scaling.md), and
   with S out of the error control 0.83–0.98× that (Brusselator, 128 and 32 states; the forward
   solve's steps, S the discrete derivative). `ForwardDiffSensitivity` with an implicit
   solver (the sensitivity equations enlarge every Newton solve: 7× diffrax's ForwardMode on the
   Oregonator and 134× on the Brusselator PDE, where ForwardDiffSensitivity is 0.5–1.0×; suite.md)
   or n ≤ m (Lotka–Volterra: fastest, ForwardSensitivity 2.2× it in the suite's selection run).
2. `memory-budget`: the stored interpolation (`STORED_STEPS` steps at most: XLA's buffers are
   static; a solve that takes more re-solves from checkpoints) over `memory_budget` →
   `InterpolatingAdjoint(checkpointing=True)`.
3. `stored-steps`: m ≥ 4n and the stored steps' states (`STORED_STEPS` at most, whatever the
   user's `max_steps`: the cost follows the steps taken) fit in `STORE_ALL_BYTES` →
   `DiscreteAdjoint`, which then keeps every step: its reverse pass is one VJP per stage, with
   no re-solve and no recomputation, where a continuous adjoint integrates the m-vector μ with
   the solver (stages and error control over 2n + m values). Measured (2-core CPU, one run
   each): long-horizon neural ODE (n = 2, m = 400, 2 save points) 0.72–0.82× diffrax's
   BacksolveAdjoint and 0.66–0.80× sciad's best continuous adjoint; gene circuit (n = 10, m = 130)
   0.55–0.62× InterpolatingAdjoint; spiral with 2 save points 1.07× BacksolveAdjoint. With
   m ≪ n it loses (Brusselator, n = 512, m = 3: 7.9× ForwardSensitivity, 5.5× BacksolveAdjoint).
4. `dense-saves`: at least 5 save points and m ≥ 4n (steps too many to store: recursive
   checkpoints) → `DiscreteAdjoint`: a continuous adjoint restarts once per save point and
   integrates μ; discretise-then-optimise only sums the stages' products. Spiral (n = 2,
   m = 252 to 50,002, 30 save points): DiscreteAdjoint fastest by 2.5–35× (spiral-node.md,
   gpu-crossover.md).
5. `implicit`: implicit solver → `InterpolatingAdjoint` (no backsolve through a stiff problem).
6. `explicit`: otherwise → `BacksolveAdjoint` (u reset at every save time; it checks its own drift);
   with m < n on the Brusselator it beats DiscreteAdjoint by 1.7–5.5× (scaling.md).
"""

import dataclasses
from typing import NamedTuple

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sciad.adjoints import (
    AbstractSensitivity,
    BacksolveAdjoint,
    DiscreteAdjoint,
    ForwardDiffSensitivity,
    ForwardSensitivity,
    GaussAdjoint,
    InterpolatingAdjoint,
    describe,
)
from sciad.adjoints._base import interpolation_step_bytes, is_implicit, stored_steps
from sciad.adjoints._discrete import STORE_ALL_BYTES, stored_steps_bytes
from sciad._timing import ties


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """The heuristic's thresholds: forward mode up to `forward_mode_parameters` parameters;
    `DiscreteAdjoint` from `dense_saves` save points when m ≥ `parameters_per_state` · n."""

    forward_mode_parameters: int
    dense_saves: int
    parameters_per_state: float


THRESHOLDS = Thresholds(forward_mode_parameters=8, dense_saves=5, parameters_per_state=4)
RULES = ("sparse-stages", "few-parameters", "memory-budget", "stored-steps", "dense-saves", "implicit", "explicit")


@dataclasses.dataclass(frozen=True)
class Features:
    """The facts the choice uses, from shapes and settings only:

    - states, parameters: n and m, the entries in the array leaves of u0 and of p;
    - dtype: their result type's name, e.g. "float64";
    - implicit_solver: whether the solver is implicit;
    - save_points: the number of save times;
    - rtol, atol: the solver's tolerances;
    - interpolation_bytes: bytes of the stored dense output (`STORED_STEPS` steps at most, stages + 1 n-vectors each);
    - stored_steps_bytes: bytes of the steps' states `DiscreteAdjoint` stores (`STORED_STEPS` at most);
    - memory_budget: bytes allowed the stored interpolation (None: no bound);
    - device: JAX's default backend, e.g. "cpu";
    - integral_entries: k, the entries of an integrand ∫ g dt (0 without one): the solver's state is
      then (u, q), n + k values, and the continuous adjoints add ∂g/∂u to λ's equation (no state);
    - stage_jacobian: how an implicit solver's stages solve with their Jacobian ("dense", "sparse",
      "matrix-free"), and stage_jacobian_reason: why (`sciad._stiff.auto_jacobian`'s answer).
    """

    states: int
    parameters: int
    dtype: str
    implicit_solver: bool
    save_points: int
    rtol: float
    atol: float
    interpolation_bytes: int
    stored_steps_bytes: int
    memory_budget: int | None
    device: str
    integral_entries: int = 0
    stage_jacobian: str = "dense"
    stage_jacobian_reason: str = ""


class Pick(NamedTuple):
    """The heuristic's answer: the sensealg, the name of the rule that fired (one of `RULES`) and why."""

    sensealg: AbstractSensitivity
    rule: str
    reason: str


@dataclasses.dataclass
class Choice:
    """The chosen `sensealg`, the `features` that drove it and the
    `candidates` considered (dicts: name, reason, and when autotuned ok, and
    as measured compile_s, rel_error, times_s, median_s and spread: the
    interquartile range of times_s over its median; see `sciad.select.measure`)."""

    sensealg: AbstractSensitivity
    features: Features
    candidates: list[dict]
    autotuned: bool = False

    @property
    def name(self) -> str:
        """The chosen sensealg with its engine and options, e.g. `BacksolveAdjoint(jax-reverse)`."""
        return describe(self.sensealg)

    @property
    def heuristic_pick(self) -> Pick:
        """The heuristic's `Pick` for these features: the rule that fired (or, autotuned, would have)."""
        return heuristic(self.features)

    def report(self) -> str:
        """A Markdown explanation: how it was chosen (the rule that fired, or the measurement and the
        rule that would have fired; a tie within noise, `sciad.timing.ties`, named as one), the features,
        then one row per candidate (when autotuned: times, their spread, and whether it was measured)."""
        pick = self.heuristic_pick
        how = f"heuristic rule `{pick.rule}`"
        if self.autotuned:
            measured = f"of {sum('median_s' in c for c in self.candidates)} measured"
            tied = [c["name"] for c in ties(self.candidates)]
            if len(tied) > 1:
                settled = "the heuristic's pick" if self.name == describe(pick.sensealg) else "the least median"
                way = f"tie (within noise) among {', '.join(tied)} {measured}, {settled} taken"
            elif tied:
                way = f"the fastest correct {measured}"
            else:
                way = "the heuristic's pick alone measured, unchecked: the budget ran out before the reference"
            how = f"autotuned: {way}; {how} would pick {describe(pick.sensealg)}"
        lines = [f"chosen: {self.name} ({how})", ""]
        lines += [f"- {k.replace('_', ' ')}: {v}" for k, v in dataclasses.asdict(self.features).items()]
        lines += ["", "| candidate | why considered | median (s) | IQR / median | compile (s) | rel. error | ok |",
                  "|---|---|---|---|---|---|---|"]
        for c in self.candidates:
            cells = [_fmt(c.get(k)) for k in ("median_s", "spread", "compile_s", "rel_error", "ok")]
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
             memory_budget: int | None = None, integral_entries: int = 0,
             jacobian: tuple[str, str] = ("dense", "")) -> Features:
    """The `Features` of a solve from `u0` with parameters `p` saved at `ts` (T,) by `solver` (with an
    integrand of `integral_entries` entries, its stages solved as `jacobian` = (kind, why) says);
    u0, p and `ts` may be traced."""
    leaves = jax.tree.leaves(eqx.filter((u0, p), eqx.is_array))
    dtype = np.dtype(jnp.result_type(*leaves))
    n = size(u0) + integral_entries  # the solver's state (u, q)
    step_bytes = interpolation_step_bytes(solver, n, dtype.itemsize)
    return Features(
        states=size(u0),
        parameters=size(p),
        dtype=str(dtype),
        implicit_solver=is_implicit(solver),
        save_points=int(np.prod(jnp.shape(ts))),
        rtol=rtol,
        atol=atol,
        interpolation_bytes=stored_steps(max_steps, step_bytes) * step_bytes,
        stored_steps_bytes=stored_steps_bytes(max_steps, n, dtype.itemsize),
        memory_budget=memory_budget,
        device=jax.default_backend(),
        integral_entries=integral_entries,
        stage_jacobian=jacobian[0],
        stage_jacobian_reason=jacobian[1],
    )


def heuristic(feat: Features, thresholds: Thresholds = THRESHOLDS) -> Pick:
    """The rule-based pick from `feat`, with `thresholds` (an integrand changes no rule: every
    sensealg differentiates it, and its entries count in the stored state's bytes)."""
    pick = _rule(feat, thresholds)
    if not feat.integral_entries:
        return pick
    return pick._replace(reason=f"{pick.reason}; the integral ({feat.integral_entries} entries) rides with u in the "
                         "forward solve and enters λ's equation as ∂g/∂u (no adjoint state)")


def _rule(feat: Features, thresholds: Thresholds) -> Pick:
    n, m, saves = feat.states, feat.parameters, feat.save_points
    over_budget = feat.memory_budget is not None and feat.interpolation_bytes > feat.memory_budget
    few, dense, per_state = thresholds.forward_mode_parameters, thresholds.dense_saves, thresholds.parameters_per_state
    if feat.implicit_solver and feat.stage_jacobian != "dense":
        return Pick(GaussAdjoint(checkpointing=over_budget), "sparse-stages",
                    f"an implicit solver with {feat.stage_jacobian} stage solves: the adjoint of λ alone steps the same "
                    "Newton backwards (forward mode through the steps or DiscreteAdjoint would differentiate every "
                    "Newton solve with a dense n × n Jacobian)"
                    + ("; its stored interpolation exceeds the memory budget: checkpointed" if over_budget else ""))
    if m <= few and not over_budget:
        if feat.implicit_solver or n <= m:
            return Pick(ForwardDiffSensitivity(), "few-parameters",
                        f"m = {m} ≤ {few} parameters and {'an implicit solver' if feat.implicit_solver else f'n = {n} ≤ m'}: "
                        "forward mode through the solver's steps (sensitivity equations would add n·m unknowns "
                        "to the error control, and to every Newton solve)")
        return Pick(ForwardSensitivity(seminorm=True), "few-parameters",
                    f"m = {m} ≤ {few} parameters: forward mode (one tangent per parameter) is cheapest; error "
                    "control on u alone (the forward solve's steps)")
    if over_budget:
        return Pick(InterpolatingAdjoint(checkpointing=True), "memory-budget",
                    "stored interpolation exceeds the memory budget: checkpoint")
    if m >= per_state * n and feat.stored_steps_bytes <= STORE_ALL_BYTES:
        return Pick(DiscreteAdjoint(), "stored-steps",
                    f"m = {m} ≥ {per_state:g}n and every step's state fits in {STORE_ALL_BYTES >> 20} MiB: "
                    "discretise-then-optimise keeps the steps (one VJP per stage backwards, no re-solve); a "
                    "continuous adjoint would integrate μ (m) with the solver")
    if m >= per_state * n and saves >= dense:
        return Pick(DiscreteAdjoint(), "dense-saves",
                    f"{saves} save points and m = {m} ≥ {per_state:g}n: a continuous adjoint restarts once per save "
                    "point and integrates μ (m) with the solver; discretise-then-optimise does not")
    if feat.implicit_solver:
        return Pick(InterpolatingAdjoint(), "implicit",
                    "implicit solver (stiff): no backsolve; adjoint on the stored interpolation")
    return Pick(BacksolveAdjoint(), "explicit", "explicit solver: backsolve with compiled reverse-mode VJPs (u is "
                "reset at every saveat time, and it checks its own drift)")


def auto_sensealg(u0, p, ts, *, solver: dfx.AbstractSolver, rtol: float, atol: float, max_steps: int = 4096,
                  memory_budget: int | None = None, integral_entries: int = 0,
                  jacobian: tuple[str, str] = ("dense", "")) -> Choice:
    """The heuristic's `Choice` for gradients of a solve from `u0` with parameters `p` saved at `ts`
    (T,) by `solver`, with an integrand of `integral_entries` entries and stage solves by `jacobian`
    = (kind, why); works on traced values (what `solve(..., sensealg="auto")` calls)."""
    feat = features(u0, p, ts, solver=solver, rtol=rtol, atol=atol, max_steps=max_steps, memory_budget=memory_budget,
                    integral_entries=integral_entries, jacobian=jacobian)
    pick = heuristic(feat)
    return Choice(pick.sensealg, feat, [{"name": describe(pick.sensealg), "reason": pick.reason}])
