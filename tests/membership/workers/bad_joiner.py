"""usage: bad_joiner.py mismatch|die|plain|midway|arrays|torch COUNT  (GOSSIP_RENDEZVOUS set;
JOIN_TIMEOUT)

A joiner that fails (tests/membership/test_membership.py): refused at the door (REFUSED,
exit 3), SIGKILLed once admitted (die) or midway through the state transfer (midway), or
given a state that does not check (plain: CORRUPT, exit 5) or another model (MISMATCH,
exit 4: one array of COUNT - 1 elements; arrays: the second of three is; torch: a module
whose fc.weight is 31x16, not 32x16, under a DistributedOptimizer)."""
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
    if how == "arrays":   # the members' are 10, 1000 and 5 elements
        Synchronous().attach(peer, [np.zeros(10), np.zeros(999), np.zeros(5)])
    elif how == "torch":
        import torch
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        from test_membership import named_model
        model = named_model(31)   # the members' has 32
        gossip.DistributedOptimizer(torch.optim.SGD(model.named_parameters(), lr=0.01),
                                    peer=peer, policy=Synchronous())
    else:
        Synchronous().attach(peer, [np.zeros(999)])   # the members' model has 1000
except ValueError as exc:
    print("MISMATCH", exc, flush=True)
    sys.exit(4)
