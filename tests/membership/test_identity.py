"""A live member's identity is never given to another process (issue #35, defect 1;
DESIGN.md, Security by default): a joiner without an identity from its launcher joins as a
member of its own; one under a live member's name is refused, naming that member; a restart
replaces only a member whose door does not answer (a probe) or that its transport counts
lost; a member replaced although alive (stopped, then back) stops with MemberReplaced
naming its replacement instead of training on alone. Real processes, real sockets, a real
SIGSTOP / SIGCONT."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from gossip.testing import spawn, wait_until
from helpers import clean_env

# The joiners started by hand hold the group's key (tests/conftest.py's group_key).
pytestmark = pytest.mark.usefixtures("group_key")

JOINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers",
                      "identity_joiner.py")
JOB = "identity-35"


def _publish(peer, workdir) -> tuple[str, int]:
    """Rank 0 writes the rendezvous address for the test; this member's (name, incarnation)."""
    if peer.rank == 0:
        with open(os.path.join(workdir, "address.tmp"), "w") as f:
            f.write(peer.settings.rendezvous)
        os.replace(os.path.join(workdir, "address.tmp"), os.path.join(workdir, "address"))
    me = peer.view.members[peer.rank]
    return me.name, me.incarnation


def _joiner(workdir, mode, **env) -> subprocess.Popen:
    path = os.path.join(workdir, "address")
    address = wait_until(lambda: os.path.exists(path) and open(path).read(), 60,
                         what="rank 0's rendezvous address")
    return subprocess.Popen([sys.executable, JOINER, mode, workdir], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env=clean_env(GOSSIP_JOIN="1", GOSSIP_RENDEZVOUS=address,
                                          GOSSIP_JOB_ID=JOB, **env))


def _line(out: str, tag: str) -> dict | None:
    lines = [ln for ln in out.splitlines() if ln.startswith(tag + " ")]
    return json.loads(lines[0][len(tag) + 1:]) if lines else None


# ---------------------------------------------------------------- a joiner of its own
def members_until_four(peer, workdir):
    from gossip.policies import Synchronous
    me = _publish(peer, workdir)
    x = np.zeros(1000)
    policy = Synchronous().attach(peer, [x])
    while (policy.step < 40 or peer.world_size < 4) and policy.step < 100_000:
        x += 1.0
        policy.after_step()
        np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
    mine = peer.view.members[peer.rank]
    return me, (mine.name, mine.incarnation), peer.view.names(), policy.step, float(x[0])


def test_a_joiner_without_an_identity_from_its_launcher_joins_as_a_new_member(tmp_path):
    # Started by hand: GOSSIP_JOIN, the job's address and id, no RANK: it used to be taken
    # for rank0's restart (rank0 + a new incarnation) while rank 0 lived.
    workdir, box = str(tmp_path), {}

    def joiner():
        proc = box["proc"] = _joiner(workdir, "new")
        box["out"] = proc.communicate(timeout=120)[0]

    thread = threading.Thread(target=joiner)
    thread.start()
    try:
        results = spawn(members_until_four, n=3, timeout=150, args=(workdir,),
                        peer_timeout=30, job_id=JOB)
    finally:
        thread.join(150)
    joined = _line(box.get("out", ""), "JOINED")
    assert joined, box.get("out")
    assert joined["name"].endswith(f"-{joined['pid']}")   # <host>-<pid>: its own
    assert joined["names"] == ["rank0", "rank1", "rank2", joined["name"]]
    for start, now, names, steps, x in results:
        assert now == start                  # every member kept its name and incarnation
        assert names == joined["names"] and steps == joined["steps"]
        assert x == joined["x"] == float(steps)


# ---------------------------------------------------------------- a live member's name
def members_until_done(peer, workdir, victim):
    """A Gossip ring; ``victim`` (a first rank) waits at step 20 for the test (which stops
    it there) until told to go on; every member trains until the test says ``finish``. A
    replaced member returns its MemberReplaced."""
    import gossip
    from gossip.policies import Gossip
    me = _publish(peer, workdir)
    first = peer.rank
    x = np.full(100, float(peer.rank))
    policy = Gossip().attach(peer, [x])
    try:
        while not os.path.exists(os.path.join(workdir, "finish")) and policy.step < 100_000:
            if first == victim and policy.step == 20 \
                    and not os.path.exists(os.path.join(workdir, "pid")):
                with open(os.path.join(workdir, "pid"), "w") as f:
                    f.write(str(os.getpid()))
                wait_until(lambda: os.path.exists(os.path.join(workdir, "cont")), 90,
                           what="the test's SIGCONT")
            policy.after_step()
            np.ones((96, 96)) @ np.ones((96, 96))   # a step's compute
    except gossip.GossipError as exc:   # MemberReplaced, expected of the stopped member
        open(os.path.join(workdir, "replaced"), "w").close()
        by = getattr(exc, "by", None)
        return type(exc).__name__, me, str(exc), by and (by.name, by.incarnation, by.door)
    return "trained", me, peer.view.number, [str(m) for m in peer.view.members]


