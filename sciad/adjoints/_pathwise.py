"""Pathwise derivatives of an SDE solve on the fixed grid of `sciad._sde_solvers.SDESetup`, for the sensealgs
that do not step SDEs on sciad's one loop yet (ForwardDiffSensitivity, DiscreteAdjoint and the continuous
adjoints do: `sciad._sde.solve`):

- `ForwardSensitivity`: the pathwise sensitivity SDE S' = ∂a/∂u S + ∂a/∂θ, ∂σ/∂u S + ∂σ/∂θ on the
  same increments, discretised by the forward solver itself (S rides in the scan with y); on a fixed
  grid that is the forward-mode derivative of the steps, with the products from its `jvp` engine.
- `DiscreteAdjoint` with reversible Heun (whose state a step's start does not give): reverse mode through
  the steps (JAX's tape of the scan: memory ~ steps).
- `ReversibleAdjoint`: exact gradient of reversible Heun, flat memory (`_reversible`).

The products are the sensealg's engine's, JAX engines only (the drift correction and Milstein's term
differentiate them again): ForwardSensitivity's steps run on F wrapped by `sciad.ad.differentiate_with`.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

import sciad.ad as ad
from sciad.adjoints._discrete import DiscreteAdjoint
from sciad.adjoints._forward import ForwardSensitivity
from sciad.adjoints._registry import describe
from sciad.adjoints._reversible import ReversibleAdjoint, reversible_rules


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
        return (
            f"sensealg={name} does not differentiate SDE solves; pass one of {sorted(cls.__name__ for cls in RULES)}, "
            "or those that step them on sciad's loop: ForwardDiffSensitivity, DiscreteAdjoint, InterpolatingAdjoint, "
            "BacksolveAdjoint, GaussAdjoint"
        )
    if isinstance(sensealg, ReversibleAdjoint) and not setup.solver.reversible:
        return (
            f"sensealg=ReversibleAdjoint needs an algebraically reversible solver, got "
            f"{type(setup.solver).__name__}: pass solver='reversible_heun', or keep this solver with "
            "sensealg=sciad.DiscreteAdjoint() (exact, memory ~ steps) or sciad.InterpolatingAdjoint()"
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


RULES = {
    ForwardSensitivity: _forward_mode,
    DiscreteAdjoint: None,
    ReversibleAdjoint: reversible_rules,
}
