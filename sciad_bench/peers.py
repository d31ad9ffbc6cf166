"""Peers timed in the same run: diffrax's own adjoints, torchdiffeq, `jax.experimental.ode` and diffsol-jax.

Same problem, same right-hand side, same tolerances; diffrax with sciad's
solver (Tsit5) or one named, the others with their Dormand–Prince 5(4) (`dopri5`),
diffsol-jax with the method named (Tsit45, BDF).
SUNDIALS (IDAS, CVODES) runs through CasADi: `casadi_call` wraps a CasADi
function's call.
"""

import contextlib
import dataclasses
import importlib.util
import io

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np

from sciad import get_solver
from sciad.adjoints import step_controller
from sciad.problems import Benchmark
from sciad_bench.harness import Combination


@contextlib.contextmanager
def _quiet():
    """CasADi prints a failing call's inputs and SUNDIALS' messages before it raises: kept off the progress lines."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def casadi_call(fn, p):
    """() -> fn(p), quiet, a failure raised as SUNDIALS' own last message (e.g. "IDASolveB returned ...")."""

    def call():
        with _quiet():
            try:
                return fn(p)
            except RuntimeError as e:
                raise RuntimeError(str(e).strip().splitlines()[-1].split(": ", 1)[-1]) from None

    return call


def _diffrax_objective(bench: Benchmark, adjoint):
    prob = bench.problem
    term = dfx.ODETerm(lambda t, u, p: prob.f(u, p, t))
    t0, t1 = prob.tspan

    def objective(p):
        u0 = jnp.asarray(prob.u0, p.dtype)
        solver = get_solver(bench.solver)
        sol = dfx.diffeqsolve(
            term,
            solver,
            t0,
            t1,
            None,
            u0,
            args=p,
            saveat=dfx.SaveAt(ts=jnp.asarray(bench.saveat, p.dtype)),
            stepsize_controller=step_controller(solver, bench.rtol, bench.atol),
            max_steps=bench.max_steps,
            adjoint=adjoint,
        )
        return bench.loss(sol.ys)

    return objective


def diffrax_peer(adjoint: str, solver: str | None = None) -> Combination:
    """`diffrax.diffeqsolve` with `adjoint` ("RecursiveCheckpointAdjoint", "BacksolveAdjoint"
    or "ForwardMode", the last differentiated by `jax.jacfwd`), with the benchmark's solver or
    `solver` (a name `sciad.get_solver` knows, e.g. "kvaerno5" where the benchmark's is "auto")."""

    def build(bench):
        bench = bench if solver is None else dataclasses.replace(bench, solver=solver)
        objective = _diffrax_objective(bench, getattr(dfx, adjoint)())
        return jax.jit(jax.jacfwd(objective) if adjoint == "ForwardMode" else jax.grad(objective))

    return Combination(f"diffrax {adjoint}" + (f" ({solver})" if solver else ""), "jax", build, kind="peer")


def diffsol_peer(method: str) -> Combination:
    """diffsol-jax's `ODEProblem.solve` with `method` ("tsit45", "bdf", ...), differentiated by `jax.grad`:
    the benchmark's f lowered to DiffSL and compiled by Cranelift when the gradient is built (its
    forward-sensitivity system, n(1 + m) states, when it is first traced), solved by diffsol (Rust) in
    an XLA custom call; u0 fixed, solved from t = 0."""

    def build(bench):
        from diffsol_jax import ODEProblem

        prob = bench.problem
        if float(prob.tspan[0]) != 0.0:
            raise ValueError(f"diffsol-jax solves from t = 0; {bench.name} starts at {prob.tspan[0]}")
        f, p0 = prob.f, jnp.asarray(prob.p)
        solver = ODEProblem(lambda t, u, p: f(u, p, t), jnp.asarray(prob.u0, p0.dtype), p0)
        ts = jnp.asarray(bench.saveat, p0.dtype)

        def objective(p):
            _, us = solver.solve(p, ts, ode_solver=method, rtol=bench.rtol, atol=bench.atol)
            return bench.loss(us)

        return jax.jit(jax.grad(objective))

    return Combination(f"diffsol-jax {method}", None, build, kind="peer")


def jax_odeint_peer() -> Combination:
    """`jax.experimental.ode.odeint` (dopri5, continuous adjoint by JAX reverse mode)."""

    def build(bench):
        from jax.experimental.ode import odeint

        prob = bench.problem

        def objective(p):
            ts = jnp.asarray(bench.saveat, p.dtype)
            us = odeint(
                lambda u, t, p: prob.f(u, p, t),
                jnp.asarray(prob.u0, p.dtype),
                ts,
                p,
                rtol=bench.rtol,
                atol=bench.atol,
                mxstep=100_000,
            )
            return bench.loss(us)

        return jax.jit(jax.grad(objective))

    return Combination("jax.experimental.ode odeint", "jax", build, kind="peer")


def torchdiffeq_peer(adjoint: bool) -> Combination:
    """torchdiffeq `odeint` (backpropagation through the solver) or `odeint_adjoint`, dopri5,
    in the benchmark's dtype, on the CPU."""

    def build(bench):
        import torch
        import torchdiffeq

        prob = bench.problem
        dtype = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}[np.dtype(prob.p.dtype)]

        class Rhs(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.p = torch.nn.Parameter(torch.zeros(prob.p.shape[0], dtype=dtype))

            def forward(self, t, u):
                return prob.f(u, self.p, t)

        rhs = Rhs()
        u0 = torch.as_tensor(np.asarray(prob.u0), dtype=dtype)
        ts = torch.as_tensor(bench.saveat, dtype=dtype)
        solve = torchdiffeq.odeint_adjoint if adjoint else torchdiffeq.odeint

        def grad(p):
            with torch.no_grad():
                rhs.p.copy_(torch.as_tensor(np.array(p), dtype=dtype))
            rhs.p.grad = None
            us = solve(rhs, u0, ts, rtol=bench.rtol, atol=bench.atol, method="dopri5")
            bench.loss(us).backward()
            return rhs.p.grad.numpy().copy()  # pyright: ignore[reportAttributeAccessIssue]  # torch's stubs

        return grad

    return Combination(f"torchdiffeq {'odeint_adjoint' if adjoint else 'odeint'}", "torch", build, kind="peer")


def peers(*, quick: bool = False) -> tuple[list[Combination], list[str]]:
    """The peers importable here (quick: without diffrax BacksolveAdjoint and torchdiffeq
    `odeint_adjoint`) and what was skipped and why."""
    combos = [diffrax_peer("RecursiveCheckpointAdjoint"), diffrax_peer("ForwardMode")]
    skipped = []
    if quick:
        skipped.append("diffrax BacksolveAdjoint (quick mode)")
    else:
        combos.append(diffrax_peer("BacksolveAdjoint"))
    if importlib.util.find_spec("jax.experimental.ode") is not None:
        combos.append(jax_odeint_peer())
    else:
        skipped.append("jax.experimental.ode odeint (not importable)")
    if importlib.util.find_spec("torchdiffeq") is None:
        skipped.append("torchdiffeq (not installed: pip install 'sciad[bench]')")
    elif quick:
        combos.append(torchdiffeq_peer(False))
        skipped.append("torchdiffeq odeint_adjoint (quick mode: seconds per gradient; torchdiffeq odeint stays)")
    else:
        combos += [torchdiffeq_peer(False), torchdiffeq_peer(True)]
    return combos, skipped
