"""Shared test set-up: float64 in JAX, and one parametrization over AD engines.

The library leaves JAX's precision alone; the tests compare derivatives at
1e-10 relative and so switch on float64 here.
"""

import jax
import pytest

import sciad.ad as ad

jax.config.update("jax_enable_x64", True)


def pytest_generate_tests(metafunc):
    """A test with an argument `engine_name` runs once per registry name in
    `sciad.ad.BACKENDS`, skipped where the engine's package is not installed
    (and marked slow for the engines a module lists in `SLOW_ENGINES`)."""
    if "engine_name" not in metafunc.fixturenames:
        return
    installed = set(ad.available())
    slow = getattr(metafunc.module, "SLOW_ENGINES", ())
    metafunc.parametrize(
        "engine_name",
        [
            pytest.param(
                name,
                id=name,
                marks=[pytest.mark.skipif(name not in installed, reason=f"package {cls.package!r} is not installed"),
                       *([pytest.mark.slow] if name in slow else [])],
            )
            for name, cls in ad.BACKENDS.items()
        ],
    )


def slow_except(values, fast):
    """`values` as pytest params, all but those in `fast` marked slow (the full matrix runs in CI)."""
    return [v if v in fast else pytest.param(v, marks=pytest.mark.slow) for v in values]


def engine_matrix(sensealgs, slow_engines) -> list:
    """(sensealg, engine) params for every sensealg and registry engine: in the default run each
    sensealg with one engine not in `slow_engines` (taking them in turn, so each runs too), every other
    pair marked slow (the full matrix runs in CI); engines not installed skipped."""
    fast_engines = [name for name in ad.BACKENDS if name not in slow_engines]
    fast = {(s, fast_engines[i % len(fast_engines)]) for i, s in enumerate(sensealgs)}
    installed = set(ad.available())
    return [pytest.param(s, e, id=f"{e}-{s}", marks=[
        pytest.mark.skipif(e not in installed, reason=f"the {e} engine is not installed"),
        *([] if (s, e) in fast else [pytest.mark.slow])]) for e in ad.BACKENDS for s in sensealgs]


@pytest.fixture(scope="module")
def fast_compiles():
    """Same programs, about half the compile time: XLA's optimisations off for a
    module (`pytestmark = pytest.mark.usefixtures("fast_compiles")`)."""
    previous = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", previous)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped where JAX sees no GPU (`pip install 'sciad[cuda]'` on a machine with one)."""
    marked = [item for item in items if "gpu" in item.keywords]
    if not marked or gpu_devices():
        return
    skip = pytest.mark.skip(reason="needs a GPU: JAX sees none (pip install 'sciad[cuda]' on a machine with one)")
    for item in marked:
        item.add_marker(skip)


def gpu_devices() -> list:
    """JAX's GPU devices ([] where there are none or no GPU backend is installed)."""
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []
