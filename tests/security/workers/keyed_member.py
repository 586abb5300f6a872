"""usage: keyed_member.py WORKDIR  (under `gossip run`; tests/security/test_secure_by_default.py)

A member of a Synchronous group of 10 float64s: prints KEYED with its rank and whether it holds
a cluster key; rank 0 publishes the rendezvous address, the job id and GOSSIP_KEY's path in
WORKDIR/info (JSON); every member steps until step 40 and a view of 3 (a joiner admitted), then
prints DONE with its rank, the world size and the view number."""
import json, os, sys, time, numpy as np, gossip
from gossip.policies import Synchronous
workdir = sys.argv[1]
peer = gossip.init(timeout=30)
print("KEYED", peer.rank, peer.transport.config.key is not None, flush=True)
x = np.zeros(10)
policy = Synchronous().attach(peer, [x])
if peer.rank == 0:
    info = {"address": peer.settings.rendezvous, "job": peer.job_id,
            "key": os.environ.get("GOSSIP_KEY", "")}
    with open(os.path.join(workdir, "info.tmp"), "w") as f:
        json.dump(info, f)
    os.replace(os.path.join(workdir, "info.tmp"), os.path.join(workdir, "info"))
while (policy.step < 40 or peer.world_size < 3) and policy.step < 20_000:
    x += 1.0
    policy.after_step()
    time.sleep(0.01)
print("DONE", peer.rank, peer.world_size, peer.view.number, flush=True)
peer.close()
