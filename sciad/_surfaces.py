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
    return tuple(int(part) for part in re.match(r"\d+(?:\.\d+)*", text).group().split("."))  # pyright: ignore[reportOptionalMemberAccess]  # a version starts with digits


def installed(package: str) -> str:
    """The installed version of `package` (a distribution name, e.g. "diffrax")."""
    return importlib.metadata.version(package)


def in_range(package: str, tested: tuple[str, str]) -> bool:
    """Whether the installed `package` lies in `tested` = (lowest, first untested)."""
    lowest, first_untested = tested
    return version(lowest) <= version(installed(package)) < version(first_untested)


def untested(package: str, tested: tuple[str, str]) -> str:
    """What to tell a user when the private names of `package` sciad uses may have changed, naming the fix."""
    lowest, first_untested = tested
    pin = f"{package}>={lowest},<{first_untested}"
    where = "lies in that range, yet they differ" if in_range(package, tested) else "is outside that range"
    return (
        f"sciad uses private names of {package} (sciad/_{package}_internals.py), tested on {pin}; the "
        f"installed {package} {installed(package)} {where}. Install a tested version (pip install '{pin}'), "
        f"or run tests/test_private_surfaces.py on this one and widen that module's TESTED and the {package} pin "
        "in pyproject.toml"
    )


@contextlib.contextmanager
def private_surface(package: str, tested: tuple[str, str]):
    """Imports of `package`'s private names, failing with `untested`'s message when one is gone."""
    try:
        yield
    except (ImportError, AttributeError) as error:
        raise ImportError(f"{untested(package, tested)} ({error})") from error
