"""usage: compression_joiner.py SIZE COUNT  (POLICY, GOSSIP_RENDEZVOUS, GOSSIP_MEMBER_NAME set)

A process joining a running LocalSGD group with DiLoCo's outer optimizer and top-k
(tests/membership/test_compression_membership.py): its policy is POLICY (a Python
expression, the members' own); it prints JOINED with the step it entered at, its last step,
the anchors, outer buffers and residuals it took, and a digest of x."""
import hashlib, os, sys, numpy as np, gossip
from gossip.policies import LocalSGD   # noqa: F401 (POLICY names it)
size, count = int(sys.argv[1]), int(sys.argv[2])
peer = gossip.init(join=True, timeout=30)
x = np.zeros(count, dtype=np.float32)
policy = eval(os.environ["POLICY"]).attach(peer, [x])      # takes the running state here
start, state = policy.step, policy.state_dict()
taken = (len(state["outer"]["anchors"]), len(state["outer"]["optimizer"]["buffers"]),
         len(state["residuals"]))
while (policy.step < 40 or peer.world_size < size or policy.step % 2) and \
        policy.step < 100_000:
    x += np.float32(0.01) * np.sin(np.arange(count, dtype=np.float32) + peer.rank)
    policy.after_step()
    np.ones((96, 96)) @ np.ones((96, 96))
print("JOINED", start, policy.step, *taken, hashlib.sha256(x.tobytes()).hexdigest(),
      flush=True)
peer.close()
