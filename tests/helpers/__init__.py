"""What the tests share: the sensealg variants by name, the AD engines, the split of a matrix of them
between the default run and the slow one, one central finite-difference reference and one agreement
check. A test module takes what it needs (`from helpers import SENSEALGS, assert_agrees`) and keeps
only its own problems and the variants its question needs.
"""

import functools

import jax
import numpy as np
import pytest

import sciad.ad as ad
from sciad.adjoints import (
    BacksolveAdjoint,
    DiscreteAdjoint,
    ForwardDiffSensitivity,
    ForwardSensitivity,
    GaussAdjoint,
    InterpolatingAdjoint,
    engine_option,
)

# name → the sensealg, a function of its engine (a registry name or a backend; the default left out) for
# those that take one. QuadratureAdjoint is InterpolatingAdjoint(seminorm=True) by SciML's other name,
# not a variant of its own.
SENSEALGS = {
    "ForwardDiffSensitivity": ForwardDiffSensitivity,
    "ForwardSensitivity": ForwardSensitivity,
    "ForwardSensitivity-seminorm": functools.partial(ForwardSensitivity, seminorm=True),
    "BacksolveAdjoint": BacksolveAdjoint,
    "InterpolatingAdjoint": InterpolatingAdjoint,
    "InterpolatingAdjoint-checkpointing": functools.partial(InterpolatingAdjoint, checkpointing=True),
    "GaussAdjoint": GaussAdjoint,
    "DiscreteAdjoint": DiscreteAdjoint,
}


def reference_for(name: str, parameters: int = 1) -> str:
    """The variant a gradient of sensealg `name` is checked against: never `name` itself, and discretise-
    then-differentiate (exact for the steps taken, independent of every continuous adjoint). Forward mode
    through the steps (ForwardDiffSensitivity: half DiscreteAdjoint's compile time, a cost that grows with
    the parameters) up to 16 `parameters`, DiscreteAdjoint beyond, or where `name` is forward mode."""
    return "DiscreteAdjoint" if parameters > 16 or name == "ForwardDiffSensitivity" else "ForwardDiffSensitivity"


# the variants whose products go through an engine (vector-Jacobian or Jacobian-vector)
WITH_ENGINE = [name for name, make in SENSEALGS.items() if engine_option(make())]
# the AD engines by registry name, and those that run f on the host through a callback
ENGINES = list(ad.BACKENDS)
HOST_ENGINES = [name for name, cls in ad.BACKENDS.items() if cls.host]


def engine_params(names=ENGINES, slow=()) -> list:
    """The engines `names` as pytest params, skipped where the engine's package is not installed, marked
    slow for those in `slow`."""
    installed = set(ad.available())
    return [
        pytest.param(
            name,
            id=name,
            marks=[
                pytest.mark.skipif(
                    name not in installed, reason=f"package {ad.BACKENDS[name].package!r} is not installed"
                ),
                *([pytest.mark.slow] if name in slow else []),
            ],
        )
        for name in names
    ]


def slow_except(values, fast):
    """`values` as pytest params, all but those in `fast` marked slow (the full matrix runs in CI)."""
    return [v if v in fast else pytest.param(v, marks=pytest.mark.slow) for v in values]


def engine_matrix(sensealgs, slow_engines, fast=None) -> list:
    """(sensealg, engine) params for every sensealg and registry engine: in the default run each
    sensealg in `fast` (all by default) with one engine not in `slow_engines` (taking them in turn, so
    each runs too), every other pair marked slow (the full matrix runs in CI); engines not installed
    skipped."""
    fast_engines = [name for name in ENGINES if name not in slow_engines]
    fast = {(s, fast_engines[i % len(fast_engines)]) for i, s in enumerate(sensealgs) if fast is None or s in fast}
    installed = set(ad.available())
    return [
        pytest.param(
            s,
            e,
            id=f"{e}-{s}",
            marks=[
                pytest.mark.skipif(e not in installed, reason=f"the {e} engine is not installed"),
                *([] if (s, e) in fast else [pytest.mark.slow]),
            ],
        )
        for e in ENGINES
        for s in sensealgs
    ]


def central_differences(f, x, rel_step=1e-5, floor=1.0):
    """The derivative of `f` at `x` by central differences in float64, stepping each element x_i by
    rel_step · max(|x_i|, floor). `x` is an array or a PyTree of arrays; the derivative has x's
    structure, each leaf with f(x)'s shape appended (a scalar loss: its gradient)."""
    leaves, tree = jax.tree.flatten(x)
    leaves = [np.asarray(leaf, np.float64) for leaf in leaves]
    flat = np.concatenate([leaf.ravel() for leaf in leaves])
    splits = np.cumsum([leaf.size for leaf in leaves])[:-1]

    def at(values):
        return tree.unflatten([v.reshape(leaf.shape) for v, leaf in zip(np.split(values, splits), leaves)])

    columns = []
    for i, h in enumerate(rel_step * np.maximum(np.abs(flat), floor)):
        up, down = flat.copy(), flat.copy()
        up[i] += h
        down[i] -= h
        columns.append((np.asarray(f(at(up)), np.float64) - np.asarray(f(at(down)), np.float64)) / (2 * h))
    columns = np.stack(columns)
    return tree.unflatten(
        [c.reshape(leaf.shape + columns.shape[1:]) for c, leaf in zip(np.split(columns, splits), leaves)]
    )


def assert_agrees(actual, expected, what, rtol):
    """Agreement to `rtol` componentwise, components far below the expected's scale compared at `rtol`
    of that scale (atol = rtol · max|expected|); PyTrees of the same structure leaf by leaf, each at its
    own scale."""
    assert jax.tree.structure(actual) == jax.tree.structure(expected), what
    for (path, a), e in zip(jax.tree_util.tree_leaves_with_path(actual), jax.tree.leaves(expected)):
        e = np.asarray(e)
        np.testing.assert_allclose(
            np.asarray(a),
            e,
            rtol=rtol,
            atol=rtol * np.max(np.abs(e), initial=0.0),
            err_msg=f"{what}{jax.tree_util.keystr(path)}",
        )


def assert_close(actual, expected, rtol):
    """Equal to `rtol` relative to the largest entry of `expected` (tuples item by item)."""
    if isinstance(expected, tuple):
        assert isinstance(actual, tuple) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_close(a, e, rtol)
        return
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1.0)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale)


def values_and_jacobian(f, *args, argnums=0, has_aux=False):
    """(f(*args), ∂f/∂args[argnums]) from one compiled reverse-mode program: the values ride along the
    gradient's forward pass, so a test pays one trace and compile, not three (eager values, then a
    jitted Jacobian). With `has_aux`, f returns (y, aux) and this gives ((y, aux), ∂y)."""

    def with_values(*a):
        out = f(*a)
        y = out[0] if has_aux else out
        return y, out

    jacobian, values = jax.jit(jax.jacrev(with_values, argnums=argnums, has_aux=True))(*args)
    return values, jacobian
