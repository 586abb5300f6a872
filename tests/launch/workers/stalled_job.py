"""usage: stalled_job.py DIR  (under gossip run)

A Synchronous job whose last rank stalls in its own function (``stall_in_user_code``) at step
5, until DIR/go exists, while the others wait for it in the step's allreduce; then all train
to step 10 and print DONE. Each member prints ``RUNNING`` (rank, pid) first.
"""
import functools
import os
import sys
import time

import numpy as np

import gossip
from gossip.policies import Synchronous
from gossip.testing import wait_until

folder = sys.argv[1]


def stall_in_user_code() -> None:
    with open(os.path.join(folder, "stalled.tmp"), "w") as f:
        f.write(repr(time.time()))   # when it stalled (benchmarks/status_latency.py reads it)
    os.replace(os.path.join(folder, "stalled.tmp"), os.path.join(folder, "stalled"))
    # Held here (the frame `gossip status` names) until the test lets it go, 5 minutes at most.
    # (A partial, not a lambda: no frame of this file inside the wait.)
    wait_until(functools.partial(os.path.exists, os.path.join(folder, "go")), 300.0,
               what="the test's go file")


with gossip.init() as peer:
    print(f"RUNNING rank={peer.rank} pid={os.getpid()}", flush=True)
    x = np.zeros(256, dtype=np.float32)
    policy = Synchronous().attach(peer, [x])
    for step in range(10):
        if step == 5 and peer.rank == peer.world_size - 1:
            stall_in_user_code()
        x += 1.0
        policy.after_step()
    print(f"DONE rank={peer.rank} step={policy.step}", flush=True)
