"""usage: nnodes_train.py SIZE STARTED  (under `gossip run --nnodes MIN:MAX`)

Synchronous training on the nodes of an elastic job (tests/membership/test_elastic_nodes.py):
rank 0 of view 0 creates STARTED once the first node trains; nodes beyond MIN join; every
peer trains until the view has SIZE members and prints DONE with its slot, rank, view size,
step and x."""
import os, sys, numpy as np, gossip
from gossip.policies import Synchronous
size = int(sys.argv[1])
peer = gossip.init(timeout=30)
x = np.full(1000, float(peer.rank))
policy = Synchronous().attach(peer, [x])       # a joiner takes the replicas' x here
if peer.rank == 0 and peer.view.number == 0:
    open(sys.argv[2], "w").close()              # the first node trains: start the next
# The same condition on every replica: they change views at the same boundary.
while (policy.step < 30 or peer.world_size < size) and policy.step < 100_000:
    x += 1.0
    policy.after_step()
    np.ones((96, 96)) @ np.ones((96, 96))       # a step's compute
print("DONE", os.environ["RANK"], peer.rank, peer.world_size, policy.step, float(x[0]),
      float(x.max() - x.min()), flush=True)
peer.close()
