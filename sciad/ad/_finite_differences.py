"""Central finite differences: the numerical reference engine."""

import dataclasses

import numpy as np

from sciad.ad._backend import AbstractHostBackend


@dataclasses.dataclass(frozen=True)
class FiniteDifferences(AbstractHostBackend):
    """Central differences on NumPy arrays: `(f(x + h v) - f(x - h v)) / 2h`.

    `step` is the relative step; `None` picks `eps^(1/3)` of the input dtype
    (about 6e-6 in float64), which balances truncation and round-off
    errors. The perturbation is `step * max(1, |x|_∞) / |v|_∞`. Accuracy is
    about `step²`, i.e. 1e-10 relative in float64 at best.
    """

    step: float | None = None

    name = "finite-differences"
    mode = "forward"
    primitives = frozenset({"pushforward"})

    def __post_init__(self):
        if self.step is not None and not (np.isfinite(self.step) and self.step > 0):
            raise ValueError(f"FiniteDifferences(step={self.step}): step must be a positive number")

    def asarray(self, x, like=None):
        return np.asarray(x, dtype=None if like is None else like.dtype)

    def value_and_pushforward(self, f, xs):
        xs = tuple(np.asarray(x) for x in xs)
        dtype = np.result_type(*xs)
        rel = self.step if self.step is not None else float(np.finfo(dtype).eps) ** (1 / 3)
        scale = max([1.0] + [float(np.max(np.abs(x), initial=0.0)) for x in xs])
        y = np.asarray(f(*xs))

        def pf(vs):
            vs = tuple(np.asarray(v) for v in vs)
            vmax = max(float(np.max(np.abs(v), initial=0.0)) for v in vs)
            if vmax == 0.0:
                return np.zeros_like(y)
            h = rel * scale / vmax
            plus = np.asarray(f(*(x + h * v for x, v in zip(xs, vs))))
            minus = np.asarray(f(*(x - h * v for x, v in zip(xs, vs))))
            return ((plus - minus) / (2 * h)).astype(y.dtype)

        return y, pf
