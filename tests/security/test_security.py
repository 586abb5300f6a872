"""CURVE with a cluster key: key files, encrypted peers that work, and intruders that get
nothing in and nothing out."""
from __future__ import annotations

import os
import stat
import threading
import time

import numpy as np
import pytest
import zmq

import gossip
from collectives.security import load_cluster_key, write_cluster_key
from collectives.transport.wire import DATA, Header, encode_header
from gossip.testing import free_port, spawn, wait_until


@pytest.fixture
def key_path(tmp_path):
    path = tmp_path / "cluster.key"
    write_cluster_key(path)
    return str(path)


def test_key_file_is_private_and_round_trips(key_path):
    assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
    key = load_cluster_key(key_path)
    assert len(key.public) == 40 and "secret" not in repr(key)
    with pytest.raises(FileExistsError):
        write_cluster_key(key_path)


@pytest.mark.parametrize("text, match", [
    ("", "not a gossip cluster key"),
    ("public = abc\nsecret = def\n", "not a gossip cluster key"),
])
def test_bad_key_files(tmp_path, text, match):
    path = tmp_path / "bad.key"
    path.write_text(text)
    with pytest.raises(gossip.AuthenticationError, match=match):
        load_cluster_key(path)


def test_mismatched_key_halves(tmp_path, key_path):
    a = load_cluster_key(key_path)
    other = write_cluster_key(tmp_path / "other.key")
    path = tmp_path / "mixed.key"
    path.write_text(f"public = {a.public.decode()}\nsecret = {other.secret.decode()}\n")
    with pytest.raises(gossip.AuthenticationError, match="does not belong"):
        load_cluster_key(path)


def test_missing_key_file():
    with pytest.raises(gossip.AuthenticationError, match="cannot read cluster key"):
        gossip.init(rank=0, world_size=1, key="/nonexistent/cluster.key")


def encrypted_peer(peer, endpoint_file, done_file):
    if peer.rank == 0:
        with open(endpoint_file + ".tmp", "w") as f:
            f.write(peer.transport.endpoints["tcp"])
        os.replace(endpoint_file + ".tmp", endpoint_file)
    deadline = time.monotonic() + 60
    rounds = 0
    while True:
        x = np.full(1000, peer.rank + 1.0)
        peer.allreduce(x)
        assert np.all(x == 3.0)
        rounds += 1
        finished = np.array([os.path.exists(done_file)])
        peer.allreduce(finished, op="max")
        if finished[0] or time.monotonic() > deadline:
            break
    stats = peer.stats()
    return rounds, stats["dropped"], stats["authentication_denied"]


def test_intruder_without_key_is_rejected(tmp_path, key_path):
    endpoint_file, done_file = str(tmp_path / "endpoint"), str(tmp_path / "done")
    server_public = load_cluster_key(key_path).public
    observed = {}

    def intrude():
        try:
            wait_until(lambda: os.path.exists(endpoint_file), 60, what="rank 0's endpoint")
        except TimeoutError:
            open(done_file, "w").close()
            return  # the peers failed to start; spawn reports why
        endpoint = open(endpoint_file).read()
        ctx = zmq.Context()
        socks = []
        try:
            plain = ctx.socket(zmq.DEALER)  # no security at all
            own_public, own_secret = zmq.curve_keypair()
            curve = ctx.socket(zmq.DEALER)  # knows the server's public key, not the secret
            curve.curve_serverkey, curve.curve_publickey = server_public, own_public
            curve.curve_secretkey = own_secret
            monitor = curve.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
            for s, identity in ((plain, b"gossip:1"), (curve, b"gossip:1")):
                s.linger = 0
                s.routing_id = identity
                s.connect(endpoint)
                socks.append(s)
                hostile = encode_header(Header(DATA, 1, 0, 5,
                                               "allreduce(sum,recursive-doubling)", "float64",
                                               (1000,), 8000, 0))
                for _ in range(50):
                    try:  # a refused connection leaves no pipe: a blocking send would hang
                        s.send_multipart([hostile, np.zeros(1000).tobytes()], zmq.NOBLOCK)
                    except zmq.Again:
                        break
            observed["auth_failed"] = monitor.poll(10_000) != 0
            observed["received"] = any(s.poll(500) for s in socks)
            curve.disable_monitor()
            monitor.close()
        finally:
            for s in socks:
                s.close()
            ctx.term()
            open(done_file, "w").close()

    intruder = threading.Thread(target=intrude)
    intruder.start()
    try:
        results = spawn(encrypted_peer, n=2, timeout=120, args=(endpoint_file, done_file),
                        key=key_path, transport="tcp")
    finally:
        intruder.join(70)
    rounds, dropped, denied = results[0]
    assert rounds >= 1
    assert dropped == 0          # nothing the intruder sent reached the peer's inbox
    assert denied >= 1           # the CURVE client with a foreign key was refused by ZAP
    assert observed == {"auth_failed": True, "received": False}


