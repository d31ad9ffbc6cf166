"""`sciad bench NAME ...` and `sciad reproduce` (the `sciad` command hands them over here)."""

import argparse

from sciad_bench.experiments import PLANS, ROUNDS
from sciad_bench.harness import SLOW_CALL
from sciad_bench.suite import FAMILIES
from sciad_bench.suite import ROUNDS as SUITE_ROUNDS

BENCHMARKS = (*PLANS, "selection", "suite", "ensemble", "losses", "events", "large-stiff", "dae", "sde", "dde")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="sciad", description="sciad's benchmarks and the paper's reproduction")
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser("bench", help="time ODE gradients over every sensealg × engine and peers")
    bench.add_argument("name", choices=BENCHMARKS)
    bench.add_argument("--quick", action="store_true", help="fewer combinations and repeats (a few minutes)")
    bench.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=(
            f"timed rounds of the calls under {SLOW_CALL:g} s and of the slower ones, per problem (default "
            f"{ROUNDS[False][0]}; quick: {ROUNDS[True][0]}, each within {ROUNDS[True][1]:g} s; suite quick: "
            f"{SUITE_ROUNDS[True][0]}, each within {SUITE_ROUNDS[True][1]:g} s; ensemble: rounds of all calls, 3 quick)"
        ),
    )
    bench.add_argument("--engines", default=None, help="comma-separated sciad.ad engines (default: all installed)")
    bench.add_argument("--out", default=None, help="output folder (default results/NAME)")
    bench.add_argument(
        "--family",
        action="append",
        choices=FAMILIES,
        default=None,
        help=(f"suite: run only this family of the suite (repeatable; default all: {', '.join(FAMILIES)})"),
    )
    bench.add_argument(
        "--devices",
        type=int,
        default=None,
        help="ensemble: simulate N CPU devices (sets XLA_FLAGS before JAX starts its backend)",
    )
    reproduce = commands.add_parser(
        "reproduce", help="run every benchmark and regenerate paper/figures and paper/tables"
    )
    reproduce.add_argument("--repeats", type=int, default=5, help="timed calls per combination (default 5)")
    reproduce.add_argument("--quick", action="store_true", help="quick variants of every benchmark (a smoke test)")
    args = parser.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    if args.command == "reproduce":
        from sciad_bench.reproduce import reproduce as run_all

        run_all(repeats=args.repeats, quick=args.quick)
    elif args.devices is not None and args.name != "ensemble":
        parser.error("--devices applies to sciad bench ensemble only")
    elif args.family is not None and args.name != "suite":
        parser.error("--family applies to sciad bench suite only")
    elif args.name == "ensemble":
        from sciad_bench.ensemble import run_ensemble

        try:
            run_ensemble(quick=args.quick, repeats=args.repeats, devices=args.devices, out=args.out)
        except ValueError as e:
            parser.error(str(e))
    elif args.name == "losses":
        from sciad_bench.losses import run_losses

        run_losses(quick=args.quick, repeats=args.repeats, out=args.out)
    elif args.name == "events":
        from sciad_bench.events import run_events

        run_events(quick=args.quick, repeats=args.repeats, out=args.out)
    elif args.name == "large-stiff":
        from sciad_bench.large_stiff import run_large_stiff

        run_large_stiff(quick=args.quick, repeats=args.repeats, out=args.out)
    elif args.name == "dae":
        from sciad_bench.dae import run_dae

        run_dae(quick=args.quick, repeats=args.repeats, out=args.out)
    elif args.name == "sde":
        from sciad_bench.sde import run_sde

        run_sde(quick=args.quick, repeats=args.repeats, out=args.out)
    elif args.name == "dde":
        from sciad_bench.dde import run_dde

        run_dde(quick=args.quick, repeats=args.repeats, out=args.out)
    elif args.name == "selection":
        from sciad_bench.selection import run_selection

        run_selection(quick=args.quick, out=args.out)
    elif args.name == "suite":
        from sciad_bench.suite import run_suite

        engines = None if args.engines is None else [e.strip() for e in args.engines.split(",") if e.strip()]
        try:
            run_suite(quick=args.quick, repeats=args.repeats, engines=engines, out=args.out, families=args.family)
        except ValueError as e:
            parser.error(str(e))
    else:
        from sciad_bench.experiments import run_experiment

        engines = None if args.engines is None else [e.strip() for e in args.engines.split(",") if e.strip()]
        if args.repeats is not None and args.repeats < 1:
            parser.error("--repeats must be at least 1")
        try:
            run_experiment(args.name, quick=args.quick, repeats=args.repeats, engines=engines, out=args.out)
        except ValueError as e:
            parser.error(str(e))
