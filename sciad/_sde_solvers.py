"""Fixed-step SDE solvers on flat vectors, stepped in one `jax.lax.scan` over the grid.

`System` is the SDE inside sciad: drift and diffusion side by side in one function F(u, θ, t) =
[a (n); σ (d); g (k)] (σ the diffusion raveled: d = n for diagonal noise and for scalar noise,
n · m for m general Brownian motions; g an integrand, whose integral q rides in the state y =
(u, q) with drift g and no noise), converted to the solver's calculus by the Itô–Stratonovich drift
correction where the problem's differs. The solvers (`SDE_SOLVERS`) step y on the grid t_k = t0 +
k dt with the increments of a Brownian path (`sciad._brownian`); `SDESetup.run` is the forward
solve the sensealgs differentiate or reconstruct.

Strong orders (checked in tests/test_sde_convergence.py: the mean error at t1 over many paths
against the closed form on each path, as dt halves):
- "euler" (Euler–Maruyama, Itô): 1/2; 1 with additive noise.
- "milstein" (Itô, diagonal or scalar noise): 1 for commutative noise (σᵢ depending on uᵢ
  alone, or scalar noise; the term ½ (∂σ/∂u · σ) (ΔW² - dt), as SciML's RKMil); 1/2 otherwise.
- "heun" (Stratonovich): 1 for scalar, commutative or additive noise, 1/2 in general.
- "reversible_heun" (Stratonovich, Kidger et al. 2021): as Heun (1 on scalar or additive noise,
  1/2 in general); algebraically reversible (`ReversibleAdjoint` reconstructs its states backwards).
"""

import abc
import dataclasses
import typing
from collections.abc import Callable
from typing import ClassVar

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sciad._brownian import grid_increment


class Noise(eqx.Module):
    """How the diffusion σ (d,) meets the Brownian increments dW (m,): `kind` "diagonal" (σ ⊙ dW,
    m = n), "scalar" (σ dW, m = 1) or "general" (σ as an (n, m) matrix times dW)."""

    kind: str = eqx.field(static=True)
    n: int = eqx.field(static=True)
    m: int = eqx.field(static=True)

    @property
    def d(self) -> int:
        """Entries of the raveled diffusion."""
        return self.n * self.m if self.kind == "general" else self.n

    def apply(self, sigma, dW):
        """σ dW (n,)."""
        if self.kind == "diagonal":
            return sigma * dW
        if self.kind == "scalar":
            return sigma * dW[0]
        return sigma.reshape(self.n, self.m) @ dW

    def correction(self, sigma_of: Callable, u, sigma):
        """c = ½ Σⱼ (∂Gⱼ/∂u) Gⱼ (n,), Gⱼ the diffusion's column j (`sigma_of(u)`: σ at u, σ its value
        there): Stratonovich drift = Itô drift - c. Exact for every noise kind (n products for
        diagonal noise, m for general, one for scalar)."""
        if self.kind == "scalar":
            return 0.5 * jax.jvp(sigma_of, (u,), (sigma,))[1]
        if self.kind == "diagonal":  # c_i = ½ σ_i ∂σ_i/∂u_i: the Jacobian's diagonal
            basis = jnp.eye(self.n, dtype=u.dtype)
            columns = jax.vmap(lambda e: jax.jvp(sigma_of, (u,), (e,))[1])(basis)  # row j: ∂σ/∂u_j
            return 0.5 * sigma * jnp.diagonal(columns)
        g = sigma.reshape(self.n, self.m)
        moved = jax.vmap(lambda col: jax.jvp(sigma_of, (u,), (col,))[1].reshape(self.n, self.m), in_axes=1)(g)
        return 0.5 * jnp.einsum("jij->i", moved)


