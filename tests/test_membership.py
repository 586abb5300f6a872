"""Membership (DESIGN.md): versioned views, processes that join a running group and take its
state at a step boundary, survivors that re-form a synchronous group when a peer dies.
Real peer processes, real sockets, real SIGKILLs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np

from gossip.testing import spawn, wait_until

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER_TIMEOUT = 30.0


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GOSSIP_", "RANK", "WORLD_SIZE", "MASTER_", "SLURM_", "OMPI_"))}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


# ---------------------------------------------------------------- view 0
def describe_view(peer):
    view = peer.view
    return view.number, [m.name for m in view.members], [bool(m.door) for m in view.members]


def test_every_peer_reads_the_same_first_view():
    results = spawn(describe_view, n=3, timeout=60)
    assert results[0] == (0, ["rank0", "rank1", "rank2"], [True, True, True])
    assert results[0] == results[1] == results[2]


# ---------------------------------------------------------------- a joiner
def members_until_joined(peer, workdir, size):
    from gossip.policies import Synchronous
    if peer.rank == 0:
        with open(os.path.join(workdir, "address.tmp"), "w") as f:
            f.write(peer.settings.rendezvous)
        os.replace(os.path.join(workdir, "address.tmp"), os.path.join(workdir, "address"))
    x = np.full(1000, float(peer.rank))
    policy = Synchronous().attach(peer, [x])      # every replica starts from rank 0's x
    # The same condition on every replica (they switch views at the same boundary).
    while (policy.step < 40 or peer.world_size < size) and policy.step < 3000:
        x += 1.0
        policy.after_step()
        time.sleep(0.005)
    views = peer.view.number
    policy.close()
    return peer.world_size, views, policy.step, float(x[0]), float(x.max() - x.min())


JOINER = textwrap.dedent("""
    import sys, time, numpy as np, gossip
    from gossip.policies import Synchronous
    size = int(sys.argv[1])
    peer = gossip.init(join=True, timeout=30)
    x = np.zeros(1000)
    policy = Synchronous().attach(peer, [x])      # takes the running state here
    start = policy.step
    while (policy.step < 40 or peer.world_size < size) and policy.step < 3000:
        x += 1.0
        policy.after_step()
        time.sleep(0.005)
    print("JOINED", peer.rank, peer.world_size, peer.view.number, start, policy.step,
          float(x[0]), flush=True)
    peer.close()
""")


def _start_joiner(workdir, size, name="joiner"):
    address = wait_until(lambda: os.path.exists(os.path.join(workdir, "address"))
                         and open(os.path.join(workdir, "address")).read(), 60,
                         what="rank 0's rendezvous address")
    script = os.path.join(workdir, "joiner.py")
    with open(script, "w") as f:
        f.write(JOINER)
    return subprocess.Popen([sys.executable, script, str(size)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env=_env(GOSSIP_RENDEZVOUS=address, GOSSIP_MEMBER_NAME=name))


def test_a_process_joins_a_running_synchronous_group_and_takes_its_state(tmp_path):
    workdir = str(tmp_path)
    box = {}

    def joiner():
        box["proc"] = proc = _start_joiner(workdir, 4)
        box["out"], _ = proc.communicate(timeout=120)

    thread = threading.Thread(target=joiner)
    thread.start()
    try:
        results = spawn(members_until_joined, n=3, timeout=150, args=(workdir, 4),
                        peer_timeout=PEER_TIMEOUT)
    finally:
        thread.join(150)
    line = [ln for ln in box["out"].splitlines() if ln.startswith("JOINED")]
    assert line, box["out"]
    _, rank, size, number, start, steps, value = line[0].split()
    assert (int(rank), int(size), int(number)) == (3, 4, 1)
    assert int(start) > 0                       # it entered at a boundary, with the state
    for world, views, member_steps, x0, spread in results:
        assert (world, views) == (4, 1)
        assert member_steps == int(steps)       # everyone stopped at the same step
        assert x0 == float(value) == float(member_steps)   # x = 0 + 1 per step, exactly
        assert spread == 0.0


# ---------------------------------------------------------------- a death, elastic
def elastic_until(peer, victim, kill_at, total):
    from gossip.policies import Synchronous
    x = np.arange(1000, dtype=np.float64)
    policy = Synchronous(elastic=True).attach(peer, [x])
    first_rank = peer.rank   # ranks are renumbered densely by a view change
    while policy.step < total:
        if first_rank == victim and policy.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        x += peer.rank + 1.0   # averaged every step: the replicas move by the mean
        policy.after_step()
    return peer.world_size, peer.view.number, [m.name for m in peer.view.members], \
        policy.step, x.tobytes()


def test_survivors_of_an_elastic_synchronous_group_re_form_it_and_stay_identical():
    results = spawn(elastic_until, n=4, timeout=150, args=(3, 15, 40), tolerate=(3,),
                    peer_timeout=PEER_TIMEOUT)
    survivors = results[:3]
    assert results[3] is None
    for world, number, names, steps, _ in survivors:
        assert (world, number, names, steps) == (3, 1, ["rank0", "rank1", "rank2"], 40)
    assert survivors[0][4] == survivors[1][4] == survivors[2][4]   # bitwise identical


def test_the_death_of_rank_0_the_first_coordinator_stops_nothing():
    results = spawn(elastic_until, n=4, timeout=150, args=(0, 12, 40), tolerate=(0,),
                    peer_timeout=PEER_TIMEOUT)
    survivors = results[1:]
    for world, number, names, steps, _ in survivors:
        assert (world, number, names, steps) == (3, 1, ["rank1", "rank2", "rank3"], 40)
    assert survivors[0][4] == survivors[1][4] == survivors[2][4]
