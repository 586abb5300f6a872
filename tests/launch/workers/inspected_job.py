"""usage: inspected_job.py DIR [PEERS]  (under gossip run, or started by hand as a joiner)

A Synchronous job that a test looks into while it runs. Each member prints ``RUNNING`` with
its launcher rank, pid, job id and rendezvous address once gossip.init() has returned (its
SIGUSR1 handler is in place then), trains until DIR/stop exists (the flag is averaged with
the parameters, so every member stops at the same step) or, given PEERS, until the view has
that many members, and prints ``DONE``. A joiner (started with GOSSIP_JOIN) writes
DIR/joined.PID with its step and the view's size once it has the job's state.
"""
import json
import os
import sys

import numpy as np

import gossip
from gossip.policies import Synchronous

folder = sys.argv[1]
peers = int(sys.argv[2]) if len(sys.argv) > 2 else 0
with gossip.init() as peer:
    print(f"RUNNING rank={os.environ.get('RANK', '-')} pid={os.getpid()} "
          f"job={os.environ.get('GOSSIP_JOB_ID')} rendezvous={peer.settings.rendezvous}",
          flush=True)
    x, stop = np.zeros(64), np.zeros(1)
    joiner = peer.joining   # until the policy attaches: then the state has come
    policy = Synchronous().attach(peer, [x, stop])
    if joiner:
        path = os.path.join(folder, f"joined.{os.getpid()}")
        with open(path + ".tmp", "w") as f:
            json.dump({"step": policy.step, "members": peer.world_size}, f)
        os.replace(path + ".tmp", path)
    while stop[0] == 0 and not (peers and peer.world_size >= peers):
        stop[0] = float(os.path.exists(os.path.join(folder, "stop")))
        x += 1.0
        policy.after_step()   # averages the flag too: every member sees the same value
        np.ones((96, 96)) @ np.ones((96, 96))   # the rest of a training step
    print(f"DONE step={policy.step} members={peer.world_size} x={x[0]:.0f}", flush=True)
