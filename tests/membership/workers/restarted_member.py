"""usage: restarted_member.py TOTAL  (GOSSIP_RANK, GOSSIP_WORLD_SIZE, GOSSIP_RENDEZVOUS set)

A killed member of an elastic Synchronous group started again exactly as the first time
(tests/membership/test_membership.py): it rejoins, trains to TOTAL steps in a view of 4 and
prints RESTARTED with its rank, view, step and x."""
import sys, time, numpy as np, gossip
from gossip.policies import Synchronous
total = int(sys.argv[1])
peer = gossip.init(timeout=30)       # started exactly as the first time
x = np.zeros(1000)
policy = Synchronous(elastic=True).attach(peer, [x])
while (policy.step < total or peer.world_size < 4) and policy.step < 100_000:
    x += 4.0
    policy.after_step()
    np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
sys.stdout.write("RESTARTED %d %d %d %d %s\n" % (peer.rank, peer.world_size,
                 peer.view.number, policy.step, x.tobytes().hex()))
peer.close()
