"""BacksolveAdjoint's self-check, calibrated on one corpus and tested on another.

For every case of the calibration corpus (tests/helpers/backsolve_corpus.py) and of the held-out corpus
(tests/helpers/backsolve_heldout.py) this runs BacksolveAdjoint(on_instability="warn") and records

- the drift per forward step: the quantity the check compares to `drift_tolerance` (read where the
  check hands it to `warn_if`), and the same signal as it was measured before the held-out corpus
  (`old_drift`: in tolerances atol + rtol |u| at the interval's start alone; its limit was OLD_LIMIT),
- the backward steps per forward step: the most attempted backward steps one interval between
  breakpoints took, over the forward solve's accepted steps + 8 (what the check compares to
  `BACKWARD_STEPS`),
- the gradient's relative error against a tight reference, InterpolatingAdjoint's error at the
  case's solver and tolerances (`own`), and whether that makes the gradient right
  (`backsolve_corpus.right`),

then prints each corpus's margins: the largest drift over the right gradients and the smallest over
the wrong ones (and the backward steps), and which gradients the check refuses wrongly. The
gradient is taken with no drift limit and a budget of STEP_CAP backward steps per forward step, so
that every interval is solved and the gradient the check judges is the one it would return.

    .venv/bin/python experiments/backsolve_calibration.py [calibration] [heldout] [-k substring]

The calibration corpus is what the limits are set on; the held-out corpus is only looked at. Both
take about 10 minutes on 2 cores; the margins are quoted at DRIFT_TOLERANCE in
sciad/adjoints/_continuous.py.
"""

import argparse
import importlib
import pathlib
import sys
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import sciad  # noqa: E402
import sciad.adjoints._continuous as continuous  # noqa: E402
import sciad.adjoints._stepping as stepping  # noqa: E402
from helpers.backsolve_corpus import breakpoints, gradient, own, reference, relative_error, right  # noqa: E402

STEP_CAP = 50  # backward steps per forward step measured at most
CORPORA = {"calibration": "helpers.backsolve_corpus", "heldout": "helpers.backsolve_heldout"}


def old_drift(setup, u_back, u_at, u_from, steps):
    """The drift as measured before: in tolerances at the interval's start alone, per forward step."""
    rtol, atol = setup.adjoint_tolerances
    return jnp.sqrt(jnp.mean(((u_back - u_at) / (atol + rtol * jnp.abs(u_at))) ** 2)) / jnp.maximum(steps, 1)


class Probe:
    """Reads the check's signals from a BacksolveAdjoint gradient: the drift it hands `warn_if`, the
    old measure of every interval, and the start times of the attempted backward steps."""

    def __init__(self):
        self.drifts, self.old, self.steps = [], [], []
        self.saved = continuous.warn_if, continuous.Backsolved.drift, stepping.Stepper.step
        warn_if, drift, step = self.saved

        def record(values, x):
            return jax.pure_callback(
                lambda v: (values.append(float(v)), np.zeros((), v.dtype))[1], jax.ShapeDtypeStruct((), x.dtype), x
            )

        def probed_warn_if(x, pred, message, value):
            token = record(self.drifts, value)
            return warn_if(jax.tree.map(lambda leaf: leaf + token.astype(leaf.dtype), x), pred, message, value)

        def probed_drift(setup, u_back, u_at, u_from, steps):
            new = drift(setup, u_back, u_at, u_from, steps)
            return new + record(self.old, old_drift(setup, u_back, u_at, u_from, steps))

        def probed_step(stepper, t0, *rest):
            jax.debug.callback(lambda s: self.steps.append(-float(s)), t0)  # backwards: s = -t
            return step(stepper, t0, *rest)

        self.patches = probed_warn_if, staticmethod(probed_drift), probed_step

    def __enter__(self):
        continuous.warn_if, continuous.Backsolved.drift, stepping.Stepper.step = self.patches
        return self

    def __exit__(self, *exc):
        warn_if, drift, step = self.saved
        continuous.warn_if, stepping.Stepper.step = warn_if, step
        continuous.Backsolved.drift = staticmethod(drift)


