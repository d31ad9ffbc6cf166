"""`sciad bench dde`: delay differential equations, sciad against the peers a user would pick instead: jitcdde
(compiled C, its own adaptive integrator: forward solves) and torchdde (PyTorch: gradients, its adjoint and
backpropagation through its steps), each checked before it is timed, in interleaved rounds in one process
(`sciad.timing.compare`).

Problem: Mackey–Glass, u'(t) = β u(t − τ) / (1 + u(t − τ)ⁿ) − γ u(t), β = 0.2, γ = 0.1, n = 10, τ = 17, constant
history u = 1.2 for t ≤ 0, t ∈ [0, 100], saved at t = 5, 10, …, 100 (`SAVES`), rtol = atol = 1e-6 (`TOL`),
float64 throughout.

1. **Forward solve**: sciad (`jax.jit` of `sciad.solve(DDEProblem(...))`, warm; solver "auto" = Tsit5, and Bosh3,
   the order of jitcdde's and torchdde's) against jitcdde (its Bogacki–Shampine integrator at the same atol, rtol;
   `step_on_discontinuities()` past the history's kink, then `integrate(t)` per save time; the saves before τ
   read from its Hermite past). jitcdde's first call includes generating and compiling its C code. Check: each
   solution's largest difference from a reference (jitcdde at rtol = atol = 1e-12, which sciad at 1e-12 matches
   to ~1e-11) and from jitcdde's at the benchmark tolerance, against `AGREE`; rows off by more are still timed and
   marked.
2. **Gradient** of the loss Σ u(tᵢ)² over the save times in p = (β, γ, n, τ), the delay among them: sciad's
   `jax.grad` of the jitted loss (ForwardDiffSensitivity, what "auto" picks) against torchdde 0.1's
   `integrate` with its adjoint (`discretize_then_optimize=False`: the delays a parameter of the module, Calver
   & Zhao's adjoint, which gives the delay's gradient) and with backpropagation through its steps
   (`discretize_then_optimize=True`); torchdde with Bosh3 and its adaptive controller at the same tolerances
   (its Dopri5 interpolation casts to float32, so float64 runs need another solver), one torch thread, a saving
   grid from t0 (its adjoint integrates between consecutive saves from ts[0]). Check, before timing: each
   gradient against central differences of sciad's loss at rtol = atol = 1e-10 (`reference`; steps 1e-4·|pᵢ|),
   relative error in the max norm: within `GRADIENT_OK` ok, within `GRADIENT_GATE` timed and marked inaccurate,
   beyond it WRONG and not timed. Also reported: each against torchdde's backpropagated gradient, and sciad's
   `jax.grad` at the benchmark tolerance against central differences of its own loss at that tolerance (an
   adaptive solve's loss is not smooth in p at the step-control level: that check is loose by nature).
3. **Neural DDE** (full runs): u ∈ R², u' = MLP(u(t), u(t − τ)) (4 → 32 → 2, tanh; 226 weights and τ = 1, 227
   parameters), history u = (1, 0), t ∈ [0, 10] saved at t = 1, …, 10, loss Σ (u(tᵢ) − 0.5 (cos tᵢ, sin tᵢ))²;
   sciad (ForwardDiffSensitivity: one tangent per parameter) against torchdde's adjoint and backpropagation.
   Same checks, the reference by central differences in each of the 227 parameters.

Timing: the JAX rows and jitcdde together in interleaved rounds (median of `ROUNDS`), torchdde's in rounds of
their own (torch's threads), first calls (`compile_s`: trace, compile and first run; jitcdde's C code
generated and compiled) reported apart. Ratios are to sciad "auto"'s median on the same part, measured in the
same process. The machine's cores and load average go in the table's header.

Each record: part, name, kind (sciad, peer), solver, rtol, compile_s, median_s, times_s, spread, steps (sciad:
accepted steps), error (forward: max |u − reference|; gradients: relative error to the reference, max norm),
vs_peer (forward: max |u − jitcdde's u|; gradients: relative difference to torchdde's backpropagated gradient),
per_parameter (gradients: relative error of each parameter), status, ok.
"""

import os
import pathlib
import platform
import time
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import sciad
from sciad.timing import compare, relative_error
from sciad_bench import plots
from sciad_bench.tables import seconds, write_result

