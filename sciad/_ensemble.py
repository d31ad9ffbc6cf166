"""`ensemble`: one problem solved for many members at once — batches of u0, p, save times and, for
an SDE, Brownian paths' keys — vmapped, and sharded over a device mesh when one is given.
Differentiable like `solve`.

    mesh = jax.make_mesh((8,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))
    sols = sciad.ensemble(prob, ps=ps, saveat=ts, mesh=mesh)      # ps: p's PyTree, leaves (B, ...)
    sols.us                                                        # (B, T, ...), sharded over 8 devices
    grads = jax.jit(jax.grad(lambda ps: sciad.ensemble(prob, ps=ps, saveat=ts, mesh=mesh).us.sum()))(ps)
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec
from jaxtyping import ArrayLike, PyTree, Real, Shaped

from sciad._problem import AbstractProblem
from sciad._pytrees import leaf_names
from sciad._solve import Solution, solve

# batched argument -> the solve argument it batches
BATCHED = {"u0s": "u0", "ps": "p", "saveats": "saveat", "keys": "key"}


def ensemble(
    prob: AbstractProblem,
    *,
    u0s: PyTree[Shaped[ArrayLike, "B ..."]] | None = None,
    ps: PyTree[Shaped[ArrayLike, "B ..."]] | None = None,
    saveats: Real[ArrayLike, "B T"] | None = None,
    keys: Shaped[ArrayLike, "B ..."] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    **solve_options: Any,
) -> Solution:
    """`solve(prob, ...)` for B members: `u0s`, `ps` (u0's, p's PyTree with a leading member axis B on
    every array leaf), `saveats` (B, T) and, for an `SDEProblem`, `keys` (B,) (the members' Brownian
    paths: `jax.random.split(key, B)`) vary per member; `u0=`, `p=`, `saveat=`, `key=` and the other
    `solve` options (`sensealg`, `solver`, `dt0`, ...) are shared by all. Returns a `Solution` whose
    leaves have a leading axis B (`us`: (B, T, ...)).

    With `mesh` (axes of type `Auto`), the member axis is sharded over all the mesh's devices
    (under jax.distributed, a global mesh spans hosts); B is padded to a multiple of the device count
    by repeating the last member, and the padding is dropped from the result. Composes with
    `jax.jit`, `jax.grad` (with respect to batched and shared inputs alike) and `jax.vmap`.
    """
    if not isinstance(prob, AbstractProblem):
        raise TypeError(f"prob must be a sciad.ODEProblem or sciad.SDEProblem, got {type(prob).__name__}")
    if keys is not None and "key" not in prob.options:
        raise ValueError(f"keys= batches the Brownian paths of an SDEProblem; a {type(prob).__name__} has none")
    given = {"u0s": u0s, "ps": ps, "saveats": saveats, "keys": keys}
    batched = {BATCHED[name]: tree for name, tree in given.items() if tree is not None}
    if not batched:
        raise ValueError(
            "ensemble needs at least one batched argument: u0s, ps, saveats or keys (leading axis: members)"
        )
    for name, one in BATCHED.items():
        if one in batched and one in solve_options:
            raise ValueError(f"ensemble got both {name} (one per member) and {one} (shared by all): pass one of them")
    if solve_options.get("dense"):
        raise ValueError(
            "ensemble returns no dense interpolants (dense=True): save at the times you need with saveat= or saveats="
        )
    sizes = {name: _members(prob, name, tree) for name, tree in given.items() if tree is not None}
    if len(set(sizes.values())) > 1:
        raise ValueError(
            "the batched arguments have different numbers of members (leading axes): "
            + ", ".join(f"{k}: {v}" for k, v in sizes.items())
        )
    size = next(iter(sizes.values()))
    sharding = None if mesh is None else _batch_sharding(mesh)
    padded = size if mesh is None else -(-size // mesh.size) * mesh.size
    batched = _map_arrays(jnp.asarray, batched)  # NumPy leaves would reach vmapped rules as non-canonical constants
    if padded > size:
        batched = _map_arrays(lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], padded - size, axis=0)]), batched)
    if sharding is not None:
        batched = _map_arrays(lambda x: jax.lax.with_sharding_constraint(x, sharding), batched)
    sols = eqx.filter_vmap(lambda members: solve(prob, **members, **solve_options))(batched)
    if sharding is not None:
        sols = _map_arrays(lambda x: jax.lax.with_sharding_constraint(x, sharding), sols)
    return sols if padded == size else _map_arrays(lambda x: x[:size], sols)


def _members(prob: AbstractProblem, name: str, tree) -> int:
    """The number of members B in batched argument `name`; a clear error for a leaf without the
    leading member axis, with a member of the wrong shape, or with another B than its siblings."""
    one = BATCHED[name]
    if one == "saveat":
        member_shapes = [None] * len(jax.tree.leaves(tree))  # (T,), any T
    elif one == "key":
        if not (eqx.is_array(tree) and np.ndim(tree) >= 1):
            raise ValueError(f"keys must be PRNG keys with a leading member axis, got {type(tree).__name__}")
        return np.shape(tree)[0]
    else:
        like = getattr(prob, one)
        if jax.tree.structure(tree) != jax.tree.structure(like):
            raise ValueError(
                f"{name} has structure {jax.tree.structure(tree)} but the problem's {one} has "
                f"{jax.tree.structure(like)}: pass {one}'s PyTree with a leading member axis on each leaf"
            )
        member_shapes = [np.shape(x) if eqx.is_array_like(x) else False for x in jax.tree.leaves(like)]
    sizes = {}
    for (label, x), shape in zip(leaf_names(tree, name), member_shapes):
        if shape is False:
            continue  # a static leaf of p (an equinox model's activation, ...): shared by all members
        if not eqx.is_array(x):
            raise TypeError(
                f"{label} is a {type(x).__name__}; a batched leaf must be an array with a leading "
                "member axis (numpy or jax)"
            )
        member = np.shape(x)[1:]
        if np.ndim(x) == 0 or (len(member) != 1 if shape is None else member != shape):
            want = "(B, T)" if shape is None else f"({', '.join(['B', *map(str, shape)])}{',' * (not shape)})"  # pyright: ignore[reportArgumentType]  # an array leaf's shape
            raise ValueError(
                f"{label} has shape {np.shape(x)}; pass the members stacked along a new leading axis, shape {want}"
            )
        sizes[label] = np.shape(x)[0]
    if not sizes:
        raise ValueError(f"{name} has no array leaves to batch")
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"the leaves of {name} have different numbers of members (leading axes): "
            + ", ".join(f"{k}: {v}" for k, v in sizes.items())
        )
    return next(iter(sizes.values()))


def _batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    """The leading axis over every axis of `mesh` (which must be of type Auto)."""
    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(
            f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}: "
            "jax.make_mesh((n,), ('batch',), axis_types=(jax.sharding.AxisType.Auto,))"
        )
    explicit = [n for n, t in zip(mesh.axis_names, mesh.axis_types) if t != AxisType.Auto]
    if explicit:
        raise ValueError(
            f"mesh axes {explicit} are not of type Auto (jax.make_mesh makes Explicit axes by "
            "default, and JAX cannot vmap the ODE solver's loops over them): build the mesh with "
            f"axis_types=(jax.sharding.AxisType.Auto,) * {len(mesh.axis_names)}"
        )
    return NamedSharding(mesh, PartitionSpec(mesh.axis_names))


def _map_arrays(fn, tree):
    """`fn` applied to every array leaf of `tree`; other leaves kept as they are."""
    return jax.tree.map(lambda x: fn(x) if eqx.is_array(x) else x, tree)
