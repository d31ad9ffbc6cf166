"""Ensemble throughput (`sciad bench ensemble`): gradients per second against batch size and device
count, on Lotka–Volterra and the spiral.

A batch of B parameter sets (the problem's p, each entry perturbed by up to ±10 %) is
differentiated, with the sensealg `sensealg="auto"` picks, in four ways timed side by side in
interleaved rounds: a Python loop over one jitted gradient per member ("loop"); one jitted gradient
of the vmapped batch on one device ("vmap", `sciad.ensemble`); the batch sharded over d devices by
`sciad.ensemble(..., mesh=...)` ("sharded": XLA partitions one batched loop, so devices step
together); and one batched loop per device, `jax.shard_map` around an unsharded ensemble
("shard_map"). Every batched gradient is checked against the loop's before it is timed.
"""

import json
import os
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import sciad
from sciad.adjoints import describe
from sciad.errors import summary
from sciad.problems import lotka_volterra, spiral_node
from sciad.timing import interleaved, timed
from sciad_bench.harness import Progress, device_name

DEVICE_FLAG = "--xla_force_host_platform_device_count"
METHODS = ("loop", "vmap", "sharded", "shard_map")


def simulate_cpu_devices(count: int) -> None:
    """Have JAX's CPU backend show `count` devices (XLA's host device count flag). Works only before
    JAX starts its backends (the first device query or computation); a clear error otherwise."""
    if count < 1:
        raise ValueError(f"--devices must be at least 1, got {count}")
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_FLAG)]
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"{DEVICE_FLAG}={count}"])
    if jax.default_backend() != "cpu":
        raise ValueError(
            f"--devices simulates CPU devices, but JAX runs on {jax.default_backend()} here "
            f"({jax.device_count()} devices): leave --devices out"
        )
    if jax.device_count() != count:
        raise ValueError(
            f"--devices {count}: JAX had already started with {jax.device_count()} CPU devices; "
            f"start Python with XLA_FLAGS={DEVICE_FLAG}={count} instead"
        )


def members(bench, batch: int, seed: int = 0) -> np.ndarray:
    """(batch, m) parameter sets: the problem's p with each entry scaled by a factor in [0.9, 1.1]."""
    p = np.asarray(bench.problem.p)
    factors = 1 + 0.1 * np.random.default_rng(seed).uniform(-1, 1, (batch, p.size))
    return (p * factors).astype(p.dtype)


def _mesh(count: int):
    return jax.make_mesh((count,), ("batch",), axis_types=(AxisType.Auto,), devices=jax.devices()[:count])


def gradient(bench, sensealg, method: str, count: int):
    """The batched gradient `ps (B, m) -> (B, m)` of `method` on `count` devices (jitted), and how
    to place its input."""
    options = dict(
        saveat=bench.saveat,
        solver=bench.solver,
        rtol=bench.rtol,
        atol=bench.atol,
        max_steps=bench.max_steps,
        sensealg=sensealg,
    )

    def losses(ps, mesh=None):  # (B,) member losses
        return jax.vmap(bench.loss)(sciad.ensemble(bench.problem, ps=ps, mesh=mesh, **options).us)

    if method == "loop":
        one = jax.jit(jax.grad(lambda p: bench.objective(p, sensealg)))
        return (lambda rows: [one(p) for p in rows]), lambda ps: list(jnp.asarray(ps))
    if method == "vmap":
        return jax.jit(jax.grad(lambda ps: losses(ps).sum())), jnp.asarray
    mesh = _mesh(count)
    place = lambda ps: jax.device_put(ps, NamedSharding(mesh, PartitionSpec("batch")))  # noqa: E731
    if method == "sharded":
        return jax.jit(jax.grad(lambda ps: losses(ps, mesh).sum())), place
    per_device = jax.shard_map(
        losses, mesh=mesh, in_specs=PartitionSpec("batch"), out_specs=PartitionSpec("batch"), check_vma=False
    )
    return jax.jit(jax.grad(lambda ps: per_device(ps).sum())), place