BETA, GAMMA, N, TAU = 0.2, 0.1, 10.0, 17.0
P0 = np.array([BETA, GAMMA, N, TAU])
PARAMS = ("β", "γ", "n", "τ")
U0 = 1.2
T1 = 100.0
SAVES = np.linspace(5.0, T1, 20)
TOL = 1e-6
REFERENCE_TOL = 1e-12  # the forward reference (jitcdde; sciad at 1e-12 agrees to ~1e-11)
GRADIENT_REFERENCE_TOL = 1e-10  # central differences of sciad's loss at this tolerance: the gradient reference
FD_STEP = 1e-4  # central differences' step, relative to each parameter
AGREE = 1e-4  # forward solutions: max |u − reference| at the save times
GRADIENT_OK = 1e-2  # gradients: relative error to the reference (max norm) for "ok"
GRADIENT_GATE = 0.1  # beyond this a gradient is WRONG and not timed; between GRADIENT_OK and it, timed, inaccurate
ROUNDS = {True: (3, 1), False: (20, 5)}  # (JAX and jitcdde rounds, torchdde rounds)
BUDGET = 120.0  # s: a tier's rounds stop after the round that ends past it
AUTO = "sciad auto"
TORCH_BACKPROP = "torchdde backprop (discretize-then-optimize)"
TORCH_ADJOINT = "torchdde adjoint"
JITCDDE = "jitcdde"
# torchdde's adjoint with its adaptive controller returns zeros here; with fixed steps (its examples' set-up) it runs:
# these steps, the save grid as fine (its adjoint steps between saves).
ADJOINT_DT = 0.5
NEURAL_ADJOINT_DT = 0.05
NEURAL_FD_STEP = 1e-5


# --- Mackey–Glass in each library ---------------------------------------------------------------------------------


def mackey_glass(u, h, p, t):
    beta, gamma, n, tau = p
    past = h(t - tau)
    return beta * past / (1 + past**n) - gamma * u


def sciad_problem():
    return sciad.DDEProblem(mackey_glass, jnp.array([U0]), None, (0.0, T1), jnp.asarray(P0), lags=lambda p: (p[3],))


def sciad_forward(solver: str = "auto", tol: float = TOL) -> Callable:
    """p -> (u at `SAVES`, accepted steps), jitted."""
    prob = sciad_problem()

    @jax.jit
    def forward(p):
        sol = sciad.solve(prob, p=p, saveat=jnp.asarray(SAVES), solver=solver, rtol=tol, atol=tol, max_steps=100_000)
        return sol.us[:, 0], sol.stats["accepted_steps"]

    return forward


def sciad_gradient(solver: str = "auto", tol: float = TOL) -> Callable:
    """p -> ∇loss, `jax.grad` of the jitted loss Σ u(tᵢ)² (sensealg "auto")."""
    prob = sciad_problem()

    def loss(p):
        sol = sciad.solve(prob, p=p, saveat=jnp.asarray(SAVES), solver=solver, rtol=tol, atol=tol, max_steps=100_000)
        return jnp.sum(sol.us**2)

    return jax.jit(jax.grad(loss))


def central_differences(forward: Callable, p=P0, step: float = FD_STEP) -> np.ndarray:
    """∇ Σ u(tᵢ)² by central differences of `forward` (p -> (u, steps)), step `step`·|pᵢ|."""
    loss = lambda q: float(np.sum(np.asarray(forward(jnp.asarray(q))[0]) ** 2))  # noqa: E731
    out = np.zeros(len(p))
    for i in range(len(p)):
        e = np.zeros(len(p))
        e[i] = step * abs(p[i])
        out[i] = (loss(p + e) - loss(p - e)) / (2 * e[i])
    return out


class Jitcdde:
    """Mackey–Glass in jitcdde: the C code generated and compiled on construction; `solve()` sets the constant past,
    steps over the history's kink and integrates to each save time (those before the kink's first propagation read
    from its Hermite past)."""

    def __init__(self, tol: float = TOL):
        from jitcdde import jitcdde, t, y

        past = y(0, t - TAU)
        self.tol = tol
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.dde = jitcdde([BETA * past / (1 + past**N) - GAMMA * y(0)], verbose=False)
            self.dde.compile_C()

    def accepted_steps(self) -> int:
        """The steps a `solve()` accepts (counted on a solve of its own, untimed)."""
        dde, count = self.dde, [0]
        step = dde.try_single_step

        def counted(length):
            accepted = step(length)
            count[0] += bool(accepted)
            return accepted

        dde.try_single_step = counted
        try:
            self.solve()
        finally:
            del dde.try_single_step
        return count[0]

    def solve(self) -> np.ndarray:
        dde = self.dde
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "the spline already contains points": the past is reset on purpose
            dde.constant_past([U0], 0)
            dde.set_integration_parameters(atol=self.tol, rtol=self.tol)
            dde.step_on_discontinuities()
            early = SAVES[SAVES <= dde.t]
            out = [np.asarray(dde.get_state().get_state(early))[:, 0]] if early.size else []
            out += [np.array([dde.integrate(s)[0] for s in SAVES[SAVES > dde.t]])]
        return np.concatenate(out)


