"""usage: fail_one.py DIR FAIL_RANK exit|sigkill [finish]

Every peer writes DIR/pid.RANK. FAIL_RANK waits until all peers have written theirs (so the
test knows every PID), then exits with code 3 or kills itself with SIGKILL; the others wait
forever, until the launcher stops them (with `finish`: until FAIL_RANK has failed, then
they exit 0, as peers that train on around a dead one would).
"""
import os
import signal
import sys
from gossip.testing import wait_until

folder, fail_rank, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
with open(os.path.join(folder, f"pid.{rank}.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.rename(os.path.join(folder, f"pid.{rank}.tmp"), os.path.join(folder, f"pid.{rank}"))

if rank == fail_rank:
    wait_until(lambda: all(os.path.exists(os.path.join(folder, f"pid.{r}"))
                           for r in range(world)), 30, what="every peer's PID file")
    print(f"rank {rank} failing on purpose ({mode})", flush=True)
    open(os.path.join(folder, "failed"), "w").close()
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(3)

if sys.argv[4:] == ["finish"]:
    wait_until(lambda: os.path.exists(os.path.join(folder, "failed")), 30,
               what=f"rank {fail_rank}'s failure")
    failing = int(open(os.path.join(folder, f"pid.{fail_rank}")).read())

    def failing_gone() -> bool:
        try:
            os.kill(failing, 0)  # succeeds until the launcher has reaped it
        except ProcessLookupError:
            return True
        return False
    wait_until(failing_gone, 30, what=f"the end of rank {fail_rank}")
    print(f"rank {rank} finished", flush=True)
    sys.exit(0)
while True:
    signal.pause()  # until the launcher stops us
