"""Failures that cross a host callback are sciad's `SolveError`s: raised as themselves where the call
runs eagerly, the last line of JAX's runtime error under a user's `jax.jit` (whose first line jaxlib
writes: "CpuCallback error calling callback", then the host call's traceback; sciad/_errors.py). The
cases: a check inside a compiled rule (Enzyme's NaN derivative in an implicit adjoint), a host
engine's failure in `differentiate_with` (f's own, or the engine's refusal), and the host LU."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
import sciad.ad as ad
from sciad._errors import carried
from sciad.ad import namespace


def inverse_sum(x):
    """Singular at x = (-1, 0, 0, -1): NumPy's inverse raises there (JAX's gives inf)."""
    xp = namespace(x)
    return xp.sum(xp.linalg.inv(xp.reshape(x, (2, 2)) + xp.eye(2, dtype=x.dtype)))


SINGULAR = jnp.array([-1.0, 0.0, 0.0, -1.0])
HOST_FAILURE = (
    r"f raised LinAlgError on the host \(the 'finite-differences' engine, called from JAX\): Singular "
    r"matrix; where f itself fails at these inputs, fix f, else differentiate it with another engine, "
    r"e\.g\. 'jax-reverse'"
)


def under_jit(fn, *args) -> jax.errors.JaxRuntimeError:
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(jax.jit(fn)(*args))
    return info.value


def assert_carried(error: Exception, pattern: str) -> None:
    """`error` (JAX's, under jit) ends with the SolveError matching `pattern`, which `summary` finds. Its
    first line is jaxlib's (pinned: when JAX lets a callback's exception be the error, it should start
    with the SolveError too)."""
    message = carried(error)
    assert message is not None and re.search(pattern, message), str(error)
    assert str(error).endswith(f"SolveError: {message}")
    assert sciad.errors.summary(error) == f"SolveError: {message}"
    assert str(error).startswith("INTERNAL: CpuCallback error calling callback: Traceback")


def test_host_engine_failure_eagerly_is_a_solve_error():
    """f fails on the host in the value, and in an eager jax.grad: a SolveError naming the engine and f."""
    g = ad.differentiate_with(inverse_sum, "finite-differences")
    np.testing.assert_allclose(g(jnp.zeros(4)), 2.0)
    for call in (g, jax.grad(g)):
        with pytest.raises(sciad.SolveError, match=HOST_FAILURE) as info:
            call(SINGULAR)
        assert type(info.value) is sciad.SolveError and "Traceback" not in str(info.value)


def test_host_engine_failure_under_jit_ends_with_the_solve_error():
    g = ad.differentiate_with(inverse_sum, "finite-differences")
    assert_carried(under_jit(jax.grad(g), SINGULAR), HOST_FAILURE)


def test_host_engine_failure_in_the_pullback_names_it():
    """Autograd refuses copysign when it differentiates, in the pullback (the value runs)."""
    pytest.importorskip("autograd")
    g = ad.differentiate_with(lambda x: namespace(x).sum(namespace(x).copysign(x, x - 0.4)), "autograd")
    x = jnp.array([0.1, 0.7])
    np.testing.assert_allclose(g(x), -0.1 + 0.7)
    pattern = (
        r"^the pullback of f raised NotImplementedError on the host \(the 'autograd' engine, called from JAX\): "
        r"autograd cannot differentiate `copysign`"
    )
    with pytest.raises(sciad.SolveError, match=pattern):
        jax.grad(g)(x)
    assert_carried(under_jit(jax.grad(g), x), pattern)


ENZYME_NAN = r"^the 'enzyme' engine's derivative is NaN or infinite where f and the cotangent are finite.*'jax-reverse'"


def robertson(u, p, t):
    k1, k2, k3 = p
    return namespace(u).stack(
        [-k1 * u[0] + k3 * u[1] * u[2], k1 * u[0] - k2 * u[1] ** 2 - k3 * u[1] * u[2], k2 * u[1] ** 2]
    )


def test_enzyme_refusal_in_differentiate_with_under_jit():
    """enzyme-ad's NaN derivative of u[1] u[2] at 0 (a check compiled into the rule)."""
    pytest.importorskip("enzyme_ad")
    g = ad.differentiate_with(lambda u: namespace(u).sum(robertson(u, jnp.array([0.04, 3e7, 1e4]), 0.0)), "enzyme")
    assert_carried(under_jit(jax.grad(g), jnp.array([1.0, 0.0, 0.0])), ENZYME_NAN)


@pytest.mark.slow
def test_enzyme_refusal_in_an_implicit_adjoint_under_jit():
    """The reported case: Robertson's kinetics by Kvaerno5 with GaussAdjoint(vjp="enzyme") under
    jax.jit(jax.grad(...)), and eagerly."""
    pytest.importorskip("enzyme_ad")
    prob = sciad.ODEProblem(robertson, np.array([1.0, 0.0, 0.0]), (0.0, 1.0), np.array([0.04, 3e7, 1e4]))

    def loss(p):
        return jnp.sum(
            sciad.solve(prob, p=p, solver="kvaerno5", sensealg=sciad.GaussAdjoint(vjp="enzyme"), saveat=[1.0]).us
        )

    with pytest.raises(sciad.SolveError, match=ENZYME_NAN):
        jax.grad(loss)(prob.p)
    assert_carried(under_jit(jax.grad(loss), prob.p), ENZYME_NAN)


def test_host_lu_failure_under_jit_ends_with_the_solve_error(monkeypatch):
    """A failure inside the host LU's call (here a MemoryError put in its place) names the LU and the fix."""
    from sciad._host_lu import HostLU, lu_solve

    lu = HostLU(np.array([0, 1]), np.array([0, 1]), (2, 2), kept=1)

    def out_of_memory(self, values, b, transpose=False):
        raise MemoryError("no memory for the factors")

    monkeypatch.setattr(HostLU, "solve", out_of_memory)
    assert_carried(
        under_jit(lambda v, b: lu_solve(lu, v, b), jnp.ones(2), jnp.ones(2)),
        r"^the sparse LU solve on the host \(HostLU\(n=2, nnz=2, kept=1\)\) raised MemoryError: no memory "
        r"for the factors; pass jacobian='dense' or jacobian='matrix-free' to sciad.solve",
    )
