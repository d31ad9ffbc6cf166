"""`SteadyStateAdjoint`: derivatives of a steady state f(u*, p, t) = 0 by the implicit function theorem.

Differentiating f(u*(p), p, t) = 0 gives J du* = −(∂f/∂p) dp with J = ∂f/∂u at u*: one linear
solve with J per tangent (forward mode) and one with Jᵀ per cotangent (reverse mode,
∂L/∂p = −λᵀ ∂f/∂p with Jᵀ λ = ∂L/∂u*). Nothing of the way u* was found enters.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx

import sciad.ad as ad
from sciad._errors import error_if
from sciad.adjoints._base import Products, normalised

# States up to which "auto" solves with a dense J: n products and an LU, exact, with nothing to fail to
# converge and singularity reported as such; above, GMRES needs J's products alone (memory ~ n, not n²).
DENSE_UP_TO = 100

KRYLOV_FAILED = (
    "the Krylov solve with the Jacobian ∂f/∂u did not converge: ∂f/∂u is singular or "
    "ill-conditioned at the steady state (a conserved quantity makes it singular: eliminate one "
    "state with it, or replace one equation of f by the constraint); with "
    "SteadyStateAdjoint(linear_solver='dense') a singular ∂f/∂u is reported as such"
)


class SteadyStateAdjoint(eqx.Module):
    """Gradients of `sciad.steady_state` by the implicit function theorem: reverse mode solves
    (∂f/∂u)ᵀ λ = ∂L/∂u* and gives ∂L/∂p = −λᵀ ∂f/∂p (one VJP); forward mode solves
    (∂f/∂u) du* = −(∂f/∂p) dp. ∂L/∂u0 = 0: the steady state does not depend on the initial guess.
    Second derivatives compose (forward over reverse: `jax.hessian`), and so do `jax.vmap`, `jax.jit`.

    `vjp`: the `sciad.ad` engine (a backend or its name) of f's products. `linear_solver`: how
    the systems with ∂f/∂u (Newton's and the adjoint's) are solved: "dense" (J from n products of
    the engine's native mode, LU), "gmres" (matrix-free, lineax's GMRES from J's products alone,
    at the steady state's rtol and atol; no preconditioner), a lineax solver (given J's products),
    or "auto": dense up to `DENSE_UP_TO` (100) states, GMRES above.
    """

    vjp: ad.AbstractBackend
    linear_solver: Any = eqx.field(static=True)

    def __init__(
        self, vjp: str | ad.AbstractBackend = "jax-reverse", linear_solver: str | lx.AbstractLinearSolver = "auto"
    ):
        self.vjp = ad.get(vjp)
        if not (isinstance(linear_solver, lx.AbstractLinearSolver) or linear_solver in ("auto", "dense", "gmres")):
            raise ValueError(
                f"SteadyStateAdjoint(linear_solver={linear_solver!r}): choose 'auto', 'dense', "
                "'gmres' or pass a lineax solver"
            )
        self.linear_solver = linear_solver

    def engines(self) -> tuple:
        """The `sciad.ad` backends this sensealg runs f's products on."""
        return (self.vjp,)

    def linear(self, n: int, rtol: float, atol: float):
        """The solver for systems with J (n×n): "dense", or a lineax solver."""
        how = self.linear_solver
        if how == "auto":
            how = "dense" if n <= DENSE_UP_TO else "gmres"
        return lx.GMRES(rtol=rtol, atol=atol) if how == "gmres" else how

    def solve(self, field, find: Callable, u0, p, *, t, rtol: float, atol: float):
        """-> (u* (n,), stats), with `(u*, stats) = find(field, u0, p, linear)` for the `VectorField`
        `field` at time `t` (`linear`: how to solve with J, as `self.linear` says), differentiable by
        the implicit function theorem in p (m,) and the values f closes over, c = field.held (k,)
        (appended to p where they are differentiated); u0 (n,), the initial guess, gets a zero
        derivative."""
        m, c = p.shape[0], field.held
        base = field.with_closure(jnp.zeros((0,), c.dtype), False)  # the rules see c as their own input only
        linear = self.linear(u0.shape[0], rtol, atol)

        def forward(u0, p, c, active):
            if active is None:
                return find(base.with_closure(c, False), u0, p, linear), None
            # The primal through the rules themselves: an outer jvp (Hessians) gets u*'s tangent from them.
            u, stats = rules(u0, p, c)
            _, _, merged = active  # one flag per input: u0, p, c
            p_in = jnp.concatenate([p, c]) if merged else p
            jac = None
            if linear == "dense":
                jac = jacobian(Products(base.with_closure(c, merged), self.vjp), u, p_in, t)
            return (u, stats), _Residuals(u, p_in, c, jac, merged)

        def pushforward(res, vs):
            _, dp, dc = vs
            prods = Products(base.with_closure(res.c, res.merged), self.vjp)
            dp = jnp.concatenate([dp, dc]) if res.merged else dp
            rhs = -prods.jvp(res.u, res.p_in, t, jnp.zeros_like(res.u), dp)[1]
            du = jacobian_solve(
                linear, rhs, matrix=res.jac, matvec=lambda v: prods.jvp(res.u, res.p_in, t, v, jnp.zeros_like(dp))[1]
            )
            return du, jnp.zeros((3,), du.dtype)

        def pullback(res, w):
            prods = Products(base.with_closure(res.c, res.merged), self.vjp)
            lam = jacobian_solve(
                linear,
                w[0],
                matrix=None if res.jac is None else res.jac.T,
                matvec=lambda v: prods.vjp(res.u, res.p_in, t, v)[1],
            )
            g_p = -prods.vjp(res.u, res.p_in, t, lam)[2]
            g_u0 = jnp.zeros_like(res.u)
            return (g_u0, g_p, None) if not res.merged else (g_u0, g_p[:m], g_p[m:])

        rules = ad.custom_linear_rules(forward, pushforward, pullback)
        return rules(u0, p, c)


