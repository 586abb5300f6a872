"""`gossip keygen PATH`: write a cluster key (CURVE key pair shared by the cluster's peers)."""
from __future__ import annotations

import argparse

__all__ = ["register", "main"]


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `keygen` subcommand to the `gossip` parser."""
    parser = subparsers.add_parser(
        "keygen", help="write a cluster key that turns on CURVE encryption and authentication",
        description="Write a cluster key to PATH (mode 0600). Give the same file to every peer "
                    "(gossip.init(key=PATH), GOSSIP_KEY=PATH or gossip run --key PATH): every "
                    "socket is then encrypted, and a process without the key can neither "
                    "connect, read nor inject.")
    parser.add_argument("path", help="where to write the key file")
    parser.add_argument("--force", action="store_true", help="overwrite an existing key file")
    parser.set_defaults(func=main)
    return parser


def main(args: argparse.Namespace) -> int:
    """Run `gossip keygen`: write the key and print its public key; an existing file is a
    FileExistsError (one line) unless --force."""
    from collectives.security import write_cluster_key

    key = write_cluster_key(args.path, overwrite=args.force)
    print(f"wrote cluster key {key.path} (public key {key.public.decode()}); copy it to every "
          "peer and keep it secret")
    return 0