def _rendezvous_with_keys(port: int, keys: list, *, timeout: float) -> dict:
    """gossip.init for rank r with keys[r], every rank in its own thread, at once; returns
    rank -> the error each got (a Peer that got through is closed and returned)."""
    results = {}

    def run(rank, key):
        try:
            results[rank] = gossip.init(rank=rank, world_size=len(keys), key=key,
                                        timeout=timeout, rendezvous=f"tcp://127.0.0.1:{port}")
        except gossip.GossipError as exc:
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(r, key)) for r, key in enumerate(keys)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for value in results.values():
        if isinstance(value, gossip.Peer):
            value.close()
    return results


def check_key_matters(peer):
    return peer.allreduce(np.ones(3)).tolist()


def test_peers_with_the_key_work_and_without_it_fail(tmp_path, key_path):
    assert spawn(check_key_matters, n=3, key=key_path) == [[3.0] * 3] * 3
    # One peer without the key cannot even rendezvous.
    results = _rendezvous_with_keys(free_port(), [key_path, None], timeout=2)
    assert isinstance(results[0], gossip.RendezvousError)
    assert isinstance(results[1], gossip.RendezvousError)


def _refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "refused a handshake" in r.getMessage()]


def test_every_refused_handshake_is_logged(tmp_path, key_path, caplog, no_leaks):
    """Clients without CURVE or with another server key never reach ZAP (libzmq refuses them
    in the handshake); they are logged and counted like ZAP's denials."""
    caplog.set_level("WARNING", logger="collectives")
    peer = gossip.init(rank=0, world_size=1, key=key_path, timeout=5)
    ctx = zmq.Context()
    try:
        endpoint = peer.transport.endpoints["tcp"]
        other_public, _ = zmq.curve_keypair()
        own_public, own_secret = zmq.curve_keypair()
        plain = ctx.socket(zmq.DEALER)                 # no CURVE at all
        wrong_server = ctx.socket(zmq.DEALER)          # another server key
        wrong_server.curve_serverkey = other_public
        wrong_server.curve_publickey, wrong_server.curve_secretkey = own_public, own_secret
        foreign = ctx.socket(zmq.DEALER)               # the right server key, its own pair
        foreign.curve_serverkey = load_cluster_key(key_path).public
        foreign.curve_publickey, foreign.curve_secretkey = zmq.curve_keypair()
        for s in (plain, wrong_server, foreign):
            s.linger = 0
            s.connect(endpoint)
            s.send(b"hello", zmq.NOBLOCK)

        def logged():
            text = "\n".join(_refusals(caplog))
            return all(w in text for w in ("without CURVE", "does not decrypt",
                                           "does not hold the cluster key"))
        wait_until(logged, 20, what="three refusals in the log")
        lines = _refusals(caplog)
        assert all("rank 0" in line and "127.0.0.1" in line for line in lines), lines
        assert peer.stats()["handshakes_refused"]["inbound"] >= 3
        assert peer.stats()["dropped"] == 0  # nothing got through
    finally:
        ctx.destroy(linger=0)
        peer.close()


def test_refused_rendezvous_handshakes_are_logged(tmp_path, key_path, caplog, no_leaks):
    """At the rendezvous too: rank 0 logs the peer with another key and the one without."""
    caplog.set_level("WARNING", logger="collectives")
    other = tmp_path / "other.key"
    write_cluster_key(other)
    port = free_port()
    results = _rendezvous_with_keys(port, [key_path, str(other), None], timeout=3)
    assert all(isinstance(results[r], gossip.RendezvousError) for r in range(3)), results
    text = "\n".join(_refusals(caplog))
    assert f"127.0.0.1:{port}" in text
    assert "does not decrypt" in text and "without CURVE" in text, text
