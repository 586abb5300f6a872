"""usage: sharded_easgd_joiner.py SIZE LENGTH WORKDIR TESTS_DIR STEPS  (GOSSIP_RENDEZVOUS set)

A process joining a running ElasticAveraging group with the sharded centre
(tests/membership/test_elastic_sharded_membership.py, whose Recorded policy it imports from
TESTS_DIR): it takes its model and shards, records the centre in WORKDIR as the members do,
and prints JOINED."""
import sys, numpy as np, gossip
sys.path.insert(0, sys.argv[4])                  # the tests: Recorded, as the members'
from test_elastic_sharded_membership import Recorded, record, train_until
size, length, workdir, steps = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[5])
peer = gossip.init(join=True, timeout=20)
x = np.zeros(length)
policy = Recorded(workdir, period=1).attach(peer, [x])   # model and shards come here
train_until(peer, policy, x, size, steps)
record(policy, workdir, "end")
print("JOINED", peer.rank, peer.world_size, policy.step, flush=True)
policy.close()
peer.close()
