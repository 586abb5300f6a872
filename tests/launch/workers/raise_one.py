"""Rank 2 raises ValueError at step 3 while the others allreduce: their next allreduce
raises PeerLost naming it (a consequence, which the launcher reports in one line)."""
import numpy as np

import gossip

peer = gossip.init(timeout=30)
x = np.ones(1000)
for step in range(100):
    if peer.rank == 2 and step == 3:
        raise ValueError(f"bad batch at step {step}")
    peer.allreduce(x)
