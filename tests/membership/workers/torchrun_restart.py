"""Under `torchrun --max-restarts 1` (tests/membership/test_membership.py): rank 1's first
attempt exits with code 3, torchrun restarts every worker, and each worker of the second
attempt writes OUT_DIR/done-RANK-ATTEMPT with the group's size, job id and allreduce."""
import os, numpy as np, gossip
peer = gossip.init(timeout=20)
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
x = np.full(4, float(peer.rank))
peer.allreduce(x)
if attempt == 0 and peer.rank == 1:
    os._exit(3)        # the first attempt of rank 1 fails: torchrun restarts every worker
peer.allreduce(x)
with open(os.path.join(os.environ["OUT_DIR"], f"done-{peer.rank}-{attempt}"), "w") as f:
    f.write(f"{peer.world_size} {peer.job_id} {x.tolist()}")
peer.close()
