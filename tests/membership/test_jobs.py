"""Job identity (DESIGN.md, Membership): every peer belongs to a job, named by the launcher or
the user; peers of two jobs never mix, at the rendezvous or on a connection, even when the
two jobs meet at one address at the same moment. Real processes and sockets."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import zmq

import gossip
from collectives.transport.sockets import identity_of, job_of_identity, rank_of_identity
from collectives.transport.wire import DATA, Header, encode_header
from gossip.settings import resolve_job_id
from gossip.testing import free_port, spawn, wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEMBER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "job_member.py")


# ---------------------------------------------------------------- where the id comes from
@pytest.mark.parametrize("env, expected", [
    ({}, ("", "none")),
    ({"GOSSIP_JOB_ID": "exp-7"}, ("exp-7", "GOSSIP_JOB_ID")),
    ({"GOSSIP_JOB_ID": "exp-7", "SLURM_JOB_ID": "99"}, ("exp-7", "GOSSIP_JOB_ID")),
    ({"TORCHELASTIC_RUN_ID": "none"}, ("", "none")),   # torchrun's default names no job
    ({"TORCHELASTIC_RUN_ID": "abc123"}, ("torchrun-abc123", "torchrun")),
    ({"SLURM_JOB_ID": "4242"}, ("slurm-4242", "SLURM")),
    ({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3"}, ("slurm-4242.3", "SLURM")),
    ({"PMIX_NAMESPACE": "prterun-node1-123@1", "OMPI_COMM_WORLD_SIZE": "2"},
     ("mpi-prterun-node1-123@1", "OpenMPI")),
    ({"TORCHELASTIC_RUN_ID": "a b/c"}, ("torchrun-a_b_c", "torchrun")),  # made fit
])
def test_the_job_id_comes_from_the_first_source_that_has_one(env, expected):
    assert resolve_job_id(None, env) == expected


def test_an_argument_outranks_every_variable_and_a_bad_one_is_refused():
    assert resolve_job_id("mine", {"GOSSIP_JOB_ID": "other"}) == ("mine", "arguments")
    for bad in ("has space", "a/b", "x" * 65):
        with pytest.raises(gossip.RendezvousError, match="job id"):
            resolve_job_id(None, {"GOSSIP_JOB_ID": bad})


def test_identities_carry_the_job():
    assert identity_of("", 3) == b"gossip:3"   # an unnamed job: the spelling of old
    assert identity_of("exp-7", 3) == b"gossip:exp-7/3"
    assert rank_of_identity(b"gossip:exp-7/3", 4, "exp-7") == 3
    assert rank_of_identity(b"gossip:exp-7/3", 4, "") is None
    assert rank_of_identity(b"gossip:3", 4, "exp-7") is None
    assert rank_of_identity(b"gossip:other/3", 4, "exp-7") is None
    assert job_of_identity(b"gossip:other/3") == "other"
    assert job_of_identity(b"gossip:3") == ""
    assert job_of_identity(b"intruder") is None


# ---------------------------------------------------------------- at the rendezvous
def _init_in_thread(results: dict, key, **kwargs) -> threading.Thread:
    def run():
        try:
            results[key] = gossip.init(**kwargs)
        except Exception as exc:  # the test inspects it
            results[key] = exc
    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_peer_of_another_job_is_refused_at_the_rendezvous_naming_both(no_leaks, caplog):
    port, results = free_port(), {}
    address = f"tcp://127.0.0.1:{port}"
    with caplog.at_level(logging.WARNING, logger="collectives"):
        stranger = _init_in_thread(results, "B1", rank=1, world_size=2, rendezvous=address,
                                   timeout=3, job_id="job-B")
        owner = _init_in_thread(results, "A0", rank=0, world_size=2, rendezvous=address,
                                timeout=10, job_id="job-A")
        # Job B's rank 1 came first and keeps asking: it is refused each time, and job A's
        # own rank 1 still completes the group.
        wait_until(lambda: any("refused rank 1 of job 'job-B'" in r.getMessage()
                               for r in caplog.records), 10, what="the refusal's log line")
        member = _init_in_thread(results, "A1", rank=1, world_size=2, rendezvous=address,
                                 timeout=10, job_id="job-A")
        for t in (owner, member, stranger):
            t.join(30)
    try:
        a0, a1, b1 = results["A0"], results["A1"], results["B1"]
        assert isinstance(a0, gossip.Peer) and isinstance(a1, gossip.Peer), (a0, a1)
        assert a0.job_id == a1.job_id == "job-A"
        x = [np.full(3, 1.0), np.full(3, 2.0)]
        works = [threading.Thread(target=p.allreduce, args=(v,)) for p, v in zip((a0, a1), x)]
        for w in works:
            w.start()
        for w in works:
            w.join(30)
        assert x[0].tolist() == x[1].tolist() == [3.0] * 3
        assert isinstance(b1, gossip.RendezvousError), b1
        assert "'job-A'" in str(b1) and "'job-B'" in str(b1), b1
    finally:
        for value in results.values():
            if isinstance(value, gossip.Peer):
                value.close()


def test_a_refusal_names_each_job_plainly(no_leaks):
    """The reason a peer of another job hears reads as a sentence: "belongs to job 'job-A'",
    never "job 'job-A''s" (issue #35, defect 3), at a member's door and at the rendezvous."""
    from collectives.config import TransportConfig
    from collectives.group import Door
    owner, stranger = (Door(TransportConfig(job_id="job-A"), who="owner"),
                       Door(TransportConfig(job_id="job-B"), who="stranger"))
    answers: list[dict] = []
    stranger.on("refused", answers.append)
    try:
        stranger.tell(owner.address, "join", member={})
        wait_until(lambda: answers, 10, what="the door's refusal")
    finally:
        stranger.close()
        owner.close()
    port, results = free_port(), {}
    address = f"tcp://127.0.0.1:{port}"
    peer = _init_in_thread(results, "B1", rank=1, world_size=2, rendezvous=address,
                           timeout=1, job_id="job-B")
    rank0 = _init_in_thread(results, "A0", rank=0, world_size=2, rendezvous=address,
                            timeout=2, job_id="job-A")
    peer.join(30), rank0.join(30)
    refusals = [answers[0]["reason"], str(results["B1"])]
    assert "belongs to job 'job-A'" in refusals[0] and "job 'job-B'" in refusals[0], refusals
    assert "belongs to job 'job-A'" in refusals[1] and "job 'job-B'" in refusals[1], refusals
    assert not any("''s" in text for text in refusals), refusals


# ---------------------------------------------------------------- on a connection
def job_target(peer, endpoint_file, done_file):
    if peer.rank == 0:
        with open(endpoint_file + ".tmp", "w") as f:
            f.write(peer.transport.endpoints["tcp"])
        os.replace(endpoint_file + ".tmp", endpoint_file)
    while True:
        x = np.full(1000, float(peer.rank + 1))
        peer.allreduce(x)
        assert np.all(x == 3.0)
        done = np.array([peer.rank == 0 and os.path.exists(done_file)
                         and peer.stats()["dropped"] >= 5], dtype=bool)
        peer.allreduce(done, op="max")
        if done[0]:
            break
    return peer.stats()["dropped_by_reason"]


def test_messages_of_another_jobs_peer_are_dropped_and_logged(tmp_path):
    endpoint_file, done_file = str(tmp_path / "endpoint"), str(tmp_path / "done")

    def intrude():
        try:
            endpoint = wait_until(lambda: os.path.exists(endpoint_file)
                                  and open(endpoint_file).read(), 60, what="the endpoint")
        except TimeoutError:
            return
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.routing_id = identity_of("job-B", 1)   # rank 1, but of another job
        s.connect(endpoint)
        try:
            for number in range(1, 6):   # well-formed: only the job tells them apart
                s.send_multipart([encode_header(Header(DATA, 1, 0, 10**6, "allreduce(sum)",
                                                       "float64", (1000,), 8000, 0, 8000,
                                                       number=number)),
                                  np.ones(1000).tobytes()])
        finally:
            s.close(linger=2000)
            ctx.term()
            open(done_file, "w").close()

    intruder = threading.Thread(target=intrude)
    intruder.start()
    try:
        reasons, _ = spawn(job_target, n=2, timeout=120, args=(endpoint_file, done_file),
                           job_id="job-A", transport="tcp", insecure=True)   # no key: job ids
    finally:
        intruder.join(60)
    assert reasons.get("foreign", 0) >= 5, reasons


# ---------------------------------------------------------------- two launches, one port
# Each member names its launcher (its parent process): a group whose members have two
# parents mixed two jobs, whatever the job ids say (workers/job_member.py).
def _race(script: str, trials: int) -> list[tuple[int, str]]:
    """``trials`` times, two `gossip run -n 2 --master-port P` started at the same moment on
    one P: every line a member printed, with its launcher's exit code."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GOSSIP_", "RANK", "WORLD_SIZE", "MASTER_", "SLURM_", "OMPI_"))}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    outcomes = []
    for _ in range(trials):
        port = free_port()
        cmd = [sys.executable, "-m", "gossip", "run", "-n", "2", "--master-port", str(port),
               script]
        runs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for _ in range(2)]
        for run in runs:
            out, _ = run.communicate(timeout=120)
            outcomes.append((run.returncode, out))
    return outcomes


def _check_never_mixed(outcomes) -> int:
    succeeded = 0
    for code, out in outcomes:
        lines = [line.split("MEMBERS ", 1)[1].split() for line in out.splitlines()
                 if "MEMBERS " in line]
        for launcher, members in lines:
            assert members == launcher, f"a peer of launcher {launcher} had members of " \
                                        f"launchers {members}:\n{out}"
        if code == 0:
            assert len(lines) == 2, out
            succeeded += 1
    return succeeded


@pytest.mark.slow
def test_two_launches_at_one_port_never_mix(tmp_path):
    script = MEMBER
    outcomes = _race(str(script), trials=4)
    # The one that binds the port first always completes; the other may find it in use.
    assert _check_never_mixed(outcomes) >= 4


@pytest.mark.slow
def test_two_launches_at_one_port_never_mix_in_many_trials(tmp_path):
    script = MEMBER
    assert _check_never_mixed(_race(str(script), trials=40)) >= 40
