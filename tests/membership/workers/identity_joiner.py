"""usage: identity_joiner.py new|named WORKDIR  (GOSSIP_JOIN, GOSSIP_RENDEZVOUS, GOSSIP_JOB_ID
set; GOSSIP_MEMBER_NAME for ``named``)

A process started by hand to join a running job (tests/membership/test_identity.py). ``new``:
no identity from a launcher; it trains in the members' Synchronous group until the view has
4 members and prints JOINED with its name and the view's names. ``named``: under a member's
name; refused (RendezvousError: REFUSED and the message, exit 3), or admitted in the place of
a member that did not answer (a Gossip ring): it prints JOINED once it has the state, trains
60 rounds and prints DONE."""
import json, os, sys, numpy as np, gossip
from gossip.policies import Gossip, Synchronous
mode, workdir = sys.argv[1], sys.argv[2]
try:
    peer = gossip.init(timeout=8 if mode == "named" else 30)
except gossip.RendezvousError as exc:
    print("REFUSED", exc, flush=True)
    sys.exit(3)
me = peer.view.members[peer.rank]
if mode == "new":
    x = np.zeros(1000)
    policy = Synchronous().attach(peer, [x])
    while (policy.step < 40 or peer.world_size < 4) and policy.step < 100_000:
        x += 1.0
        policy.after_step()
        np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
    print("JOINED", json.dumps({"name": me.name, "inc": me.incarnation, "pid": os.getpid(),
                                "names": peer.view.names(), "steps": policy.step,
                                "x": float(x[0])}), flush=True)
else:
    x = np.zeros(100)
    policy = Gossip().attach(peer, [x])
    print("JOINED", json.dumps({"name": me.name, "inc": me.incarnation, "door": me.door,
                                "view": peer.view.number}), flush=True)
    start = policy.step
    while policy.step < start + 60:
        policy.after_step()
        np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
    print("DONE", flush=True)
peer.close()
