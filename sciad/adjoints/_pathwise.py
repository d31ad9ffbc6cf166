"""Pathwise derivatives of an SDE solve: every sensealg differentiates the solution of one Brownian
path (the gradient of this path's solution), on the fixed grid of `sciad._sde_solvers.SDESetup`.

- `ForwardDiffSensitivity`: forward mode through the solver's steps (one tangent per input).
- `ForwardSensitivity`: the pathwise sensitivity SDE S' = ∂a/∂u S + ∂a/∂θ, ∂σ/∂u S + ∂σ/∂θ on the
  same increments, discretised by the forward solver itself (S rides in the scan with y); on a fixed
  grid that is the forward-mode derivative of the steps, with the products from its `jvp` engine.
- `DiscreteAdjoint`: reverse mode through the steps (JAX's tape of the scan: memory ~ steps).
- `BacksolveAdjoint`: the backward Stratonovich adjoint SDE (Li et al. 2020) for (u, λ, μ) on the
  same path, by Heun backwards, u re-solved backwards and reset at every save time; an Itô problem
  is adjointed in its Stratonovich form (the drift correction, and its derivatives). Its drift check
  (`on_instability`, `drift_tolerance`) is an ODE solve's: not made here.
- `InterpolatingAdjoint`: the same adjoint SDE for (λ, μ) alone on the stored forward path (every
  grid step's y: memory ~ steps).
- `GaussAdjoint`: λ alone by Heun on the stored path, ∂L/∂θ by the trapezoid rule on λ's steps (the
  Stratonovich integral's consistent quadrature; one product more per step).
- `ReversibleAdjoint`: exact gradient of reversible Heun, flat memory (`_reversible`).

The continuous adjoints converge to the pathwise derivative as dt → 0 (their error is of the
solver's strong order); ForwardDiffSensitivity, ForwardSensitivity, DiscreteAdjoint and
ReversibleAdjoint give the discrete solution's exact derivative. Options of the ODE sensealgs that
concern adaptive steps (`seminorm`, tolerances) change nothing on the fixed grid; `checkpointing=True`
is refused. The products are the sensealg's engine's, JAX engines only (the drift correction and
Milstein's term differentiate them again): the adjoints' vector-Jacobian products of drift and
diffusion are the engine's own pullbacks (`System.pulled`), and ForwardSensitivity's steps run on F
wrapped by `sciad.ad.differentiate_with`.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

import sciad.ad as ad
from sciad.adjoints._continuous import BacksolveAdjoint, GaussAdjoint, InterpolatingAdjoint
from sciad.adjoints._discrete import DiscreteAdjoint, ForwardDiffSensitivity
from sciad.adjoints._forward import ForwardSensitivity
from sciad.adjoints._registry import describe
from sciad.adjoints._reversible import ReversibleAdjoint, reversible_rules, through_steps


class EngineField(eqx.Module):
    """F(u, θ, t) with its derivatives computed by a `sciad.ad` engine (`differentiate_with`)."""

    g: Callable
    c: jax.Array

    def __call__(self, u, theta, t):
        return self.g(u, theta, self.c, t)


def with_engine(setup, field, backend):
    """`setup` (an `SDESetup` on the merged `field`) with F's products from `backend`."""
    wrapped = EngineField(ad.differentiate_with(field.open(), backend), jnp.zeros((0,), field.dtype))
    return eqx.tree_at(lambda s: s.system.F, setup, wrapped)


