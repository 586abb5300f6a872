"""usage: metrics_job.py DIR  (under gossip run)

A Synchronous job that a test scrapes while it runs: each member prints ``RUNNING`` once
gossip.init() returned (its metrics exporter is up then), trains until DIR/stop exists (the
flag is averaged with the parameters, so every member stops at the same step), and
prints ``DONE``."""
import os
import sys

import numpy as np

import gossip
from gossip.policies import Synchronous

folder = sys.argv[1]
with gossip.init() as peer:
    print(f"RUNNING rank={peer.rank}", flush=True)
    x, stop = np.zeros(256), np.zeros(1)
    policy = Synchronous().attach(peer, [x, stop])
    while stop[0] == 0:
        stop[0] = float(os.path.exists(os.path.join(folder, "stop")))
        x += 1.0
        policy.after_step()
        np.ones((64, 64)) @ np.ones((64, 64))   # the rest of a training step
    print(f"DONE step={policy.step}", flush=True)
