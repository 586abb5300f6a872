"""The `gossip` command line (the console script ``gossip``, and ``python -m gossip``): the
parser and ``main`` in main.py, and one module per subcommand, NAME_command.py (run, bench,
demo, topology, keygen), each defining ``register(subparsers)``."""
from gossip.cli.main import build_parser, main

__all__ = ["main", "build_parser"]
