"""PyTree inputs at the operator boundary: flattened to leaves there, regrouped after.

The arguments `xs` (a tuple) are flattened to their leaves, which the
engines see as separate arrays; per-argument results (gradients, Jacobians,
cotangents) come back with the arguments' structure. Leaves are named by
their paths (`x['a'][0]`) in errors.
"""

from typing import Callable

import jax
from jax.tree_util import keystr

# Containers a host engine's function receives as they are (their leaves become the engine's arrays).
HOST_CONTAINERS = (dict, list, tuple)


def is_array(leaf) -> bool:
    """Arrays and numbers are differentiated; other leaves (an equinox module's functions, strings) are static."""
    return hasattr(leaf, "dtype") or isinstance(leaf, (bool, int, float, complex))


def structure(xs: tuple, host: bool, multi: bool) -> tuple[jax.tree_util.PyTreeDef, tuple]:
    """`(tree, static)`: the PyTree structure of the arguments `xs` and their static leaves as
    `(position, leaf)` pairs; on host engines only `HOST_CONTAINERS` nest."""
    if host:
        check_host(xs if multi else xs[0], "x")
    leaves, tree = jax.tree.flatten(xs)
    return tree, tuple((i, leaf) for i, leaf in enumerate(leaves) if not is_array(leaf))


def check_host(tree, name: str) -> None:
    """Raise unless `tree` (called `name` in the error) nests only `HOST_CONTAINERS`, as a host engine needs."""
    for path, node in jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda n: type(n) not in HOST_CONTAINERS and n is not None
    )[0]:
        if jax.tree.structure(node) != jax.tree.structure(0):
            raise TypeError(
                f"{name}{keystr(path)} is a {type(node).__name__}, which a host engine cannot hold (it takes "
                f"dicts, lists and tuples of arrays): pass its arrays in one of those, or use a JAX engine "
                f"('jax-reverse', 'jax-forward'), which takes any PyTree")


def is_flat(tree: jax.tree_util.PyTreeDef) -> bool:
    """Whether the arguments are arrays themselves (no nesting)."""
    return tree == jax.tree.structure((0,) * tree.num_leaves)


def named_leaves(base: str, xs: tuple, multi: bool) -> list[tuple[str, object]]:
    """`(name, leaf)` pairs, named `base` + path (the argument index only when there are several)."""
    return [(base + keystr(path if multi else path[1:]), leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(xs)[0] if is_array(leaf)]


def check_like(name: str, vs: tuple, xs: tuple, multi: bool) -> None:
    """Raise unless `vs` has the structure of `xs`, naming the first leaf that differs."""
    if jax.tree.structure(vs) == jax.tree.structure(xs):
        return
    x_names = [n for n, _ in named_leaves("", xs, multi)]
    v_names = [n for n, _ in named_leaves("", vs, multi)]
    missing = [n for n in x_names if n not in v_names]
    extra = [n for n in v_names if n not in x_names]
    what = (f"{name}{missing[0]} is missing" if missing else f"{name}{extra[0]} is not in x" if extra
            else f"its containers differ ({jax.tree.structure(vs)} vs {jax.tree.structure(xs)})")
    raise ValueError(f"{name} must have the structure of x, but {what}: build it like x "
                     f"(e.g. jax.tree.map(numpy.zeros_like, x))")


def array_leaves(xs: tuple, tree: jax.tree_util.PyTreeDef, static: tuple) -> tuple:
    """The leaves of `xs` (structured as `tree`) that are differentiated."""
    skip = {i for i, _ in static}
    return tuple(leaf for i, leaf in enumerate(tree.flatten_up_to(xs)) if i not in skip)


def _with_static(leaves, static: tuple) -> list:
    full = list(leaves)
    for i, leaf in static:
        full.insert(i, leaf)
    return full


def flat_function(f: Callable, tree: jax.tree_util.PyTreeDef, static: tuple) -> Callable:
    """`f` as a function of the differentiated leaves of its arguments, the static ones held."""
    return lambda *leaves: f(*tree.unflatten(_with_static(leaves, static)))


def regroup(leaf_results: tuple, tree: jax.tree_util.PyTreeDef, static: tuple, multi: bool):
    """One result per differentiated leaf -> the arguments' structure (None at static leaves, as equinox)."""
    grouped = tree.unflatten(_with_static(leaf_results, tuple((i, None) for i, _ in static)))
    return grouped if multi else grouped[0]