class System(eqx.Module):
    """The SDE y = (u, q) (n + k,) on flat vectors: `F(u, θ, t)` = [a; σ; g] (n + d + k,), the
    `noise`, the problem's `calculus`, and `shift`: +1 or -1 adds or subtracts the Itô–Stratonovich correction to
    the drift
    (-1: an Itô problem stepped by a Stratonovich solver; +1: the reverse), 0 none."""

    F: Callable
    noise: Noise
    k: int = eqx.field(static=True)
    calculus: str = eqx.field(static=True)
    shift: int = eqx.field(static=True, default=0)

    def in_calculus(self, calculus: str) -> "System":
        """This SDE written in `calculus` ("ito" or "stratonovich"): the drift corrected where the
        problem's calculus differs (Stratonovich drift = Itô drift - c)."""
        shift = 0 if calculus == self.calculus else (-1 if calculus == "stratonovich" else 1)
        return System(self.F, self.noise, self.k, self.calculus, shift)

    @property
    def n(self) -> int:
        return self.noise.n

    def sigma(self, u, theta, t):
        """σ (d,) at u (n,)."""
        n = self.n
        return self.F(u, theta, t)[n : n + self.noise.d]

    def rates(self, y, theta, t):
        """(a (n + k,), σ (d,)) at y: the drift (with the integrand's rate, and the calculus
        correction) and the diffusion."""
        n, d = self.n, self.noise.d
        u, t = y[:n], jnp.asarray(t, y.dtype)
        out = self.F(u, theta, t)
        a, sigma = jnp.concatenate([out[:n], out[n + d :]]), out[n : n + d]
        if self.shift:
            c = self.noise.correction(lambda v: self.sigma(v, theta, t), u, sigma)
            a = a.at[:n].add(self.shift * c)
        return a, sigma

    def pulled(self, backend, y, theta, t):
        """((a, σ) at y, pb): pb(ā, σ̄) = (ȳ (n + k,), θ̄ (m,)), the cotangents through the rates by
        `backend`'s pullback (a `sciad.ad` backend: its own vector-Jacobian product)."""
        size = y.shape[0]
        rates, pb = backend.value_and_pullback(lambda y, th: jnp.concatenate(self.rates(y, th, t)), (y, theta))
        return (rates[:size], rates[size:]), lambda a_bar, sigma_bar: tuple(pb(jnp.concatenate([a_bar, sigma_bar])))

    def increment(self, a, sigma, dt, dW):
        """a dt + σ dW (n + k,) (the integral q has no noise)."""
        du = self.noise.apply(sigma, dW)
        return a * dt + (jnp.concatenate([du, jnp.zeros((self.k,), du.dtype)]) if self.k else du)

    def noise_cotangent(self, lam, dW):
        """The cotangent of σ (d,) from λ (n,) through σ dW: its transpose."""
        if self.noise.kind == "diagonal":
            return lam * dW
        if self.noise.kind == "scalar":
            return lam * dW[0]
        return jnp.outer(lam, dW).reshape(-1)


class AbstractSDESolver(eqx.Module):
    """A fixed-step SDE solver: `init` its state from y0, `step` it over [t, t + dt] with the
    increment dW, `value` the y (n + k,) it holds. `calculus` is the one it solves in (a problem in
    the other gets the drift correction); `noises` the noise kinds it serves."""

    calculus: ClassVar[str]
    noises: ClassVar[tuple] = ("diagonal", "scalar", "general")
    reversible: ClassVar[bool] = False

    def init(self, system: System, y0, theta, t0):
        return y0

    def value(self, state):
        return state

    @abc.abstractmethod
    def step(self, system: System, state, theta, t, dt, dW):
        """The state at t + dt from `state` at t, with the Brownian increment dW over the step."""


class Euler(AbstractSDESolver):
    """Euler–Maruyama (Itô): y + a dt + σ dW. Strong order 1/2 (1 with additive noise)."""

    calculus = "ito"

    def step(self, system: System, y, theta, t, dt, dW):
        a, sigma = system.rates(y, theta, t)
        return y + system.increment(a, sigma, dt, dW)


