"""`python -m gossip` is the `gossip` command."""
import sys

from gossip.cli import main

__all__: list[str] = []  # a script, not a library: nothing to import from here

sys.exit(main())
