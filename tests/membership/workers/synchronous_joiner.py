"""usage: synchronous_joiner.py SIZE [COUNT]  (GOSSIP_RENDEZVOUS, GOSSIP_MEMBER_NAME set)

A process joining a running Synchronous group (tests/membership/test_membership.py): it
takes the replicas' state at a step boundary, trains until the view has SIZE members, and
prints JOINED with its rank, view, steps, x and the donors of its state."""
import sys, time, numpy as np, gossip
from gossip.policies import Synchronous
size = int(sys.argv[1])
count = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
peer = gossip.init(join=True, timeout=30)
x = np.zeros(count)
policy = Synchronous().attach(peer, [x])      # takes the running state here
start = policy.step
while (policy.step < 40 or peer.world_size < size) and policy.step < 100_000:
    x += 1.0
    policy.after_step()
    np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
print("JOINED", peer.rank, peer.world_size, peer.view.number, start, policy.step,
      float(x[0]), float(x.max() - x.min()),
      ",".join(map(str, peer.stats()["join"]["donors"])), flush=True)
peer.close()
