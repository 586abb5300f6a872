"""Under `gossip run -n 2` (tests/membership/test_jobs.py): a member prints MEMBERS with its
launcher's pid and the launcher pids of every member of its group (a group of two
launches' peers would show two)."""
import os, numpy as np, gossip
peer = gossip.init(timeout=8)
parents = peer.allgather(np.array([os.getppid()], dtype=np.int64))
print("MEMBERS", os.getppid(), ",".join(str(p) for p in sorted(set(parents.ravel().tolist()))),
      flush=True)
peer.close()