class Milstein(AbstractSDESolver):
    """Milstein (Itô, diagonal or scalar noise): Euler–Maruyama plus ½ (∂σ/∂u · σ) ⊙ (ΔW² - dt),
    one Jacobian-vector product per step. Strong order 1 for commutative noise (σᵢ depending on
    uᵢ alone, or scalar noise), as SciML's RKMil; 1/2 otherwise."""

    calculus = "ito"
    noises = ("diagonal", "scalar")

    def step(self, system: System, y, theta, t, dt, dW):
        n = system.n
        (a, sigma), lin = jax.linearize(lambda u: system.rates(jnp.concatenate([u, y[n:]]), theta, t), y[:n])
        moved = lin(sigma)[1]  # ∂σ/∂u · σ
        squares = (dW**2 if system.noise.kind == "diagonal" else dW[0] ** 2) - dt
        extra = 0.5 * moved * squares
        step = system.increment(a, sigma, dt, dW)
        return y + step.at[:n].add(extra)


class Heun(AbstractSDESolver):
    """Heun's method (Stratonovich): predictor ỹ = y + a dt + σ dW, then the trapezoid of both ends.
    Strong order 1 for scalar and commutative diagonal noise, 1/2 in general."""

    calculus = "stratonovich"

    def step(self, system: System, y, theta, t, dt, dW):
        first = system.increment(*system.rates(y, theta, t), dt, dW)
        second = system.increment(*system.rates(y + first, theta, t + dt), dt, dW)
        return y + 0.5 * (first + second)


class ReversibleHeun(AbstractSDESolver):
    """Reversible Heun (Stratonovich; Kidger, Foster, Li, Lyons 2021): the state (y, ŷ, a(ŷ), σ(ŷ)),
    ŷ' = 2y - ŷ + a(ŷ) dt + σ(ŷ) dW, y' = y + ½ (a(ŷ) + a(ŷ')) dt + ½ (σ(ŷ) + σ(ŷ')) dW: one
    evaluation of drift and diffusion per step, and algebraically reversible (`reverse`). Strong
    order 1/2 (1 with additive noise)."""

    calculus = "stratonovich"
    reversible = True

    def init(self, system: System, y0, theta, t0):
        return (y0, y0, *system.rates(y0, theta, t0))

    def value(self, state):
        return state[0]

    def step(self, system: System, state, theta, t, dt, dW):
        y, yh, a, sigma = state
        first = system.increment(a, sigma, dt, dW)
        yh_next = 2 * y - yh + first
        a_next, sigma_next = system.rates(yh_next, theta, t + dt)
        return y + 0.5 * (first + system.increment(a_next, sigma_next, dt, dW)), yh_next, a_next, sigma_next

    def reverse(self, system: System, state, theta, t, dt, dW):
        """The state at t from the state at t + dt (the step `step` took with dW), exactly in
        exact arithmetic."""
        y_next, yh_next, a_next, sigma_next = state
        second = system.increment(a_next, sigma_next, dt, dW)
        yh = 2 * y_next - yh_next - second
        a, sigma = system.rates(yh, theta, t)
        return y_next - 0.5 * (system.increment(a, sigma, dt, dW) + second), yh, a, sigma


SDE_SOLVERS: dict[str, type[AbstractSDESolver]] = {
    "euler": Euler,
    "milstein": Milstein,
    "heun": Heun,
    "reversible_heun": ReversibleHeun,
}


def default_sde_solver(calculus: str, noise: str) -> AbstractSDESolver:
    """Itô: Milstein for diagonal and scalar noise (strong order 1), Euler–Maruyama for general
    noise; Stratonovich: Heun."""
    if calculus == "stratonovich":
        return Heun()
    return Milstein() if noise in Milstein.noises else Euler()