def refusal(sensealg, setup) -> str | None:
    """Why `sensealg` cannot differentiate the SDE solve `setup`, naming what can (None if it can)."""
    name = describe(sensealg)
    if type(sensealg) not in RULES:
        return f"sensealg={name} does not differentiate SDE solves; pass one of {sorted(cls.__name__ for cls in RULES)}"
    if isinstance(sensealg, ReversibleAdjoint) and not setup.solver.reversible:
        return (
            f"sensealg=ReversibleAdjoint needs an algebraically reversible solver, got "
            f"{type(setup.solver).__name__}: pass solver='reversible_heun', or keep this solver with "
            "sensealg=sciad.DiscreteAdjoint() (exact, memory ~ steps) or sciad.InterpolatingAdjoint()"
        )
    if getattr(sensealg, "checkpointing", False):
        return (
            f"sensealg={name}: checkpointing is not available for SDE solves yet (the stored path is every "
            "grid step's state); for memory flat in the steps pass solver='reversible_heun' with "
            "sensealg=sciad.ReversibleAdjoint(), or sciad.BacksolveAdjoint()"
        )
    host = [e.name for e in sensealg.engines() if not e.traced]
    if host:
        return (
            f"sensealg={name}: SDE solves take JAX engines for their products (the drift correction and the "
            f"solver's own Jacobian-vector products differentiate again), got {host[0]!r}: pass "
            "'jax-reverse', 'jax-forward' or 'jax-transpose'"
        )
    return None


def solve(sensealg, setup, field, y0, theta):
    """ys (T, n + k) of the SDE solve `setup` from y0 with parameters θ (m,) (the closure's values
    appended), differentiable in (y0, θ) by `sensealg`'s pathwise rules (checked by `refusal` first)."""
    rules = RULES[type(sensealg)]
    if isinstance(sensealg, ForwardSensitivity):  # the solver's own steps take the engine's pushforwards
        setup = with_engine(setup, field, sensealg.jvp)
    if rules is None:  # reverse mode through the steps: JAX's own rules of the scan
        return setup.run(y0, theta)
    forward, pushforward, pullback = rules(sensealg)
    data, rebuild = _traced_parts(setup)  # the rules close over no traced value (a vmapped key)

    def forward_(y0, theta, *data, active):
        ys, res = forward(rebuild(data), y0, theta, None if active is None else active[:2])
        return ys, (res, data)

    def pushforward_(res, vs):
        return pushforward(rebuild(res[1]), res[0], vs[:2])

    def pullback_(res, w):
        return (*pullback(rebuild(res[1]), res[0], w), *([None] * len(res[1])))

    return ad.custom_linear_rules(forward_, pushforward_, pullback_)(y0, theta, *data)


