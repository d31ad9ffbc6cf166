"""SDEs as a problem kind of sciad's solve, stepped by diffrax's solvers on sciad's loop.

`System` is the SDE inside sciad: drift and diffusion side by side in one function F(u, θ, t) =
[a (n); σ (d); g (k)] (σ the diffusion raveled: d = n for diagonal noise and for scalar noise,
n · m for m general Brownian motions; g an integrand, whose integral q rides in the state y =
(u, q) with drift g and no noise), converted to the solver's calculus by the Itô–Stratonovich drift
correction where the problem's differs. `SDEField` is what the kind adds to a solve's `Setup`: its
terms (`Increment`: drift and diffusion from one evaluation per stage; or the drift's `ODETerm` beside
a `Diffusion` or, backwards, a `Reversed` noise), its Brownian path as the rules' inputs, its backward
sweep's setup. `SDE_SOLVERS` names the solvers (diffrax's, and `DiagonalMilstein`).

Strong orders (checked in tests/test_sde_convergence.py: the mean error at t1 over many paths
against the closed form on each path, as dt halves):
- "euler" (Euler–Maruyama, Itô): 1/2; 1 with additive noise.
- "milstein" (Itô, diagonal or scalar noise): 1 for commutative noise (σᵢ depending on uᵢ
  alone, or scalar noise; the term ½ (∂σ/∂u · σ) (ΔW² - dt), as SciML's RKMil); 1/2 otherwise.
- "heun" (Stratonovich): 1 for scalar, commutative or additive noise, 1/2 in general.
- "reversible_heun" (Stratonovich, Kidger et al. 2021): as Heun (1 on scalar or additive noise,
  1/2 in general); algebraically reversible (`ReversibleAdjoint` reconstructs its states backwards).
"""

import dataclasses
import typing
from collections.abc import Callable
from typing import ClassVar

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp

from sciad._vector_field import AroundVectorField


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

    def increment(self, a, sigma, dt, dW):
        """a dt + σ dW (n + k,) (the integral q has no noise)."""
        du = self.noise.apply(sigma, dW)
        return a * dt + (jnp.concatenate([du, jnp.zeros((self.k,), du.dtype)]) if self.k else du)


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


class SDEField(AroundVectorField):
    """An SDE as a problem kind of sciad's solve: the `system` (drift, diffusion and integrand on flat
    vectors, in the calculus of the solver that steps it) and the Brownian `path` that drives it (None in a
    setup's bare copy, whose rules receive it as an input: `driving`, `driven`). What the solve's `Setup`
    asks of its field: `__call__(u, θ, t)` is the drift of y = (u, q) (n + k,) (what a time's derivative
    and the ODE parts of the pipeline read), `terms` the drift and the noise as the solver takes them."""

    system: System
    path: typing.Any
    # ForwardSensitivity's sensitivity SDE, discretised by the solver on the same increments, is the forward-mode
    # derivative of the steps: it differentiates them, its products from its engine (`with_products`)
    sensitivities_through_steps: typing.ClassVar[bool] = True
    host_engines_refused: typing.ClassVar[str] = (
        "an SDE solve takes JAX engines for its products (the drift correction and the solver's own "
        "Jacobian-vector products are differentiated again)"
    )
    no_time_derivative: typing.ClassVar[str] = (
        "an SDE solve is not differentiable in its times (tspan, saveat, event times): a Brownian path has no "
        "derivative in time; differentiate in u0, p and the values the functions close over, with the times "
        "held (jax.lax.stop_gradient)"
    )

    @property
    def F(self):  # noqa: N802  (the field's name in `System`)
        return self.system.F

    @property
    def integrand_size(self) -> int:
        return self.system.k

    def with_closure(self, c, merged: bool) -> "SDEField":
        return SDEField(eqx.tree_at(lambda s: s.F, self.system, self.F.with_closure(c, merged)), self.path)

    def with_products(self, backend) -> "SDEField":
        """This SDE with drift's and diffusion's derivative products computed by `backend`."""
        return SDEField(eqx.tree_at(lambda s: s.F, self.system, self.F.with_products(backend)), self.path)

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


# sciad's names of the SDE solvers (diffrax's, and Milstein's diagonal form)
SDE_SOLVERS: dict[str, Callable[[], dfx.AbstractSolver]] = {
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
