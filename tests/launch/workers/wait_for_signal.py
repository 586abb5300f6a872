"""usage: wait_for_signal.py DIR [--stubborn]

Writes DIR/pid.RANK once its handlers are in place, then waits. On SIGINT (Python's own
KeyboardInterrupt) or SIGTERM it writes DIR/caught.RANK.SIGNAME, proving the signal reached
this peer, and exits. Only the first SIGTERM counts: when a launcher is killed, the kernel's
parent-death signal can come more than once (once per launcher thread that exits). With
--stubborn it ignores both signals, so only SIGKILL ends it.
"""
import os
import signal
import sys

caught = None


class Stop(Exception):
    pass


def on_term(signum, frame):
    global caught
    if caught is None:
        caught = "SIGTERM"
        raise Stop()


folder = sys.argv[1]
rank = os.environ["RANK"]
if "--stubborn" in sys.argv:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, on_term)
try:  # before the PID file: a signal may come the moment the test sees it
    with open(os.path.join(folder, f"pid.{rank}.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(folder, f"pid.{rank}.tmp"), os.path.join(folder, f"pid.{rank}"))
    while True:
        signal.pause()
except KeyboardInterrupt:
    caught = "SIGINT"
except Stop:
    pass
open(os.path.join(folder, f"caught.{rank}.{caught}"), "w").close()
try:
    print(f"rank {rank} caught {caught}, cleaning up", flush=True)
except BrokenPipeError:
    pass  # the launcher is gone (killed): nobody to tell
sys.exit(1)