def configurations(batch: int, counts: list[int], *, largest: bool, quick: bool) -> list[tuple[str, int]]:
    """(method, devices) pairs timed at `batch`: the loop and vmap on one device; sharded and
    shard_map on each count > 1 dividing the batch (quick: at the largest batch only)."""
    configs = [("loop", 1), ("vmap", 1)]
    if largest or not quick:
        configs += [(m, d) for d in counts if d > 1 and batch % d == 0 for m in ("sharded", "shard_map")]
    return configs


def measure(bench, batch: int, configs, *, repeats: int, progress: Progress) -> list[dict]:
    """Records of `configs` at `batch`: compiled, checked against the loop (relative error within
    100 × the benchmark's rtol), then timed together in `repeats` interleaved rounds."""
    sensealg = sciad.select_sensealg(
        bench.problem,
        saveat=bench.saveat,
        solver=bench.solver,
        rtol=bench.rtol,
        atol=bench.atol,
        max_steps=bench.max_steps,
    ).sensealg
    ps = members(bench, batch)
    records, calls, reference = [], [], None
    for method, count in configs:
        progress.step(f"{bench.name} B={batch}: {method} ×{count} (compiling)")
        record = {
            "problem": bench.name,
            "size": bench.size,
            "sensealg": describe(sensealg),
            "batch": batch,
            "method": method,
            "devices": count,
            "device": device_name(jax.devices()[0]),
            "times": [],
            "median_s": None,
            "grads_per_s": None,
            "compile_time": None,
            "rel_error": None,
            "ok": False,
            "error": None,
        }
        try:
            fn, place = gradient(bench, sensealg, method, count)
            x = place(ps)
            out, record["compile_time"] = timed(lambda: fn(x))
            out = np.stack([np.asarray(g) for g in out]) if method == "loop" else np.asarray(out)
            reference = out if method == "loop" else reference
            if reference is None:
                raise RuntimeError("no reference to check against: the loop failed")
            record["rel_error"] = float(np.linalg.norm(out - reference) / np.linalg.norm(reference))
            record["ok"] = bool(np.isfinite(record["rel_error"]) and record["rel_error"] <= 100 * bench.rtol)
            if record["ok"]:
                calls.append((record, lambda fn=fn, x=x: fn(x)))
            else:
                record["error"] = f"gradient off: relative error {record['rel_error']:.2e}"
        except Exception as e:  # a method that cannot run is reported, not fatal
            record["error"] = f"{type(e).__name__}: {summary(e)[:300]}"
        records.append(record)
    interleaved([call for _, call in calls], rounds=1)  # warm-up
    times = interleaved(
        [call for _, call in calls],
        rounds=repeats,
        on_round=lambda i: progress.show(f"{bench.name} B={batch}: timing ({repeats} rounds)", f"round {i + 1}"),
    )
    for (record, _), t in zip(calls, times):
        record["times"], record["median_s"] = t, float(np.median(t))
        record["grads_per_s"] = batch / record["median_s"]
    return records


def label(record: dict) -> str:
    return record["method"] if record["devices"] == 1 else f"{record['method']} ×{record['devices']}"


def labels(records: list[dict]) -> list[str]:
    """Every record's label, by method (as in METHODS), then device count."""
    return sorted(
        {label(r) for r in records}, key=lambda c: (METHODS.index(c.split(" ×")[0]), int(c.partition("×")[2] or 1))
    )


