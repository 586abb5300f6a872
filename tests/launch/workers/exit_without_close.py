"""usage: exit_without_close.py exit|sigkill

A world of one that ends without close(): os._exit (a torchrun rank leaving at once) or
SIGKILL. It prints its ipc endpoint first."""
import os
import signal
import sys

import gossip

peer = gossip.init(rank=0, world_size=1)
print("IPC", peer.transport.endpoints["ipc"], flush=True)
if sys.argv[1] == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
os._exit(0)
