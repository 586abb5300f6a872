"""`python -m gossip` is the `gossip` command."""
import sys

from gossip.cli import main

sys.exit(main())
