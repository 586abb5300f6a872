"""`gossip run`: start N peers on this machine, torchrun-style (see gossip.launch.launcher)."""
from __future__ import annotations

import argparse

from gossip.launch import launcher

__all__ = ["register", "main"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `run` subcommand to the `gossip` parser."""
    parser = subparsers.add_parser(
        "run",
        help="start N peer processes on this machine (torchrun-style)",
        description=(
            "Start N peers of a script or module with torchrun's variables (RANK, WORLD_SIZE, "
            "LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...). Output lines are prefixed by rank; "
            "the first peer to fail stops the others and its exit code is returned; Ctrl-C "
            "reaches every peer. The job is encrypted and authenticated with a cluster key "
            "made for it (one node), or --key FILE (every node of a multi-node job: the same "
            "file, from `gossip keygen FILE`), unless --insecure."
        ),
        epilog=("examples: gossip run -n 4 train.py --lr 0.1 | gossip run -n 2 -m mypkg.train | "
                "gossip run --nnodes 2 --node-rank 0 --master-addr node0 --key cluster.key "
                "-n 8 train.py"),
    )
    launcher.add_arguments(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Run the peers; bad arguments raise ValueError, which `gossip` prints as one line."""
    return launcher.run_from_args(args)
