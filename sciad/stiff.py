"""Newton steps of implicit stages without a dense Jacobian: a root finder for diffrax's implicit solvers.

diffrax's implicit Runge–Kutta solvers (Kvaerno, KenCarp) solve each stage's relation
z − h γ f(y + h γ z) = 0 with a chord method (`diffrax.VeryChord`): the Jacobian I − h γ ∂f/∂y is
formed once per step, densely (n Jacobian-vector products and an n × n LU), and reused for every
stage and iteration. That is the whole cost at thousands of states. `StageNewton` is the same chord
method with the Jacobian's linear solves done another way (its `jacobian`):

- `MatrixFree`: Newton–Krylov. The step's linearisation point is kept (arrays only) and each
  linear solve is GMRES on Jacobian-vector products of the stage relation there. Nothing of size
  n × n is formed. It serves any system the solver steps, including the adjoint systems that
  `sciad.adjoints` step backwards with the same solver.

    solver = diffrax.Kvaerno5(root_finder=sciad.stiff.StageNewton(sciad.stiff.MatrixFree()))

`stiff_solver(solver, jacobian)` does that for a solver or its name; `sciad.solve(...,
jacobian="matrix-free")` applies it.

Measured on `brusselator_pde(n)` (Kvaerno5, rtol = atol = 1e-6, t ≤ 1; one process, interleaved
rounds, medians; 2 cores shared with other jobs, load 4–5): forward solve 16×16 (512 states)
17.2 s dense, 2.2 s matrix-free; 24×24 (1,152) 49.3 s, 4.9 s; InterpolatingAdjoint gradient 16×16
48.8 s, 8.3 s (agreeing to 1e-7). Without a preconditioner GMRES does not keep up with the
diffusion's stiffness (h γ |λ_max| in the thousands) at 64×64: no solve within 15 minutes.
"""

from typing import Any, Callable

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import optimistix as optx

from sciad._diffrax_internals import use_stepsize_tol


class MatrixFree(eqx.Module):
    """(I − h γ J) x = b by restarted GMRES on Jacobian-vector products of the stage relation at the
    step's linearisation point: to `rtol` relative to |b| (max norm), in at most `max_steps`
    products, restarted every `restart`. An inexact solve only slows the chord iteration, which
    checks its own convergence; a failed one (out of products) rejects the step."""

    rtol: float = 1e-3
    restart: int = 50
    max_steps: int = 1000

    def linearise(self, fn, y, args):
        """The arrays of the linearisation point (y, args): the step's chord Jacobian."""
        return jax.lax.stop_gradient((y, eqx.filter(args, eqx.is_array)))

    def solve(self, state, fn, args, b, atol):
        """x with (∂fn/∂y at the linearisation point) x = b, and lineax's result: to `rtol` relative
        to max |b|, or `rtol` × `atol` (the root finder's absolute tolerance: a residual far below
        it moves no Newton iterate; b itself is roundoff at an adjoint's start, λ = 0)."""
        y, dynamic = state
        point = eqx.combine(dynamic, eqx.filter(args, eqx.is_array, inverse=True))
        operator = lx.JacobianLinearOperator(_NoAux(fn), y, point)
        # lineax's test is per entry, |r_i| ≤ atol + rtol |b_i|: relative to max |b| it is atol alone.
        atol = self.rtol * jnp.maximum(optx.max_norm(b), atol)
        gmres = lx.GMRES(rtol=0.0, atol=atol, restart=self.restart, max_steps=self.max_steps)
        sol = lx.linear_solve(operator, b, gmres, throw=False)
        # lineax calls a breakdown (an invariant Krylov space: the exact solution, in small systems)
        # outside its tolerance a failure when the iterate moved in the last restart cycle: the
        # residual itself decides.
        residual = optx.max_norm(jax.tree.map(jnp.subtract, b, operator.mv(sol.value)))
        return sol.value, lx.RESULTS.where(residual <= atol, lx.RESULTS.successful, sol.result)


class _NoAux(eqx.Module):
    fn: Callable

    def __call__(self, y, args):
        return self.fn(y, args)[0]


class _ChordState(eqx.Module):
    linearisation: Any
    diff: Any
    diffsize: jax.Array
    diffsize_prev: jax.Array
    result: optx.RESULTS
    step: jax.Array


