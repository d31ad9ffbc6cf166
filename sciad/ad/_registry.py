"""Backends by name: `get("torch")`, and which engines are installed here."""

import importlib.util

from sciad.ad._autograd_backend import Autograd
from sciad.ad._backend import AbstractBackend
from sciad.ad._finite_differences import FiniteDifferences
from sciad.ad._jax_backends import Enzyme, JaxForward, JaxReverse, JaxTranspose
from sciad.ad._torch_backend import Torch

BACKENDS: dict[str, type[AbstractBackend]] = {
    cls.name: cls for cls in (JaxReverse, JaxForward, JaxTranspose, Enzyme, Torch, Autograd, FiniteDifferences)
}


def get(name: str | AbstractBackend, **settings) -> AbstractBackend:
    """The backend registered as `name` (with `settings`, e.g. `jit=False`).

    A backend passed in is returned as it is. Raises `ValueError` for an
    unknown name and `MissingEngineError` (naming the extra) when the
    engine's package is not installed.
    """
    if isinstance(name, AbstractBackend):
        return name
    if name not in BACKENDS:
        raise ValueError(f"unknown AD backend {name!r}; choose one of {sorted(BACKENDS)}")
    return BACKENDS[name](**settings)


def available() -> list[str]:
    """Names of the backends whose engine packages import here."""
    return [
        name
        for name, cls in BACKENDS.items()
        if cls.package is None or importlib.util.find_spec(cls.package) is not None
    ]
