"""usage: late_restart.py  (under gossip run -n 3 --max-restarts 1; DONE_FILE set)

Rank 2 SIGKILLs itself at step 5 of a Synchronous(elastic=True) job. Ranks 0 and 1 end as
soon as their view has lost it; rank 0 writes DONE_FILE once its peer is closed. The restart
of rank 2 waits for that file, then looks for the rendezvous of a job that has ended (as a
restart does that comes back after the job's last step): nobody answers it within its
GOSSIP_TIMEOUT. With FAIL_AFTER_END=1 no group is formed: ranks 0 and 1 write their pids
(DONE_FILE.0, .1) and exit 0, and rank 2 exits 3 once both processes are gone (a failure once
the job has ended)."""
import os
import signal

import numpy as np

import gossip
from gossip.testing import wait_until
from gossip.policies import Synchronous

done_file = os.environ["DONE_FILE"]
rank = int(os.environ["RANK"])
first = os.environ.get("GOSSIP_INCARNATION", "0") == "0"


def wait_for_done() -> None:
    wait_until(lambda: os.path.exists(done_file), 60, what=f"rank {rank}: {done_file} written")


def gone(pid_file: str) -> bool:
    """The process whose pid ``pid_file`` holds has ended and been reaped by the launcher."""
    try:
        with open(pid_file) as f:
            os.kill(int(f.read()), 0)
    except (FileNotFoundError, ValueError):
        return False   # (not written yet, or half written)
    except ProcessLookupError:
        return True
    return False


if os.environ.get("FAIL_AFTER_END") == "1":   # no group: the launcher's part alone
    if rank == 2:   # after both others have exited (and the launcher has seen them exit)
        wait_until(lambda: gone(f"{done_file}.0") and gone(f"{done_file}.1"), 60,
                   what="ranks 0 and 1 ended")
        raise SystemExit(3)
    with open(f"{done_file}.{rank}.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(f"{done_file}.{rank}.tmp", f"{done_file}.{rank}")
    raise SystemExit(0)
if rank == 2 and not first:
    wait_for_done()
with gossip.init() as peer:
    w = np.zeros(4)
    policy = Synchronous(elastic=True).attach(peer, [w])
    while peer.world_size == 3 if rank != 2 else True:
        if rank == 2 and first and policy.step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        w += 1.0
        policy.after_step()
    print(f"rank {rank}: ended at step {policy.step} of {peer.view.describe()}", flush=True)
if rank == 0:
    open(done_file, "w").close()
