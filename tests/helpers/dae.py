"""The DAE problems the mass-matrix test modules share: a linear index-1 DAE with closed-form solution and
gradients, a rotation and mixing of it (a full singular M), and Robertson's kinetics with its conservation law
as the algebraic equation."""

import jax.numpy as jnp
import numpy as np

import sciad

TOL = dict(rtol=1e-9, atol=1e-11)
TS = np.array([0.0, 0.5, 1.0, 2.0])


# --- a linear index-1 DAE with a closed form -------------------------------------------------------
# x' = -a x + z, 0 = z - b x: x(t) = x0 e^{(b - a) t}, z = b x (z0 is solved from x0).


def linear(u, p, t):
    a, b = p
    return jnp.stack([-a * u[0] + u[1], u[1] - b * u[0]])


P0 = np.array([2.0, 0.5])


def exact(x0, p, ts=TS):
    a, b = p
    x = x0 * np.exp((b - a) * ts)
    return np.stack([x, b * x], -1)


def exact_gradients(x0, p, ts=TS):
    """∂/∂(x0, a, b) of L = Σ_t (x + 2 z) = Σ_t (1 + 2b) x."""
    a, b = p
    x = x0 * np.exp((b - a) * ts)
    return (np.sum((1 + 2 * b) * x / x0), np.sum(-(1 + 2 * b) * ts * x), np.sum(2 * x + (1 + 2 * b) * ts * x))


def linear_loss(us):
    return jnp.sum(us[:, 0] + 2 * us[:, 1])


def linear_problem(**kw):
    return sciad.ODEProblem(linear, np.array([1.5, 0.0]), (0.0, 2.0), P0, mass_matrix=np.array([1.0, 0.0]), **kw)


R = np.array([[1.0, 0.4], [-0.3, 1.2]])  # u = R w, w = (x, z) the linear DAE's states
R_INV = np.linalg.inv(R)
Q = np.array([[1.0, 2.0], [0.5, 1.5]])


def robertson(u, p, t):
    k1, k2, k3 = p
    return jnp.stack([-k1 * u[0] + k3 * u[1] * u[2], k1 * u[0] - k3 * u[1] * u[2] - k2 * u[1] ** 2, k2 * u[1] ** 2])


def robertson_dae(u, p, t):
    return robertson(u, p, t).at[2].set(u[0] + u[1] + u[2] - 1)


ROBERTSON_P = np.array([0.04, 3e7, 1e4])
ROBERTSON_TS = np.array([1e-2, 1.0, 10.0, 100.0, 1e3])
