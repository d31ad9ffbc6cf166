"""Host engines under `jax.vmap`: each callback receives the whole batch
(`differentiate_with`, `AbstractBackend.map_batch`), and the batched results
equal the members' one by one and JAX's own."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
import sciad.ad as ad
from helpers import HOST_ENGINES, engine_params
from sciad.ad import namespace

US = np.array([1.0, 0.5]) + np.linspace(-0.5, 0.5, 4)[:, None]  # (4, 2)
PS = np.array([1.5, 1.0, 3.0, 1.0]) + np.linspace(-0.3, 0.3, 3)[:, None]  # (3, 4)
W = np.array([-0.6, 1.1])


def lotka_volterra(u, p):
    xp = namespace(u, p)
    return xp.stack([p[0] * u[0] - p[1] * u[0] * u[1], -p[2] * u[1] + p[3] * u[0] * u[1]])


def _tolerance(engine):
    return 1e-6 if engine == "finite-differences" else 1e-10


def _assert_close(actual, expected, rtol):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * max(1.0, float(jnp.max(jnp.abs(e), initial=0.0))))


def _stacked(members: list):
    return jax.tree.map(lambda *m: jnp.stack(m), *members)


# Per-member transformations of a right-hand side `rhs(u, p)`.
TRANSFORMS = {
    "value": lambda rhs: rhs,
    "jvp": lambda rhs: lambda u, p: jax.jvp(rhs, (u, p), (u - 1.0, p / 2))[1],
    "vjp": lambda rhs: lambda u, p: jax.vjp(rhs, u, p)[1](W),
    "grad": lambda rhs: jax.grad(lambda u, p: jnp.sum(jnp.sin(rhs(u, p))), argnums=(0, 1)),
}
MEMBERS = {"both batched": (US[:3], PS), "u batched": (US, PS[0]), "p batched": (US[0], PS)}


@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
@pytest.mark.parametrize("engine", engine_params(HOST_ENGINES))
def test_vmap_equals_members(engine, transform):
    """jit(vmap) of the engine's products = its products member by member = JAX's, with all or some
    arguments batched."""
    t = TRANSFORMS[transform]
    fn = t(ad.differentiate_with(lotka_volterra, engine))
    one = jax.jit(fn)
    for us, ps in MEMBERS.values():
        in_axes = (0 if us.ndim == 2 else None, 0 if ps.ndim == 2 else None)
        batched = jax.jit(jax.vmap(fn, in_axes=in_axes))(us, ps)
        size = max(len(x) for x, a in zip((us, ps), in_axes) if a == 0)
        members = [one(us[i] if in_axes[0] == 0 else us, ps[i] if in_axes[1] == 0 else ps) for i in range(size)]
        _assert_close(batched, _stacked(members), _tolerance(engine))
        _assert_close(batched, jax.jit(jax.vmap(t(lotka_volterra), in_axes=in_axes))(us, ps), _tolerance(engine))


@pytest.mark.parametrize("engine", engine_params(HOST_ENGINES))
def test_nested_vmap_and_jit_orders(engine):
    """vmap of vmap (u on the inner axis, p on the outer), vmap of jit and jit of vmap."""
    t = TRANSFORMS["grad"]
    fn, expected = t(ad.differentiate_with(lotka_volterra, engine)), t(lotka_volterra)
    nested = lambda g: jax.vmap(jax.vmap(g, in_axes=(0, None)), in_axes=(None, 0))  # noqa: E731
    _assert_close(jax.jit(nested(fn))(US, PS), jax.jit(nested(expected))(US, PS), _tolerance(engine))
    reference = jax.jit(jax.vmap(expected))(US[:3], PS)
    _assert_close(jax.vmap(jax.jit(fn))(US[:3], PS), reference, _tolerance(engine))
    _assert_close(jax.jit(jax.vmap(fn))(US[:3], PS), reference, _tolerance(engine))


@pytest.mark.parametrize("size", [0, 1])
def test_batches_of_one_and_none(size):
    fn = jax.jit(jax.vmap(TRANSFORMS["vjp"](ad.differentiate_with(lotka_volterra, "finite-differences"))))
    us, ps = US[:size], PS[:size]
    _assert_close(fn(us, ps), jax.vmap(TRANSFORMS["vjp"](lotka_volterra))(us, ps), 1e-6)


@pytest.mark.parametrize("engine", engine_params(HOST_ENGINES))
def test_one_callback_per_product_whatever_the_batch(engine, monkeypatch):
    """The batch runs in one host call: `map_batch` is called as often for 8 members as for 4."""
    calls = []
    cls = ad.BACKENDS[engine]
    map_batch = cls.map_batch
    monkeypatch.setattr(cls, "map_batch", lambda self, *args: calls.append(1) or map_batch(self, *args))
    fn = jax.jit(jax.vmap(TRANSFORMS["grad"](ad.differentiate_with(lotka_volterra, engine)), in_axes=(0, None)))
    counts = []
    for size in (4, 8):
        calls.clear()
        jax.block_until_ready(fn(np.resize(US, (size, 2)), PS[0]))
        counts.append(len(calls))
    assert counts[0] == counts[1] > 0


def test_torch_evaluates_the_batch_with_torch_func_vmap():
    """f runs once per callback on the batch (torch.func.vmap), not once per member."""
    pytest.importorskip("torch")
    calls = []

    def counted(u, p):
        calls.append(1)
        return lotka_volterra(u, p)

    fn = jax.jit(jax.vmap(TRANSFORMS["vjp"](ad.differentiate_with(counted, "torch"))))
    jax.block_until_ready(fn(US[:3], PS))
    calls.clear()
    jax.block_until_ready(fn(US[:3], PS))
    assert len(calls) == 1


def test_torch_function_it_cannot_vmap_runs_member_by_member():
    """A value-dependent branch cannot run under torch.func.vmap: the batch falls back to a loop."""
    pytest.importorskip("torch")

    def branchy(u, p):
        y = lotka_volterra(u, p)
        return y if float(namespace(u).sum(u)) > 1.0 else -y

    assert min(US[:3].sum(1)) < 1.0 < max(US[:3].sum(1))  # the members take both branches
    fn = TRANSFORMS["vjp"](ad.differentiate_with(branchy, "torch"))
    batched = jax.jit(jax.vmap(fn))(US[:3], PS)
    _assert_close(batched, _stacked([jax.jit(fn)(u, p) for u, p in zip(US[:3], PS)]), 1e-12)


@pytest.mark.slow  # two compiles of a vmapped adjoint solve (as test_sensealgs's host-engine gradients)
def test_vmap_of_gradients_through_a_torch_adjoint():
    """jax.vmap(jax.grad) of a Lotka–Volterra loss with InterpolatingAdjoint(vjp="torch") = jax-reverse's."""
    pytest.importorskip("torch")
    bench = sciad.problems.lotka_volterra()
    problem = sciad.ODEProblem(bench.problem.f, bench.problem.u0, (0.0, 2.0), bench.problem.p)
    bench = dataclasses.replace(bench, problem=problem, saveat=np.linspace(0.0, 2.0, 11), rtol=1e-4, atol=1e-4)
    ps = jnp.asarray(bench.problem.p) * jnp.array([[1.0], [0.95], [1.05]])

    def grads(engine):
        return jax.jit(jax.vmap(jax.grad(lambda p: bench.objective(p, sciad.InterpolatingAdjoint(vjp=engine)))))(ps)

    _assert_close(grads("torch"), grads("jax-reverse"), 1e-8)
