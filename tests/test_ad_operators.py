"""Scenario zoo (after DifferentiationInterface.jl): every backend x every operator
x every scenario, against analytic derivatives.

A scenario is a function with its analytic Jacobian (and Hessian for scalar
functions of one array), written once with `sciad.ad.namespace`. Every
operator's expected value is derived from those two. AD engines must agree to
1e-10 relative in float64, finite differences to their truncation error.
Compiled engines must refuse value-dependent Python branches with a
ValueError; eager ones must differentiate them.
"""

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

import sciad.ad as ad
from helpers import assert_close
from sciad.ad import namespace

# -- scenarios ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Scenario:
    """`f` at `x` (an array or a tuple of arrays) and at a second point `x_new`
    (same shapes, for prepared operators), with its analytic derivatives."""

    name: str
    f: Callable
    x: object
    x_new: object
    jacobian: Callable  # x -> ∂f/∂x, shape f.shape + x.shape (a tuple for a tuple x)
    hessian: Callable | None = None  # x -> ∇²f (scalar f of one array)
    branches: bool = False  # value-dependent Python control flow

    @property
    def multi(self):
        return isinstance(self.x, tuple)

    @property
    def xs(self):
        return self.x if self.multi else (self.x,)

    def __str__(self):
        return self.name


def _scalar(x):
    xp = namespace(x)
    return xp.sin(x) * xp.exp(x)


def _vector_to_scalar(x):
    xp = namespace(x)
    return xp.sum(xp.sin(x) * x) + xp.sum(x) ** 2 / 2


def _vector_to_vector(x):
    xp = namespace(x)
    return xp.stack([x[0] * x[1] * x[2], xp.exp(x[0]) + x[1] ** 2 - x[2]])


def _lotka_volterra(u, p):
    xp = namespace(u, p)
    return xp.stack([p[0] * u[0] - p[1] * u[0] * u[1], -p[2] * u[1] + p[3] * u[0] * u[1]])


def _lotka_volterra_jacobian(up):
    (u0, u1), (a, b, c, d) = up
    return (
        np.array([[a - b * u1, -b * u0], [d * u1, -c + d * u0]]),
        np.array([[u0, -u0 * u1, 0, 0], [0, 0, -u1, u0 * u1]]),
    )


def _two_arguments_to_scalar(x, s):
    xp = namespace(x, s)
    return xp.exp(s) * xp.sum(x**2)


def _gram_norm(X):
    """‖XᵀX‖²_F / 4: gradient X XᵀX."""
    xp = namespace(X)
    return xp.sum((X.T @ X) ** 2) / 4


def _gram_norm_hessian(X):
    n, m = X.shape
    return (
        np.einsum("ik,lj->ijkl", np.eye(n), X.T @ X)
        + np.einsum("il,kj->ijkl", X, X)
        + np.einsum("ik,jl->ijkl", X @ X.T, np.eye(m))
    )


def _outer_product(X):
    return X @ X.T


def _outer_product_jacobian(X):
    n = X.shape[0]
    return np.einsum("ik,jl->ijkl", np.eye(n), X) + np.einsum("il,jk->ijkl", X, np.eye(n))


def _branches(x):
    if x[0] > x[1]:
        return x[0] ** 2 * x[1]
    xp = namespace(x)
    return xp.sin(x[0]) + x[1] ** 3


def _branches_jacobian(x):
    if x[0] > x[1]:
        return np.array([2 * x[0] * x[1], x[0] ** 2])
    return np.array([np.cos(x[0]), 3 * x[1] ** 2])


def _branches_hessian(x):
    if x[0] > x[1]:
        return np.array([[2 * x[1], 2 * x[0]], [2 * x[0], 0.0]])
    return np.array([[-np.sin(x[0]), 0.0], [0.0, 6 * x[1]]])


