"""Under `gossip run -n 2` (tests/launch/test_logging.py): three allreduces of 16 MiB (1 MiB
chunks over tcp), then MESSAGES with the number of messages this peer received."""
import numpy as np, gossip
with gossip.init(timeout=60) as peer:
    x = np.ones(4 << 20, dtype=np.float32)   # 16 MiB: 1 MiB chunks over tcp
    for _ in range(3):
        peer.allreduce(x)
    print("MESSAGES", peer.stats()["messages_received"], flush=True)
