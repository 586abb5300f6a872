"""usage: links_joiner.py SIZE  (GOSSIP_RENDEZVOUS, GOSSIP_MEMBER_NAME set)

A process joining a running Synchronous group (tests/membership/test_membership.py) that
looks, as soon as it is admitted, whether its links to every member of the new view are open
(connecting, or past the handshake): it prints LINKS with those ranks and the others, then
JOINED as synchronous_joiner.py does."""
import sys, numpy as np, gossip
from gossip.policies import Synchronous
size = int(sys.argv[1])
peer = gossip.init(join=True, timeout=30)
# At once: the links opened by the view change itself (connecting, or reached already), not
# those a message opens later (the state's manifest, a member's ring announcement).
t = peer.transport
others = [r for r in range(peer.world_size) if r != peer.rank]
print("LINKS", [r for r in others if t.reached(r) or t.connecting(r)], others, flush=True)
x = np.zeros(1000)
policy = Synchronous().attach(peer, [x])      # takes the running state here
while (policy.step < 40 or peer.world_size < size) and policy.step < 100_000:
    x += 1.0
    policy.after_step()
    np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
print("JOINED", peer.rank, peer.world_size, float(x[0]), flush=True)
peer.close()