def _torch_module(torch, delay: float):
    class MackeyGlass(torch.nn.Module):
        """f(t, y, args, history) with the delays the first parameter (torchdde's adjoint reads `func.delays` and
        adds the delay's gradient to the first parameter's)."""

        def __init__(self):
            super().__init__()
            self.delays = torch.nn.Parameter(torch.tensor([delay]))
            self.beta = torch.nn.Parameter(torch.tensor(BETA))
            self.gamma = torch.nn.Parameter(torch.tensor(GAMMA))
            self.n = torch.nn.Parameter(torch.tensor(N))

        def forward(self, t, y, args, *, history):
            past = history[0]
            return self.beta * past / (1 + past**self.n) - self.gamma * y

    return MackeyGlass()


def torchdde_gradient(adjoint: bool, tol: float = TOL, fixed: float | None = None) -> Callable:
    """() -> ∇loss (β, γ, n, τ) by torchdde (float64, Bosh3, one torch thread): its adaptive controller at `tol`, or
    fixed steps of `fixed` (the save grid then every `fixed`, the loss on `SAVES` among them)."""
    import torch

    spacing = fixed or float(SAVES[1] - SAVES[0])
    ts = torch.linspace(0.0, T1, round(T1 / spacing) + 1, dtype=torch.float64)  # ts[0] = t0: its adjoint starts there
    saved = torch.as_tensor(np.rint(SAVES / spacing).astype(int))
    history = torch.full((1, 1), U0, dtype=torch.float64)

    def gradient():
        default_dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
        torch.set_default_dtype(torch.float64)
        torch.set_num_threads(1)
        try:
            module = _torch_module(torch, TAU)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ys = _torchdde_solve(module, ts, history, tol, fixed, adjoint)
                (ys[0, saved, 0] ** 2).sum().backward()
            return np.array([x.grad.item() for x in (module.beta, module.gamma, module.n, module.delays)])
        finally:
            torch.set_default_dtype(default_dtype)
            torch.set_num_threads(threads)

    return gradient


def _torchdde_solve(module, ts, history, tol: float, fixed: float | None, adjoint: bool):
    """torchdde's solve of `module` (its `delays` a parameter) saved at `ts` from a constant `history`, by Bosh3 with
    its adaptive controller at `tol` or fixed steps of `fixed`, differentiated by its adjoint or through its steps."""
    import torch
    import torchdde

    adaptive = torchdde.AdaptiveStepSizeController(atol=tol, rtol=tol)
    return torchdde.integrate(
        module,
        torchdde.Bosh3(),
        ts[0],
        ts[-1],
        ts,
        lambda t: history,
        None,
        stepsize_controller=torchdde.ConstantStepSizeController() if fixed else adaptive,
        dt0=torch.tensor(fixed, dtype=torch.float64) if fixed else None,
        delays=module.delays,
        discretize_then_optimize=not adjoint,
        max_steps=100_000,
    )


# --- rows: builds for `compare` that keep their first output ----------------------------------------------------------


class Row:
    """One timed method: `make()` returns (the call to time, () -> its checked output, info) after its set-up."""

    def __init__(self, name: str, kind: str, solver: str, rtol: float | None, make: Callable, torch: bool = False):
        self.name, self.kind, self.solver, self.rtol, self.make, self.torch = name, kind, solver, rtol, make, torch


def _kept(row: Row, outputs: dict):
    def prepare():
        call, info = row.make()
        first = [True]

        def run():
            out = call()
            if first:
                first.clear()
                outputs[row.name] = (np.asarray(out[0] if isinstance(out, tuple) else out), info(out))
                return outputs[row.name][0]
            return out

        return run

    return prepare


def _jax_row(name, solver, tol, build, p=P0) -> Row:
    def make():
        fn, q = build(solver, tol), jnp.asarray(p)
        return (lambda: fn(q)), (lambda out: int(out[1]) if isinstance(out, tuple) else None)

    return Row(name, "sciad", "Tsit5 (auto)" if solver == "auto" else solver, tol, make)


def forward_rows(quick: bool) -> list[Row]:
    rows = [_jax_row(AUTO, "auto", TOL, sciad_forward)]
    if not quick:
        rows += [
            _jax_row("sciad Bosh3", "bosh3", TOL, sciad_forward),
            _jax_row("sciad auto, rtol 1e-8", "auto", 1e-8, sciad_forward),
        ]

    def jitc():
        solver = Jitcdde(TOL)
        return solver.solve, lambda out: solver.accepted_steps()

    return [*rows, Row(JITCDDE, "peer", "Bogacki–Shampine (its own)", TOL, jitc)]


def _torch_row(name: str, solver: str, fixed: float | None, gradient: Callable) -> Row:
    """A torchdde row: `gradient()` makes the call to time (its adaptive controller at `TOL`, or fixed steps)."""
    return Row(name, "peer", solver, None if fixed else TOL, lambda: (gradient(), lambda out: None), torch=True)


