"""`sciad bench sde`: pathwise gradients of SDE solutions, sciad's sensealgs against a hand-written
`lax.scan` (the floor), diffrax's adjoints and torchsde, each checked on a known Brownian path, then
timed in interleaved rounds in one process (`sciad.timing.compare`).

Problems (diagonal noise, Itô, fixed steps on a uniform grid, `paths` paths under `jax.vmap` over keys):

- **neural SDE**: du = f_θ(u) dt + g_θ(u) ∘ dW, f and g MLPs of width 32 (tanh), g = 0.5 ·
  sigmoid(MLP); n = 4 (or 16) states, θ all the weights (584 or 2,144 parameters), u(0) fixed, 100 Euler steps
  on [0, 1]; loss: moment matching at T, Σ_i (mean u_i(T) − 0.5)² + (var u_i(T) − 0.2)² over the paths.
- **stochastic Lotka–Volterra** (a stochastic kinetics model, demographic noise in the diagonal approximation
  of the chemical Langevin equation, system size Ω = 100): prey x and predators y,
  dx = (αx − βxy) dt + sqrt((αx + βxy)/Ω) dW₁, dy = (δxy − γy) dt + sqrt((δxy + γy)/Ω) dW₂, θ = (α, β, δ, γ)
  = (1.5, 1, 1, 3), u(0) = (3, 2) (near the equilibrium (3, 1.5)), 256 Euler steps on [0, 4] (dt = 1/64:
  binary-exact, so that torchsde's accumulated times land on the save times) saved at t = 1, 2, 3, 4; loss:
  Σ_t of the squared distance of the mean over paths from (3, 1.5) plus that of the variance from (0.5, 0.5).

Schemes: Itô Euler–Maruyama ("euler"), and on the Stratonovich form of the same SDE (drift − ½ g ∘ ∂g/∂u,
diagonal noise; the correction written out per problem): Heun ("heun"), reversible Heun ("reversible_heun",
Kidger et al. 2021: the scheme of diffrax's `ReversibleHeun` and torchsde's `reversible_heun`).

Rows (`plan`):

- **the floor**: the Euler steps written by hand, `lax.scan` over increments drawn beforehand (an argument
  of the compiled call), `jax.grad` through it (`scan_gradient`; its Heun and reversible-Heun versions are
  the references of the other schemes);
- **sciad**: `sciad.solve(SDEProblem(...), key=..., dt0=..., solver=..., sensealg=...)` with
  ForwardDiffSensitivity, DiscreteAdjoint, BacksolveAdjoint, InterpolatingAdjoint, GaussAdjoint and "auto"
  (Euler, Itô) and `ReversibleAdjoint()` (reversible Heun, the Stratonovich form); rows that sciad refuses
  are recorded with its message; without `sciad.SDEProblem` they are recorded as pending;
- **diffrax** (`diffeqsolve`, `VirtualBrownianTree` with tol = dt/10 unless said): Euler with
  RecursiveCheckpointAdjoint; Euler with BacksolveAdjoint (refused: Stratonovich only, recorded); Heun on the
  Stratonovich form with BacksolveAdjoint; ReversibleHeun with RecursiveCheckpointAdjoint; Euler on
  `UnsafeBrownianPath` (reverse mode refused; ForwardMode, `jax.jacfwd`);
- **torchsde** (CPU torch, float64, its own `BrownianInterval`, one torch thread): `sdeint` (Euler,
  backpropagation through the steps), `sdeint_adjoint` (Euler forward, its default Itô adjoint: Milstein
  backwards) and `sdeint_adjoint` with `method="reversible_heun"`, `adjoint_method="adjoint_reversible_heun"`
  (the Stratonovich form); in full runs of the neural SDE also `sdeint_adjoint` (Euler) with torch's default
  threads (one per core). torch's threads spin-wait for work: on a machine shared with other processes its
  default threads make these calls slower than one thread.

Checks, before timing: each row's gradient on a Brownian path whose increments are known, against the
scan of the same scheme on those increments (`reference`): diffrax's from its `VirtualBrownianTree` (or
unsafe path) evaluated at its own step times, sciad's from `Solution.brownian.evaluate`, the floor's its
own. torchsde draws its path inside each call, so its check runs the same gradient on a torchsde Brownian
motion that returns the floor's increments (`_increments_brownian`); its timed calls use its own
`BrownianInterval`. Discrete gradients (backpropagation or forward mode through the steps, reversible Heun's
exact adjoint) agree to `EXACT` (float64); continuous adjoints (Backsolve, Interpolating, Gauss; torchsde's
adjoint SDE) are the exact gradient only as dt → 0: they are checked against the discrete gradient to
`CONTINUOUS`, which bounds the discretisation error at these steps (the table gives each error).

Timing: the JAX rows in interleaved rounds (calls of `SLOW`s or more in rounds of their own; each set's rounds
stop past `BUDGET` seconds), then the torch rows in rounds of their own (a JAX call right after torch's is
slowed while its threads spin); the ratios are to the floor's median in the same process. Memory: JAX rows, XLA's
temporaries of the compiled gradient
(`memory_analysis()`); torchsde rows, how far a fresh process' peak RSS rises over one gradient (full runs).
A sweep compiles the neural SDE's gradients at 100, 1,000 and 10,000 steps: XLA's temporaries against the
number of steps (ReversibleAdjoint's: flat).

Each record: problem, states, paths, steps, params, name, kind (floor, sciad, peer), scheme, path,
compile_s (build and first call: the check), median_s, times_s, rel_error (against the same-path
reference), tolerance, ok, temp_bytes, peak_bytes, rss_bytes.
"""

import dataclasses
import functools
import multiprocessing
import os
import pathlib
import time
from collections.abc import Callable

import diffrax as dfx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

