"""A live member that a view leaves out (stopped past the timeout, then resumed) comes back
as its next incarnation, and never forms a group of its own (split brain). Real processes, a
real SIGSTOP / SIGCONT."""
from __future__ import annotations

import os
import signal
import threading

import numpy as np

from gossip.testing import spawn, wait_until


def stopped_member(peer, workdir):
    from gossip.policies import Synchronous
    x = np.full(1000, float(peer.rank))
    policy = Synchronous(elastic=True).attach(peer, [x])
    name = peer.view.members[peer.rank].name
    views = set()
    while policy.step < 100_000:
        if name == "rank3" and policy.step == 15 and not os.path.exists(f"{workdir}/pid"):
            with open(f"{workdir}/pid", "w") as f:
                f.write(str(os.getpid()))
            # The test stops this process here, and lets it go on once the others re-formed.
            wait_until(lambda: os.path.exists(f"{workdir}/cont"), 60, what="the SIGCONT")
        if peer.world_size == 3 and peer.rank == 0 and not os.path.exists(f"{workdir}/reformed"):
            open(f"{workdir}/reformed", "w").close()
        views.add((peer.view.number, peer.world_size))
        if peer.world_size == 4 and peer.view.number >= 2 and policy.step >= 60:
            break
        x += 1.0
        policy.after_step()
    return name, peer.world_size, peer.view.number, policy.step, x.copy(), sorted(views)


def test_a_member_stopped_past_the_timeout_is_left_out_and_comes_back_without_a_split(tmp_path):
    workdir = str(tmp_path)

    def stop_then_resume():
        wait_until(lambda: os.path.exists(f"{workdir}/pid"), 60, what="rank 3 at step 15")
        pid = int(open(f"{workdir}/pid").read())
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(lambda: os.path.exists(f"{workdir}/reformed"), 60,
                       what="the others' view without rank 3")
        finally:
            open(f"{workdir}/cont", "w").close()
            os.kill(pid, signal.SIGCONT)

    driver = threading.Thread(target=stop_then_resume)
    driver.start()
    try:
        out = spawn(stopped_member, n=4, timeout=120, peer_timeout=4, args=(workdir,))
    finally:
        driver.join(70)
    names = sorted(r[0] for r in out)
    assert names == ["rank0", "rank1", "rank2", "rank3"]
    finals = {(r[1], r[2], r[3]) for r in out}
    assert len(finals) == 1, [r[:4] for r in out]   # one view, one step: no second group
    world, number, _ = finals.pop()
    assert world == 4 and number >= 2
    for r in out[1:]:
        assert np.array_equal(r[4], out[0][4])       # the replicas identical
    stopped = next(r for r in out if r[0] == "rank3")
    # It never trained in a group of its own (a view of 1 member).
    assert all(size > 1 for _, size in stopped[5]), stopped[5]