def table(records: list[dict]) -> str:
    """Gradients per second per problem and batch (columns: loop, vmap, sharded ×d, shard_map ×d)
    and the best batched method's speed-up over the loop."""
    columns = labels(records)
    lines = [
        "| problem (sensealg) | batch | " + " | ".join(f"{c} (grads/s)" for c in columns) + " | best / loop |",
        "|---|---|" + "---|" * (len(columns) + 1),
    ]
    groups = {}
    for r in records:
        groups.setdefault((r["problem"], r["sensealg"], r["batch"]), {})[label(r)] = r
    for (problem, sensealg, batch), row in groups.items():
        cells = []
        for c in columns:
            r = row.get(c)
            cells.append(
                ""
                if r is None
                else f"{r['grads_per_s']:.4g}"
                if r["ok"]
                else "wrong"
                if r["error"] and r["error"].startswith("gradient off")
                else "failed"
            )
        rates = [r["grads_per_s"] for c, r in row.items() if r["ok"] and c != "loop"]
        loop = row.get("loop")
        ratio = f"{max(rates) / loop['grads_per_s']:.2f}" if rates and loop and loop["ok"] else ""
        lines.append(f"| {problem} ({sensealg}) | {batch} | " + " | ".join(cells) + f" | {ratio} |")
    failures = sorted({f"{label(r)} on {r['problem']}: {r['error']}" for r in records if r["error"]})
    return "\n".join(lines) + "\n" + "".join(f"\n- {f}" for f in failures) + ("\n" if failures else "")


def plot(records: list[dict], path: pathlib.Path, title: str) -> None:
    """Gradients per second against batch size (log–log), one panel per problem, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    problems = sorted({r["problem"] for r in records})
    colors = {name: f"C{i}" for i, name in enumerate(labels(records))}
    fig, axes = plt.subplots(1, len(problems), figsize=(6 * len(problems), 4.5), squeeze=False)
    for ax, problem in zip(axes[0], problems):
        for name in colors:
            points = sorted(
                (r["batch"], r["grads_per_s"])
                for r in records
                if r["problem"] == problem and r["ok"] and label(r) == name
            )
            if points:
                ax.plot(*zip(*points), "--" if name == "loop" else "-", marker="o", color=colors[name], label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size (members)")
        ax.set_ylabel("gradients per second")
        ax.set_title(f"{title}: {problem}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_ensemble(
    *, quick: bool = False, repeats: int | None = None, devices: int | None = None, out=None, benches=None, batches=None
) -> list[dict]:
    """Measure every problem (default Lotka–Volterra and the spiral) at every batch size (quick 8, 64;
    full 1 to 1024) on 1 and all of JAX's devices (full: powers of two between); `devices`
    simulates that many CPU devices first. Writes records.json, table.md and ensemble.png to `out`
    (default results/ensemble) and prints the table."""
    if repeats is not None and repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    if devices is not None:
        simulate_cpu_devices(devices)
    out = pathlib.Path(out or "results/ensemble")
    out.mkdir(parents=True, exist_ok=True)
    repeats = repeats or (3 if quick else 10)
    benches = benches or [lotka_volterra(), spiral_node()]
    batches = batches or ((8, 64) if quick else (1, 8, 64, 256, 1024))
    n = jax.device_count()
    counts = sorted({1, n} | (set() if quick else {2**k for k in range(n.bit_length()) if 2**k <= n}))
    plan = [
        (bench, b, configurations(b, counts, largest=b == max(batches), quick=quick))
        for bench in benches
        for b in batches
    ]
    progress = Progress(sum(len(c) for _, _, c in plan))
    start = time.perf_counter()
    records = []
    for bench, batch, configs in plan:
        records += measure(bench, batch, configs, repeats=repeats, progress=progress)
    progress.close()
    device = device_name(jax.devices()[0])
    (out / "records.json").write_text(
        json.dumps(
            {"experiment": "ensemble", "quick": quick, "devices": n, "device": device, "records": records}, indent=1
        )
    )
    title = f"ensemble{' (quick)' if quick else ''}, {n} × {device}"
    md = f"# {title}: gradients per second\n\n" + table(records)
    (out / "table.md").write_text(md)
    plot(records, out / "ensemble.png", title)
    print(md)
    print(f"ensemble: {len(records)} records in {time.perf_counter() - start:.0f} s -> {out}/")
    return records