import sciad
from sciad.timing import compare
from sciad_bench import plots
from sciad_bench.harness import peak_bytes
from sciad_bench.tables import seconds, write_result

EXACT = 1e-8  # discrete gradients of one scheme on one path, float64: rounding only
CONTINUOUS = 0.1  # continuous adjoints against the discrete gradient at the benchmark's steps (measured ≤ ~3e-2)
SLOW = 1.0  # s: JAX calls at least this slow (forward mode over hundreds of parameters) in rounds of their own
FORWARD_MODE_UP_TO = 1000  # parameters: forward-mode rows (one tangent each) beyond take tens of seconds
MEMORY_STEPS = {True: (20, 200), False: (100, 1000, 10000)}
ROUNDS = {True: (3, 1), False: (20, 3)}  # (JAX rounds, torch rounds)
BUDGET = (
    240.0  # s: a tier's rounds stop after the round that ends past it (16 states: continuous adjoints take seconds)
)
SENSEALGS = (
    "ForwardDiffSensitivity",
    "DiscreteAdjoint",
    "BacksolveAdjoint",
    "InterpolatingAdjoint",
    "GaussAdjoint",
    "auto",
)
CONTINUOUS_SENSEALGS = ("BacksolveAdjoint", "InterpolatingAdjoint", "GaussAdjoint")
FLOOR = "hand-written lax.scan Euler (floor)"
SCHEMES = {
    "euler": "Itô Euler",
    "heun": "Heun, Stratonovich form",
    "reversible_heun": "reversible Heun, Stratonovich form",
}


@dataclasses.dataclass(frozen=True)
class SDEBench:
    """One problem. `drift`, `diffusion` and `stratonovich_drift` (the Stratonovich form's drift) take
    (u, p, t, xp) with u of shape (n,) or (paths, n) and xp the array module (jax.numpy or torch); `loss(us,
    xp)` takes the saved states (paths, saves, n). Its `factory` and `options` rebuild it (in a child
    process)."""

    name: str
    states: int
    paths: int
    steps: int
    t1: float
    saveat: tuple
    u0: np.ndarray
    p: np.ndarray
    drift: Callable
    diffusion: Callable
    stratonovich_drift: Callable
    loss: Callable
    factory: Callable
    options: dict
    t0: float = 0.0
    seed: int = 0

    @property
    def dt(self) -> float:
        return (self.t1 - self.t0) / self.steps

    @property
    def grid(self) -> np.ndarray:
        return np.linspace(self.t0, self.t1, self.steps + 1)

    @property
    def save_index(self) -> np.ndarray:
        """The step indices (1-based: after that many steps) of the save times."""
        return np.rint((np.asarray(self.saveat) - self.t0) / self.dt).astype(int)

    @property
    def label(self) -> str:
        return f"{self.name}, {self.states} states, {self.paths} paths, {self.steps} steps"

    def keys(self):
        return jax.random.split(jax.random.key(self.seed), self.paths)


# --- the problems (one definition for JAX and torch: xp is jax.numpy or torch) --------------------------------

WIDTH = 32
SIGMA = 0.5  # the neural SDE's largest diffusion


def _mlp(p, u, n, xp):
    """The MLP n → WIDTH → n of the flat weights p: (output, hidden activations, W1, W2)."""
    h = WIDTH
    w1 = p[: h * n].reshape(h, n)
    b1 = p[h * n : h * n + h]
    w2 = p[h * n + h : 2 * h * n + h].reshape(n, h)
    b2 = p[2 * h * n + h : 2 * h * n + h + n]
    hidden = xp.tanh(u @ w1.T + b1)
    return hidden @ w2.T + b2, hidden, w1, w2


def _mlp_size(n: int) -> int:
    return 2 * WIDTH * n + WIDTH + n


def _neural_drift(u, p, t, xp=jnp):
    return _mlp(p[: _mlp_size(u.shape[-1])], u, u.shape[-1], xp)[0]


def _neural_diffusion(u, p, t, xp=jnp):
    z = _mlp(p[_mlp_size(u.shape[-1]) :], u, u.shape[-1], xp)[0]
    return SIGMA / (1 + xp.exp(-z))


def _neural_stratonovich_drift(u, p, t, xp=jnp):
    """drift − ½ g ∘ diag(∂g/∂u): g = SIGMA s(z), ∂g_i/∂u_i = SIGMA s(1 − s) Σ_k W2[i, k] (1 − h_k²) W1[k, i]."""
    n = u.shape[-1]
    z, hidden, w1, w2 = _mlp(p[_mlp_size(n) :], u, n, xp)
    s = 1 / (1 + xp.exp(-z))
    dz = (1 - hidden**2) @ (w2 * w1.T).T
    g = SIGMA * s
    return _neural_drift(u, p, t, xp) - 0.5 * g * SIGMA * s * (1 - s) * dz


def _neural_loss(us, xp=jnp):
    final = us[:, -1]
    mean = final.mean(0)
    var = ((final - mean) ** 2).mean(0)
    return ((mean - 0.5) ** 2).sum() + ((var - 0.2) ** 2).sum()


def neural_sde(states: int = 4, paths: int = 64, steps: int = 100) -> SDEBench:
    rng = np.random.default_rng(35)

    def mlp_weights():
        w1 = rng.normal(size=(WIDTH, states)) / np.sqrt(states)
        w2 = rng.normal(size=(states, WIDTH)) / np.sqrt(WIDTH)
        return np.concatenate([w1.ravel(), np.zeros(WIDTH), w2.ravel(), np.zeros(states)])

    return SDEBench(
        "neural SDE",
        states,
        paths,
        steps,
        1.0,
        (1.0,),
        np.linspace(-0.5, 0.5, states),
        np.concatenate([mlp_weights(), mlp_weights()]),
        _neural_drift,
        _neural_diffusion,
        _neural_stratonovich_drift,
        _neural_loss,
        neural_sde,
        {"states": states, "paths": paths, "steps": steps},
    )


