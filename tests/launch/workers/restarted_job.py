"""usage: restarted_job.py  (under gossip run --max-restarts 1)

A Synchronous(elastic=True) job whose rank 1 SIGKILLs itself at step 10 the first time it
runs; `gossip run` starts it again and it rejoins. Every member trains to step 40 with the
full group back, then prints ``METRICS`` and the membership's counts from a scrape of its own
metrics (gossip.metrics.collect, as a Prometheus scrape answers)."""
import json
import os
import signal

import numpy as np

import gossip
from gossip.metrics import collect, render
from gossip.policies import Synchronous

with gossip.init() as peer:
    x = np.zeros(16)
    policy = Synchronous(elastic=True).attach(peer, [x])
    first = os.environ.get("GOSSIP_INCARNATION", os.environ.get("TORCHELASTIC_RESTART_COUNT",
                                                                  "0")) == "0"
    size = int(os.environ["WORLD_SIZE"])
    while policy.step < 40 or peer.world_size < size:
        if peer.rank == 1 and first and policy.step == 10 and peer.view.number == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        x += 1.0
        policy.after_step()
        np.ones((64, 64)) @ np.ones((64, 64))   # a step's compute
    values = {}
    for line in render(collect(peer)).splitlines():
        if line.startswith(("gossip_member_", "gossip_view ", "gossip_view{",
                            "gossip_view_changes", "gossip_members_")):
            name, value = line.rsplit(" ", 1)
            values[name.split("{", 1)[0]] = float(value)
    print("METRICS " + json.dumps(values), flush=True)
