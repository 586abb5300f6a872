"""An honest sender running far ahead of its receiver: the receiver holds what arrives for
operations it has not started up to HELD_PAUSE, then asks the sender to wait (HOLD), and lets
it go on once it catches up. Nothing is dropped, every array arrives exact, and the receiver
never holds more than HELD_PER_LINK from that sender."""
from __future__ import annotations

import numpy as np

from collectives import defaults
from gossip.testing import spawn, wait_until

MESSAGES = 24
SIZE = 16 << 20  # 24 x 16 MiB = 384 MiB: past the pause and the hard bound both


def run_ahead(peer):
    if peer.rank == 1:
        for i in range(MESSAGES):
            peer.send(0, np.full(SIZE, i % 251, dtype=np.uint8))  # waits while held
        peer.barrier()
        return peer.stats()["holds_received"]
    t = peer.transport
    # The receiver starts nothing until it has asked the sender to wait: everything the
    # sender sent so far is for operations not started.
    wait_until(lambda: t.stats()["holds_sent"]["pause"] >= 1, 60, what="a pause")
    exact = True
    for i in range(MESSAGES):
        x = peer.recv(1)
        exact &= x.size == SIZE and int(x[0]) == i % 251 and int(x[-1]) == i % 251
    peer.barrier()
    stats = peer.stats()
    return exact, stats["dropped"], stats["held_peak"], stats["holds_sent"]


def test_fast_sender_waits_instead_of_being_dropped():
    (exact, dropped, peak, sent), received = spawn(run_ahead, n=2, timeout=120,
                                                  transport="tcp")
    assert exact and dropped == 0
    assert defaults.HELD_PAUSE < peak <= defaults.HELD_PER_LINK, peak
    assert sent["pause"] >= 1 and sent["resume"] >= 1, sent
    assert received["pause"] >= 1 and received["resume"] >= 1, received
    print(f"\nrun ahead: {MESSAGES} x {SIZE >> 20} MiB, held peak {peak / 2**20:.1f} MiB, "
          f"holds {sent}, 0 dropped")
