"""`sciad bench large-stiff`: the 2-D Brusselator PDE on N × N grids (2N² states), rtol = atol = 1e-6,
t ≤ 1: forward solves and gradients of sciad (solver, jacobian and sensealg "auto": Rodas5P, one sparse
LU per step and no Newton iteration, and ForwardDiffSensitivity for its 3 parameters; Kvaerno5 with its
sparse and matrix-free Newton, and each stage strategy where it finishes; BDF with its sparse LU kept
across steps, its gradients through its steps by forward mode and DiscreteAdjoint) against diffrax's
default (Kvaerno5, a dense Newton), SciPy's `solve_ivp(method="BDF", jac_sparsity=...)` (forward only) and
SUNDIALS' CVODES through CasADi (BDF, Newton on CasADi's symbolic sparse Jacobian with its default sparse
QR, faster here than its "csparse" LU; forward, and the gradient by its adjoint
sensitivities: `jtimes(L, p, 1, True)`, CVODES' backward problem from checkpoints), checked against each
other, then timed in interleaved rounds in one process (`sciad.timing.compare`; at most `BUDGET` seconds
of rounds per call and size, one at least).

Each record: grid, states, what (forward, gradient), name, compile_s (the first call, compilation
included), median_s, times_s, rel_error against the reference (forward: SciPy's BDF, the
independent method; gradient: sciad's InterpolatingAdjoint on Kvaerno5's sparse Newton, another
solver and adjoint), steps (forward), factorisations and linear_solves of one call (the sparse Newton's host
LUs and solves: one solve per Newton iteration or Rosenbrock stage; SciPy's LUs), peak_bytes (XLA's buffers of the
compiled call) and factor_bytes (the most the host held in LU factors).
"""

import functools
import json
import pathlib
import time

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate

import sciad
from sciad.problems import brusselator_pde
from sciad.sparsity import jacobian_pattern
from sciad.stiff import LU_COUNTS
from sciad.timing import compare
from sciad_bench import plots
from sciad_bench.harness import peak_bytes
from sciad_bench.peers import casadi_call
from sciad_bench.tables import seconds

TOL = 1e-6
REFERENCE = "sciad InterpolatingAdjoint (Kvaerno5, sparse)"  # the gradients' reference: another solver and adjoint
GRIDS = {True: (16, 32, 64), False: (16, 24, 32, 64, 128)}
DENSE_UP_TO = 32  # N: a dense Newton beyond (8,192 states) forms a 512 MB Jacobian and an LU of ~0.4 TFLOP per step
MATRIX_FREE_UP_TO = 32  # N: unpreconditioned GMRES does not keep up with the diffusion beyond (docs: sciad.stiff)
DIFFRAX_GRADIENT_UP_TO = 24  # N: dense gradients (diffrax's ForwardMode, its fastest here) take minutes beyond
AGREEMENT = {"forward": 1e-3, "gradient": 1e-3}  # two methods at rtol = 1e-6: their errors, not ours


def _compiled(jitted, *args):
    """(the call of `jitted` on `args`, compiled once; XLA's peak bytes of it)."""
    compiled = jitted.lower(*args).compile()
    return functools.partial(compiled, *args), peak_bytes(compiled)


def sciad_forward(b, jacobian, solver="auto"):
    call, memory = _compiled(
        jax.jit(
            lambda p: (lambda sol: (sol.us, sol.stats["steps"]))(
                sciad.solve(b.problem, p=p, saveat=b.saveat, solver=solver, rtol=TOL, atol=TOL, jacobian=jacobian)
            )
        ),
        b.problem.p,
    )
    return lambda: (lambda us, steps: (us, int(steps)))(*call()), memory


def diffrax_forward(b):
    term = dfx.ODETerm(lambda t, u, p: b.problem.f(u, p, t))

    def solve(p):
        sol = dfx.diffeqsolve(
            term,
            dfx.Kvaerno5(),
            0.0,
            1.0,
            None,
            jnp.asarray(b.problem.u0),
            args=p,
            saveat=dfx.SaveAt(ts=jnp.asarray(b.saveat)),
            stepsize_controller=dfx.PIDController(rtol=TOL, atol=TOL),
            max_steps=4096,
        )
        return sol.ys, sol.stats["num_steps"]

    call, memory = _compiled(jax.jit(solve), b.problem.p)
    return lambda: (lambda ys, steps: (ys, int(steps)))(*call()), memory


