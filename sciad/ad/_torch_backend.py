"""PyTorch autograd: operator overloading on a dynamic tape."""

import dataclasses

import numpy as np

from sciad.ad._backend import AbstractBackend, AbstractHostBackend, check_scalar


@dataclasses.dataclass(frozen=True)
class Torch(AbstractHostBackend):
    """PyTorch reverse mode (`torch.autograd.grad`), the paper's tape-based
    ReverseDiff/Tracker. Value-dependent branches are fine: the tape is
    rebuilt at every call. Nests with itself for Hessians. Under `jax.vmap` a
    host callback's whole batch runs in one `torch.func.vmap`. `gradient` is one
    `torch.autograd.grad` call (no retained graph), within a few percent of
    calling torch directly (`experiments/overhead.py`)."""

    name = "torch"
    mode = "reverse"
    primitives = frozenset({"pullback"})
    package = "torch"
    extra = "torch"

    def asarray(self, x, like=None):
        import torch

        if like is not None:
            return torch.as_tensor(x, dtype=like.dtype, device=like.device)
        if isinstance(x, torch.Tensor):
            return x
        return torch.from_numpy(np.array(x))

    def numpy(self, y):
        return y.detach().cpu().numpy()

    def value_and_gradient(self, f, xs):
        """One backward pass with an implicit seed and no retained graph.

        Written as plain loops: on small functions every generator or context
        manager here shows up as a percent over calling torch directly.
        """
        import torch

        grad_enabled = torch.is_grad_enabled()
        leaves = []
        for x in xs:
            if grad_enabled and x.requires_grad:  # nested: keep the graph
                return super().value_and_gradient(f, xs)
            leaves.append(x.detach().requires_grad_(True))
        if grad_enabled:
            y = f(*leaves)
        else:
            with torch.enable_grad():
                y = f(*leaves)
        if y.ndim:
            check_scalar(y)
        grads = torch.autograd.grad(y, leaves, allow_unused=True)
        for g in grads:
            if g is None:  # an input f does not use
                grads = tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves))
                break
        return y.detach(), grads

    def value_and_pullback(self, f, xs):
        import torch

        # Inside an outer torch differentiation (Hessians) keep the graph.
        nested = torch.is_grad_enabled() and any(x.requires_grad for x in xs)
        if not nested:
            xs = tuple(x.detach().requires_grad_(True) for x in xs)
        with torch.enable_grad():
            y = f(*xs)

        def pb(w):
            grads = torch.autograd.grad(y, xs, w, retain_graph=True, create_graph=nested, allow_unused=True)
            return tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, xs))

        return (y if nested else y.detach()), pb

    def map_batch(self, product, args, batched):
        """The whole batch in one `torch.func.vmap` of `product` on `torch.func.vjp`/`jvp`
        (the tape-based primitives above cannot run under it). A function `torch.func.vmap`
        cannot batch (a value-dependent branch, `.item()`, NumPy) runs member by member instead."""
        import torch

        functional, in_dims = _Functional(), tuple(0 if b else None for b in batched)
        try:
            return torch.func.vmap(lambda *member: product(functional, *member), in_dims=in_dims)(*args)
        except RuntimeError:  # what torch.func.vmap cannot batch; a real error in f raises again in the loop
            return super().map_batch(product, args, batched)


@dataclasses.dataclass(frozen=True)
class _Functional(Torch):
    """Torch's primitives as `torch.func` transforms, which compose with `torch.func.vmap`."""

    primitives = frozenset({"pullback", "pushforward"})
    value_and_gradient = AbstractBackend.value_and_gradient  # the pullback of 1, not a tape

    def value_and_pullback(self, f, xs):
        import torch

        return torch.func.vjp(f, *xs)

    def value_and_pushforward(self, f, xs):
        import torch

        return f(*xs), lambda vs: torch.func.jvp(f, tuple(xs), tuple(vs))[1]
