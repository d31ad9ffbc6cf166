"""The `sciad` command line: `sciad demo`; `sciad bench NAME ...` and `sciad reproduce` run the
benchmark product (`sciad_bench`, installed with `pip install 'sciad[bench]'`)."""

import argparse
import sys

BENCH_COMMANDS = ("bench", "reproduce")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in BENCH_COMMANDS:
        return _bench_main()(argv)
    parser = argparse.ArgumentParser(prog="sciad", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="differentiate one function with every installed engine")
    commands.add_parser("bench", help="time ODE gradients over every sensealg × engine and peers (see sciad bench -h)")
    commands.add_parser("reproduce", help="run every benchmark and regenerate paper/ (see sciad reproduce -h)")
    parser.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    from sciad._demo import main as demo

    demo()


def _bench_main():
    """The benchmark product's command line, or a clear error naming the install extra."""
    try:
        from sciad_bench.cli import main
    except ModuleNotFoundError as e:
        raise SystemExit(
            f"sciad bench and sciad reproduce need the benchmark product, which needs {e.name!r}: "
            "pip install 'sciad[bench]'"
        ) from None
    return main


if __name__ == "__main__":
    main()