def gradient_rows(quick: bool) -> list[Row]:
    rows = [_jax_row(AUTO, "auto", TOL, sciad_gradient)]
    if not quick:
        rows += [
            _jax_row("sciad Bosh3", "bosh3", TOL, sciad_gradient),
            _jax_row("sciad auto, rtol 1e-8", "auto", 1e-8, sciad_gradient),
        ]

    def torch_row(name, adjoint, solver, fixed):
        return _torch_row(name, solver, fixed, lambda: torchdde_gradient(adjoint, fixed=fixed))

    return [
        *rows,
        torch_row(TORCH_BACKPROP, False, "Bosh3", None),
        torch_row(TORCH_ADJOINT, True, f"Bosh3, fixed dt {ADJOINT_DT:g}", ADJOINT_DT),
    ]


def measure(part: str, rows: list[Row], reference: np.ndarray, rounds: tuple[int, int], log) -> list[dict]:
    """`rows` compiled, checked against `reference` (gated at `GRADIENT_GATE` relative, max norm) and timed: the
    JAX and jitcdde rows in interleaved rounds, the torch rows in rounds of their own."""
    outputs, records = {}, []
    for torch_tier, count in ((False, rounds[0]), (True, rounds[1])):
        tier = [r for r in rows if r.torch == torch_tier]
        if not tier:
            continue
        results = compare(
            [_kept(r, outputs) for r in tier],
            lambda: lambda: reference,
            tolerance=GRADIENT_GATE,
            rounds=count,
            budget=BUDGET,
            slow_call=None if torch_tier else 1.0,
            on_compile=lambda i, tier=tier: log(f"  {part}: first call of {tier[i].name}"),
            on_round=lambda kind, i, count=count: log(f"  {part}: timing, round {i + 1}/{count}"),
        )
        for row, result in zip(tier, results):
            out, info = outputs.get(row.name, (None, None))
            records.append(
                {
                    "part": part,
                    "name": row.name,
                    "kind": row.kind,
                    "solver": row.solver,
                    "rtol": row.rtol,
                    "compile_s": result.get("compile_s"),
                    "median_s": result.get("median_s"),
                    "times_s": result.get("times_s", []),
                    "spread": result.get("spread"),
                    "steps": info,
                    "output": None if out is None else out.tolist(),
                    "raised": None if result["ok"] in (True, False) else str(result["ok"]),
                }
            )
    return records


def _forward_checks(records: list[dict], reference: np.ndarray) -> None:
    peer = next((np.asarray(r["output"]) for r in records if r["name"] == JITCDDE and r["output"]), None)
    for r in records:
        if r["output"] is None:
            r.update(error=None, vs_peer=None, ok=False, status=f"failed ({r['raised']})")
            continue
        u = np.asarray(r["output"])
        r["error"] = float(np.max(np.abs(u - reference)))
        r["vs_peer"] = None if peer is None or r["name"] == JITCDDE else float(np.max(np.abs(u - peer)))
        r["ok"] = r["error"] <= AGREE
        r["status"] = "ok" if r["ok"] else f"off by {r['error']:.1e} > {AGREE:g} (timed)"


def _gradient_checks(records: list[dict], reference: np.ndarray) -> None:
    peer = next((np.asarray(r["output"]) for r in records if r["name"] == TORCH_BACKPROP and r["output"]), None)
    for r in records:
        if r["output"] is None:
            r.update(error=None, vs_peer=None, per_parameter=None, ok=False, status=f"failed ({r['raised']})")
            continue
        g = np.asarray(r["output"])
        r["error"] = relative_error(g, reference)
        floor = 1e-3 * np.max(np.abs(reference))  # components near 0: relative to a thousandth of the largest
        r["per_parameter"] = (np.abs(g - reference) / np.maximum(np.abs(reference), floor)).tolist()
        r["vs_peer"] = None if peer is None or r["name"] == TORCH_BACKPROP else relative_error(g, peer)
        r["ok"] = r["error"] <= GRADIENT_OK
        if r["ok"]:
            r["status"] = "ok"
        elif r["error"] <= GRADIENT_GATE:
            r["status"] = f"inaccurate: {r['error']:.1e} > {GRADIENT_OK:g} (timed)"
        else:
            r["status"] = f"WRONG gradient: {r['error']:.1e} > {GRADIENT_GATE:g} (not timed)"


# --- a neural DDE: u' = MLP(u(t), u(t − τ)), in sciad and torchdde --------------------------------------------------

