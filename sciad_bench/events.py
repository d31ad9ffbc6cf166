"""`sciad bench events`: gradients through events, sciad against diffrax written as a loop of solves.

- multi-dose: a one-compartment pharmacokinetic fit, u' = -k u with 6 doses of D every 12 h, least
  squares on a concentration between doses, in (k, D). sciad: `PresetTimeCallback`; diffrax: one
  solve per dosing interval.
- bouncing ball: (h(T), v(T)) after three bounces, L = h² + v², in (h0, e). sciad:
  `ContinuousCallback` with a restitution affect; diffrax: one solve per flight, each stopped by an
  `Event` (Newton root find), the velocity flipped in between.
- integrate-and-fire: V' = (I - V) / τ, V -> 0 at V = 1; L = Σ (spike time - target)² of the first
  four spikes, in (I, τ). sciad: a resetting `ContinuousCallback`; diffrax: one solve per spike.
- spike times: an Izhikevich neuron (v' = 0.04 v² + 5 v + 140 - w + I, w' = a (b v - w); v -> c,
  w -> w + d at v = 30), L = Σ (spike time - target)² of the first three spikes on [0, 100] ms, in
  (a, b, c, d, I). sciad: a resetting `ContinuousCallback`; diffrax: one solve per spike.
- landing: a projectile with drag stops where it lands; L = (x_land - 10)², in (drag, v, angle).
  sciad: a terminating `ContinuousCallback`; diffrax: its terminating `Event`.

diffrax's loops know the number of events in advance (sciad finds them); each gradient is checked
against sciad's `DiscreteAdjoint` before timing (`sciad_bench.harness.run`), so a diffrax adjoint
whose event-time derivatives are wrong is reported as not correct rather than timed.
"""

import json
import pathlib
import time
from typing import Any

import diffrax as dfx
import jax.numpy as jnp
import numpy as np
import optimistix as optx

import sciad
from sciad import get_solver
from sciad.adjoints import engine_option, step_controller
from sciad_bench import plots, tables
from sciad_bench.harness import sciad_combination
from sciad_bench.losses import (
    ENGINES,
    QUICK_SENSEALGS,
    SENSEALGS,
    LossCase,
    auto_combination,
    diffrax_combination,
    ratio_table,
    time_cases,
)

DOSES = 12.0 * np.arange(6)
G = 9.81


def _diffrax_segment(vector_field, y0, args, t0, t1, adjoint, rtol, atol, cond=None):
    """(t_end, y(t_end)): one Tsit5 solve from t0 to t1, stopped where `cond(y)` crosses zero if given."""
    solver = get_solver("tsit5")
    # Newton to 1e-10: at 1e-12 it could stall in roundoff on a spike's steep upstroke (max_steps reached, now and
    # then), and 1e-10 is far below the gradient check's tolerance
    event = None if cond is None else dfx.Event(lambda t, y, args, **kw: cond(y), optx.Newton(1e-10, 1e-10))
    sol = dfx.diffeqsolve(
        dfx.ODETerm(vector_field),
        solver,
        t0,
        t1,
        None,
        y0,
        args=args,
        saveat=dfx.SaveAt(t1=True),
        stepsize_controller=step_controller(solver, rtol, atol),
        max_steps=4096,
        adjoint=adjoint,
        event=event,
    )
    return sol.ts[-1], sol.ys[-1]  # pyright: ignore[reportOptionalSubscript]  # saved: not None


def multi_dose() -> LossCase:
    prob = sciad.ODEProblem(lambda u, p, t: -p[0] * u, np.array([0.0]), (0.0, 72.0), np.array([0.2]))
    saves = DOSES + 6.0
    data = np.array([sum(10.0 * np.exp(-0.15 * (t - d)) for d in DOSES if d <= t) for t in saves])

    def sciad_loss(x, sensealg, rtol, atol):
        dose = sciad.PresetTimeCallback(times=DOSES, affect=lambda u, p, t: u + x[1])
        sol = sciad.solve(
            prob, p=x[:1], saveat=saves, callbacks=[dose], solver="tsit5", rtol=rtol, atol=atol, sensealg=sensealg
        )
        return jnp.sum((sol.us[:, 0] - data) ** 2)

    def diffrax_loss(x, adjoint, rtol, atol):
        u, loss = jnp.zeros(1, x.dtype), 0.0
        for i, t in enumerate(DOSES):
            _, u = _diffrax_segment(lambda t, u, k: -k * u, u + x[1], x[:1], t, t + 6.0, adjoint, rtol, atol)
            loss = loss + (u[0] - data[i]) ** 2
            _, u = _diffrax_segment(lambda t, u, k: -k * u, u, x[:1], t + 6.0, t + 12.0, adjoint, rtol, atol)
        return loss

    return LossCase("multi-dose", np.array([0.2, 8.0]), 1, sciad_loss, diffrax_loss)


