"""The user's f(u, p, t) on PyTrees as f(u, p, c, t) on flat vectors, for the sensealgs' inside."""

from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from sciad.ad.trees import check_host
from sciad.pytrees import Layout


def _traced_float(x) -> bool:
    return isinstance(x, jax.core.Tracer) and eqx.is_inexact_array(x)


class VectorField(eqx.Module):
    """`field(u, p, c, t)`: f with u (n,) raveled from u0's structure, p (m,) from the parameters'
    array leaves (the rest of p is static) and c (k,) from the traced float values f closes over
    (hoisted by closure conversion, so the sensealgs can differentiate them), all in `dtype`."""

    fn: Callable
    u: Layout
    p: Layout
    c: Layout
    static_p: Any
    dtype: Any = eqx.field(static=True)

    @classmethod
    def of(cls, f: Callable, u0, p, t0: float, *, host: bool) -> tuple["VectorField", Any]:
        """The field of `f` at u0's and p's structures, and the hoisted closure values (a PyTree).
        `host`: a host engine will run f on its own arrays (no hoisting possible; p must be
        made of dicts, lists and tuples)."""
        params, static_p = eqx.partition(p, eqx.is_array)
        dtype = jnp.result_type(*jax.tree.leaves(u0), *jax.tree.leaves(params))
        t = jnp.asarray(t0, dtype)
        converted = eqx.filter_closure_convert(f, u0, p, t)
        closure, rest = eqx.partition(converted, _traced_float)
        if host:
            _check_host(p, closure)
        fn = f if host or not jax.tree.leaves(closure) else rest
        field = cls(fn, Layout.of(u0, dtype), Layout.of(params, dtype), Layout.of(closure, dtype, keep_dtypes=True), static_p,
                    dtype)
        return field, closure

    def __call__(self, u, p, c, t):
        fn = self.fn if self.c.size == 0 else eqx.combine(self.c.unravel(c), self.fn)
        if self.c.size:
            t = jnp.asarray(t, self.dtype)  # the closure-converted f takes t as it was traced
        return self.u.ravel(fn(self.u.unravel(u), eqx.combine(self.p.unravel(p), self.static_p), t))


def _check_host(p, closure) -> None:
    if jax.tree.leaves(closure):
        raise ValueError("f closes over traced values (e.g. parameters being differentiated), which a host "
                         "engine (torch, autograd, finite-differences) cannot see: pass them in p, or use a "
                         "JAX engine (jax-reverse, jax-forward, jax-transpose)")
    check_host(p, "p")
