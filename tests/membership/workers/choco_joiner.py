"""usage: choco_joiner.py COUNT ROUNDS OUT  (POLICY, GOSSIP_RENDEZVOUS set)

A process joining a running CHOCO-SGD group (tests/membership/test_choco_membership.py):
its policy is POLICY (a Python expression, the members' own), it takes a member's
parameters, runs ROUNDS rounds, saves x at the join and at the end to OUT (.npz) and
prints JOINED with its rank, the view's size and number as it joined (at the end the members
may have left already: they close once their rounds are done)."""
import os, sys, numpy as np, gossip
from gossip.policies import Choco   # noqa: F401 (POLICY names it)
count, rounds, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
peer = gossip.init(join=True, timeout=30)
x = np.zeros(count)
policy = eval(os.environ["POLICY"]).attach(peer, [x])      # takes a member's parameters here
start, at = peer.view.step, x.copy()   # the switch's step: the members count from it too
joined = (peer.rank, peer.world_size, peer.view.number)
while policy.step < start + rounds:
    policy.after_step()
np.savez(out, at=at, x=x)
print("JOINED", *joined, flush=True)
peer.close()