def _falling_height(u):
    """The height while falling, positive while rising: a flight that starts on the floor (h a rounding error
    below zero, v > 0) is not stopped at once, as it is with h alone under some of XLA's optimisations."""
    return jnp.where(u[1] < 0, u[0], jnp.abs(u[0]) + 1.0)


def bouncing_ball(bounces: int = 3) -> LossCase:
    """(h(2)² + v(2)²) in (h0, e) after `bounces` bounces (0: the same solve without its event). Each
    call makes its own vector field, as after an edit (the first-gradient suite times fresh functions)."""

    def fall(u, p, t):
        return jnp.stack([u[1], -G + 0.0 * u[1]])

    prob = sciad.ODEProblem(fall, np.array([1.0, 0.0]), (0.0, 2.0))

    def sciad_loss(x, sensealg, rtol, atol):
        bounce = sciad.ContinuousCallback(lambda u, p, t: u[0], lambda u, p, t: jnp.stack([u[0], -x[1] * u[1]]), "down")
        events: dict[str, Any] = dict(callbacks=[bounce], max_events=bounces + 1) if bounces else {}
        sol = sciad.solve(
            prob, u0=jnp.stack([x[0], 0.0 * x[0]]), solver="tsit5", rtol=rtol, atol=atol, sensealg=sensealg, **events
        )
        return jnp.sum(sol.us[-1] ** 2)

    def diffrax_loss(x, adjoint, rtol, atol):
        t, u = 0.0, jnp.stack([x[0], 0.0 * x[0]])
        for _ in range(bounces):
            t, u = _diffrax_segment(
                lambda t, u, p: fall(u, p, t), u, None, t, 2.0, adjoint, rtol, atol, cond=_falling_height
            )
            u = jnp.stack([u[0], -x[1] * u[1]])
        _, u = _diffrax_segment(lambda t, u, p: fall(u, p, t), u, None, t, 2.0, adjoint, rtol, atol)
        return jnp.sum(u**2)

    return LossCase("bouncing ball", np.array([1.0, 0.9]), 2, sciad_loss, diffrax_loss)


def integrate_and_fire() -> LossCase:
    prob = sciad.ODEProblem(lambda u, p, t: (p[0] - u) / p[1], np.array([0.0]), (0.0, 3.0), np.array([1.5, 0.5]))
    targets = np.array([0.5, 1.0, 1.5, 2.0])

    def sciad_loss(x, sensealg, rtol, atol):
        spike = sciad.ContinuousCallback(lambda u, p, t: u[0] - 1.0, lambda u, p, t: jnp.zeros_like(u), "up")
        sol = sciad.solve(
            prob, p=x, callbacks=[spike], solver="tsit5", rtol=rtol, atol=atol, sensealg=sensealg, max_events=8
        )
        return jnp.sum((sol.event_times[0][:4] - targets) ** 2)  # pyright: ignore[reportOptionalSubscript]  # callbacks: set

    def diffrax_loss(x, adjoint, rtol, atol):
        t, u, loss = 0.0, jnp.zeros(1, x.dtype), 0.0
        for target in targets:
            t, u = _diffrax_segment(
                lambda t, u, p: (p[0] - u) / p[1], u, x, t, 3.0, adjoint, rtol, atol, cond=lambda u: u[0] - 1.0
            )
            loss, u = loss + (t - target) ** 2, jnp.zeros_like(u)
        return loss

    return LossCase("integrate-and-fire", np.array([1.5, 0.5]), 1, sciad_loss, diffrax_loss)


def _izhikevich(u, p, t):
    a, b, _, _, current = p
    return jnp.stack([0.04 * u[0] ** 2 + 5.0 * u[0] + 140.0 - u[1] + current, a * (b * u[0] - u[1])])


def _spike_reset(u, p, t):
    return jnp.stack([p[2] + 0.0 * u[0], u[1] + p[3]])


