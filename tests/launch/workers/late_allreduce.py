"""Three peers, timeout 30 s: rank 2 sleeps 12 s before its second allreduce (COUNT float32
elements), so ranks 0 and 1 wait on it past defaults.LONG_WAIT; everyone prints DONE."""
import os
import time

import numpy as np

import gossip

with gossip.init(timeout=30) as peer:
    x = np.ones(int(os.environ.get("COUNT", "1000")), dtype=np.float32)
    peer.allreduce(x)
    if peer.rank == 2:
        time.sleep(12)
    peer.allreduce(x)
    print("DONE", x[0], flush=True)
