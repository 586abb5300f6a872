"""Print the launcher variables this peer received, and its arguments (stdout and stderr)."""
import os
import sys

NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "GROUP_RANK", "GOSSIP_TOPOLOGY", "GOSSIP_TIMEOUT", "PYTHONUNBUFFERED")
print(" ".join(f"{name}={os.environ.get(name, '')}" for name in NAMES))
print("ARGS", *sys.argv[1:])
print(f"stderr line of rank {os.environ['RANK']}", file=sys.stderr)
