"""Errors raised at the boundary of `sciad.ad`."""

import importlib.util


class MissingEngineError(ImportError):
    """An engine's package is not installed; the message names the extra."""


def require(package: str, extra: str | None, backend: str) -> None:
    """Raise `MissingEngineError` unless `package` imports here."""
    if importlib.util.find_spec(package) is None:
        raise MissingEngineError(
            f"backend {backend} needs the package '{package}', which is not installed: pip install 'sciad[{extra}]'"
        )