def test_a_joiner_under_a_live_members_name_is_refused_naming_it(tmp_path):
    workdir, box = str(tmp_path), {}

    def joiner():
        try:
            proc = _joiner(workdir, "named", GOSSIP_MEMBER_NAME="rank1")
            box["out"] = proc.communicate(timeout=120)[0]
            box["code"] = proc.returncode
        finally:
            open(os.path.join(workdir, "finish"), "w").close()

    thread = threading.Thread(target=joiner)
    thread.start()
    try:
        results = spawn(members_until_done, n=3, timeout=150, args=(workdir, -1),
                        peer_timeout=30, job_id=JOB)
    finally:
        thread.join(150)
    out = box.get("out", "")
    assert box.get("code") == 3 and "REFUSED" in out, out
    _, rank1, _, _ = results[1]
    holder = f"{rank1[0]}#{rank1[1]}"
    assert holder in out and "answered a probe" in out, out   # its identity, named
    assert "tcp://" in out and "host" in out, out              # and where it lives
    for kind, _, number, members in results:
        assert (kind, number) == ("trained", 0)                # the group as it was
        assert holder in members


def test_a_member_replaced_while_stopped_stops_naming_its_replacement(tmp_path):
    # Rank 1 is stopped (SIGSTOP); a process under its name asks to join: rank 1's door
    # does not answer the probe, so it takes rank 1's place. Rank 1, let go on (SIGCONT),
    # learns it at its next boundary and stops instead of training on alone.
    workdir, box = str(tmp_path), {}

    def stop_and_join():
        try:
            pid = int(wait_until(lambda: os.path.exists(os.path.join(workdir, "pid"))
                                 and open(os.path.join(workdir, "pid")).read(), 90,
                                 what="rank 1 at step 20"))
            os.kill(pid, signal.SIGSTOP)
            try:
                proc = _joiner(workdir, "named", GOSSIP_MEMBER_NAME="rank1")
                lines = []
                for line in proc.stdout:
                    lines.append(line)
                    if line.startswith("JOINED"):
                        break
            finally:
                open(os.path.join(workdir, "cont"), "w").close()
                os.kill(pid, signal.SIGCONT)
            lines += proc.communicate(timeout=120)[0].splitlines(keepends=True)
            box["out"], box["code"] = "".join(lines), proc.returncode
            wait_until(lambda: os.path.exists(os.path.join(workdir, "replaced")), 60,
                       what="rank 1's MemberReplaced")
        finally:
            open(os.path.join(workdir, "finish"), "w").close()

    thread = threading.Thread(target=stop_and_join)
    thread.start()
    try:
        results = spawn(members_until_done, n=3, timeout=180, args=(workdir, 1),
                        peer_timeout=8, job_id=JOB)
    finally:
        thread.join(180)
    out = box.get("out", "")
    joined = _line(out, "JOINED")
    assert joined and box.get("code") == 0 and "DONE" in out, out
    kind, old, message, by = results[1]
    assert kind == "MemberReplaced", results[1]
    assert by == (joined["name"], joined["inc"], joined["door"])   # names its replacement
    assert f"{old[0]}#{old[1]}" in message and joined["door"] in message, message
    assert joined["name"] == old[0] and joined["inc"] > old[1]
    for kind, _, number, members in (results[0], results[2]):
        assert kind == "trained" and number >= 1
        assert f"rank1#{joined['inc']}" in members


# ---------------------------------------------------------------- a knock at a member's door
@pytest.mark.parametrize("keyed", [False, True])
def test_a_knock_tells_a_door_that_is_gone_from_one_that_listens(keyed, group_key):
    """Door.knock, which lets a restart take a dead member's name without waiting out the
    probe: a closed door's port refuses the connection (True); a live door's completes the
    handshake (False), and that door counts no refused handshake."""
    from collectives.config import TransportConfig
    from collectives.group import Door
    from collectives.security import load_cluster_key
    config = TransportConfig(key=load_cluster_key(group_key) if keyed else None)
    knocker, member, gone = (Door(config, who="coordinator"), Door(config, who="member"),
                             Door(config, who="gone"))
    pings: list[dict] = []
    member.on("ping", pings.append)

    def refused_after_a_ping() -> int:
        # (The door's thread reads its monitor and its messages in one loop: a message told
        # after a connection ended is taken after that connection's events.)
        count = len(pings)
        knocker.tell(member.address, "ping")
        wait_until(lambda: len(pings) > count, 10, what="the member's door taking a ping")
        return member.refusals.count

    try:
        gone.close()   # its port: nothing listens there any more
        assert knocker.knock(gone.address, 5.0) is True
        assert knocker.knock(member.address, 5.0) is False
        assert refused_after_a_ping() == 0, member.refusals.by_reason
        # What the knock avoids: a plain connection that hangs up before any handshake is
        # a refused handshake at that door.
        host, port = member.address[len("tcp://"):].rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5).close()
        assert wait_until(lambda: refused_after_a_ping() == 1, 10,
                          what="the plain connection counted"), member.refusals.by_reason
    finally:
        for door in (knocker, member, gone):
            door.close()