OMEGA = 100.0  # the Lotka–Volterra system size: noise ~ 1/√Ω
LV_MEAN, LV_VAR = (3.0, 1.5), (0.5, 0.5)


def _lv_rates(u, p):
    x, y = u[..., 0], u[..., 1]
    return x, y, p[0] * x, p[1] * x * y, p[2] * x * y, p[3] * y


def _lv_drift(u, p, t, xp=jnp):
    x, y, birth, predation, growth, death = _lv_rates(u, p)
    return xp.stack([birth - predation, growth - death], -1)


def _lv_diffusion(u, p, t, xp=jnp):
    x, y, birth, predation, growth, death = _lv_rates(u, p)
    return xp.stack([xp.sqrt(abs(birth + predation) / OMEGA), xp.sqrt(abs(growth + death) / OMEGA)], -1)


def _lv_stratonovich_drift(u, p, t, xp=jnp):
    """drift − ½ g ∘ diag(∂g/∂u): g_x² = (αx + βxy)/Ω, so g_x ∂g_x/∂x = (α + βy)/(2Ω); g_y ∂g_y/∂y = (δx + γ)/(2Ω)."""
    x, y = u[..., 0], u[..., 1]
    correction = xp.stack([(p[0] + p[1] * y) / (2 * OMEGA), (p[2] * x + p[3]) / (2 * OMEGA)], -1)
    return _lv_drift(u, p, t, xp) - 0.5 * correction


def _lv_loss(us, xp=jnp):
    mean = us.mean(0)
    var = ((us - mean) ** 2).mean(0)
    return ((mean - xp.asarray(LV_MEAN)) ** 2).sum() + ((var - xp.asarray(LV_VAR)) ** 2).sum()


def lotka_volterra(paths: int = 128, steps: int = 256) -> SDEBench:
    return SDEBench(
        "stochastic Lotka–Volterra",
        2,
        paths,
        steps,
        4.0,
        (1.0, 2.0, 3.0, 4.0),
        np.array([3.0, 2.0]),
        np.array([1.5, 1.0, 1.0, 3.0]),
        _lv_drift,
        _lv_diffusion,
        _lv_stratonovich_drift,
        _lv_loss,
        lotka_volterra,
        {"paths": paths, "steps": steps},
    )


def problems(quick: bool):
    if quick:
        return [functools.partial(neural_sde, 4, 16, 20), functools.partial(lotka_volterra, 16, 256)]
    return [
        functools.partial(neural_sde, 4, 64, 100),
        functools.partial(neural_sde, 16, 256, 100),
        functools.partial(lotka_volterra, 128, 256),
    ]


# --- the floor: the steps written by hand over given increments --------------------------------------------------


def _scan_path(b: SDEBench, scheme: str, p, dw, ts):
    """One path's saved states (saves, n): `scheme`'s steps over the increments dw (steps, n) at the times ts."""
    f = b.drift if scheme == "euler" else b.stratonovich_drift
    g = b.diffusion
    u0 = jnp.asarray(b.u0, dw.dtype)

    if scheme == "euler":

        def step(u, x):  # pyright: ignore[reportRedeclaration]  # one step per scheme
            t, t1, w = x
            return u + f(u, p, t) * (t1 - t) + g(u, p, t) * w

        init, state = u0, lambda c: c
    elif scheme == "heun":

        def step(u, x):  # pyright: ignore[reportRedeclaration]  # one step per scheme
            t, t1, w = x
            fu, gu = f(u, p, t), g(u, p, t)
            v = u + fu * (t1 - t) + gu * w
            return u + 0.5 * (fu + f(v, p, t1)) * (t1 - t) + 0.5 * (gu + g(v, p, t1)) * w

        init, state = u0, lambda c: c
    else:  # reversible Heun: carry (u, z, f(z), g(z))

        def step(c, x):
            u, z, fz, gz = c
            t, t1, w = x
            z1 = 2 * u - z + fz * (t1 - t) + gz * w
            fz1, gz1 = f(z1, p, t1), g(z1, p, t1)
            return u + 0.5 * (fz + fz1) * (t1 - t) + 0.5 * (gz + gz1) * w, z1, fz1, gz1

        init, state = (u0, u0, f(u0, p, ts[0]), g(u0, p, ts[0])), lambda c: c[0]

    xs = (ts[:-1], ts[1:], dw)
    if list(b.save_index) == [b.steps]:  # the final state only: nothing else kept
        return state(jax.lax.scan(lambda c, x: (step(c, x), None), init, xs)[0])[None]  # pyright: ignore[reportArgumentType]  # the scheme's carry
    _, states = jax.lax.scan(lambda c, x: (lambda c1: (c1, state(c1)))(step(c, x)), init, xs)
    return states[b.save_index - 1]


def scan_loss(b: SDEBench, scheme: str, p, dws, ts):
    return b.loss(jax.vmap(lambda dw: _scan_path(b, scheme, p, dw, ts))(dws), jnp)


def scan_gradient(b: SDEBench, scheme: str = "euler"):
    """jit(grad) of the loss by `scheme`'s steps written as a `lax.scan`, in (p, increments (paths, steps, n),
    times (steps + 1,))."""
    return jax.jit(jax.grad(functools.partial(scan_loss, b, scheme)))


def predrawn(b: SDEBench):
    """The floor's increments (paths, steps, n): √dt × standard normals, drawn before any call."""
    key = jax.random.key(b.seed + 1)
    return jnp.sqrt(b.dt) * jax.random.normal(key, (b.paths, b.steps, b.states), jnp.float64)


