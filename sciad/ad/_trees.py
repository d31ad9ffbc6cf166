"""PyTrees at the operator boundary: arguments flattened to their leaves, outputs to one array.

An operator's arguments `x` (one, or a tuple of several) are flattened to
their leaves, which the engines see as separate arrays (`Arguments`); f's
output, when it is a PyTree rather than one array, is seen by the engines as
its leaves raveled and concatenated (`Outputs`). Results per leaf come back
with the structures of x and of f's output, as JAX's own transformations
give them. Leaves are named by their paths (`x['a'][0]`) in errors.
"""

import dataclasses
import math
from collections.abc import Callable

import jax
import numpy as np
from jax.tree_util import PyTreeDef, keystr

from sciad.ad._namespace import namespace

# Containers a host engine's function receives as they are (their leaves become the engine's arrays).
HOST_CONTAINERS = (dict, list, tuple)


def is_array(leaf) -> bool:
    """Arrays and numbers are differentiated; other leaves (an equinox module's functions, strings) are static."""
    return hasattr(leaf, "dtype") or isinstance(leaf, (bool, int, float, complex))


def check_host(tree, name: str) -> None:
    """Raise unless `tree` (called `name` in the error) nests only `HOST_CONTAINERS`, as a host engine needs."""
    for path, node in jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda n: type(n) not in HOST_CONTAINERS and n is not None
    )[0]:
        if jax.tree.structure(node) != jax.tree.structure(0):
            raise TypeError(
                f"{name}{keystr(path)} is a {type(node).__name__}, which a host engine cannot hold (it takes "
                f"dicts, lists and tuples of arrays): pass its arrays in one of those, or use a JAX engine "
                f"('jax-reverse', 'jax-forward'), which takes any PyTree"
            )


