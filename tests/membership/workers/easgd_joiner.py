"""usage: easgd_joiner.py SIZE LENGTH  (GOSSIP_RENDEZVOUS, GOSSIP_MEMBER_NAME set)

A process joining a running ElasticAveraging group with the replicated centre
(tests/membership/test_elastic_averaging_membership.py): it takes a member's model and the
centre, trains until the view has SIZE members and 60 steps are done, and prints JOINED
with digests of its centre at the end and at the join (or REFUSED, exit 3)."""
import hashlib, sys, numpy as np, gossip
from gossip.policies import ElasticAveraging
size = int(sys.argv[1])
try:
    peer = gossip.init(join=True, timeout=20)
except gossip.GossipError as exc:
    print("REFUSED", exc, flush=True)
    sys.exit(3)
x = np.zeros(int(sys.argv[2]))
policy = ElasticAveraging(period=1).attach(peer, [x])     # takes model and centre here
start = hashlib.sha256(policy.center[0].tobytes()).hexdigest()
done = np.zeros(1)
while policy.step < 100_000:
    done[0] = peer.world_size >= size and policy.step >= 60
    peer.allreduce(done, op="max")
    if done[0]:
        break
    x -= 0.01 * x
    policy.after_step()
center = hashlib.sha256(policy.center[0].tobytes()).hexdigest()
print("JOINED", peer.rank, peer.world_size, policy.step, center, start, flush=True)
policy.close()
peer.close()