def measure(case) -> dict:
    """The check's signals and the gradient's error on `case`."""
    start = time.perf_counter()
    exact = reference(case)
    allowed = own(case, exact)
    forward = sciad.solve(
        case.problem,
        saveat=jnp.asarray(case.saveat, np.asarray(case.problem.u0).dtype),
        solver=case.solver,
        rtol=case.rtol,
        atol=case.atol,
        max_steps=case.max_steps,
    )
    forward_steps = int(forward.stats["accepted_steps"])
    budget, continuous.BACKWARD_STEPS = continuous.BACKWARD_STEPS, STEP_CAP
    try:
        with Probe() as probe, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = gradient(case, sciad.BacksolveAdjoint(on_instability="warn", drift_tolerance=np.inf))
    finally:
        continuous.BACKWARD_STEPS = budget
    (drift,) = probe.drifts
    failed = not np.isfinite(drift)  # out of steps (past STEP_CAP per forward step) or the solver's failure
    error = np.inf if failed else relative_error(g, exact)
    bps = breakpoints(case)  # a step belongs to the interval it starts in
    per_interval = np.bincount(np.clip(np.searchsorted(bps, probe.steps) - 1, 0, len(bps) - 2), minlength=len(bps) - 1)
    backward = float(np.max(per_interval)) / (forward_steps + 8)
    return dict(
        name=case.name,
        wrong=case.wrong,
        right=right(error, case.rtol, lambda: allowed),
        error=error,
        own=allowed,
        drift=drift,
        old=np.inf if failed else max(probe.old),
        backward=backward,
        forward_steps=forward_steps,
        seconds=time.perf_counter() - start,
    )


OLD_LIMIT = 10.0  # DRIFT_TOLERANCE with the old measure


def refused(r, measure="drift") -> bool:
    limit = OLD_LIMIT if measure == "old" else continuous.DRIFT_TOLERANCE
    return bool(r[measure] > limit or r["backward"] > continuous.BACKWARD_STEPS)


def margins(rows, title):
    budget = continuous.BACKWARD_STEPS
    ok = [r for r in rows if r["right"]]
    bad = [r for r in rows if not r["right"]]
    print(f"\n{title}: {len(ok)} right, {len(bad)} wrong")
    for measure, limit in (("old", OLD_LIMIT), ("drift", continuous.DRIFT_TOLERANCE)):
        line = f"  {'before (old measure' if measure == 'old' else 'now (measure'}, limit {limit:g}):"
        if ok:
            worst = max(ok, key=lambda r: r[measure])
            line += f" right ≤ {worst[measure]:.3g} ({worst['name']}: limit/drift {limit / worst[measure]:.3g});"
        drifting = [r for r in bad if r["backward"] <= budget]  # the wrong ones left to the drift
        if drifting:
            least = min(drifting, key=lambda r: r[measure])
            line += f" wrong ≥ {least[measure]:.3g} ({least['name']}: drift/limit {least[measure] / limit:.3g})"
        print(line)
        wrongly = [r["name"] for r in rows if refused(r, measure) == r["right"]]
        print(f"    refused right or accepted wrong: {wrongly or 'none'}")
    if ok:
        print(
            f"  backward steps per forward step (limit {budget}): right ≤ {max(r['backward'] for r in ok):.3g}; "
            f"refused by the budget: {[r['name'] for r in bad if r['backward'] > budget]}"
        )
    contradicted = [r["name"] for r in rows if r["right"] == r["wrong"]]
    print(f"  labels contradicted by the measurement: {contradicted or 'none'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpora", nargs="*", metavar="corpus", help="calibration, heldout (default: both)")
    parser.add_argument("-k", default="", help="only the cases whose name contains this")
    args = parser.parse_args()
    if set(args.corpora) - set(CORPORA):
        parser.error(f"unknown corpus: {sorted(set(args.corpora) - set(CORPORA))}; choose from {list(CORPORA)}")
    for corpus in args.corpora or list(CORPORA):
        cases = [c for c in importlib.import_module(CORPORA[corpus]).cases() if args.k in c.name]
        rows = []
        print(f"\n== {corpus} ({len(cases)} cases) ==")
        print(
            f"{'case':52} {'label':5} {'right':5} {'error':>8} {'own':>8} {'old':>9} {'drift':>9} {'bwd/fwd':>7} "
            f"{'fwd':>6} {'s':>4}"
        )
        for case in cases:
            r = measure(case)
            rows.append(r)
            print(
                f"{r['name'][:52]:52} {'wrong' if r['wrong'] else 'right':5} {'yes' if r['right'] else 'no':5} "
                f"{r['error']:8.2g} {r['own']:8.2g} {r['old']:9.3g} {r['drift']:9.3g} {r['backward']:7.3g} "
                f"{r['forward_steps']:6d} {r['seconds']:4.0f}",
                flush=True,
            )
        margins(rows, corpus)


if __name__ == "__main__":
    main()
