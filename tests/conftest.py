"""Shared test set-up: float64 in JAX, the parametrization over AD engines, fixtures and hooks
(what tests share besides: the tests/helpers package).

The library leaves JAX's precision alone; the tests compare derivatives at
1e-10 relative and so switch on float64 here.
"""

import gc
import os

# XLA:CPU's older fusion code generator: the same programs, about half the compile time of the newer one. Each
# program's LLVM module compiled whole, not split into parts for a thread pool: the same code, about a fifth less
# compile time (the split's copies of the module cost more than its threads win with two workers on two cores).
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1"]
).strip()

import jax  # noqa: E402  (after XLA_FLAGS)
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)
# Compiling dominates the tests' time: XLA's optimisations off (the same programs, faster compiles), except in
# modules that ask for them (`xla_optimisations`).
jax.config.update("jax_disable_most_optimizations", True)

from helpers import engine_params  # noqa: E402  (after float64 is on: it imports sciad)

# Python's cycle collector: what the imports built (sciad, JAX, diffrax, equinox, SciPy) is frozen out of its
# passes, and its youngest generation is collected every 10,000 allocations, not 700. Tracing allocates objects by
# the million, and full passes over every live object, the imported modules' included, took about a sixth of a
# module's CPU time (test_solve: 5.8 s of 28 s; 1.3 s so).
gc.collect()
gc.freeze()
gc.set_threshold(10_000, 10, 10)


def pytest_generate_tests(metafunc):
    """A test with an argument `engine_name` runs once per registry name in
    `sciad.ad.BACKENDS`, skipped where the engine's package is not installed
    (and marked slow for the engines a module lists in `SLOW_ENGINES`)."""
    if "engine_name" in metafunc.fixturenames:
        metafunc.parametrize("engine_name", engine_params(slow=getattr(metafunc.module, "SLOW_ENGINES", ())))


HELD_BYTES = 3 * 2**30  # a worker's resident memory past which its compiled programs are freed
GROWN_BYTES = 2**28  # and the growth since it last freed them past which it frees them again


def resident_bytes() -> int | None:
    """This process's resident memory (Linux); None where /proc is not there (programs are then freed after
    every module)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


_freed_at = [0]  # the resident bytes when this worker last freed its compiled programs


@pytest.fixture(autouse=True, scope="module")
def _compiled_programs_freed():
    """After a module, a worker holding more than `HELD_BYTES`, `GROWN_BYTES` more than when it last freed its
    compiled programs, frees them: one that runs a hundred modules would otherwise hold every program it compiled
    until it exits (and freeing after every module would recompile the library's own helpers each time). The
    memory freed stays resident, reused by the programs compiled next, so the growth, not the level, says when
    to free again (the level alone freed after every module once past it)."""
    yield
    resident = resident_bytes()
    if resident is None or (resident >= HELD_BYTES and resident - _freed_at[0] >= GROWN_BYTES):
        jax.clear_caches()
        gc.collect()
        _freed_at[0] = resident_bytes() or 0


@pytest.fixture(scope="module")
def xla_optimisations():
    """XLA's optimisations on for a module (`pytestmark = pytest.mark.usefixtures("xla_optimisations")`): the
    programs as users compile them."""
    jax.config.update("jax_disable_most_optimizations", False)
    yield
    jax.config.update("jax_disable_most_optimizations", True)


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