class SDESetup(eqx.Module):
    """A fixed-step solve: the `system`, the `solver`, the Brownian `path`, `steps` steps of the grid
    t_k = t0 + k dt from step `start` (a segment between events starts past 0), and the save steps
    (T,) int32 (indices into the segment's steps 0 .. steps, non-decreasing, repeats allowed, traced or
    not; the integral's solve saves the last step once more at the end)."""

    system: System
    solver: AbstractSDESolver
    path: eqx.Module
    t0: float = eqx.field(static=True)
    dt: float = eqx.field(static=True)
    steps: int = eqx.field(static=True)
    save_steps: jax.Array | np.ndarray
    start: int = eqx.field(static=True, default=0)

    def time(self, k):
        """t at the segment's step k."""
        return self.t0 + (self.start + k) * self.dt

    def increment(self, k):
        """The segment's step k's Brownian increment (m,)."""
        return jnp.asarray(grid_increment(self.path, self.t0, self.dt, self.start + k))

    def run(self, y0, theta, *, every_step: bool = False, final_state: bool = False):
        """The forward solve: ys (T, n + k) at the save steps; with `every_step` also every grid
        step's y (steps + 1, n + k); with `final_state` the solver's state at the last step."""
        solver, system = self.solver, self.system
        saves = self.save_steps
        T = saves.shape[0]
        # Each step's y goes to the first save at its step (a last row for the steps not saved); repeats read it.
        first = jnp.searchsorted(saves, saves, side="left")
        after = jnp.append(jnp.searchsorted(saves, saves, side="right"), T)  # the next save past each one's step
        buffer = jnp.zeros((T + 1, y0.shape[0]), y0.dtype).at[0].set(y0)
        start_j = jnp.where(saves[0] == 0, after[0], 0).astype(jnp.int32)

        def body(carry, _):  # the step index rides in the carry: no per-step input (memory flat in steps)
            state, buffer, j, k = carry
            dW = self.increment(k).astype(y0.dtype)
            state = solver.step(system, state, theta, jnp.asarray(self.time(k), y0.dtype), self.dt, dW)
            y = solver.value(state)
            hit = saves[jnp.minimum(j, T - 1)] == k + 1
            buffer = jax.lax.dynamic_update_index_in_dim(buffer, y, jnp.where(hit, j, T), 0)
            return (state, buffer, jnp.where(hit, after[j], j).astype(j.dtype), k + 1), (y if every_step else None)

        state0 = solver.init(system, y0, theta, jnp.asarray(self.time(0), y0.dtype))
        start = (state0, buffer, start_j, jnp.asarray(0, jnp.int32))
        (state, buffer, _, _), path = jax.lax.scan(body, start, None, length=self.steps)
        final = solver.value(state)  # the saves at the last step (the integral's among them) hold it
        out = [jnp.where((saves == self.steps)[:, None], final, buffer[first])]
        if every_step:
            out.append(jnp.concatenate([y0[None], path]))  # pyright: ignore[reportArgumentType]  # every_step: the path
        if final_state:
            out.append(state)
        return out[0] if len(out) == 1 else tuple(out)


class Diffusion(dfx.AbstractTerm):
    """The noise term σ(u, θ, t) dW of the state y = (u, q) (n + k,), driven by a Brownian `path`: `vf`
    is σ (d,) raveled as `Noise` says, `contr` the path's increment dW (m,), `prod` σ dW with zeros for
    the integral q (it has no noise). Held by `SDEField.terms` beside the drift's `diffrax.ODETerm`."""

    sigma: Callable  # (t, y, args) -> σ (d,)
    noise: Noise
    k: int = eqx.field(static=True)
    path: typing.Any

    def vf(self, t, y, args):
        return self.sigma(t, y, args)

    def contr(self, t0, t1, **kwargs):
        return jnp.asarray(self.path.evaluate(t0, t1))

    def prod(self, vf, control):
        du = self.noise.apply(vf, control.astype(vf.dtype))
        return jnp.concatenate([du, jnp.zeros((self.k,), du.dtype)]) if self.k else du


class SDEField(eqx.Module):
    """An SDE as a problem kind of sciad's solve: the `system` (drift, diffusion and integrand on flat
    vectors, in the calculus of the solver that steps it) and the Brownian `path` that drives it (None in a
    setup's bare copy, whose rules receive it as an input: `driving`, `driven`). What the solve's `Setup`
    asks of its field: `__call__(u, θ, t)` is the drift of y = (u, q) (n + k,) (what a time's derivative
    and the ODE parts of the pipeline read), `terms` the drift and the noise as the solver takes them."""

    system: System
    path: typing.Any
    no_time_derivative: typing.ClassVar[str] = (
        "an SDE solve is not differentiable in its times (tspan, saveat, event times): a Brownian path has no "
        "derivative in time; differentiate in u0, p and the values the functions close over, with the times "
        "held (jax.lax.stop_gradient)"
    )

    @property
    def F(self):  # noqa: N802  (the field's name in `System`)
        return self.system.F

    @property
    def u(self):
        return self.F.u

    @property
    def p(self):
        return self.F.p

    @property
    def held(self):
        return self.F.held

    @property
    def dtype(self):
        return self.F.dtype

    @property
    def integrand_size(self) -> int:
        return self.system.k

    def with_closure(self, c, merged: bool) -> "SDEField":
        return SDEField(eqx.tree_at(lambda s: s.F, self.system, self.F.with_closure(c, merged)), self.path)

    def driving(self) -> tuple:
        """The path's arrays (PRNG keys as their raw data): the inputs a custom rule takes the path as."""
        leaves = jax.tree.leaves(eqx.filter(self.path, eqx.is_array))
        return tuple(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x for x in leaves)

    def driven(self, arrays, like: "SDEField") -> "SDEField":
        """This field driven by the path of `like` made of `arrays` (`driving`'s), or by none (`arrays` None)."""
        if arrays is None:
            return SDEField(self.system, None)
        template, rest = eqx.partition(like.path, eqx.is_array)
        leaves, treedef = jax.tree.flatten(template)
        leaves = [
            jax.random.wrap_key_data(a, impl=jax.random.key_impl(x))
            if jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
            else a
            for x, a in zip(leaves, arrays)
        ]
        return SDEField(self.system, eqx.combine(jax.tree.unflatten(treedef, leaves), rest))

    def open(self) -> Callable:
        """The drift as g(u, θ, c, t), the closure values c an argument (`sciad.adjoints._base.Products`)."""
        F, system = self.F.open(), self.system

        def drift(u, theta, c, t):
            closed = eqx.tree_at(lambda s: s.F, system, lambda u, theta, t: F(u, theta, c, t))
            y = jnp.concatenate([u, jnp.zeros((system.k,), u.dtype)]) if system.k else u
            return closed.rates(y, theta, t)[0]

        return drift

    def noise_pullback(self, u, theta, t, dW, lam):
        """(σ dW (n,), λᵀ∂(σ dW)/∂u (n,), λᵀ∂(σ dW)/∂θ (m,)) at u (n,): one vector-Jacobian product of the
        noise's increment (what the adjoint SDE's noise term is made of)."""
        system = self.system
        value, pb = jax.vjp(lambda u, th: system.noise.apply(system.sigma(u, th, t), dW.astype(u.dtype)), u, theta)
        return (value, *pb(lam))

    def backward(self, setup):
        """The setup the continuous adjoints solve backwards on: this SDE in its Stratonovich form (the adjoint
        SDE's calculus), stepped by Heun, steps clipped only at the sweep's breakpoints."""
        return dataclasses.replace(
            setup,
            f=SDEField(self.system.in_calculus("stratonovich"), self.path),
            solver=dfx.Heun(),
            steps_at_saves=False,
        )

    def __call__(self, u, theta, t):
        """The drift of y = (u, q): [a; g] (n + k,), a with the calculus correction."""
        y = jnp.concatenate([u, jnp.zeros((self.system.k,), u.dtype)]) if self.system.k else u
        return self.system.rates(y, theta, t)[0]

    def terms(self, solver: dfx.AbstractSolver, drift=None, noise=None):
        """What `solver` steps: the SDE itself (no `drift` given) as one `Increment` term where the solver
        takes any term (drift and diffusion from one evaluation of the field per stage), else the drift
        `drift(t, y, args)` (default: the field's) as a `diffrax.ODETerm` beside the noise in a
        `diffrax.MultiTerm`: a `Diffusion` along the path, or `noise(s, y, args, dW)`, the increment a backward
        sweep in s = -t takes over a step whose forward increment is dW (`Reversed`)."""
        system, n = self.system, self.system.n
        if drift is None and noise is None and typing.get_origin(solver.term_structure) is not dfx.MultiTerm:
            return Increment(system, self.path)
        drift = drift or (lambda t, y, theta: system.rates(y, theta, t)[0])
        if noise is not None:
            return dfx.MultiTerm(dfx.ODETerm(drift), Reversed(noise, self.path))
        sigma = lambda t, y, theta: system.sigma(y[:n], theta, jnp.asarray(t, y.dtype))  # noqa: E731
        return dfx.MultiTerm(dfx.ODETerm(drift), Diffusion(sigma, system.noise, system.k, self.path))


