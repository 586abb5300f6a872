"""usage: nnodes_bounded.py FULL STOP  (under `gossip run --nnodes 1:2 -n 1`)

A job at its bound (tests/membership/test_elastic_nodes.py): rank 0 creates FULL once the
view has 2 members, every peer trains until rank 0 sees STOP, then prints DONE with its
slot, rank, view size and step."""
import os, sys, numpy as np, gossip
from gossip.policies import Synchronous
full, stop = sys.argv[1], sys.argv[2]
peer = gossip.init(timeout=30)
x = np.zeros(10)
policy = Synchronous().attach(peer, [x])
# Until told to stop (one peer reads the file, the allreduce tells the others).
while policy.step < 100_000:
    if peer.world_size == 2 and peer.rank == 0:
        open(full, "w").close()
    flag = np.array([float(peer.rank == 0 and os.path.exists(stop))])
    peer.allreduce(flag)
    if flag[0]:
        break
    x += 1.0
    policy.after_step()
    np.ones((96, 96)) @ np.ones((96, 96))
print("DONE", os.environ["RANK"], peer.rank, peer.world_size, policy.step, flush=True)
peer.close()
