"""`ODEProblem`: u' = f(u, p, t), u(t0) = u0, on tspan = (t0, t1)."""

import dataclasses
from typing import Callable

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class ODEProblem:
    """An initial value problem u' = f(u, p, t) on tspan = (t0, t1).

    `f(u, p, t)` maps u (n,) and the flat parameter vector p (m,) to du/dt
    (n,); write it once with `sciad.ad.namespace(u)` so every engine can run
    it. `u0` is (n,), `p` (m,) (or None: no parameters). Checked here:
    shapes, finite values, t1 > t0, and that f returns the shape of u0.
    """

    f: Callable
    u0: jax.Array
    tspan: tuple[float, float]
    p: jax.Array | None = None

    def __post_init__(self):
        if not callable(self.f):
            raise TypeError(f"ODEProblem(f=...): f must be callable f(u, p, t), got {self.f!r}")
        object.__setattr__(self, "u0", check_vector("u0", self.u0))
        p = np.zeros((0,)) if self.p is None else self.p
        object.__setattr__(self, "p", check_vector("p", p))
        object.__setattr__(self, "tspan", check_tspan(self.tspan))
        check_rhs(self.f, self.u0, self.p, self.tspan[0])


def check_vector(name: str, x):
    """`x` as a 1-D float array; a clear error for other shapes, dtypes, non-finite values."""
    if not isinstance(x, jax.core.Tracer):
        x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array (flat vector), got shape {tuple(x.shape)}: flatten it")
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"{name} has dtype {x.dtype}; pass a float array, e.g. numpy.asarray({name}, dtype=float)")
    if not isinstance(x, jax.core.Tracer) and not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contains non-finite values (NaN or inf): {x}")
    return x


def check_tspan(tspan) -> tuple[float, float]:
    """`(t0, t1)` as floats with t1 > t0."""
    try:
        t0, t1 = (float(t) for t in tspan)
    except (TypeError, ValueError) as e:
        raise ValueError(f"tspan must be a pair of numbers (t0, t1), got {tspan!r}") from e
    if not (np.isfinite(t0) and np.isfinite(t1)):
        raise ValueError(f"tspan must be finite, got {tspan!r}")
    if not t1 > t0:
        raise ValueError(
            f"tspan = {tspan!r} is reversed or empty: t1 must be greater than t0 "
            "(sciad integrates forward in time; substitute s = -t for backward problems)"
        )
    return t0, t1


def check_rhs(f: Callable, u0, p, t0: float) -> None:
    """f must map (u0, p, t0) to an array of u0's shape (checked by tracing, no run)."""
    import jax.numpy as jnp

    try:
        out = jax.eval_shape(lambda u, p: f(u, p, jnp.asarray(t0, u.dtype)), u0, p)
    except jax.errors.ConcretizationTypeError as e:
        raise ValueError(
            "f(u, p, t) has value-dependent Python control flow, which JAX cannot trace into the "
            "ODE solver: write branches with jnp.where / jax.lax.cond"
        ) from e
    if tuple(out.shape) != tuple(np.shape(u0)):
        raise ValueError(
            f"f(u, p, t) returns shape {tuple(out.shape)} but u0 has shape {tuple(np.shape(u0))}: "
            "they must match"
        )


def check_saveat(saveat, t0: float, t1: float) -> np.ndarray:
    """`saveat` as sorted times (T,) inside [t0, t1] (default: t0 and t1); a clear error otherwise."""
    if saveat is None:
        return np.array([t0, t1])
    if isinstance(saveat, jax.core.Tracer):
        raise TypeError("saveat must be concrete (NumPy or Python numbers), not traced by jax.jit")
    ts = np.atleast_1d(np.asarray(saveat, dtype=float))
    if ts.ndim != 1 or ts.size == 0:
        raise ValueError(f"saveat must be a non-empty 1-D sequence of times, got shape {ts.shape}")
    if not np.all(np.isfinite(ts)):
        raise ValueError("saveat contains non-finite times")
    if np.any(np.diff(ts) <= 0):
        raise ValueError("saveat must be strictly increasing (sorted, no repeats): sort it with numpy.unique")
    if ts[0] < t0 or ts[-1] > t1:
        raise ValueError(f"saveat must lie inside tspan ({t0}, {t1}), got [{ts[0]}, {ts[-1]}]")
    return ts
