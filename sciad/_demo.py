"""`sciad demo`: one function differentiated by every installed engine, as a table."""

import numpy as np

import sciad.ad as ad


def rosenbrock(x):
    """Σ 100 (x_{i+1} - x_i²)² + (1 - x_i)², written once for every engine."""
    xp = ad.namespace(x)
    return xp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def rosenbrock_gradient(x):
    """The analytic gradient, for reference."""
    g = np.zeros_like(x)
    g[:-1] = -400.0 * x[:-1] * (x[1:] - x[:-1] ** 2) - 2.0 * (1.0 - x[:-1])
    g[1:] += 200.0 * (x[1:] - x[:-1] ** 2)
    return g


def main() -> None:
    x = np.linspace(-1.0, 1.5, 6)
    exact = rosenbrock_gradient(x)
    print(f"gradient of the Rosenbrock function at x = {np.round(x, 3).tolist()}")
    print(f"{'engine':<20} {'gradient[:3]':<44} {'max rel. error':>14}")
    for name in ad.BACKENDS:
        if name not in ad.available():
            print(f"{name:<20} not installed: pip install 'sciad[{ad.BACKENDS[name].extra}]'")
            continue
        b = ad.get(name)
        g = b.numpy(ad.gradient(b, rosenbrock, x))
        err = np.max(np.abs(g - exact)) / np.max(np.abs(exact))
        print(f"{name:<20} {np.array2string(g[:3], precision=8):<44} {err:>14.2e}")
