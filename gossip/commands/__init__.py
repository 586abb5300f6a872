"""Subcommands of the `gossip` command line, one per module; each defines register(subparsers)."""
__all__: list[str] = []
