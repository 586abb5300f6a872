"""The `gossip` command line: one subcommand per module gossip/cli/NAME_command.py."""
from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["main", "build_parser"]

# name -> module gossip.cli.NAME_command; each module defines register(subparsers).
# Modules are imported only when the parser is built, so `gossip --help` stays cheap.
SUBCOMMANDS = ("topology", "keygen", "run", "status", "bench", "demo", "simulate")


def build_parser() -> argparse.ArgumentParser:
    """The `gossip` parser, with one subcommand from each module in SUBCOMMANDS."""
    parser = argparse.ArgumentParser(
        prog="gossip",
        description="Decentralized gossip and allreduce runtime for data-parallel training.",
    )
    from gossip import __version__
    parser.add_argument("--version", action="version", version=f"gossip {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"gossip.cli.{name}_command").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `gossip` with ``argv`` (default: sys.argv[1:]) and return the exit code: 2 without a
    command or on a ValueError / OSError (one line, no traceback), 130 on Ctrl-C."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, OSError) as exc:
        # User errors (bad spec, missing file, ...) get one line, not a traceback.
        print(f"gossip {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
