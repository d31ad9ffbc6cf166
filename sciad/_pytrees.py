"""PyTrees at the boundary: u0, p and the vector field's closure as flat vectors inside.

`Layout` records where each leaf of a PyTree of arrays lives in one flat
vector and moves between the two with the array module of the values
(`sciad.ad.namespace`), so the same layout serves JAX and the host engines.
"""

from typing import Any

import equinox as eqx
import jax
import numpy as np

from sciad.ad import namespace


class Layout(eqx.Module):
    """The structure, shapes and dtypes of a PyTree's array leaves, raveled in
    leaf order into one vector of `dtype` (size `size`)."""

    treedef: Any = eqx.field(static=True)
    shapes: tuple = eqx.field(static=True)
    dtypes: tuple = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)

    @classmethod
    def of(cls, tree, dtype, *, keep_dtypes: bool = False) -> "Layout":
        """The layout of `tree` (arrays or shape-dtype structs) raveled in `dtype`; unraveled leaves
        come back in `dtype` too, or with `keep_dtypes` in their own dtypes."""
        leaves, treedef = jax.tree.flatten(tree)
        dtype = np.dtype(dtype)
        dtypes = tuple(np.dtype(x.dtype) if keep_dtypes else dtype for x in leaves)
        return cls(treedef, tuple(tuple(np.shape(x)) for x in leaves), dtypes, dtype)

    @property
    def size(self) -> int:
        return int(sum(np.prod(s, dtype=int) for s in self.shapes))

    @property
    def mixed(self) -> bool:
        """Whether some leaf keeps a dtype other than the flat one (then values are cast both ways)."""
        return any(d != self.dtype for d in self.dtypes)

    @property
    def is_vector(self) -> bool:
        """One 1-D leaf of the flat dtype: raveling is the identity."""
        return len(self.shapes) == 1 and len(self.shapes[0]) == 1 and not self.mixed

    def ravel(self, tree):
        """`tree` -> (size,) in the layout's dtype."""
        leaves = self.treedef.flatten_up_to(tree)
        if self.is_vector:
            return leaves[0]
        if not leaves:
            return np.zeros((0,), self.dtype)
        xp = namespace(*leaves)
        return xp.concat([xp.reshape(x.astype(self.dtype) if self.mixed else x, (-1,)) for x in leaves])

    def unravel(self, x):
        """(size,) -> the PyTree, each leaf in its own shape and dtype."""
        if self.is_vector:
            return self.treedef.unflatten([x])
        xp = namespace(x)
        leaves, start = [], 0
        for shape, dtype in zip(self.shapes, self.dtypes):
            stop = start + int(np.prod(shape, dtype=int))
            leaf = xp.reshape(x[start:stop], shape)
            leaves.append(leaf.astype(dtype) if self.mixed else leaf)
            start = stop
        return self.treedef.unflatten(leaves)


def leaf_names(tree, name: str) -> list[tuple[str, Any]]:
    """(`name` + key path, leaf) for every leaf of `tree`, e.g. ("u0['x']", array)."""
    return [(name + jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]