WIDTH = 32
STATES = 2
NEURAL_TAU = 1.0
NEURAL_T1 = 10.0
NEURAL_SAVES = np.linspace(1.0, NEURAL_T1, 10)
NEURAL_HISTORY = np.array([1.0, 0.0])
NEURAL_TARGET = 0.5 * np.stack([np.cos(NEURAL_SAVES), np.sin(NEURAL_SAVES)], axis=1)
WEIGHTS = 2 * STATES * WIDTH + WIDTH + WIDTH * STATES + STATES  # 4 → WIDTH → 2: 226


def neural_p0(seed: int = 0) -> np.ndarray:
    """The MLP's weights (Glorot-scaled normal, zero biases) then τ: (WEIGHTS + 1,)."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0.0, (2 / (2 * STATES + WIDTH)) ** 0.5, (WIDTH, 2 * STATES))
    w2 = rng.normal(0.0, (2 / (WIDTH + STATES)) ** 0.5, (STATES, WIDTH))
    return np.concatenate([w1.ravel(), np.zeros(WIDTH), w2.ravel(), np.zeros(STATES), [NEURAL_TAU]])


def _unpack(p):
    i = WIDTH * 2 * STATES
    w1 = p[:i].reshape(WIDTH, 2 * STATES)
    b1 = p[i : i + WIDTH]
    w2 = p[i + WIDTH : i + WIDTH + STATES * WIDTH].reshape(STATES, WIDTH)
    b2 = p[i + WIDTH + STATES * WIDTH : WEIGHTS]
    return w1, b1, w2, b2


def neural_f(u, h, p, t):
    w1, b1, w2, b2 = _unpack(p)
    return w2 @ jnp.tanh(w1 @ jnp.concatenate([u, h(t - p[-1])]) + b1) + b2


def neural_forward(tol: float = TOL) -> Callable:
    """p -> (u at `NEURAL_SAVES` (10, 2), accepted steps), jitted."""
    prob = sciad.DDEProblem(
        neural_f, jnp.asarray(NEURAL_HISTORY), None, (0.0, NEURAL_T1), jnp.asarray(neural_p0()), lags=lambda p: (p[-1],)
    )

    @jax.jit
    def forward(p):
        sol = sciad.solve(prob, p=p, saveat=jnp.asarray(NEURAL_SAVES), rtol=tol, atol=tol, max_steps=100_000)
        return sol.us, sol.stats["accepted_steps"]

    return forward


def neural_loss_of(us) -> float:
    return float(np.sum((np.asarray(us) - NEURAL_TARGET) ** 2))


def neural_gradient(solver: str = "auto", tol: float = TOL) -> Callable:
    """p -> ∇ Σ (u(tᵢ) − target)², `jax.grad` of the jitted loss (sensealg "auto")."""
    forward = neural_forward(tol).__wrapped__  # pyright: ignore[reportFunctionMemberAccess]  # jax.jit's wrapped function
    return jax.jit(jax.grad(lambda p: jnp.sum((forward(p)[0] - NEURAL_TARGET) ** 2)))


def torchdde_neural_gradient(adjoint: bool, tol: float = TOL, fixed: float | None = None) -> Callable:
    """() -> ∇loss (the weights, then τ) by torchdde, as `torchdde_gradient`."""
    import torch

    spacing = fixed or float(NEURAL_SAVES[1] - NEURAL_SAVES[0])
    ts = torch.linspace(0.0, NEURAL_T1, round(NEURAL_T1 / spacing) + 1, dtype=torch.float64)
    saved = torch.as_tensor(np.rint(NEURAL_SAVES / spacing).astype(int))
    history = torch.as_tensor(NEURAL_HISTORY[None, :])
    target = torch.as_tensor(NEURAL_TARGET)
    w1, b1, w2, b2 = (torch.as_tensor(np.array(x)) for x in _unpack(neural_p0()))

    class NeuralDDE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.delays = torch.nn.Parameter(torch.tensor([NEURAL_TAU], dtype=torch.float64))  # first: its adjoint
            self.w1, self.b1 = torch.nn.Parameter(w1.clone()), torch.nn.Parameter(b1.clone())
            self.w2, self.b2 = torch.nn.Parameter(w2.clone()), torch.nn.Parameter(b2.clone())

        def forward(self, t, y, args, *, history):
            return torch.tanh(torch.cat([y, history[0]], dim=-1) @ self.w1.T + self.b1) @ self.w2.T + self.b2

    def gradient():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            module = NeuralDDE()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ys = _torchdde_solve(module, ts, history, tol, fixed, adjoint)
                ((ys[0, saved] - target) ** 2).sum().backward()
            grads = [
                torch.as_tensor(x.grad).reshape(-1) for x in (module.w1, module.b1, module.w2, module.b2, module.delays)
            ]
            return torch.cat(grads).numpy().copy()
        finally:
            torch.set_num_threads(threads)

    return gradient


def neural_rows() -> list[Row]:
    def make():
        fn, q = neural_gradient("auto", TOL), jnp.asarray(neural_p0())
        return (lambda: fn(q)), (lambda out: None)

    def torch_row(name, adjoint, solver, fixed):
        return _torch_row(name, solver, fixed, lambda: torchdde_neural_gradient(adjoint, fixed=fixed))

    return [
        Row(AUTO, "sciad", "Tsit5 (auto)", TOL, make),
        torch_row(TORCH_BACKPROP, False, "Bosh3", None),
        torch_row(TORCH_ADJOINT, True, f"Bosh3, fixed dt {NEURAL_ADJOINT_DT:g}", NEURAL_ADJOINT_DT),
    ]


def neural_reference() -> np.ndarray:
    """∇loss by central differences of sciad's solve at `GRADIENT_REFERENCE_TOL`, steps `NEURAL_FD_STEP`."""
    forward, p0 = neural_forward(GRADIENT_REFERENCE_TOL), neural_p0()
    out = np.zeros(p0.size)
    for i in range(p0.size):
        e = np.zeros(p0.size)
        e[i] = NEURAL_FD_STEP
        plus, minus = (neural_loss_of(forward(jnp.asarray(p0 + s * e))[0]) for s in (1, -1))
        out[i] = (plus - minus) / (2 * NEURAL_FD_STEP)
    return out