class Increment(dfx.AbstractTerm):
    """The SDE as one term: control (dt, dW) over a step (dW the path's increment), vector field (a, σ) at y
    from one evaluation of the field (drift with the calculus correction, diffusion), product a dt + σ dW
    (the integral's q with no noise)."""

    system: System
    path: typing.Any

    def vf(self, t, y, args):
        return self.system.rates(y, args, jnp.asarray(t, y.dtype))

    def contr(self, t0, t1, **kwargs):
        return t1 - t0, jnp.asarray(self.path.evaluate(t0, t1))

    def prod(self, vf, control):
        (a, sigma), (dt, dW) = vf, control
        return self.system.increment(a, sigma, jnp.asarray(dt, a.dtype), dW.astype(a.dtype))


class Reversed(dfx.AbstractTerm):
    """A noise term stepped backwards in s = -t: over [s0, s1] its control is the forward path's increment
    dW = W(-s0) - W(-s1) over the same stretch, and `product(s, y, args, dW)` the state's increment (one
    vector-Jacobian product of the noise per stage for an adjoint: never the matrix)."""

    product: Callable
    path: typing.Any

    def vf(self, t, y, args):
        raise NotImplementedError("a reversed noise term has products only (vf_prod)")

    def contr(self, t0, t1, **kwargs):
        return jnp.asarray(self.path.evaluate(-t1, -t0))

    def prod(self, vf, control):
        raise NotImplementedError("a reversed noise term has products only (vf_prod)")

    def vf_prod(self, t, y, args, control):
        return self.product(t, y, args, control)

    def is_vf_expensive(self, t0, t1, y, args) -> bool:
        return True


class DiagonalMilstein(dfx.AbstractItoSolver):
    """Milstein's method (Itô) for diagonal and scalar noise on `SDEField.terms`: Euler–Maruyama plus
    ½ (∂σ/∂u · σ) ⊙ (ΔW² - dt), one Jacobian-vector product per step (σᵢ depending on uᵢ alone, or
    scalar noise: strong order 1; 1/2 otherwise), as SciML's RKMil. Fixed steps (no error estimate)."""

    term_structure: ClassVar = dfx.MultiTerm[tuple[dfx.AbstractTerm, dfx.AbstractTerm]]
    interpolation_cls: ClassVar = dfx.LocalLinearInterpolation

    def order(self, terms):
        return None

    def strong_order(self, terms):
        return 1

    def init(self, terms, t0, t1, y0, args):
        return None

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        del solver_state, made_jump
        drift, diffusion = terms.terms
        dt, dW = drift.contr(t0, t1), diffusion.contr(t0, t1)
        n = diffusion.noise.n
        sigma, lin = jax.linearize(lambda u: diffusion.vf(t0, jnp.concatenate([u, y0[n:]]), args), y0[:n])
        dW = dW.astype(y0.dtype)
        squares = (dW**2 if diffusion.noise.kind == "diagonal" else dW[0] ** 2) - dt
        step = drift.vf_prod(t0, y0, args, dt) + diffusion.prod(sigma, dW)
        y1 = y0 + step.at[:n].add(0.5 * lin(sigma) * squares)
        return y1, None, dict(y0=y0, y1=y1), None, dfx.RESULTS.successful

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)


# sciad's names of the SDE solvers stepped on the one loop (diffrax's, and Milstein's diagonal form)
LOOP_SOLVERS: dict[str, Callable[[], dfx.AbstractSolver]] = {
    "euler": dfx.Euler,
    "milstein": DiagonalMilstein,
    "heun": dfx.Heun,
    "reversible_heun": dfx.ReversibleHeun,
}


def calculus_of(solver: dfx.AbstractSolver) -> str | None:
    """The calculus a diffrax solver's SDE solutions converge in, as diffrax declares it; None for an ODE solver."""
    if isinstance(solver, dfx.AbstractItoSolver):
        return "ito"
    if isinstance(solver, dfx.AbstractStratonovichSolver):
        return "stratonovich"
    return None