def _traced_parts(setup):
    """(data, rebuild): the setup's arrays (PRNG keys as their raw data) and the function making the
    setup again from them."""
    arrays, rest = eqx.partition(setup, eqx.is_array)
    leaves, treedef = jax.tree.flatten(arrays)
    impls = [jax.random.key_impl(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else None for x in leaves]
    data = tuple(x if impl is None else jax.random.key_data(x) for x, impl in zip(leaves, impls))

    def rebuild(data):
        leaves = [x if impl is None else jax.random.wrap_key_data(x, impl=impl) for x, impl in zip(data, impls)]
        return eqx.combine(jax.tree.unflatten(treedef, leaves), rest)

    return data, rebuild


def _forward_mode(sensealg):
    """Forward mode through the steps: the Jacobians of the saves in y0 and θ, kept as residuals."""

    def forward(setup, y0, theta, active):
        if active is None:
            return setup.run(y0, theta), None
        argnums = tuple(i for i, on in enumerate(active) if on)
        run = lambda y0, theta: (setup.run(y0, theta),) * 2  # noqa: E731
        jacs, ys = jax.jacfwd(run, argnums=argnums, has_aux=True)(y0, theta)
        full = [None, None]
        for i, jac in zip(argnums, jacs):
            full[i] = jac
        return ys, tuple(full)

    def pushforward(setup, jacs, vs):
        return sum(jnp.tensordot(j, v, axes=1) for j, v in zip(jacs, vs) if j is not None)

    def pullback(setup, jacs, w):
        return tuple(None if j is None else jnp.tensordot(w, j, axes=2) for j in jacs)

    return forward, pushforward, pullback


class _Stored(eqx.Module):
    """A continuous adjoint's residuals: y0, θ, the saves, and every grid step's y (None for
    BacksolveAdjoint, which keeps the final y)."""

    y0: jax.Array
    theta: jax.Array
    ys: jax.Array
    path: jax.Array | None
    final: jax.Array | None


def _continuous(sensealg):
    """The backward Stratonovich adjoint SDE, by Heun on the grid backwards with the forward pass's
    increments: (u, λ, μ) for BacksolveAdjoint, (λ, μ) on the stored path for InterpolatingAdjoint,
    λ with μ by the trapezoid rule for GaussAdjoint."""
    backsolve = isinstance(sensealg, BacksolveAdjoint)
    trapezoid = isinstance(sensealg, GaussAdjoint)

    def forward(setup, y0, theta, active):
        if active is None:
            return setup.run(y0, theta), None
        if backsolve:
            ys, state = setup.run(y0, theta, final_state=True)
            return ys, _Stored(y0, theta, ys, None, setup.solver.value(state))
        ys, path = setup.run(y0, theta, every_step=True)
        return ys, _Stored(y0, theta, ys, path, None)

    def pullback(setup, res, w):
        theta = res.theta
        adjoint = setup.system.in_calculus("stratonovich")
        saves = jnp.asarray(setup.save_steps)
        dt, n = setup.dt, setup.system.n

        def products(y, lam, t, dW):
            """(Δ = a dt + σ dW, λᵀ∂Δ/∂y, λᵀ∂Δ/∂θ) at y, in the Stratonovich form."""
            rates, pb = adjoint.pulled(sensealg.vjp, y, theta, t)
            ybar, tbar = pb(lam * dt, adjoint.noise_cotangent(lam[:n], dW))
            return adjoint.increment(*rates, dt, dW), ybar, tbar

        def jump(k):
            return (saves == k).astype(w.dtype) @ w

        def body(carry, xs):  # backwards: the step index rides in the carry
            y1, lam1, mu1, k = carry
            k = k - 1
            y_k, y_k1 = (None, None) if backsolve else xs
            t1, t = (jnp.asarray(setup.time(j), w.dtype) for j in (k + 1, k))
            dW = setup.increment(k).astype(w.dtype)
            step1, g1, m1 = products(y1 if backsolve else y_k1, lam1, t1, dW)
            lam_p = lam1 + g1
            y_p = y1 - step1 if backsolve else y_k
            step2, g2, m2 = products(y_p, lam_p, t, dW)
            lam = lam1 + 0.5 * (g1 + g2)
            if trapezoid:
                m2 = products(y_k, lam, t, dW)[2]
            mu = mu1 + 0.5 * (m1 + m2)
            y = y1 - 0.5 * (step1 + step2) if backsolve else y_k
            if backsolve:  # reset to the saved state at a save time
                y = _reset(y, saves == k, res.ys)
            return (y, lam + jump(k), mu, k), None

        N = setup.steps
        last = res.final if backsolve else res.path[N]
        carry = (last, jump(N), jnp.zeros_like(theta), jnp.asarray(N, jnp.int32))
        stored = None if backsolve else (res.path[:-1], res.path[1:])
        (_, lam0, mu0, _), _ = jax.lax.scan(body, carry, stored, length=N, reverse=True)
        return lam0, mu0

    return forward, through_steps, pullback


def _reset(y, hit, ys):
    """The saved state where a save is at this step (the first such save), else y."""
    index = jnp.argmax(hit)
    return jnp.where(jnp.any(hit), ys[index], y)


RULES = {
    ForwardDiffSensitivity: _forward_mode,
    ForwardSensitivity: _forward_mode,
    DiscreteAdjoint: None,
    BacksolveAdjoint: _continuous,
    InterpolatingAdjoint: _continuous,
    GaussAdjoint: _continuous,
    ReversibleAdjoint: reversible_rules,
}