# --- the run ---------------------------------------------------------------------------------------------------------


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def run_dde(*, quick: bool = False, repeats: int | None = None, out=None, verbose: bool = True) -> dict:
    """The forward solves and the gradients (full runs: more rows); records.json, dde.png and table.md in `out`
    (default results/dde). Returns records.json's content."""
    out = pathlib.Path(out or "results/dde")
    rounds = ROUNDS[quick] if repeats is None else (repeats, repeats)
    log = print if verbose else (lambda *_: None)
    start = time.perf_counter()
    load = os.getloadavg()
    missing = [m for m in ("jitcdde", "torchdde") if not _has(m)]
    if missing:
        raise RuntimeError(f"sciad bench dde needs {' and '.join(missing)}: pip install 'sciad[bench]'")
    log(f"dde: load average {load[0]:.2f} on {os.cpu_count()} cores")
    checks = {}

    log(f"  forward: reference (jitcdde at rtol = atol = {REFERENCE_TOL:g})")
    reference = Jitcdde(REFERENCE_TOL).solve()
    if not quick:
        tight = np.asarray(sciad_forward("auto", REFERENCE_TOL)(jnp.asarray(P0))[0])
        checks["forward reference: sciad vs jitcdde at 1e-12"] = float(np.max(np.abs(tight - reference)))
    records = measure("forward", forward_rows(quick), reference, rounds, log)
    _forward_checks(records, reference)

    log(f"  gradient: reference (central differences of sciad's loss at rtol = atol = {GRADIENT_REFERENCE_TOL:g})")
    gradient_reference = central_differences(sciad_forward("auto", GRADIENT_REFERENCE_TOL))
    gradients = measure("gradient", gradient_rows(quick), gradient_reference, rounds, log)
    _gradient_checks(gradients, gradient_reference)
    auto = next((r for r in gradients if r["name"] == AUTO and r["output"]), None)
    if auto is not None:  # sciad's jax.grad at the benchmark tolerance against central differences of that loss
        same = central_differences(sciad_forward("auto", TOL))
        checks["sciad auto's jax.grad at 1e-6 vs central differences of its loss at 1e-6"] = relative_error(
            np.asarray(auto["output"]), same
        )
    if not quick:
        tight = np.asarray(sciad_gradient("auto", GRADIENT_REFERENCE_TOL)(jnp.asarray(P0)))
        checks["gradient reference: sciad jax.grad vs central differences, both at 1e-10"] = relative_error(
            tight, gradient_reference
        )
    records += gradients
    if not quick:
        log(f"  neural: reference (central differences of sciad's loss at rtol = atol = {GRADIENT_REFERENCE_TOL:g})")
        neural = neural_reference()
        found = measure("neural", neural_rows(), neural, rounds, log)
        _gradient_checks(found, neural)
        records += found
    for r in records:
        log(
            f"  {r['part']:8s} {r['name']:48s} {seconds(r['median_s'])} s (first {seconds(r['compile_s'])} s) "
            f"error {r['error'] if r['error'] is None else format(r['error'], '.1e')}: {r['status']}"
        )
    result = {
        "experiment": "dde",
        "quick": quick,
        "machine": f"{os.cpu_count()} cores, CPU ({_cpu_model()})",
        "load_average": {"start": load, "end": os.getloadavg()},
        "cores": os.cpu_count(),
        "versions": _versions(),
        "problem": {
            "p": dict(zip(PARAMS, P0.tolist())),
            "u0": U0,
            "t1": T1,
            "saves": SAVES.tolist(),
            "rtol": TOL,
            "atol": TOL,
        },
        "reference": {"forward": reference.tolist(), "gradient": gradient_reference.tolist()},
        "checks": checks,
        "records": records,
    }
    table = write_result(result, out, "dde", figure, markdown)
    log(table)
    log(f"dde: {len(records)} records in {time.perf_counter() - start:.0f} s -> {out}/")
    return result


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("sciad", "jax", "diffrax", "jitcdde", "torchdde", "torch"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


# --- outputs ---------------------------------------------------------------------------------------------------------


def _ms(x) -> str:
    return "–" if x is None else format(1e3 * x, ".3g")


def _ratio(r, base) -> str:
    if not (r["median_s"] and base and base["median_s"]):
        return "–"
    return f"{r['median_s'] / base['median_s']:.3g}×"


def _g(x) -> str:
    return "–" if x is None else format(x, "g")


def _e(x) -> str:
    return "–" if x is None else format(x, ".1e")


def markdown(result: dict) -> str:
    load = result["load_average"]
    records = result["records"]
    lines = [
        f"# Delay differential equations: sciad against jitcdde and torchdde{' (quick)' if result['quick'] else ''}",
        "",
        f"Machine: {result['machine']}, shared with other sessions (1-minute load average {load['start'][0]:.1f} at "
        f"the start, {load['end'][0]:.1f} at the end). Mackey–Glass (β = {BETA:g}, γ = {GAMMA:g}, n = {N:g}, "
        f"τ = {TAU:g}, constant history {U0:g}, t ∈ [0, {T1:g}], {len(SAVES)} save times "
        f"{SAVES[0]:g}, {SAVES[1]:g}, …, {SAVES[-1]:g}), rtol = atol = {TOL:g}, float64. Times: medians of "
        "interleaved rounds in one process (torchdde's rounds on their own, one torch thread); × sciad auto: the "
        "median over sciad auto's in the same part. First call: trace, compile and first run (jitcdde: generating "
        "and compiling its C code). " + ", ".join(f"{k} {v}" for k, v in result["versions"].items() if v) + ".",
        "",
    ]
    forward = [r for r in records if r["part"] == "forward"]
    per_step = lambda r: "–" if not (r["median_s"] and r["steps"]) else f"{1e6 * r['median_s'] / r['steps']:.3g}"  # noqa: E731
    base = next((r for r in forward if r["name"] == AUTO), None)
    lines += [
        "## Forward solve",
        "",
        "| method | solver | rtol | median (ms) | rounds | × sciad auto | first call (s) | accepted steps "
        "| µs per step | max error vs reference | max diff vs jitcdde | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in forward:
        lines.append(
            f"| {r['name']} | {r['solver']} | {r['rtol']:g} | {_ms(r['median_s'])} | {len(r['times_s'])} | "
            f"{_ratio(r, base)} | {seconds(r['compile_s'])} | {r['steps'] if r['steps'] is not None else '–'} | "
            f"{per_step(r)} | {_e(r['error'])} | {_e(r['vs_peer'])} | {r['status']} |"
        )
    lines += [
        "",
        f"Reference: jitcdde at rtol = atol = {REFERENCE_TOL:g}. Check: max |u − reference| over the save times "
        f"within {AGREE:g}; rows off by more are timed all the same and marked. µs per step: the median over the "
        "accepted steps (rejected steps' cost included).",
        "",
    ]
    lines += _gradient_table(
        "## Gradient of Σ u(tᵢ)² in (β, γ, n, τ)",
        [r for r in records if r["part"] == "gradient"],
        "per parameter (β, γ, n, τ)",
        lambda per: ", ".join(f"{x:.0e}" for x in per),
    )
    ref = result["reference"]["gradient"]
    lines += [
        f"Reference: central differences of sciad's loss at rtol = atol = {GRADIENT_REFERENCE_TOL:g} (steps "
        f"{FD_STEP:g}·|pᵢ|): ∇ = ({', '.join(f'{x:.6g}' for x in ref)}). Relative errors in the max norm (per "
        "parameter: each component's, relative to the larger of it and a thousandth of the largest); "
        f"ok within {GRADIENT_OK:g}, timed but marked inaccurate within {GRADIENT_GATE:g}, WRONG and not timed "
        "beyond. sciad's gradient: `jax.grad` of the jitted loss (ForwardDiffSensitivity, auto's pick); "
        "torchdde's: `integrate` with its adjoint, or backpropagation through its steps (its adaptive controller "
        f"at the same tolerances; its adjoint returns zeros with that controller, so it runs with fixed steps of "
        f"{ADJOINT_DT:g}, its examples' set-up, saving every step: its adjoint steps between saves). torchdde "
        "0.1.3's adjoint is not a gradient here: for β, γ and n it returns (t1 − t0)·θ = 100·(β, γ, n) (in "
        "adjoint_dde.py the parameters' right-hand side negates the saved parameter tensors, `params`, where "
        "their vector-Jacobian products are meant).",
        "",
    ]
    neural = [r for r in records if r["part"] == "neural"]
    if neural:
        lines += _gradient_table(
            f"## Neural DDE: gradient in {WEIGHTS} weights and τ",
            neural,
            "weights (worst), τ",
            lambda per: f"{max(per[:-1]):.0e}, {per[-1]:.0e}",
        )
        lines += [
            f"u ∈ R², u' = MLP(u(t), u(t − τ)) (4 → {WIDTH} → 2, tanh), τ = {NEURAL_TAU:g}, history "
            f"{tuple(NEURAL_HISTORY.tolist())}, t ∈ [0, {NEURAL_T1:g}] saved at t = 1, …, {NEURAL_T1:g}, loss "
            "Σ (u(tᵢ) − 0.5 (cos tᵢ, sin tᵢ))², rtol = atol = 1e-6. Reference: central differences of sciad's loss "
            f"at {GRADIENT_REFERENCE_TOL:g} (steps {NEURAL_FD_STEP:g}). sciad: ForwardDiffSensitivity, one tangent "
            f"per parameter; torchdde's adjoint with fixed steps of {NEURAL_ADJOINT_DT:g}.",
            "",
        ]
    if result["checks"]:
        lines += ["Checks:", ""] + [f"- {k}: {v:.1e}" for k, v in result["checks"].items()] + [""]
    return "\n".join(lines) + "\n"


def _gradient_table(title: str, group: list[dict], per_title: str, per_format) -> list[str]:
    base = next((r for r in group if r["name"] == AUTO), None)
    lines = [
        title,
        "",
        "| method | solver | rtol | median (ms) | rounds | × sciad auto | first call (s) | rel. error vs reference "
        f"| {per_title} | rel. diff vs torchdde backprop | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in group:
        per = "–" if r.get("per_parameter") is None else per_format(r["per_parameter"])
        lines.append(
            f"| {r['name']} | {r['solver']} | {_g(r['rtol'])} | {_ms(r['median_s'])} | {len(r['times_s'])} | "
            f"{_ratio(r, base)} | {seconds(r['compile_s'])} | {_e(r['error'])} | {per} | {_e(r['vs_peer'])} | "
            f"{r['status']} |"
        )
    return [*lines, ""]


def _label(r) -> str:
    """A figure's row: name, the peer's solver, the tolerance, and how far off a timed row that failed its check is."""
    label = r["name"] + (f" ({r['solver']})" if r["kind"] == "peer" else "")
    label += "" if "rtol" in r["name"] or r["rtol"] is None else f", rtol {r['rtol']:g}"
    if r["median_s"] and not r["ok"]:
        label += f" [error {r['error']:.0e}]"
    return label


def figure(result: dict, path) -> None:
    """One panel of violins per part (time per call, log axis; sciad blue, peers orange, WRONG rows in red)."""
    import matplotlib.pyplot as plt

    parts = {}
    for r in result["records"]:
        parts.setdefault(r["part"], []).append(r)
    heights = [len(g) for g in parts.values()]
    fig, axes = plt.subplots(
        len(heights),
        1,
        figsize=(10, 2.0 + 0.4 * sum(heights)),
        height_ratios=heights,
        squeeze=False,
        layout="constrained",
    )
    titles = {
        "forward": "Mackey–Glass, forward solve",
        "gradient": "Mackey–Glass, gradient of Σ u(tᵢ)² in (β, γ, n, τ)",
        "neural": f"neural DDE (MLP 4 → {WIDTH} → 2), gradient in its {WEIGHTS} weights and τ",
    }
    for ax, (part, group) in zip(axes[:, 0], parts.items()):
        rows = [
            {
                "label": _label(r),
                "kind": r["kind"],
                "ok": bool(r["median_s"]),
                "times": r["times_s"],
                "median_s": r["median_s"],
                "error": None if r["median_s"] else r["status"].replace("WRONG gradient: ", "gradient off: "),
            }
            for r in group
        ]
        plots._violins(ax, sorted(rows, key=lambda r: (r["median_s"] is None, r["median_s"] or 0.0)))
        ax.set_title(f"{titles.get(part, part)} (time per call)", fontsize=9)
    fig.suptitle(
        f"DDEs: sciad (blue) vs jitcdde and torchdde (orange){' (quick)' if result['quick'] else ''}", fontsize=10
    )
    fig.savefig(path, dpi=120)
    plt.close(fig)