# --- the rows -------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row:
    """One way to compute the gradient. `build(b)` returns (call, check, memory): `call()` the gradient (timed),
    `check()` (a gradient, its path's increments, the times they were drawn at, the scheme of the reference),
    `memory` a dict of bytes. `exact`: a discrete gradient (`EXACT`) or a continuous adjoint (`CONTINUOUS`)."""

    name: str
    kind: str  # "floor", "sciad", "peer"
    scheme: str
    path: str
    exact: bool
    build: Callable


def _compiled(jitted, *args):
    compiled = jitted.lower(*args).compile()
    stats = compiled.memory_analysis()
    memory = {
        "temp_bytes": None if stats is None else int(stats.temp_size_in_bytes),
        "peak_bytes": peak_bytes(compiled),
    }
    return functools.partial(compiled, *args), memory


def floor_row() -> Row:
    def build(b):
        dws, ts = predrawn(b), jnp.asarray(b.grid)
        call, memory = _compiled(scan_gradient(b), jnp.asarray(b.p), dws, ts)
        return call, lambda: (call(), dws, ts, "euler"), memory

    return Row(FLOOR, "floor", "euler", "increments drawn beforehand", True, build)


def _diffrax_terms(b: SDEBench, scheme: str, bm):
    f = b.drift if scheme == "euler" else b.stratonovich_drift
    return dfx.MultiTerm(
        dfx.ODETerm(lambda t, u, p: f(u, p, t)),
        dfx.ControlTerm(lambda t, u, p: lx.DiagonalLinearOperator(b.diffusion(u, p, t)), bm),
    )


DIFFRAX_SOLVERS = {"euler": dfx.Euler, "heun": dfx.Heun, "reversible_heun": dfx.ReversibleHeun}


def _diffrax_path(b: SDEBench, key, unsafe: bool):
    if unsafe:
        return dfx.UnsafeBrownianPath(shape=(b.states,), key=key)
    return dfx.VirtualBrownianTree(b.t0, b.t1, tol=b.dt / 10, shape=(b.states,), key=key)


def _diffrax_solve(b: SDEBench, scheme, adjoint, unsafe, key, p, saveat):
    return dfx.diffeqsolve(
        _diffrax_terms(b, scheme, _diffrax_path(b, key, unsafe)),
        DIFFRAX_SOLVERS[scheme](),
        b.t0,
        b.t1,
        b.dt,
        jnp.asarray(b.u0, p.dtype),
        args=p,
        saveat=saveat,
        adjoint=adjoint,
        max_steps=b.steps + 1,
    )


def diffrax_increments(b: SDEBench, scheme: str, unsafe: bool = False):
    """(increments (paths, steps, n), times (steps + 1,)): diffrax's Brownian paths of `b.keys()` at the times its
    steps take (`SaveAt(steps=True)` of one solve)."""
    p = jnp.asarray(b.p)
    adjoint = dfx.ForwardMode() if unsafe else dfx.RecursiveCheckpointAdjoint()  # an unsafe path refuses the other
    sol = _diffrax_solve(b, scheme, adjoint, unsafe, b.keys()[0], p, dfx.SaveAt(steps=True))
    ts = jnp.concatenate([jnp.asarray([b.t0]), sol.ts[: b.steps]])  # pyright: ignore[reportOptionalSubscript]  # saved: not None

    def path(key):
        bm = _diffrax_path(b, key, unsafe)
        return jax.vmap(bm.evaluate)(ts[:-1], ts[1:])

    return jax.jit(jax.vmap(path))(b.keys()), ts


def diffrax_row(scheme: str, adjoint: str, unsafe: bool = False) -> Row:
    """`diffeqsolve` with `scheme`'s solver and `adjoint` ("RecursiveCheckpointAdjoint", "BacksolveAdjoint",
    "ForwardMode": `jax.jacfwd`) on a `VirtualBrownianTree` per key (or an `UnsafeBrownianPath`)."""
    solver = DIFFRAX_SOLVERS[scheme].__name__

    def build(b):
        p = jnp.asarray(b.p)
        saveat = dfx.SaveAt(ts=jnp.asarray(b.saveat))

        def loss(p):
            us = jax.vmap(lambda key: _diffrax_solve(b, scheme, getattr(dfx, adjoint)(), unsafe, key, p, saveat).ys)(
                b.keys()
            )
            return b.loss(us, jnp)

        call, memory = _compiled(jax.jit(jax.jacfwd(loss) if adjoint == "ForwardMode" else jax.grad(loss)), p)
        return call, lambda: (call(), *diffrax_increments(b, scheme, unsafe), scheme), memory

    form = "" if scheme == "euler" else ", Stratonovich form"
    path = "UnsafeBrownianPath" if unsafe else "VirtualBrownianTree"
    return Row(
        f"diffrax {solver} {adjoint}{form}{' (UnsafeBrownianPath)' if unsafe else ''}",
        "peer",
        scheme,
        path,
        adjoint != "BacksolveAdjoint",
        build,
    )


def has_sdes() -> bool:
    """Whether this sciad solves SDEs (`sciad.SDEProblem`)."""
    return hasattr(sciad, "SDEProblem")


def sciad_problem(b: SDEBench, stratonovich: bool = False):
    return sciad.SDEProblem(
        b.stratonovich_drift if stratonovich else b.drift,
        b.diffusion,
        b.u0,
        (b.t0, b.t1),
        b.p,
        noise="diagonal",
        calculus="stratonovich" if stratonovich else "ito",
    )


def sciad_solve(b: SDEBench, problem, solver, sensealg, key, p):
    options = {} if sensealg is None else {"sensealg": sensealg}
    return sciad.solve(problem, p=p, key=key, dt0=b.dt, saveat=np.asarray(b.saveat), solver=solver, **options)


