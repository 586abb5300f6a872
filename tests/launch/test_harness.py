"""gossip.testing.spawn's verdict: which failure its error message leads with; the
supervisor's restarts (real processes, real SIGKILLs); and the harness reachable as
``gossip.testing`` after a plain ``import gossip``."""
import os
import signal
import subprocess
import sys
import threading

import pytest

from gossip.launch.supervisor import supervise
from gossip.testing import PeerOutcome, SpawnError, _verdict


def _headline(*outcomes: PeerOutcome, tolerate=frozenset()) -> str:
    with pytest.raises(SpawnError) as info:
        _verdict(list(outcomes), 60.0, frozenset(tolerate))
    return str(info.value).splitlines()[0]


def test_the_failure_seen_first_leads_not_the_lowest_rank() -> None:
    # Rank 1 died; rank 0 then raised PeerLost about it: the cause is rank 1.
    head = _headline(PeerOutcome(0, status="error", exitcode=1, noticed=5.0),
                     PeerOutcome(1, status="died", exitcode=7, noticed=4.0))
    assert head.startswith("rank 1 died (exit code 7)"), head


def test_seen_together_a_death_leads_an_error() -> None:
    head = _headline(PeerOutcome(0, status="error", exitcode=1, noticed=5.0),
                     PeerOutcome(1, status="died", exitcode=-9, noticed=5.0))
    assert head.startswith("rank 1 died"), head


def test_a_tolerated_death_never_leads() -> None:
    head = _headline(PeerOutcome(0, status="error", exitcode=1, noticed=5.0),
                     PeerOutcome(1, status="died", exitcode=-9, noticed=4.0), tolerate={1})
    assert head.startswith("rank 0 failed"), head


def test_gossip_testing_is_an_attribute_loaded_on_first_use() -> None:
    code = ("import sys, gossip; light = 'gossip.testing' not in sys.modules; "
            "spawn = gossip.testing.spawn; print(light, spawn.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "gossip.testing"]


def test_a_temporary_directory_too_long_for_the_fork_server_starts_peers_with_spawn(
        tmp_path) -> None:
    """The fork server's socket lives under TMPDIR; past 107 bytes Python fails with a bare
    "AF_UNIX path too long". A fresh process with such a TMPDIR still runs its peers, and
    says why they start slower."""
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    deep.mkdir(parents=True)
    code = ("import numpy as np\n"
            "from gossip.testing import spawn\n"
            "def body(peer):\n"
            "    return float(peer.allreduce(np.ones(4) * peer.rank)[0])\n"
            "if __name__ == '__main__':\n"
            "    print(spawn(body, 2, timeout=120))\n")
    script = tmp_path / "run.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=180, env={**os.environ, "TMPDIR": str(deep)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["[1.0,", "1.0]"], out.stdout
    assert "too long for the fork server's Unix socket" in out.stderr, out.stderr[-3000:]
    assert str(deep) in out.stderr


# ---------------------------------------------------------------- restarts
def _killed_first(rank: int) -> tuple:
    incarnation = os.environ.get("GOSSIP_INCARNATION")
    if rank == 1 and incarnation == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    return rank, incarnation


def test_a_rank_killed_is_started_again_with_the_next_incarnation() -> None:
    outcomes = supervise(_killed_first, 3, timeout=60, restarts={1: 1})
    assert [o.status for o in outcomes] == ["ok", "ok", "ok"]
    # Only the ranks that may restart get a count; the others keep their own incarnation.
    assert [o.result for o in outcomes] == [(0, None), (1, "1"), (2, None)]
    again = outcomes[1]
    assert again.incarnation == 1
    assert [(e.status, e.exitcode, e.incarnation) for e in again.earlier] == [
        ("died", -signal.SIGKILL, 0)]


def _always_fails(rank: int) -> int:
    if rank == 1:
        raise RuntimeError(f"incarnation {os.environ['GOSSIP_INCARNATION']} fails")
    return rank


def test_a_rank_whose_restarts_are_spent_fails_as_usual() -> None:
    outcomes = supervise(_always_fails, 2, timeout=60, restarts={1: 2})
    last = outcomes[1]
    assert last.status == "error" and "incarnation 2 fails" in last.error
    assert [e.status for e in last.earlier] == ["error", "error"]
    assert "incarnation 0 fails" in last.earlier[0].error
    with pytest.raises(SpawnError, match="rank 1 failed"):
        _verdict(outcomes, 60.0, frozenset())


def _rank1_waits(rank: int) -> int:
    if rank == 1:
        threading.Event().wait()   # a peer that never finishes (still trying to rejoin)
    return rank


def test_a_tolerated_rank_still_running_after_the_others_is_stopped_after_the_grace() -> None:
    outcomes = supervise(_rank1_waits, 2, timeout=60, tolerate={1}, tolerated_grace=0.5)
    assert [o.status for o in outcomes] == ["ok", "stopped"]
    assert _verdict(outcomes, 60.0, frozenset({1})) == [0, None]


# ---------------------------------------------------------------- a port taken before the bind
def _ran(peer) -> int:
    return peer.world_size


def test_a_rendezvous_port_taken_before_the_bind_starts_the_job_again_elsewhere(
        monkeypatch, caplog) -> None:
    # Something binds the port free_port() chose before rank 0 does (seen in CI: "Address
    # already in use"): no rank ran the function yet, so spawn starts the job on another port.
    import socket

    import gossip.testing as harness
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    ports = iter([taken])
    real = harness.free_port
    monkeypatch.setattr(harness, "free_port", lambda: next(ports, None) or real())
    try:
        with caplog.at_level("WARNING", logger="gossip.testing"):
            assert harness.spawn(_ran, n=2, timeout=60) == [2, 2]
    finally:
        holder.close()
    assert f"rendezvous port {taken} was taken" in caplog.text