class _Residuals(eqx.Module):
    """u* (n,), the parameters the products take (`p_in`: p, or [p; c] where c is differentiated:
    `merged`), the closure values c, and J (n×n) where the solves are dense."""

    u: jax.Array
    p_in: jax.Array
    c: jax.Array
    jac: jax.Array | None
    merged: bool = eqx.field(static=True)


def jacobian(prods: Products, u, p, t) -> jax.Array:
    """J = ∂f/∂u (n×n) at (u, p, t) from n products of the engine's native mode: columns J eᵢ
    from JVPs (forward engines) or rows eᵢᵀ J from VJPs (reverse engines)."""
    basis = jnp.eye(u.shape[0], dtype=u.dtype)
    if prods.backend.mode == "forward":
        return jax.vmap(lambda e: prods.jvp(u, p, t, e, jnp.zeros_like(p))[1], out_axes=1)(basis)
    return jax.vmap(lambda e: prods.vjp(u, p, t, e)[1])(basis)


def jacobian_solve(linear, b, *, matrix=None, matvec: Callable):
    """x (n,) with A x = b: by LU of `matrix` (A, n×n) where `linear` is "dense", else by the lineax
    solver `linear` from the products `matvec(v) = A v` for b divided by its largest entry, scaled back
    (its tolerances then hold relative to b's size, whatever the loss's scale), with a run-time error
    where it fails."""
    if linear == "dense":
        return jnp.linalg.solve(matrix, b)
    scale, b = normalised(b)
    operator = lx.FunctionLinearOperator(matvec, jax.ShapeDtypeStruct(b.shape, b.dtype))
    sol = lx.linear_solve(operator, b, linear, throw=False)
    return error_if(sol.value * scale, sol.result != lx.RESULTS.successful, KRYLOV_FAILED)


def is_singular(jac) -> jax.Array:
    """Whether J (n×n) is singular in working precision: σ_min ≤ σ_max · n · eps, the tolerance of
    `numpy.linalg.matrix_rank`."""
    s = jnp.linalg.svd(jac, compute_uv=False)
    return s[-1] <= s[0] * jac.shape[0] * jnp.finfo(jac.dtype).eps