def sciad_increments(b: SDEBench, problem, solver):
    """(increments (paths, steps, n), times): `Solution.brownian` of each key's solve, its steps' increments
    (`BrownianPath.increments()`, exact; `evaluate(t_k, t_k+1)` for a path without them)."""
    ts = jnp.asarray(b.grid)

    def path(key):
        brownian = sciad_solve(b, problem, solver, None, key, jnp.asarray(b.p)).brownian
        if hasattr(brownian, "increments"):
            return brownian.increments()  # pyright: ignore[reportOptionalMemberAccess, reportAttributeAccessIssue]  # a BrownianPath
        return jax.vmap(brownian.evaluate)(ts[:-1], ts[1:])  # pyright: ignore[reportOptionalMemberAccess]  # an SDE's: set

    return jax.jit(jax.vmap(path))(b.keys()), ts


def sciad_row(sensealg: str) -> Row:
    """`sciad.solve` with `sensealg` (a name, or "ReversibleAdjoint": `sciad.ReversibleAdjoint()` with the
    reversible Heun solver on the Stratonovich form), vmapped over the keys."""
    reversible = sensealg == "ReversibleAdjoint"
    scheme = "reversible_heun" if reversible else "euler"

    def build(b):
        if not has_sdes():
            raise NotImplementedError("pending: this sciad has no sciad.SDEProblem")
        problem = sciad_problem(b, stratonovich=reversible)
        alg = sciad.ReversibleAdjoint() if reversible else sensealg
        p = jnp.asarray(b.p)

        def loss(p):
            return b.loss(jax.vmap(lambda key: sciad_solve(b, problem, scheme, alg, key, p).us)(b.keys()), jnp)

        call, memory = _compiled(jax.jit(jax.grad(loss)), p)
        return call, lambda: (call(), *sciad_increments(b, problem, scheme), scheme), memory

    name = f"sciad {sensealg}" + (" (reversible Heun, Stratonovich form)" if reversible else "")
    return Row(name, "sciad", scheme, "Solution.brownian (from the key)", sensealg not in CONTINUOUS_SENSEALGS, build)


def _increments_brownian(dws, t0: float, dt: float):
    """A torchsde Brownian motion whose increments over the grid t0 + k dt are `dws` (steps, paths, n)."""
    import torch
    from torchsde import BaseBrownian

    class Increments(BaseBrownian):
        __slots__ = ("dws", "w", "t0", "dt")

        def __init__(self):
            self.dws = dws
            self.w = torch.cat([torch.zeros_like(dws[:1]), torch.cumsum(dws, 0)])
            self.t0, self.dt = t0, dt

        def _index(self, t):
            return min(max(round((float(t) - self.t0) / self.dt), 0), self.dws.shape[0])

        def __call__(self, ta, tb=None, return_U=False, return_A=False):
            if return_U or return_A:
                raise ValueError("increments only")
            if tb is None:
                return self.w[self._index(ta)]
            a, c = self._index(ta), self._index(tb)
            return self.dws[a] if c == a + 1 else self.w[c] - self.w[a]

        def __repr__(self):
            return f"Increments(steps={self.dws.shape[0]})"

        dtype = property(lambda self: self.dws.dtype)
        device = property(lambda self: self.dws.device)
        shape = property(lambda self: self.dws.shape[1:])
        levy_area_approximation = property(lambda self: "none")

    return Increments()


TORCHSDE = {  # name: (scheme, adjoint, sdeint's keywords, torch threads: None for torch's default)
    "torchsde sdeint (Euler, backpropagation)": ("euler", False, {"method": "euler"}, 1),
    "torchsde sdeint_adjoint (Euler; Milstein adjoint)": ("euler", True, {"method": "euler"}, 1),
    "torchsde sdeint_adjoint (reversible Heun, Stratonovich form)": (
        "reversible_heun",
        True,
        {"method": "reversible_heun", "adjoint_method": "adjoint_reversible_heun"},
        1,
    ),
    "torchsde sdeint_adjoint (Euler; Milstein adjoint), torch's default threads": (
        "euler",
        True,
        {"method": "euler"},
        None,
    ),
}
DEFAULT_THREADS = "torchsde sdeint_adjoint (Euler; Milstein adjoint), torch's default threads"  # full, neural SDE


def torchsde_gradient(b: SDEBench, name: str):
    """(gradient(bm=None) -> array: one torchsde gradient of the loss on Brownian motion `bm` (None: torchsde's own
    `BrownianInterval`, drawn anew each call), the SDE module)."""
    import torch
    import torchsde

    scheme, adjoint, options, threads = TORCHSDE[name]
    stratonovich = scheme != "euler"

    class SDE(torch.nn.Module):
        noise_type = "diagonal"
        sde_type = "stratonovich" if stratonovich else "ito"

        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.as_tensor(b.p, dtype=torch.float64))

        def f(self, t, y):
            return (b.stratonovich_drift if stratonovich else b.drift)(y, self.p, t, torch)

        def g(self, t, y):
            return b.diffusion(y, self.p, t, torch)

    sde = SDE()
    y0 = torch.as_tensor(np.broadcast_to(b.u0, (b.paths, b.states)).copy(), dtype=torch.float64)
    ts = torch.as_tensor([b.t0, *b.saveat], dtype=torch.float64)
    solve = torchsde.sdeint_adjoint if adjoint else torchsde.sdeint

    def gradient(bm=None):
        default = torch.get_num_threads()
        torch.set_num_threads(threads or default)
        try:
            sde.p.grad = None
            ys = solve(sde, y0, ts, dt=b.dt, bm=bm, **options)
            b.loss(ys[1:].transpose(0, 1), torch).backward()  # pyright: ignore[reportAttributeAccessIssue]  # torch's stubs
            return sde.p.grad.numpy().copy()  # pyright: ignore[reportAttributeAccessIssue]  # torch's stubs
        finally:
            torch.set_num_threads(default)

    return gradient


