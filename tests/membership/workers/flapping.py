"""Under `gossip run -n 3 --max-restarts 5` (tests/membership/test_membership.py): rank 1
SIGKILLs itself 8 steps after each of its first five starts; every peer goes on until its
sixth incarnation is back in the view and prints FINAL with the group's size, its step and
a digest of x."""
import os, signal, time, hashlib, numpy as np, gossip
from gossip.policies import Synchronous
peer = gossip.init(timeout=30)
incarnation = int(os.environ["GOSSIP_INCARNATION"])
x = np.arange(1000, dtype=np.float64)
policy = Synchronous(elastic=True).attach(peer, [x])
start = policy.step

def settled():   # the last incarnation of rank1 is back in the view
    return any(m.name == "rank1" and m.incarnation == 5 for m in peer.view.members)

while (policy.step < 40 or not settled()) and policy.step < 100_000:
    if os.environ["RANK"] == "1" and incarnation < 5 and policy.step == start + 8:
        os.kill(os.getpid(), signal.SIGKILL)
    x += 1.0
    policy.after_step()
    np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
print("FINAL", peer.world_size, policy.step, hashlib.sha1(x.tobytes()).hexdigest(),
      flush=True)
peer.close()
