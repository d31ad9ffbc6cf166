"""Private surfaces of sciad's dependencies: what each `sciad._<package>_internals` module shares.

Each of those modules holds every private name sciad takes from one package and states the
versions it was tested on, `TESTED = (lowest, first untested)`, the same range pyproject.toml
pins. Where a name is gone, importing it fails with `untested`'s message instead of a bare
`ImportError`; tests/test_private_surfaces.py checks the installed versions and what each name does.
"""

import contextlib
import importlib.metadata
import re


def version(text: str) -> tuple[int, ...]:
    """The release numbers of a version string: "0.13.8" → (0, 13, 8), "0.8.0rc1" → (0, 8, 0)."""
    return tuple(int(part) for part in re.match(r"\d+(?:\.\d+)*", text).group().split("."))


def installed(package: str) -> str:
    """The installed version of `package` (a distribution name, e.g. "diffrax")."""
    return importlib.metadata.version(package)


def in_range(package: str, tested: tuple[str, str]) -> bool:
    """Whether the installed `package` lies in `tested` = (lowest, first untested)."""
    lowest, untested = tested
    return version(lowest) <= version(installed(package)) < version(untested)


def untested(package: str, tested: tuple[str, str]) -> str:
    """What to tell a user whose `package` is not one sciad was tested on, naming the fix."""
    lowest, first_untested = tested
    return (f"{package} {installed(package)} is outside the versions sciad was tested on "
            f"({package}>={lowest},<{first_untested}): sciad uses private names of {package} "
            f"(sciad/_{package}_internals.py), which may have changed. Install a tested version "
            f"(pip install '{package}>={lowest},<{first_untested}'), or run tests/test_private_surfaces.py "
            f"on this one and widen TESTED there and the {package} pin in pyproject.toml")


@contextlib.contextmanager
def private_surface(package: str, tested: tuple[str, str]):
    """Imports of `package`'s private names, failing with `untested`'s message when one is gone."""
    try:
        yield
    except (ImportError, AttributeError) as error:
        raise ImportError(f"{untested(package, tested)} ({error})") from error