SCENARIOS = [
    Scenario(
        "scalar-to-scalar",
        _scalar,
        np.array(0.7),
        np.array(-0.3),
        lambda x: np.exp(x) * (np.sin(x) + np.cos(x)),
        lambda x: 2 * np.exp(x) * np.cos(x),
    ),
    Scenario(
        "vector-to-scalar",
        _vector_to_scalar,
        np.array([0.3, -0.5, 1.2]),
        np.array([1.1, 0.4, -0.8]),
        lambda x: np.sin(x) + x * np.cos(x) + np.sum(x),
        lambda x: np.diag(2 * np.cos(x) - x * np.sin(x)) + 1.0,
    ),
    Scenario(
        "vector-to-vector",
        _vector_to_vector,
        np.array([0.3, -0.5, 1.2]),
        np.array([-0.7, 0.2, 0.9]),
        lambda x: np.array([[x[1] * x[2], x[0] * x[2], x[0] * x[1]], [np.exp(x[0]), 2 * x[1], -1.0]]),
    ),
    Scenario(
        "several-arguments-to-vector",
        _lotka_volterra,
        (np.array([1.0, 0.5]), np.array([1.5, 1.0, 3.0, 1.0])),
        (np.array([0.8, 1.3]), np.array([1.2, 0.7, 2.0, 0.9])),
        _lotka_volterra_jacobian,
    ),
    Scenario(
        "several-arguments-to-scalar",
        _two_arguments_to_scalar,
        (np.array([0.3, -0.5, 1.2]), np.array(0.4)),
        (np.array([1.0, 0.2, -0.6]), np.array(-0.2)),
        lambda xs: (2 * np.exp(xs[1]) * xs[0], np.exp(xs[1]) * np.sum(xs[0] ** 2)),
    ),
    Scenario(
        "matrix-to-scalar",
        _gram_norm,
        np.array([[0.3, -0.5, 1.2], [0.8, 0.1, -0.4]]),
        np.array([[-0.6, 0.9, 0.2], [0.5, -1.1, 0.7]]),
        lambda X: X @ X.T @ X,
        _gram_norm_hessian,
    ),
    Scenario(
        "matrix-to-matrix",
        _outer_product,
        np.array([[0.3, -0.5, 1.2], [0.8, 0.1, -0.4]]),
        np.array([[-0.6, 0.9, 0.2], [0.5, -1.1, 0.7]]),
        _outer_product_jacobian,
    ),
    Scenario(
        "value-dependent-branches",
        _branches,
        np.array([0.9, 0.4]),
        np.array([0.2, 0.6]),  # the other branch
        _branches_jacobian,
        _branches_hessian,
        branches=True,
    ),
]

# -- backends -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Engine:
    """A backend under test: how to build it and what to expect of it."""

    id: str
    make: Callable[[], ad.AbstractBackend]
    packages: tuple = ()
    compiled: bool = False  # traced once: must refuse value-dependent branches
    numerical: bool = False  # finite differences somewhere: looser tolerance
    second_order_only: bool = False  # a HigherOrder composition: test Hessian operators only
    branches_only: bool = False  # `jit=False` of an engine tested compiled: only what differs
    # What the default run covers of its cases, the rest marked slow (CI runs them with -m slow):
    # every case when empty (no compiling: milliseconds each), else each "operator" and/or each
    # "scenario" at least once (a JAX compile is about 0.2 s a case, Enzyme's over a second; eager
    # JAX, op by op, as slow, and it differs from the compiled engines only in what each scenario shows).
    default_covers: tuple = ()


BOTH = ("operator", "scenario")
ENGINES = [
    Engine("jax-reverse", lambda: ad.JaxReverse(), compiled=True, default_covers=BOTH),
    Engine("jax-reverse-eager", lambda: ad.JaxReverse(jit=False), default_covers=("scenario",)),
    Engine("jax-forward", lambda: ad.JaxForward(), compiled=True, default_covers=BOTH),
    Engine("jax-forward-eager", lambda: ad.JaxForward(jit=False), branches_only=True, default_covers=("scenario",)),
    Engine("jax-transpose", lambda: ad.JaxTranspose(), compiled=True, default_covers=BOTH),
    Engine("jax-transpose-eager", lambda: ad.JaxTranspose(jit=False), branches_only=True, default_covers=("scenario",)),
    Engine("enzyme", lambda: ad.Enzyme(), ("enzyme_ad",), compiled=True, default_covers=("scenario",)),
    Engine("torch", lambda: ad.Torch(), ("torch",)),
    Engine("autograd", lambda: ad.Autograd(), ("autograd",)),
    Engine("finite-differences", lambda: ad.FiniteDifferences(), numerical=True),
    Engine(
        "reverse-over-reverse",
        lambda: ad.HigherOrder(ad.JaxReverse(), ad.JaxReverse()),
        compiled=True,
        second_order_only=True,
        default_covers=BOTH,
    ),
    Engine(
        "finite-differences-over-torch",
        lambda: ad.HigherOrder(ad.FiniteDifferences(), ad.Torch()),
        ("torch",),
        numerical=True,
        second_order_only=True,
    ),
]

# -- operators and their expected values ----------------------------------------

