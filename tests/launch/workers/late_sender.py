"""Two peers: rank 0's recv from rank 1 times out (rank 1 is alive, waiting on rank 0); then
rank 0 sends, rank 1 receives, and both close. A wait armed and fired, and nothing slept."""
import numpy as np

import gossip
from gossip import GossipError

with gossip.init(timeout=30) as peer:
    if peer.rank == 0:
        try:
            peer.recv(1, np.zeros(4), timeout=0.5)
        except GossipError as exc:
            print("TIMED OUT", type(exc).__name__, flush=True)
        peer.send(1, np.ones(4))
    else:
        print("GOT", peer.recv(0, np.zeros(4))[0], flush=True)