def spike_times() -> LossCase:
    prob = sciad.ODEProblem(
        _izhikevich, np.array([-65.0, -13.0]), (0.0, 100.0), np.array([0.02, 0.2, -65.0, 8.0, 10.0])
    )
    targets = np.array([3.0, 25.0, 70.0])

    def sciad_loss(x, sensealg, rtol, atol):
        spike = sciad.ContinuousCallback(lambda u, p, t: u[0] - 30.0, _spike_reset, "up")
        sol = sciad.solve(
            prob, p=x, callbacks=[spike], solver="tsit5", rtol=rtol, atol=atol, sensealg=sensealg, max_events=4
        )
        return jnp.sum((sol.event_times[0][:3] - targets) ** 2)  # pyright: ignore[reportOptionalSubscript]  # callbacks: set

    def diffrax_loss(x, adjoint, rtol, atol):
        t, u, loss = 0.0, jnp.asarray(prob.u0, x.dtype), 0.0
        for target in targets:
            t, u = _diffrax_segment(
                lambda t, u, p: _izhikevich(u, p, t), u, x, t, 100.0, adjoint, rtol, atol, cond=lambda u: u[0] - 30.0
            )
            loss, u = loss + (t - target) ** 2, _spike_reset(u, x, t)
        return loss

    # Spike times amplify a continuous adjoint's error: InterpolatingAdjoint errs by 2.4e-6 and GaussAdjoint by
    # 1.7e-6 at rtol 1e-8 (DiscreteAdjoint 2.3e-7), past the harness's 100 × rtol.
    return LossCase(
        "spike times",
        np.array([0.02, 0.2, -65.0, 8.0, 10.0]),
        2,
        sciad_loss,
        diffrax_loss,
        rtol=1e-8,
        atol=1e-8,
        tolerance=1e-5,
    )


def _drag(u, p, t):
    speed = jnp.sqrt(u[2] ** 2 + u[3] ** 2)
    return jnp.stack([u[2], u[3], -p[0] * speed * u[2], -G - p[0] * speed * u[3]])


def landing() -> LossCase:
    prob = sciad.ODEProblem(_drag, np.array([0.0, 0.0, 7.0, 7.0]), (0.0, 10.0), np.array([0.05]))

    def launch(x):
        return jnp.stack([0.0 * x[1], 0.0 * x[1], x[1] * jnp.cos(x[2]), x[1] * jnp.sin(x[2])])

    def sciad_loss(x, sensealg, rtol, atol):
        lands = sciad.ContinuousCallback(condition=lambda u, p, t: u[1], affect=None, direction="down")
        sol = sciad.solve(
            prob, u0=launch(x), p=x[:1], callbacks=[lands], solver="tsit5", rtol=rtol, atol=atol, sensealg=sensealg
        )
        return (sol.us[-1, 0] - 10.0) ** 2

    def diffrax_loss(x, adjoint, rtol, atol):
        # from just after the launch, where the height is already positive (diffrax's event would fire at t0)
        _, u = _diffrax_segment(lambda t, u, p: _drag(u, p, t), launch(x), x[:1], 0.0, 0.1, adjoint, rtol, atol)
        _, u = _diffrax_segment(
            lambda t, u, p: _drag(u, p, t), u, x[:1], 0.1, 10.0, adjoint, rtol, atol, cond=lambda u: u[1]
        )
        return (u[0] - 10.0) ** 2

    return LossCase("landing", np.array([0.05, 11.0, 0.8]), 4, sciad_loss, diffrax_loss)


def plan(quick: bool) -> list:
    sensealgs = QUICK_SENSEALGS if quick else SENSEALGS
    combos = [auto_combination()] + [sciad_combination(s, ENGINES[engine_option(s)]) for s in sensealgs]
    peers = [diffrax_combination(a) for a in ("RecursiveCheckpointAdjoint", "ForwardMode")]
    cases = [multi_dose(), bouncing_ball(), integrate_and_fire(), spike_times(), landing()]
    return [(case, combos + peers) for case in cases]


def run_events(*, quick: bool = False, repeats: int | None = None, out=None, verbose: bool = True) -> list[dict]:
    """Run the cases, write records.json, events.png and table.md to `out` (default results/events)."""
    out = pathlib.Path(out or "results/events")
    start = time.perf_counter()
    records = time_cases(plan(quick), quick=quick, repeats=repeats)
    out.mkdir(parents=True, exist_ok=True)
    (out / "records.json").write_text(
        json.dumps({"experiment": "events", "quick": quick, "records": records}, indent=1)
    )
    plots.violin_plot(
        records, out / "events.png", f"events{' (quick)' if quick else ''}: gradient time, {records[0]['device']}"
    )
    table = f"# events{' (quick)' if quick else ''}\n\n{ratio_table(records)}\n{tables.markdown_table(records)}"
    (out / "table.md").write_text(table)
    if verbose:
        print(table)
        print(f"events: {len(records)} records in {time.perf_counter() - start:.0f} s -> {out}/")
    return records
