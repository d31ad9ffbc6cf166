"""The operators keep no user function alive: a loop over fresh closures (`lambda x: loss(x, batch)`)
leaves memory flat, on every engine. A prepared call holds its function until it is dropped."""

import gc
import pathlib
import weakref

import numpy as np
import pytest

import sciad.ad as ad
from helpers import ENGINES, slow_except

STATM = pathlib.Path("/proc/self/statm")


def resident_mb() -> float:
    return int(STATM.read_text().split()[1]) * 4096 / 2**20


def closures(count: int, refs: list):
    """`count` fresh functions, each closing over its own 4 MB array; weak references go to `refs`."""
    base = np.random.default_rng(0).random((512, 1024))
    for i in range(count):
        big = base + i
        f = lambda x, big=big: (x * ad.namespace(x).asarray(big[0, :3])).sum() + float(big[1, 0]) * x[0]  # noqa: E731
        refs.append(weakref.ref(f))
        yield f


def differentiate(backend, count: int, refs: list):
    """Gradients of `count` fresh closures, in a frame of their own (Python 3.11 keeps a frame's
    locals snapshot, taken by whoever inspects the stack, until the frame ends)."""
    for f in closures(count, refs):
        ad.gradient(backend, f, np.ones(3))


@pytest.mark.skipif(not STATM.exists(), reason="resident memory is read from /proc (Linux)")
@pytest.mark.parametrize("engine", slow_except(ENGINES, fast=["jax-reverse", "torch"]))
def test_fresh_closures_leave_memory_flat(engine):
    if engine not in ad.available():
        pytest.skip(f"{engine} is not installed")
    backend, refs = ad.get(engine), []
    differentiate(backend, 5, refs)  # the engine's own one-time allocations
    gc.collect()
    before = resident_mb()
    differentiate(backend, 60, refs)  # 240 MB of captured arrays, were they kept
    gc.collect()
    assert not [r for r in refs if r() is not None], "a user function is kept alive"
    assert resident_mb() - before < 80


def test_a_bound_method_is_compiled_once_and_its_instance_freed():
    class Model:
        def __init__(self):
            self.weights = np.ones((512, 1024))

        def loss(self, x):
            return (x * self.weights[0, :3]).sum()

    backend, model, x = ad.get("jax-reverse"), Model(), np.ones(3)
    ad.gradient(backend, model.loss, x)
    compiled = ad._operators._COMPILED[model]
    ad.gradient(backend, model.loss, 2 * x)
    assert ad._operators._COMPILED[model] is compiled and len(compiled) == 1
    ref = weakref.ref(model)
    del model, compiled
    gc.collect()
    assert ref() is None


def test_a_prepared_call_holds_its_function():
    backend = ad.get("torch" if "torch" in ad.available() else "jax-reverse")
    scale = np.arange(3.0)
    g = ad.prepare(backend, "gradient", lambda x: (x * ad.namespace(x).asarray(scale)).sum(), np.ones(3))
    gc.collect()
    np.testing.assert_allclose(np.asarray(g(np.zeros(3))), scale)