def torchsde_row(name: str) -> Row:
    scheme, adjoint, _, _ = TORCHSDE[name]

    def build(b):
        import torch

        gradient = torchsde_gradient(b, name)
        dws = predrawn(b)
        bm = _increments_brownian(torch.as_tensor(np.asarray(dws).transpose(1, 0, 2).copy()), b.t0, b.dt)
        return gradient, lambda: (gradient(bm), dws, jnp.asarray(b.grid), scheme), {}

    return Row(
        name,
        "peer",
        scheme,
        "BrownianInterval (checked on the floor's increments)",
        not adjoint or scheme == "reversible_heun",
        build,
    )


def plan(b: SDEBench, quick: bool = True) -> tuple[list[Row], list[Row]]:
    """(the JAX rows, the torch rows) for `b`: forward-mode rows up to `FORWARD_MODE_UP_TO` parameters; torchsde with
    torch's default threads in full runs of the neural SDE."""
    forward_ok = b.p.size <= FORWARD_MODE_UP_TO
    jax_rows = [floor_row()]
    jax_rows += [sciad_row(s) for s in SENSEALGS if forward_ok or s != "ForwardDiffSensitivity"]
    jax_rows.append(sciad_row("ReversibleAdjoint"))
    jax_rows += [
        diffrax_row("euler", "RecursiveCheckpointAdjoint"),
        diffrax_row("euler", "BacksolveAdjoint"),
        diffrax_row("heun", "BacksolveAdjoint"),
        diffrax_row("reversible_heun", "RecursiveCheckpointAdjoint"),
    ]
    if forward_ok:
        jax_rows.append(diffrax_row("euler", "ForwardMode", unsafe=True))
    torch_rows = (
        [torchsde_row(name) for name in TORCHSDE if name != DEFAULT_THREADS or (not quick and b.factory is neural_sde)]
        if _has_torchsde()
        else []
    )
    return jax_rows, torch_rows


def _has_torchsde() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchsde") is not None


# --- checking and timing --------------------------------------------------------------------------------------


def _tolerance(row: Row) -> float:
    return EXACT if row.exact else CONTINUOUS


class _References:
    """The scan's gradient of each scheme on given increments, one compiled gradient per scheme."""

    def __init__(self, b: SDEBench):
        self.b, self.grads = b, {}

    def __call__(self, scheme, dws, ts):
        if scheme not in self.grads:
            self.grads[scheme] = scan_gradient(self.b, scheme)
        return np.asarray(self.grads[scheme](jnp.asarray(self.b.p), jnp.asarray(dws), jnp.asarray(ts)))


def _checked(row: Row, b: SDEBench, references: _References, memory: dict):
    """`compare`'s build of `row`: its first call returns the check, the relative error of the row's gradient on
    its known path against the reference on that path (max norm) over the row's tolerance, as an array of the
    gradient's shape whose largest entry is that ratio (`compare` measures it against zeros with tolerance 1);
    later calls return the gradient."""

    def prepare():
        call, check, memory[row.name] = row.build(b)
        first = [True]

        def run():
            if not first:
                return call()
            first.clear()
            gradient, dws, ts, scheme = check()
            reference = references(scheme, dws, ts)
            scale = float(np.max(np.abs(reference))) or 1.0
            return (np.asarray(gradient) - reference) / scale / _tolerance(row)

        return run

    return prepare


def measure(b: SDEBench, rows: list[Row], rounds: int, slow_call, log) -> list[dict]:
    """Records of `rows` on `b`: compiled and checked (`_checked`), then timed in interleaved rounds."""
    references, memory = _References(b), {}
    zeros = np.zeros(b.p.shape)
    results = compare(
        [_checked(row, b, references, memory) for row in rows],
        lambda: lambda: zeros,
        tolerance=1.0,
        rounds=rounds,
        budget=BUDGET,
        slow_call=slow_call,
        on_compile=lambda i: log(f"  {b.label}: compiling and checking {rows[i].name}"),
        on_round=lambda tier, i: log(f"  {b.label}: timing ({tier} calls), round {i + 1}/{rounds}"),
    )
    records = []
    for row, result in zip(rows, results):
        error = result.pop("rel_error", None)
        ok = result.pop("ok")
        records.append(
            {
                "problem": b.name,
                "states": b.states,
                "paths": b.paths,
                "steps": b.steps,
                "params": int(b.p.size),
                "name": row.name,
                "kind": row.kind,
                "scheme": row.scheme,
                "path": row.path,
                "rel_error": None if error is None else error * _tolerance(row),
                "tolerance": _tolerance(row),
                "ok": ok,
                **result,
                **memory.get(row.name, {}),
            }
        )
    return records


def _proc_status(field: str) -> int:
    """A size from /proc/self/status (Linux), in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(f"{field}:"))


def _torch_peak_rss(factory, options, name, queue):
    """In a fresh process: how far the peak RSS rises over one torchsde gradient above the RSS before it (torch's
    one-time set-up done beforehand on a one-path problem; Linux's peak reset through /proc/self/clear_refs)."""
    torchsde_gradient(factory(**{**options, "paths": 1, "steps": 4}), name)()
    gradient = torchsde_gradient(factory(**options), name)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _proc_status("VmRSS")
    gradient()
    queue.put(_proc_status("VmHWM") - before)


def torch_memory(b: SDEBench, name: str) -> int | None:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_torch_peak_rss, args=(b.factory, b.options, name, queue))
    child.start()
    child.join()
    return queue.get() if child.exitcode == 0 else None


def memory_sweep(quick: bool, log) -> list[dict]:
    """XLA's temporaries of the neural SDE's gradient (4 states, 64 paths; quick: 16) at `MEMORY_STEPS` steps:
    the floor, sciad's ReversibleAdjoint, DiscreteAdjoint and "auto", diffrax's RecursiveCheckpointAdjoint (Euler
    and reversible Heun). Compiled only."""
    rows = [
        floor_row(),
        diffrax_row("euler", "RecursiveCheckpointAdjoint"),
        diffrax_row("reversible_heun", "RecursiveCheckpointAdjoint"),
    ]
    if has_sdes():
        rows += [sciad_row("ReversibleAdjoint"), sciad_row("DiscreteAdjoint"), sciad_row("auto")]
    records = []
    for steps in MEMORY_STEPS[quick]:
        b = neural_sde(4, 16 if quick else 64, steps)
        for row in rows:
            log(f"  memory: {row.name} at {steps} steps")
            try:
                memory, error = row.build(b)[2], None
            except Exception as e:  # a row that cannot compile here: said, not fatal
                memory, error = {}, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            records.append({"name": row.name, "kind": row.kind, "steps": steps, "error": error, **memory})
    return records


def run_sde(*, quick: bool = False, repeats: int | None = None, out=None, verbose: bool = True) -> dict:
    """Every problem of `problems(quick)`: its JAX rows then its torch rows, then the memory sweep;
    records.json, sde.png and table.md in `out` (default results/sde). Returns records.json's content."""
    out = pathlib.Path(out or "results/sde")
    jax_rounds, torch_rounds = ROUNDS[quick]
    if repeats is not None:
        jax_rounds = torch_rounds = repeats
    log = print if verbose else (lambda *_: None)
    start = time.perf_counter()
    load = os.getloadavg()
    log(
        f"sde: load average {load[0]:.2f} on {os.cpu_count()} cores; sciad SDEs: "
        f"{'yes' if has_sdes() else 'pending (no sciad.SDEProblem)'}; torchsde: {'yes' if _has_torchsde() else 'no'}"
    )
    records, during = [], []
    for make in problems(quick):
        b = make()
        jax_rows, torch_rows = plan(b, quick)
        rows = measure(b, jax_rows, jax_rounds, SLOW, log)
        if torch_rows:
            rows += measure(b, torch_rows, torch_rounds, None, log)
            if not quick:
                for r in rows:
                    if r["name"] in TORCHSDE and r["ok"] is True:
                        log(f"  {b.label}: peak RSS of {r['name']} (a fresh process)")
                        r["rss_bytes"] = torch_memory(b, r["name"])
        for r in rows:
            log(
                f"  {b.label}: {r['name']:66s} {seconds(r.get('median_s'))} s (first {seconds(r.get('compile_s'))}) "
                f"error {r['rel_error'] if r['rel_error'] is None else format(r['rel_error'], '.1e')} ok={r['ok']}"
            )
        records += rows
        during.append(os.getloadavg()[0])
    sweep = memory_sweep(quick, log)
    result = {
        "experiment": "sde",
        "quick": quick,
        "load_average": {"start": load, "after each problem": during, "end": os.getloadavg()},
        "cores": os.cpu_count(),
        "sciad_sdes": has_sdes(),
        "records": records,
        "memory": sweep,
    }
    table = write_result(result, out, "sde", figure, markdown)
    log(table)
    log(f"sde: {len(records)} records in {time.perf_counter() - start:.0f} s -> {out}/")
    return result


# --- outputs --------------------------------------------------------------------------------------------------


def _groups(records) -> dict:
    groups = {}
    for r in records:
        groups.setdefault((r["problem"], r["states"], r["paths"], r["steps"]), []).append(r)
    return groups


def _floor(group):
    return next((r for r in group if r["kind"] == "floor" and r.get("median_s")), None)


def _status(r) -> str:
    if r["ok"] is True:
        return "ok"
    if r["ok"] is False:
        return "WRONG gradient"
    return str(r["ok"]).replace("|", "/").replace("\n", " ")[:160]


def _megabytes(r) -> str:
    if r.get("temp_bytes") is not None:
        return f"{r['temp_bytes'] / 1e6:.3g}"
    if r.get("rss_bytes") is not None:
        return f"{r['rss_bytes'] / 1e6:.3g} (RSS)"
    return "–"