SECOND_ORDER = {"hessian", "value_and_hessian", "value_gradient_and_hessian", "hvp", "lazy_hessian"}
FIRST_ORDER = {
    "derivative",
    "value_and_derivative",
    "gradient",
    "value_and_gradient",
    "jacobian",
    "value_and_jacobian",
    "jvp",
    "value_and_jvp",
    "vjp",
    "value_and_vjp",
    "pushforward",
    "pullback",
    "lazy_jacobian",
}
TAKES_V = {"jvp", "value_and_jvp", "hvp"}
TAKES_W = {"vjp", "value_and_vjp"}


def _applies(op: str, s: Scenario) -> bool:
    scalar_out = np.shape(s.f(*s.xs)) == ()
    if op in ("derivative", "value_and_derivative"):
        return not s.multi and np.shape(s.x) == ()
    if op in ("gradient", "value_and_gradient"):
        return scalar_out
    if op in SECOND_ORDER:
        return s.hessian is not None
    if op == "lazy_jacobian":
        return not s.multi
    return True


def _vectors(s: Scenario, seed: int = 0):
    """Deterministic tangent `v` (like x) and cotangent `w` (like f(x))."""
    rng = np.random.default_rng(seed)
    vs = tuple(rng.standard_normal(np.shape(xi)) for xi in s.xs)
    w = rng.standard_normal(np.shape(s.f(*s.xs)))
    return (vs if s.multi else vs[0]), w


def _expected(op: str, s: Scenario, x, v, w):
    xs, vs = (x, v) if s.multi else ((x,), (v,))
    y = s.f(*xs)
    J = s.jacobian(x)
    Js = J if s.multi else (J,)
    jv = sum(np.tensordot(Ji, vi, np.ndim(vi)) for Ji, vi in zip(Js, vs))
    wJs = tuple(np.tensordot(w, Ji, np.ndim(w)) for Ji in Js)
    wJ = wJs if s.multi else wJs[0]
    if op in SECOND_ORDER:
        H = s.hessian(x)
        Hv = np.tensordot(H, v, np.ndim(v))
        return {
            "hessian": H,
            "value_and_hessian": (y, H),
            "value_gradient_and_hessian": (y, J, H),
            "hvp": Hv,
            "lazy_hessian": (Hv, Hv, Hv),
        }[op]
    return {
        "derivative": J,
        "value_and_derivative": (y, J),
        "gradient": J,
        "value_and_gradient": (y, J),
        "jacobian": J,
        "value_and_jacobian": (y, J),
        "jvp": jv,
        "value_and_jvp": (y, jv),
        "vjp": wJ,
        "value_and_vjp": (y, wJ),
        "pushforward": jv,
        "pullback": wJ,
        "lazy_jacobian": (jv, wJ, wJ, jv),
    }[op]


def _call(op: str, b, s: Scenario, x, v, w):
    if op == "pushforward":
        return ad.pushforward(b, s.f, x)(v)
    if op == "pullback":
        return ad.pullback(b, s.f, x)(w)
    if op == "lazy_jacobian":
        J = ad.lazy_jacobian(b, s.f, x)
        assert J.shape == (np.size(w), np.size(x))
        assert J.T.shape == (np.size(x), np.size(w))
        return J @ v, w @ J, J.T @ w, v @ J.T
    if op == "lazy_hessian":
        H = ad.lazy_hessian(b, s.f, x)
        assert H.shape == (np.size(x), np.size(x))
        return H @ v, v @ H, H.T @ v
    return getattr(ad, op)(b, s.f, x, *_extra(op, v, w))


def _extra(op, v, w):
    return (v,) if op in TAKES_V else (w,) if op in TAKES_W else ()


def _tolerance(engine: Engine, op: str) -> float:
    if not engine.numerical:
        return 1e-10
    return 1e-4 if op in SECOND_ORDER else 1e-6


def _cases(ops):
    """Every engine x scenario x operator that applies; those the default run needs to cover what
    the engine's `default_covers` names (taken along diagonals, operator i with scenario i + k first
    for the k-th engine, so that operators meet different scenarios) are fast, the others marked slow."""
    for k, engine in enumerate(ENGINES):
        cases = [
            (s, op)
            for s in SCENARIOS
            for op in ops
            if (s.branches or not engine.branches_only)
            and _applies(op, s)
            and (op in SECOND_ORDER or not engine.second_order_only)
        ]
        diagonals = sorted(
            cases, key=lambda c: ((ops.index(c[1]) + k - SCENARIOS.index(c[0])) % len(SCENARIOS), ops.index(c[1]))
        )
        fast, covered = set(), set()
        for s, op in diagonals:
            keys = {key for key in (("operator", op), ("scenario", s.name)) if key[0] in engine.default_covers}
            if not engine.default_covers or keys - covered:
                fast.add((s.name, op))
                covered |= keys
        for s, op in cases:
            yield pytest.param(
                engine, s, op, id=f"{engine.id}-{s.name}-{op}", marks=() if (s.name, op) in fast else pytest.mark.slow
            )


