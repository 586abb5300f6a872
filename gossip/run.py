"""`python -m gossip.run -n 4 script.py ...`: the launcher, as torchrun's `python -m
torch.distributed.run` is. Same options as `gossip run`; see gossip.launch.launcher."""
from __future__ import annotations

import sys

from gossip.launch.launcher import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