def scipy_forward(b):
    """SciPy's BDF with the sparsity pattern `sciad.sparsity` detects, on f with NumPy arrays."""
    p = np.asarray(b.problem.p)
    u0 = np.asarray(b.problem.u0)
    pattern = jacobian_pattern(lambda u, p: b.problem.f(u, p, 0.0), jnp.asarray(u0), p).matrix

    def run():
        sol = scipy.integrate.solve_ivp(
            lambda t, u: b.problem.f(u, p, t),
            (0.0, 1.0),
            u0,
            method="BDF",
            t_eval=np.asarray(b.saveat),
            rtol=TOL,
            atol=TOL,
            jac_sparsity=pattern,
        )
        LU_COUNTS.add("factorisations", sol.nlu)  # BDF does not count its steps nor its solves
        return sol.y.T, None

    return run, None


CVODES = "CVODES (CasADi)"
CVODES_OPTIONS = {"abstol": TOL, "reltol": TOL, "max_num_steps": 100_000}
CVODES_UP_TO = 64  # N: forward (8,192 states: 10-30 s per call on 2 cores)
CVODES_GRADIENT_UP_TO = 64  # N: its adjoint took 13 s at 2,048 states and grows faster than the forward
BUDGET = 240.0  # seconds of timed rounds per size and call


def _casadi_brusselator(b):
    """The Brusselator PDE (`BrusselatorRHS`) as a CasADi ODE in symbolic p (3,): {"x", "p", "ode"}."""
    import casadi as ca

    rhs = b.problem.f
    n = rhs.n
    x, p = ca.SX.sym("x", 2 * n * n), ca.SX.sym("p", 3)
    flat = np.arange(n * n).reshape(n, n)
    neighbours = [np.roll(flat, shift, axis=axis).ravel().tolist() for shift in (1, -1) for axis in (0, 1)]

    def laplacian(w):
        return sum(w[k] for k in neighbours) - 4 * w

    u, v = x[: n * n], x[n * n :]
    alpha = p[2] / rhs.dx**2
    u2v = u * u * v
    return {
        "x": x,
        "p": p,
        "ode": ca.vertcat(p[1] + u2v - (p[0] + 1) * u + alpha * laplacian(u), p[0] * u - u2v + alpha * laplacian(v)),
    }


def _cvodes(b):
    """CVODES over the save times after t0 (its outputs (2n², T - 1)), and the parameters' symbol."""
    import casadi as ca

    ode = _casadi_brusselator(b)
    return ca.integrator("F", "cvodes", ode, 0.0, [float(t) for t in b.saveat[1:]], CVODES_OPTIONS), ode["p"]


def cvodes_forward(b):
    F, _ = _cvodes(b)
    u0 = np.asarray(b.problem.u0)
    solve = casadi_call(lambda p: F(x0=u0, p=p), np.asarray(b.problem.p))

    def run():
        out = solve()
        return np.vstack([u0, np.asarray(out["xf"]).T]), F.stats().get("nsteps")

    return run, None


def cvodes_gradient(b):
    """∂L/∂p by CVODES' adjoint sensitivities (the loss of the saves after t0: u0 does not depend on p)."""
    import casadi as ca

    F, _ = _cvodes(b)
    p = ca.MX.sym("p", 3)
    xf = F(x0=np.asarray(b.problem.u0), p=p)["xf"]
    loss = ca.sumsqr(xf) / xf.shape[0]  # `mean_square`: Σ over saves of the mean square over the states
    fn = ca.Function("gradient", [p], [ca.jtimes(loss, p, ca.DM.ones(1), True)])
    call = casadi_call(fn, np.asarray(b.problem.p))
    return (lambda: np.asarray(call()).ravel()), None


def sciad_gradient(b, sensealg, jacobian="auto", solver="auto"):
    def loss(p):
        return b.loss(
            sciad.solve(
                b.problem, p=p, saveat=b.saveat, solver=solver, rtol=TOL, atol=TOL, sensealg=sensealg, jacobian=jacobian
            ).us
        )

    return _compiled(jax.jit(jax.grad(loss)), b.problem.p)