class StageNewton(optx.AbstractRootFinder):
    """The chord method of `diffrax.VeryChord` (the Jacobian's linearisation point taken once per
    step, where the solver asks, and kept for every stage and iteration; the same convergence and
    divergence tests with `kappa`), its linear solves by `jacobian` (`MatrixFree`). `rtol`, `atol`
    and `norm` are the step-size controller's unless given."""

    jacobian: MatrixFree
    rtol: Any = use_stepsize_tol
    atol: Any = use_stepsize_tol
    norm: Any = use_stepsize_tol
    kappa: float = 1e-2

    def init(self, fn, y, args, options, f_struct, aux_struct, tags):
        if "init_state" in options:
            return options["init_state"]
        diff_dtype = jnp.result_type(*jax.tree.leaves(y))
        return _ChordState(self.jacobian.linearise(fn, y, args),
                           jax.tree.map(lambda x: jnp.full(x.shape, jnp.inf, x.dtype), y),
                           jnp.array(jnp.inf, diff_dtype), jnp.array(1.0, diff_dtype), optx.RESULTS.successful,
                           jnp.array(0))

    def step(self, fn, y, args, options, state, tags):
        fx, aux = fn(y, args)
        diff, result = self.jacobian.solve(state.linearisation, fn, args, fx, self.atol)
        new_y = jax.tree.map(lambda a, d: a - d, y, diff)
        with jax.numpy_dtype_promotion("standard"):
            scaled = jax.tree.map(lambda d, a: d / (self.atol + self.rtol * jnp.abs(a)), diff, new_y)
            diffsize = self.norm(scaled)
        new_state = _ChordState(state.linearisation, diff, diffsize, state.diffsize, optx.RESULTS.promote(result),
                                state.step + 1)
        return new_y, new_state, aux

    def terminate(self, fn, y, args, options, state, tags):
        at_least_two = state.step >= 2
        rate = state.diffsize / state.diffsize_prev
        factor = state.diffsize * rate / (1 - rate)
        small = state.diffsize < 10 ** (2 - jnp.finfo(state.diffsize.dtype).precision)
        diverged = ~jnp.isfinite(rate) | (rate > 2)
        converged = (factor > 0) & (factor < self.kappa)
        terminate = at_least_two & (small | diverged | converged)
        result = optx.RESULTS.where(at_least_two & ~small & (diverged | ~converged),
                                    optx.RESULTS.nonlinear_divergence, optx.RESULTS.successful)
        failed = state.result != optx.RESULTS.successful
        return failed | terminate, optx.RESULTS.where(failed, state.result, result)

    def postprocess(self, fn, y, aux, args, options, state, tags, result):
        return y, aux, {}


JACOBIANS = {"dense": None, "matrix-free": MatrixFree}


def stiff_solver(solver: dfx.AbstractSolver, jacobian) -> dfx.AbstractSolver:
    """`solver` with its implicit stages' linear solves by `jacobian`: "dense" (diffrax's own, the
    solver unchanged), "matrix-free" (`MatrixFree()`), or a `MatrixFree` instance. Explicit solvers
    have no stages to solve: any `jacobian` but "dense" is an error for them."""
    if isinstance(jacobian, str):
        if jacobian not in JACOBIANS:
            raise ValueError(f"unknown jacobian {jacobian!r}; choose one of {sorted(JACOBIANS)} or pass a "
                             "sciad.stiff.MatrixFree(...)")
        if JACOBIANS[jacobian] is None:
            return solver
        jacobian = JACOBIANS[jacobian]()
    if not isinstance(jacobian, MatrixFree):
        raise TypeError(f"jacobian must be one of {sorted(JACOBIANS)} or a sciad.stiff.MatrixFree, "
                        f"got {type(jacobian).__name__}")
    if not isinstance(solver, dfx.AbstractImplicitSolver):
        raise ValueError(f"jacobian={jacobian!r} needs an implicit solver (e.g. solver='kvaerno5'); "
                         f"{type(solver).__name__} is explicit and solves no linear systems")
    return eqx.tree_at(lambda s: s.root_finder, solver, StageNewton(jacobian))
