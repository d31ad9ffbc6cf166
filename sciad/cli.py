"""The `sciad` command line: `sciad demo`, `sciad bench NAME ...`."""

import argparse


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="sciad", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="differentiate one function with every installed engine")
    args = parser.parse_args(argv)
    if args.command == "demo":
        import jax

        jax.config.update("jax_enable_x64", True)
        from sciad.demo import main as demo

        demo()


if __name__ == "__main__":
    main()