def diffrax_gradient(b):
    term = dfx.ODETerm(lambda t, u, p: b.problem.f(u, p, t))

    def loss(p):
        sol = dfx.diffeqsolve(
            term,
            dfx.Kvaerno5(),
            0.0,
            1.0,
            None,
            jnp.asarray(b.problem.u0),
            args=p,
            saveat=dfx.SaveAt(ts=jnp.asarray(b.saveat)),
            stepsize_controller=dfx.PIDController(rtol=TOL, atol=TOL),
            adjoint=dfx.ForwardMode(),
        )
        return b.loss(sol.ys)

    return _compiled(jax.jit(jax.jacfwd(loss)), b.problem.p)  # ForwardMode: forward mode only


def forward_plan(n):
    plan = {
        "sciad auto (Rodas5P, sparse)": lambda b: sciad_forward(b, "auto"),
        "sciad Kvaerno5 (sparse)": lambda b: sciad_forward(b, "sparse", "kvaerno5"),
        "sciad BDF (sparse)": lambda b: sciad_forward(b, "sparse", "bdf"),
        "SciPy BDF (sparse)": scipy_forward,
    }
    if n <= CVODES_UP_TO:
        plan[CVODES] = cvodes_forward
    if n <= MATRIX_FREE_UP_TO:
        plan["sciad Kvaerno5 (matrix-free)"] = lambda b: sciad_forward(b, "matrix-free", "kvaerno5")
    if n <= DENSE_UP_TO:
        plan["sciad Rodas5P (dense)"] = lambda b: sciad_forward(b, "dense", "rodas5p")
        plan["diffrax Kvaerno5 (dense)"] = diffrax_forward
    return plan


def gradient_plan(n):
    plan = {
        "sciad auto (Rodas5P, sparse)": lambda b: sciad_gradient(b, "auto"),
        "sciad DiscreteAdjoint (Rodas5P, sparse)": lambda b: sciad_gradient(b, "DiscreteAdjoint", "sparse", "rodas5p"),
        "sciad GaussAdjoint (Rodas5P, sparse)": lambda b: sciad_gradient(b, "GaussAdjoint", "sparse", "rodas5p"),
        "sciad ForwardDiffSensitivity (BDF, sparse)": lambda b: sciad_gradient(
            b, "ForwardDiffSensitivity", "sparse", "bdf"
        ),
        "sciad DiscreteAdjoint (BDF, sparse)": lambda b: sciad_gradient(b, "DiscreteAdjoint", "sparse", "bdf"),
        REFERENCE: lambda b: sciad_gradient(b, "InterpolatingAdjoint", "sparse", "kvaerno5"),
    }
    if n <= CVODES_GRADIENT_UP_TO:
        plan[f"{CVODES} adjoint"] = cvodes_gradient  # pyright: ignore[reportArgumentType]  # inferred too narrow
    if n <= DIFFRAX_GRADIENT_UP_TO:  # each stage strategy under one sensealg; diffrax's fastest adjoint
        plan["sciad GaussAdjoint (Kvaerno5, matrix-free)"] = lambda b: sciad_gradient(
            b, "GaussAdjoint", "matrix-free", "kvaerno5"
        )
        plan["sciad GaussAdjoint (Rodas5P, dense)"] = lambda b: sciad_gradient(b, "GaussAdjoint", "dense", "rodas5p")
        plan["diffrax ForwardMode (dense)"] = diffrax_gradient
    return plan


def _measure(b, n, what, plan, reference, rounds, log):
    names = list(plan)
    steps, counts, memory = {}, {}, {}

    def build(name):
        call, memory[name] = plan[name](b)

        def counted():  # the output (forward: the saved states), with the steps and host LU work recorded aside
            LU_COUNTS.clear()
            out = call()
            counts[name] = LU_COUNTS.snapshot()
            if what == "gradient":
                return out
            us, steps[name] = out
            return us

        return counted

    builds = [functools.partial(build, name) for name in names]
    rows = compare(
        builds,
        builds[names.index(reference)],
        tolerance=AGREEMENT[what],
        rounds=rounds,
        slow_call=None,
        budget=BUDGET,
        on_compile=lambda i: log(f"  {what} N = {n}: compiling {names[i]}"),
    )
    return [
        {
            "grid": n,
            "states": 2 * n * n,
            "what": what,
            "name": name,
            "steps": steps.get(name),
            "factorisations": counts.get(name, {}).get("factorisations"),
            "linear_solves": counts.get(name, {}).get("solves"),
            "peak_bytes": memory.get(name),
            "factor_bytes": counts.get(name, {}).get("factor_bytes"),
            **row,
        }
        for name, row in zip(names, rows)
    ]


