"""usage: push_sum_joiner.py OVERLAP ROUNDS OUT LENGTH SIZE [TOPOLOGY]  (GOSSIP_RENDEZVOUS set)

A process joining a running PushSum group (tests/membership/test_push_sum_membership.py):
it takes a share of its donor's (x, w), waits for the view to have SIZE members, runs
ROUNDS rounds, saves its pair and model at the join and at the end to OUT (.npz) and prints
JOINED."""
import sys, numpy as np, gossip, topologies
from gossip.policies import PushSum
overlap, rounds, out = sys.argv[1] == "True", int(sys.argv[2]), sys.argv[3]
peer = gossip.init(join=True, timeout=30)
x = np.zeros(int(sys.argv[4]))
graph = topologies.parse(sys.argv[6], peer.world_size) if len(sys.argv) > 6 else None
policy = PushSum(topology=graph, overlap=overlap).attach(peer, [x])   # takes its share
at = [policy.numerators[0].copy(), policy.weights[0], x.copy()]
while peer.world_size < int(sys.argv[5]) and policy.step < 100_000:   # another joiner
    policy.after_step()
for _ in range(rounds):
    policy.after_step()
policy.flush()
final = [policy.numerators[0].copy(), policy.weights[0], x.copy()]
peer.barrier()
np.savez(out, at_x=at[0], at_w=at[1], at_m=at[2], x=final[0], w=final[1], m=final[2])
print("JOINED", peer.rank, peer.world_size, peer.view.number, flush=True)
peer.close()
