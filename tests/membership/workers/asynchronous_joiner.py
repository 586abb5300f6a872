"""usage: asynchronous_joiner.py ROUNDS OUT LENGTH TESTS_DIR EXCHANGE  (GOSSIP_RENDEZVOUS set)

A process joining a running Asynchronous group
(tests/membership/test_asynchronous_membership.py, whose train_in_view it imports from
TESTS_DIR, as the members run it): it takes its source's model and a share of its weight,
trains in the view, saves its weight and model at the join and at the end to OUT (.npz)
and prints JOINED (or REFUSED, exit 3)."""
import sys, numpy as np, gossip
sys.path.insert(0, sys.argv[4])                  # the tests: train_in_view, as the members'
from test_asynchronous_membership import train_in_view
from gossip.policies import Asynchronous
rounds, out, length = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
try:
    peer = gossip.init(join=True, timeout=30)
except gossip.GossipError as exc:
    print("REFUSED", exc, flush=True)
    sys.exit(3)
x = np.zeros(length)
policy = Asynchronous(exchange=sys.argv[5]).attach(peer, [x])   # its source's model, a share
at_w, at_m = policy.weights[0], x.copy()
train_in_view(peer, policy, rounds)
w, m = policy.weights[0], x.copy()
absorbed = policy.stats()["messages_absorbed"]
peer.barrier()
np.savez(out, at_w=at_w, at_m=at_m, w=w, m=m)
print("JOINED", peer.rank, peer.world_size, peer.view.number, absorbed, flush=True)
peer.close()