def run_large_stiff(
    *, quick: bool = False, repeats: int | None = None, out=None, verbose: bool = True, grids=None
) -> list[dict]:
    """Every grid of `grids` (default `GRIDS[quick]`), forward then gradient; records.json,
    large-stiff.png and table.md in `out` (default results/large-stiff)."""
    out = pathlib.Path(out or "results/large-stiff")
    rounds = repeats or (2 if quick else 5)
    log = print if verbose else (lambda *_: None)
    start = time.perf_counter()
    records = []
    for n in grids or GRIDS[quick]:
        b = brusselator_pde(n)
        records += _measure(b, n, "forward", forward_plan(n), "SciPy BDF (sparse)", rounds, log)
        records += _measure(b, n, "gradient", gradient_plan(n), REFERENCE, rounds, log)
        for r in records[-len(forward_plan(n)) - len(gradient_plan(n)) :]:
            log(
                f"  {r['what']:8s} {r['states']:6d} states  {r['name']:38s} "
                f"{seconds(r.get('median_s'))} (first {seconds(r.get('compile_s'))}) ok={r.get('ok')}"
            )
    table = write(records, out, quick)
    log(table)
    log(f"large-stiff: {len(records)} records in {time.perf_counter() - start:.0f} s -> {out}/")
    return records


def write(records, out, quick: bool) -> str:
    """records.json, large-stiff.png and table.md of `records` in `out`; the table."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "records.json").write_text(
        json.dumps({"experiment": "large-stiff", "quick": quick, "records": records}, indent=1, default=float)
    )
    lines = {(r["what"], r["name"]): [] for r in records}
    for r in records:
        if r.get("median_s") is not None:
            lines[(r["what"], r["name"])].append((r["states"], r["median_s"]))
    plots.panels_log_log(
        {
            what: {name: pts for (w, name), pts in lines.items() if w == what and pts}
            for what in ("forward", "gradient")
        },
        out / "large-stiff.png",
        f"2-D Brusselator, rtol = atol = {TOL:g}{' (quick)' if quick else ''}",
        xlabel="states",
        ylabel="seconds per call",
    )
    table = f"# large stiff problems{' (quick)' if quick else ''}\n\n{markdown(records)}"
    (out / "table.md").write_text(table)
    return table


def markdown(records) -> str:
    """One row per grid, call and method: median, first call, steps, LU factorisations and linear solves
    (Newton iterations) on the host, memory (XLA's peak + host LU factors), error against the reference,
    and the ratio of the fastest other method's median to sciad auto's."""
    rows = [
        "| states | call | method | median (s) | first call (s) | steps | LUs | linear solves | memory (MB) "
        "| rel. error | ok |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in records:
        megabytes = None if r.get("peak_bytes") is None else (r["peak_bytes"] + (r.get("factor_bytes") or 0)) / 1e6
        rows.append(
            f"| {r['states']} | {r['what']} | {r['name']} | {seconds(r.get('median_s'))} | "
            f"{seconds(r.get('compile_s'))} | {r.get('steps') or '–'} | {r.get('factorisations') or '–'} | "
            f"{r.get('linear_solves') or '–'} | {seconds(megabytes)} | "
            f"{'–' if r.get('rel_error') is None else format(r['rel_error'], '.1e')} | {r.get('ok')} |"
        )
    ratios = ["", "| states | call | fastest other | its median / sciad auto's |", "|---:|---|---|---:|"]
    for states, what in sorted({(r["states"], r["what"]) for r in records}):
        group = [r for r in records if (r["states"], r["what"]) == (states, what) and r.get("median_s")]
        auto = next((r for r in group if r["name"].startswith("sciad auto")), None)
        others = [r for r in group if not r["name"].startswith("sciad")]
        if auto and others:
            best = min(others, key=lambda r: r["median_s"])
            ratios.append(f"| {states} | {what} | {best['name']} | {best['median_s'] / auto['median_s']:.2f}× |")
    return "\n".join(rows + ratios) + "\n"
