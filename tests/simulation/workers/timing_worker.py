"""One real peer of the timing check (tests/simulation/test_timing_fidelity.py): the loop every
simulated peer runs (gossip.simulation.train_peer) with TIMING_SPEC's TrainingSpec, on a host of
a network the test shaped. Writes when each step began (time.monotonic(), as the loop's tick
sees it) to TIMING_DIR/result.<rank>."""
import json
import os
import time

import gossip
from gossip.simulation import TrainingSpec, train_peer

spec = TrainingSpec(**json.loads(os.environ["TIMING_SPEC"]))
peer = gossip.init()
starts: list[float] = []
result = train_peer(peer, spec, tick=lambda seconds: starts.append(time.monotonic()))
starts.append(time.monotonic())   # (the last step's end, before the evaluation's tail)
rank = peer.rank
peer.close()
path = os.path.join(os.environ["TIMING_DIR"], f"result.{rank}")
with open(path + ".tmp", "w") as f:
    json.dump({"rank": rank, "starts": starts, "accuracy": result.accuracy}, f)
os.replace(path + ".tmp", path)
