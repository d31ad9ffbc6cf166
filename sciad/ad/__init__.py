"""sciad.ad: one API over interchangeable AD engines.

Backends (small immutable values) implement one or two primitives
(pullback, pushforward), which they declare (`primitives`) with their
capabilities; every operator is derived from them. Arguments and
f's output may be PyTrees; results are structured as JAX's own transformations
structure them (`jax.jacobian`, `jax.hessian`):

    import sciad.ad as ad
    b = ad.get("torch")                       # or ad.JaxReverse(), ...
    ad.gradient(b, f, x); ad.hessian(b, f, x); ad.vjp(b, f, x, w)
    ad.jacobian(b, f, (u, p))                 # several arguments, each a PyTree
    g = ad.prepare(b, ad.gradient, f, x)      # trace/compile once
    h = ad.differentiate_with(f, "torch")     # torch derivatives inside JAX code
"""

from sciad.ad._autograd_backend import Autograd
from sciad.ad._backend import AbstractBackend
from sciad.ad._errors import MissingEngineError
from sciad.ad._finite_differences import FiniteDifferences
from sciad.ad._higher_order import HigherOrder
from sciad.ad._interop import custom_linear_rules, differentiate_with
from sciad.ad._jax_backends import Enzyme, JaxForward, JaxReverse, JaxTranspose
from sciad.ad._namespace import namespace
from sciad.ad._operators import (
    LazyHessian,
    LazyJacobian,
    derivative,
    gradient,
    hessian,
    hvp,
    jacobian,
    jvp,
    lazy_hessian,
    lazy_jacobian,
    prepare,
    pullback,
    pushforward,
    value_and_derivative,
    value_and_gradient,
    value_and_hessian,
    value_and_jacobian,
    value_and_jvp,
    value_and_vjp,
    value_gradient_and_hessian,
    vjp,
)
from sciad.ad._registry import BACKENDS, available, get
from sciad.ad._torch_backend import Torch

__all__ = [
    "AbstractBackend",
    "Autograd",
    "BACKENDS",
    "Enzyme",
    "FiniteDifferences",
    "HigherOrder",
    "JaxForward",
    "JaxReverse",
    "JaxTranspose",
    "LazyHessian",
    "LazyJacobian",
    "MissingEngineError",
    "Torch",
    "available",
    "custom_linear_rules",
    "derivative",
    "differentiate_with",
    "get",
    "gradient",
    "hessian",
    "hvp",
    "jacobian",
    "jvp",
    "lazy_hessian",
    "lazy_jacobian",
    "namespace",
    "prepare",
    "pullback",
    "pushforward",
    "value_and_derivative",
    "value_and_gradient",
    "value_and_hessian",
    "value_and_jacobian",
    "value_and_jvp",
    "value_and_vjp",
    "value_gradient_and_hessian",
    "vjp",
]