@pytest.fixture
def backend(request):
    engine = request.node.callspec.params["engine"]
    for package in engine.packages:
        pytest.importorskip(package)
    return engine.make()


# -- tests ------------------------------------------------------------------------

OPERATORS = sorted(FIRST_ORDER | SECOND_ORDER)
LINEAR_MAPS = {"pushforward", "pullback", "lazy_jacobian", "lazy_hessian"}  # not preparable


@pytest.mark.parametrize("engine, scenario, op", list(_cases(OPERATORS)))
def test_operator(backend, engine, scenario, op):
    """`op` at `x`; then, prepared once at `x`, at a new point with new vectors
    (for the branches scenario: on the other branch)."""
    v, w = _vectors(scenario)
    if scenario.branches and engine.compiled:
        with pytest.raises(ValueError, match="value-dependent Python control flow"):
            _call(op, backend, scenario, scenario.x, v, w)
        if op not in LINEAR_MAPS:
            with pytest.raises(ValueError, match="value-dependent Python control flow"):
                ad.prepare(backend, getattr(ad, op), scenario.f, scenario.x, *_extra(op, v, w))
        return
    rtol = _tolerance(engine, op)
    actual = _call(op, backend, scenario, scenario.x, v, w)
    assert_close(actual, _expected(op, scenario, scenario.x, v, w), rtol)
    if op in LINEAR_MAPS:
        return
    prepared = ad.prepare(backend, getattr(ad, op), scenario.f, scenario.x, *_extra(op, v, w))
    v, w = _vectors(scenario, seed=1)
    actual = prepared(scenario.x_new, *_extra(op, v, w))
    assert_close(actual, _expected(op, scenario, scenario.x_new, v, w), rtol)


ENGINE_ARRAYS = {
    "jax-reverse": "jax",
    "jax-reverse-eager": "jax",
    "jax-forward": "jax",
    "jax-transpose": "jax",
    "enzyme": "jax",
    "torch": "torch",
    "autograd": "numpy",
    "finite-differences": "numpy",
}


@pytest.mark.parametrize("engine", [e for e in ENGINES if e.id in ENGINE_ARRAYS], ids=lambda e: e.id)
def test_outputs_are_engine_arrays(backend, engine):
    """Inputs may be NumPy arrays; outputs are the engine's own arrays."""
    s = SCENARIOS[1]
    y, g = ad.value_and_gradient(backend, s.f, s.x)
    for out in (y, g):
        assert type(out).__module__.split(".")[0].startswith(ENGINE_ARRAYS[engine.id])
    # ... and the engine's own arrays are accepted as inputs.
    assert_close(ad.gradient(backend, s.f, backend.asarray(s.x)), s.jacobian(s.x), _tolerance(engine, "gradient"))


def test_prepare_accepts_operator_names():
    s = SCENARIOS[1]
    g = ad.prepare(ad.JaxReverse(), "gradient", s.f, s.x)
    assert_close(g(s.x_new), s.jacobian(s.x_new), 1e-10)


def test_unused_argument_has_zero_gradient(engine_name):
    x, unused = np.array([0.3, -0.5]), np.array([1.0, 2.0, 3.0])
    gx, gu = ad.gradient(ad.get(engine_name), lambda x, u: namespace(x).sum(x**2), (x, unused))
    assert_close((gx, gu), (2 * x, np.zeros(3)), 1e-6 if engine_name == "finite-differences" else 1e-10)


def test_torch_gradient_under_no_grad():
    torch = pytest.importorskip("torch")
    s = SCENARIOS[1]
    with torch.no_grad():
        y, g = ad.value_and_gradient(ad.Torch(), s.f, s.x)
    assert not y.requires_grad and not g.requires_grad
    assert_close((y, g), (s.f(s.x), s.jacobian(s.x)), 1e-10)


def test_array_api_concat_is_differentiated_by_every_engine(engine_name):
    """`xp.concat` must keep the tape (autograd's own `concat` silently drops it)."""
    backend = ad.get(engine_name)

    def f(x):
        xp = ad.namespace(x)
        return xp.concat([xp.reshape(x[:2] ** 2, (-1,)), xp.roll(x, 1)])

    x = np.array([0.5, -1.0, 2.0])
    expected = np.vstack([np.diag(2 * x)[:2], np.roll(np.eye(3), 1, axis=0)])
    tol = 1e-6 if engine_name == "finite-differences" else 1e-12
    np.testing.assert_allclose(np.asarray(backend.numpy(ad.jacobian(backend, f, x))), expected, atol=tol)
