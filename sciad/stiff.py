"""How an implicit solver's Newton steps solve with I − hγJ (`solve(..., jacobian=...)`):
`Sparse` (the pattern read off f's jaxpr, coloured, SuperLU on the host) or `MatrixFree` (GMRES);
`LU_COUNTS` tallies the host factorisations and solves (`.clear()`, a call, `.snapshot()`)."""

from typing import TYPE_CHECKING

from sciad._stiff import MatrixFree, Sparse

if TYPE_CHECKING:  # imported on first use (SciPy): the module __getattr__ below
    from sciad._host_lu import COUNTS as LU_COUNTS

__all__ = ["LU_COUNTS", "MatrixFree", "Sparse"]  # noqa: F822 (LU_COUNTS: the module __getattr__ below)


def __getattr__(name: str):
    if name == "LU_COUNTS":  # on first use: the host LU pulls SciPy, which importing sciad does not
        from sciad._host_lu import COUNTS

        return COUNTS
    raise AttributeError(f"module 'sciad.stiff' has no attribute {name!r}")