def named_leaves(base: str, tree) -> list[tuple[str, object]]:
    """`(name, leaf)` for the array leaves of `tree`, named `base` + path."""
    return [
        (base + keystr(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0] if is_array(leaf)
    ]


def check_like(name: str, tree, like, like_name: str) -> None:
    """Raise unless `tree` (called `name`) has the structure and leaf shapes of `like` (called
    `like_name`), naming the first leaf that differs."""
    if jax.tree.structure(tree) != jax.tree.structure(like):
        names = [n[len(name) :] for n, _ in named_leaves(name, tree)]
        like_names = [n[len(like_name) :] for n, _ in named_leaves(like_name, like)]
        missing = [n for n in like_names if n not in names]
        extra = [n for n in names if n not in like_names]
        what = (
            f"{name}{missing[0]} is missing"
            if missing
            else f"{name}{extra[0]} is not in {like_name}"
            if extra
            else f"its containers differ ({jax.tree.structure(tree)} vs {jax.tree.structure(like)})"
        )
        raise ValueError(
            f"{name} must have the structure of {like_name}, but {what}: build it like "
            f"{like_name} (e.g. jax.tree.map(numpy.zeros_like, {like_name}))"
        )
    for (leaf_name, leaf), (like_leaf_name, like_leaf) in zip(named_leaves(name, tree), named_leaves(like_name, like)):
        shape, like_shape = tuple(getattr(leaf, "shape", ())), tuple(getattr(like_leaf, "shape", ()))
        if shape != like_shape:
            raise ValueError(
                f"{leaf_name} has shape {shape} but {like_leaf_name} has shape {like_shape}: they must match"
            )


@dataclasses.dataclass(frozen=True)
class Arguments:
    """An operator's `x`: one argument, or a tuple of `several`, each an array or a PyTree of arrays.
    `tree` is the structure of the tuple of arguments, `static` its non-array leaves as
    `(position, leaf)`, `nested` whether some argument is not an array itself."""

    tree: PyTreeDef  # pyright: ignore[reportInvalidTypeForm]  # jax.tree_util re-exports the class
    static: tuple
    several: bool
    nested: bool

    @classmethod
    def of(cls, x, host: bool) -> "Arguments":
        """The arguments `x`; on host engines (`host`) only `HOST_CONTAINERS` nest."""
        several = isinstance(x, tuple)
        if host:
            check_host(x, "x")
        leaves, tree = jax.tree.flatten(x if several else (x,))
        static = tuple((i, leaf) for i, leaf in enumerate(leaves) if not is_array(leaf))
        return cls(tree, static, several, bool(static) or tree != jax.tree.structure((0,) * tree.num_leaves))

    def leaves(self, x) -> tuple:
        """The differentiated leaves of `x` (or of a tangent structured as `x`)."""
        xs = x if self.several else (x,)
        if not self.nested:
            return xs
        skip = {i for i, _ in self.static}
        return tuple(leaf for i, leaf in enumerate(self.tree.flatten_up_to(xs)) if i not in skip)

    def function(self, f: Callable) -> Callable:
        """`f` as a function of the differentiated leaves, the static ones held."""
        if not self.nested:
            return f
        return lambda *leaves: f(*self.tree.unflatten(self._with_static(leaves, self.static)))

    def group(self, per_leaf: tuple):
        """One result per differentiated leaf -> x's structure (None at static leaves, as equinox)."""
        if not self.nested:
            return per_leaf if self.several else per_leaf[0]
        grouped = self.tree.unflatten(self._with_static(per_leaf, tuple((i, None) for i, _ in self.static)))
        return grouped if self.several else grouped[0]

    @staticmethod
    def _with_static(leaves, static: tuple) -> list:
        full = list(leaves)
        for i, leaf in static:
            full.insert(i, leaf)
        return full


class Outputs:
    """`f` as the engines see it: a function returning one array. A PyTree output (a dict, a
    tuple, ...) comes back as its leaves raveled and concatenated; its structure and the leaves'
    shapes, recorded at each call, let `value`, `leaves` and `cotangent` undo that. One array
    passes through untouched."""

    def __init__(self, f: Callable):
        self.f, self.tree, self.shapes = f, None, ()

    def __call__(self, *xs):
        y = self.f(*xs)
        if hasattr(y, "shape"):
            self.tree = None
            return y
        paths, self.tree = jax.tree_util.tree_flatten_with_path(y)
        for path, leaf in paths:
            if not hasattr(leaf, "shape"):
                raise TypeError(
                    f"f's output{keystr(path)} is a {type(leaf).__name__}, not an array: f must "
                    "return an array or a PyTree (dict, list, tuple) of arrays"
                )
        if not paths:
            raise ValueError(f"f returned {y!r}, which holds no arrays: return an array or a PyTree of arrays")
        leaves = [leaf for _, leaf in paths]
        self.shapes = tuple(tuple(leaf.shape) for leaf in leaves)
        return _concat(leaves)

    def leaves(self, a, trailing: tuple = ()) -> list:
        """`a`, the engine's array for f's output (`trailing` axes after it: a Jacobian's argument
        axes), cut into one array per output leaf, shaped `leaf.shape + trailing`."""
        if self.tree is None:
            return [a]
        xp, start, cut = namespace(a), 0, []
        for shape in self.shapes:
            size = math.prod(shape)
            cut.append(xp.reshape(a[start : start + size], (*shape, *trailing)))
            start += size
        return cut

    def group(self, per_leaf: list):
        """One result per output leaf -> f's output structure."""
        return per_leaf[0] if self.tree is None else self.tree.unflatten(per_leaf)

    def value(self, a):
        """f's output (or a tangent of it) from the engine's one array."""
        return self.group(self.leaves(a))

    def cotangent(self, w, y, asarray: Callable):
        """`w`, structured as f's output, as the engine's one array (`asarray` with y's dtype)."""
        shapes = (tuple(y.shape),) if self.tree is None else self.shapes
        like = self.group([np.broadcast_to(0.0, shape) for shape in shapes])  # shapes, allocating nothing
        check_like("w", w, like, "f's output")
        if self.tree is None:
            return asarray(w, like=y)
        return _concat([asarray(leaf, like=y) for leaf in jax.tree.leaves(w)])


def _concat(leaves: list):
    """The leaves raveled, one after another, in their engine's array module."""
    xp = namespace(*leaves)
    flat = [xp.reshape(leaf, (-1,)) for leaf in leaves]
    return flat[0] if len(flat) == 1 else xp.concat(flat)
