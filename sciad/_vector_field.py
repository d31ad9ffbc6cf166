"""The user's f(u, p, t) on PyTrees as f(u, p, t) on flat vectors: the one wrapper of f inside sciad
(with an integrand g(u, p, t), the two side by side: F = (f, g))."""

import dataclasses
import functools
import typing
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp

from sciad._pytrees import Layout
from sciad.ad import differentiate_with, namespace
from sciad.ad._trees import check_host


def _traced_float(x) -> bool:
    return isinstance(x, jax.core.Tracer) and eqx.is_inexact_array(x)


class VectorField(eqx.Module):
    """`field(u, p, t)`: f with u (n,) raveled from u0's structure and p (m,) from the parameters'
    array leaves (the rest of p is static), all in `dtype`. The traced float values f closes over,
    c (k,), are hoisted by closure conversion (so the sensealgs can differentiate them) and held
    (`held`), or, `merged`, appended to the parameters: then p = [p; c] has m + k entries. `open()`
    gives f as g(u, p, c, t), with c an argument: what an AD engine takes.

    With an integrand g(u, p, t) (a PyTree of arrays, raveled as `q`, k values) the field is
    F(u, p, t) = [f; g] (n + k,): the rate of the state y = (u, q), q the running integral ∫ g dt.

    A kind whose f reads more than (u, p, t) (a delay equation's past) gives examples of those `extra`
    arguments: f(u, p, t, *extra), passed through as they are."""

    fn: Callable
    u: Layout
    p: Layout
    c: Layout
    q: Layout | None
    static_p: Any
    held: jax.Array
    dtype: Any = eqx.field(static=True)
    merged: bool = eqx.field(static=True, default=False)
    products: Any = None  # a `sciad.ad` backend computing the field's derivative products (`with_products`)

    @classmethod
    def of(
        cls, f: Callable, u0, p, t0, *, host: bool, integrand: Callable | None = None, extra: tuple = ()
    ) -> "VectorField":
        """The field of `f` (and `integrand`) at u0's and p's structures, holding the values they
        close over. `host`: a host engine will run f on its own arrays (no hoisting possible; p must
        be made of dicts, lists and tuples)."""
        params, static_p = eqx.partition(p, eqx.is_array)
        dtype = jnp.result_type(*jax.tree.leaves(u0), *jax.tree.leaves(params))
        t = jnp.asarray(t0, dtype)
        q = None
        if integrand is not None:
            q = Layout.of(eqx.filter_eval_shape(integrand, u0, p, t), dtype)
            f = _side_by_side(f, integrand)
        u_layout, p_layout = Layout.of(u0, dtype), Layout.of(params, dtype)
        # traced as it is called: u and p in the common dtype (a float32 u0 with float64 p is called in float64)
        example_u = u_layout.unravel(jnp.asarray(u_layout.ravel(u0), dtype))
        example_p = eqx.combine(p_layout.unravel(jnp.asarray(p_layout.ravel(params), dtype)), static_p)
        converted = eqx.filter_closure_convert(f, example_u, example_p, t, *extra)
        closure, rest = eqx.partition(converted, _traced_float)
        if host:
            _check_host(p, closure)
        fn = f if host or not jax.tree.leaves(closure) else rest
        c = Layout.of(closure, dtype, keep_dtypes=True)
        return cls(fn, u_layout, p_layout, c, q, static_p, jnp.asarray(c.ravel(closure), dtype), dtype)

    @property
    def integrand_size(self) -> int:
        """k: the entries of the integrand (0 without one)."""
        return 0 if self.q is None else self.q.size

    def with_closure(self, c, merged: bool) -> "VectorField":
        """This field holding the closure values `c` (k,), or with them appended to p (`merged`)."""
        held = jnp.zeros((0,), c.dtype) if merged else c
        return dataclasses.replace(self, held=held, merged=merged)

    def with_products(self, backend) -> "VectorField":
        """This field with its derivative products (its Jacobian-vector and vector-Jacobian products, where
        it is differentiated) computed by `backend` (`sciad.ad.differentiate_with`)."""
        return dataclasses.replace(self, products=backend)

    def driving(self) -> tuple:
        """What drives a solve besides u0 and p (an SDE's path: `sciad._sde_solvers.SDEField`): nothing."""
        return ()

    def driven(self, arrays, like) -> "VectorField":
        return self

    def __call__(self, u, p, t, *extra):
        return self.open()(u, p, self.held, t, *extra)

    def open(self) -> Callable:
        """`g(u, p, c, t, *extra)`: f with the closure values as an argument (an engine sees no traced value
        it closes over); merged, c is empty and p = [p; c]."""
        g = functools.partial(
            _evaluate,
            self.fn,
            self.u,
            self.p,
            self.c,
            self.q,
            self.static_p,
            self.dtype,
            self.p.size if self.merged else None,
        )
        return g if self.products is None else _with_products(g, self.products, self.dtype)


def _with_products(g: Callable, backend, dtype) -> Callable:
    """g(u, p, c, t, *extra) with its derivative products by `backend`, the extra arguments (PyTrees) passed to it
    as flat arrays of `dtype` (an engine takes arrays; integer and boolean leaves are cast there and back)."""
    direct = differentiate_with(g, backend)

    def products(u, p, c, t, *extra):
        if not extra:
            return direct(u, p, c, t)
        leaves, tree = jax.tree.flatten(extra)
        dtypes = [x.dtype for x in leaves]

        def flat(u, p, c, t, *xs):
            return g(u, p, c, t, *jax.tree.unflatten(tree, [x.astype(d) for x, d in zip(xs, dtypes)]))

        return differentiate_with(flat, backend)(u, p, c, t, *(jnp.asarray(x).astype(dtype) for x in leaves))

    return products


class AroundVectorField(eqx.Module):
    """A kind's field around the `VectorField` `F` of its rate (an SDE's drift, a delay equation's rate): its
    layouts, closure values and dtype are F's."""

    if typing.TYPE_CHECKING:  # a static checker reads equinox's AbstractVar as a field every constructor takes
        F: typing.ClassVar[VectorField]
    else:
        F: eqx.AbstractVar[VectorField]

    @property
    def u(self) -> Layout:
        return self.F.u

    @property
    def p(self) -> Layout:
        return self.F.p

    @property
    def held(self):
        return self.F.held

    @property
    def dtype(self):
        return self.F.dtype


def _side_by_side(f: Callable, g: Callable) -> Callable:
    return lambda u, p, t, *extra: (f(u, p, t, *extra), g(u, p, t))


def _evaluate(fn, u_layout, p_layout, c_layout, q_layout, static_p, dtype, m, u, p, c, t, *extra):
    if m is not None:
        p, c = p[:m], p[m:]
    if c_layout.size:
        fn = eqx.combine(c_layout.unravel(c), fn)
        t = jnp.asarray(t, dtype)  # the closure-converted f takes t as it was traced
    out = fn(u_layout.unravel(u), eqx.combine(p_layout.unravel(p), static_p), t, *extra)
    if q_layout is None:
        return u_layout.ravel(out)
    du, dq = u_layout.ravel(out[0]), q_layout.ravel(out[1])
    return namespace(du, dq).concat([du, dq])


def _check_host(p, closure) -> None:
    if jax.tree.leaves(closure):
        raise ValueError(
            "f closes over traced values (e.g. parameters being differentiated), which a host "
            "engine (torch, autograd, finite-differences) cannot see: pass them in p, or use a "
            "JAX engine (jax-reverse, jax-forward, jax-transpose)"
        )
    check_host(p, "p")
