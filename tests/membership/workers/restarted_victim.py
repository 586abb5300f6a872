"""Under `gossip run -n 3 --max-restarts 1` (tests/membership/test_membership.py): the rank
named by VICTIM SIGKILLs itself at step 10 of its first incarnation; the launcher starts it
again, it rejoins, and every peer prints FINAL with the group's size, its step and a
digest of x."""
import os, signal, time, hashlib, numpy as np, gossip
from gossip.policies import Synchronous
peer = gossip.init(timeout=30)
first = os.environ["GOSSIP_INCARNATION"] == "0"
x = np.arange(1000, dtype=np.float64)
policy = Synchronous(elastic=True).attach(peer, [x])
while (policy.step < 60 or peer.world_size < 3) and policy.step < 100_000:
    if first and os.environ["RANK"] == os.environ["VICTIM"] and policy.step == 10:
        os.kill(os.getpid(), signal.SIGKILL)
    x += 1.0
    policy.after_step()
    np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
print("FINAL", peer.world_size, policy.step, hashlib.sha1(x.tobytes()).hexdigest(),
      flush=True)
peer.close()