def markdown(result: dict) -> str:
    records = result["records"]
    load = result["load_average"]
    during = "".join(f", {x:.1f}" for x in load.get("after each problem", []))
    lines = [
        f"# SDEs: pathwise gradients, sciad against a hand-written scan, diffrax and torchsde"
        f"{' (quick)' if result['quick'] else ''}",
        "",
        f"Measured on a shared {result['cores']}-core CPU with other sessions running (1-minute load average "
        f"{load['start'][0]:.1f} at the start{during and f', after each problem{during}'}, {load['end'][0]:.1f} at "
        "the end); times are medians of interleaved rounds in one process, and the ratios to the hand-written "
        "scan were measured side by side. float64 throughout."
        + (
            ""
            if result["sciad_sdes"]
            else " **sciad's rows are pending**: this sciad has no `sciad.SDEProblem` "
            "yet; they are wired to the API it is to have."
        ),
        "",
        *(x for note in result.get("notes", []) for x in (note, "")),
    ]
    for (problem, states, paths, steps), group in _groups(records).items():
        floor = _floor(group)
        lines += [
            f"## {problem}: {states} states, {paths} paths, {steps} steps, {group[0]['params']} parameters",
            "",
            "| method | scheme | Brownian path | median (ms) | rounds | × scan | first call (s) | memory (MB) "
            "| rel. error | tolerance | status |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in group:
            median = r.get("median_s")
            ratio = "–" if not (median and floor) else f"{median / floor['median_s']:.3g}×"
            lines.append(
                f"| {r['name']} | {SCHEMES[r['scheme']]} | {r['path']} | "
                f"{'–' if median is None else format(1e3 * median, '.3g')} | {len(r.get('times_s', []))} | "
                f"{ratio} | "
                f"{seconds(r.get('compile_s'))} | {_megabytes(r)} | "
                f"{'–' if r.get('rel_error') is None else format(r['rel_error'], '.1e')} | "
                f"{r['tolerance']:.0e} | {_status(r)} |"
            )
        lines += ["", *_targets(group, floor), ""]
    lines += [
        "Checks: each gradient on a Brownian path with known increments against the hand-written scan of the "
        "same scheme on those increments (sciad's from `Solution.brownian`, diffrax's from its "
        "`VirtualBrownianTree` at its step times; torchsde's own `BrownianInterval` is drawn inside each call, "
        "so its check runs the same gradient on a Brownian motion returning the scan's increments). Discrete "
        f"gradients agree to {EXACT:.0e}; continuous adjoints (the exact gradient only as dt → 0) to "
        f"{CONTINUOUS:g} of the discrete one. Memory: XLA's temporaries of the compiled gradient (JAX rows); "
        "torchsde: how far a fresh process' peak RSS rises over one gradient (RSS).",
        "",
    ]
    lines += _memory_table(result["memory"])
    return "\n".join(lines) + "\n"


def _targets(group, floor) -> list[str]:
    """The SDE targets on this problem (sciad auto against the scan and torchsde), as measured."""
    timed = [r for r in group if r["ok"] is True and r.get("median_s")]
    auto = next((r for r in timed if r["name"] == "sciad auto"), None)
    diffrax = min((r for r in timed if r["name"].startswith("diffrax")), key=lambda r: r["median_s"], default=None)
    torch = min((r for r in timed if r["name"].startswith("torchsde")), key=lambda r: r["median_s"], default=None)
    said = []
    if floor and auto:
        said.append(f"sciad auto: {auto['median_s'] / floor['median_s']:.2f}× the scan (target ≤ 3×)")
    elif floor:
        said.append("sciad auto: not measured")
    if floor and diffrax:
        said.append(f"diffrax's fastest ({diffrax['name']}): {diffrax['median_s'] / floor['median_s']:.1f}× the scan")
    if torch and auto:
        said.append(
            f"torchsde's fastest ({torch['name']}) / sciad auto: {torch['median_s'] / auto['median_s']:.0f}× "
            "(target ≥ 100×)"
        )
    elif torch and floor:
        said.append(f"torchsde's fastest ({torch['name']}): {torch['median_s'] / floor['median_s']:.0f}× the scan")
    return ["Targets: " + "; ".join(said) + "."] if said else []


def _memory_table(sweep) -> list[str]:
    if not sweep:
        return []
    steps = sorted({r["steps"] for r in sweep})
    lines = [
        "## Memory against the number of steps (neural SDE, 4 states; XLA temporaries of the gradient, MB)",
        "",
        "| method | " + " | ".join(f"{s:,} steps" for s in steps) + " |",
        "|---|" + "---:|" * len(steps),
    ]
    for name in dict.fromkeys(r["name"] for r in sweep):
        cells = []
        for s in steps:
            r = next((r for r in sweep if r["name"] == name and r["steps"] == s), None)
            cells.append(
                "–"
                if r is None or r.get("temp_bytes") is None
                else (f"{r['temp_bytes'] / 1e6:.3g}" if not r.get("error") else "failed")
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + [""]


def _error(r) -> str | None:
    """What `plots` says of a row not timed: its check's error over the tolerance, or what it raised."""
    if r["ok"] is True:
        return None
    if r["ok"] is False:
        return f"gradient off: relative error {r['rel_error']:.1e} > {r['tolerance']:.0e}"
    return str(r["ok"]).removeprefix("failed: ")


def figure(result: dict, path) -> None:
    """One panel of violins per problem (time per gradient, log axis; the floor grey, sciad blue, peers orange,
    failed rows listed in red) and one of XLA's temporaries against the number of steps."""
    import matplotlib.pyplot as plt

    groups = _groups(result["records"])
    heights = [len(g) for g in groups.values()] + [6]
    fig, axes = plt.subplots(
        len(heights),
        1,
        figsize=(11, 2.5 + 0.34 * sum(heights)),
        height_ratios=heights,
        squeeze=False,
        layout="constrained",
    )
    for ax, ((problem, states, paths, steps), group) in zip(axes[:, 0], groups.items()):
        rows = [
            {
                "label": r["name"],
                "kind": "baseline" if r["kind"] == "floor" else r["kind"],
                "ok": r["ok"] is True,
                "times": r.get("times_s", []),
                "median_s": r.get("median_s"),
                "error": _error(r),
            }
            for r in group
        ]
        rows = sorted(rows, key=lambda r: (r["median_s"] is None, r["median_s"] or 0.0))
        plots._violins(ax, rows)
        ax.set_title(f"{problem}: {states} states, {paths} paths, {steps} steps (time per gradient)", fontsize=9)
    ax = axes[-1, 0]
    lines = {}
    for r in result["memory"]:
        if r.get("temp_bytes"):
            lines.setdefault(r["name"], []).append((r["steps"], r["temp_bytes"] / 2**20))
    for i, (name, points) in enumerate(lines.items()):  # lines that coincide stay visible: markers and dashes differ
        points = sorted(points)
        ax.plot(
            [x for x, _ in points],
            [y for _, y in points],
            marker="os^vDx"[i % 6],
            linestyle=("-", "--", ":")[i % 3],
            label=name,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("steps")
    ax.set_ylabel("XLA temporaries (MiB)")
    ax.set_title("neural SDE gradient's memory against the number of steps", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.suptitle(
        f"SDE gradients: sciad vs a hand-written lax.scan (grey), diffrax and torchsde (orange)"
        f"{' (quick)' if result['quick'] else ''}",
        fontsize=10,
    )
    fig.savefig(path, dpi=120)
    plt.close(fig)
