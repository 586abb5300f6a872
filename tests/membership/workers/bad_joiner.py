"""usage: bad_joiner.py mismatch|die|plain|midway COUNT  (GOSSIP_RENDEZVOUS set; JOIN_TIMEOUT)

A joiner that fails (tests/membership/test_membership.py): refused at the door (REFUSED,
exit 3), SIGKILLed once admitted (die) or midway through the state transfer (midway), or
given a state that does not check (plain: CORRUPT, exit 5) or another model (MISMATCH,
exit 4)."""
import os, signal, sys, numpy as np, gossip
from gossip.policies import Synchronous
how = sys.argv[1]
try:
    peer = gossip.init(join=True, timeout=float(os.environ.get("JOIN_TIMEOUT", "20")))
except gossip.GossipError as exc:
    print("REFUSED", type(exc).__name__, exc, flush=True)
    sys.exit(3)
if how == "die":
    os.kill(os.getpid(), signal.SIGKILL)   # admitted, dead before it takes the state
if how == "plain":
    try:
        Synchronous().attach(peer, [np.zeros(int(sys.argv[2]))])
    except gossip.SnapshotCorrupt as exc:
        print("CORRUPT", exc, flush=True)
        sys.exit(5)
if how == "midway":
    from gossip.snapshot import receiver
    wrote = receiver.SnapshotReceiver.wrote

    def die_after_one(self, offset, length):   # one chunk in, the others on their way
        wrote(self, offset, length)
        os.kill(os.getpid(), signal.SIGKILL)
    receiver.SnapshotReceiver.wrote = die_after_one
    Synchronous().attach(peer, [np.zeros(int(sys.argv[2]))])
try:
    Synchronous().attach(peer, [np.zeros(999)])   # the members' model has 1000
except ValueError as exc:
    print("MISMATCH", exc, flush=True)
    sys.exit(4)
