"""Intruders, checked on the wire: a recording relay between two peers shows what an observer
of the network sees with and without a cluster key, and an intruder that connects before the
genuine peer (taking its identity) gets nothing in and nothing out when the cluster has a key.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import psutil
import pytest
import zmq

from collectives.security import load_cluster_key, write_cluster_key
from collectives.transport.wire import DATA, Header, encode_header
from gossip.testing import spawn, wait_until
from helpers import publish as _publish, read as _read
from wire_relay import Relay

MARKER = bytes(range(0x41, 0x41 + 32)) * 2  # 64 bytes no header or handshake contains
assert len(MARKER) == 64


@pytest.fixture
def key_path(tmp_path):
    path = tmp_path / "cluster.key"
    write_cluster_key(path)
    return str(path)


def send_marker(peer, workdir: str):
    """Rank 1 sends an array holding the marker to rank 0, through the test's relay."""
    wd = Path(workdir)
    if peer.rank == 0:
        _publish(wd / "endpoint", peer.transport.endpoints["tcp"])
        got = peer.recv(1)
        peer.barrier()
        return got.tobytes() == MARKER * 16
    relay = wait_until(lambda: _read(wd / "relay"), 60, what="the relay")
    peer.transport._addresses[0] = relay  # before any operation opens the connection
    peer.send(0, np.frombuffer(bytearray(MARKER * 16), dtype=np.uint8))
    peer.barrier()
    return True


@pytest.mark.parametrize("keyed", [False, True], ids=["no-key", "key"])
def test_marker_on_the_wire_only_without_a_key(tmp_path, key_path, keyed):
    relays = []

    def start_relay():
        endpoint = wait_until(lambda: _read(tmp_path / "endpoint"), 60, what="the endpoint")
        host, port = endpoint[len("tcp://"):].rsplit(":", 1)
        relays.append(Relay((host, int(port))))
        _publish(tmp_path / "relay", relays[0].endpoint)

    import threading
    starter = threading.Thread(target=start_relay)
    starter.start()
    try:
        results = spawn(send_marker, n=2, timeout=90, args=(str(tmp_path),), transport="tcp",
                        **({"key": key_path} if keyed else {"insecure": True}))
    finally:
        starter.join(70)
        for relay in relays:
            relay.close()
    assert results == [True, True]
    wire = relays[0].wire()
    assert len(wire) > len(MARKER) * 16  # the array did travel through the relay
    if keyed:
        assert MARKER not in wire and MARKER[:16] not in wire
        assert b"CURVE" in wire  # the ZMTP greeting names the mechanism
        assert b"allreduce" not in wire and b"float" not in wire and b"uint8" not in wire
    else:
        assert wire.count(MARKER) >= 16  # readable by anyone on the path
        assert b"NULL" in wire and b"uint8" in wire  # headers too
    print(f"\n{'key' if keyed else 'no key'}: {len(wire)} bytes captured, marker found "
          f"{wire.count(MARKER)} times")


def squatted_peer(peer, workdir: str):
    """Rank 0 publishes its endpoint; both wait until the intruder has tried its luck (so its
    connection comes before rank 1's), then run allreduces."""
    wd = Path(workdir)
    if peer.rank == 0:
        _publish(wd / "endpoint", peer.transport.endpoints["tcp"])
    wait_until(lambda: (wd / "intruded").exists(), 60, what="the intruder")
    for _ in range(5):
        x = np.full(1000, peer.rank + 1.0)
        peer.allreduce(x)
        assert np.all(x == 3.0)
    peer.barrier()
    stats = peer.stats()
    return stats["dropped"], stats["authentication_denied"], stats["messages_received"]


def test_intruder_taking_a_rank_identity_first_gets_nothing_with_a_key(tmp_path, key_path):
    server_public = load_cluster_key(key_path).public
    observed = {}

    def intrude():
        try:
            endpoint = wait_until(lambda: _read(tmp_path / "endpoint"), 60, what="endpoint")
        except TimeoutError:
            return
        ctx = zmq.Context()
        plain = ctx.socket(zmq.DEALER)        # no security at all
        curve = ctx.socket(zmq.DEALER)        # the server's public key, its own key pair
        own_public, own_secret = zmq.curve_keypair()
        curve.curve_serverkey, curve.curve_publickey = server_public, own_public
        curve.curve_secretkey = own_secret
        monitors = [s.get_monitor_socket() for s in (plain, curve)]
        socks = [plain, curve]
        try:
            for s in socks:
                s.linger = 0
                s.routing_id = b"gossip:1"    # rank 1's identity, before rank 1 connects
                s.connect(endpoint)
                hostile = encode_header(Header(DATA, 1, 0, 0,
                                               "allreduce(sum,recursive-doubling)", "float64",
                                               (1000,), 8000, 0, 8000, number=1))
                for _ in range(20):
                    s.send_multipart([hostile, np.full(1000, 1e9).tobytes()], zmq.NOBLOCK)
            events = {0: set(), 1: set()}

            def failed():
                for i, m in enumerate(monitors):
                    while m.poll(0):
                        events[i].add(zmq.utils.monitor.recv_monitor_message(m)["event"])
                return (events[1] & {zmq.EVENT_HANDSHAKE_FAILED_AUTH}
                        and events[0] & {zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                                         zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                                         zmq.EVENT_DISCONNECTED})
            observed["refused"] = bool(wait_until(failed, 30, what="refusals"))
            observed["connected"] = any(zmq.EVENT_HANDSHAKE_SUCCEEDED in e
                                        for e in events.values())
            (tmp_path / "intruded").touch()
            observed["received"] = any(s.poll(1000) for s in socks)
        finally:
            for s in socks:
                s.disable_monitor()
                s.close()
            for m in monitors:
                m.close()
            ctx.term()
            (tmp_path / "intruded").touch()

    import threading
    intruder = threading.Thread(target=intrude)
    intruder.start()
    try:
        results = spawn(squatted_peer, n=2, timeout=120, args=(str(tmp_path),), key=key_path,
                        transport="tcp")
    finally:
        intruder.join(70)
    dropped, denied, _ = results[0]
    assert observed == {"refused": True, "connected": False, "received": False}
    assert dropped == 0      # none of the intruder's 40 messages got as far as validation
    assert denied >= 1       # ZAP refused the CURVE client with a foreign key
    assert results[1][0] == 0


def loopback_only(peer):
    listening = [c.laddr for c in psutil.Process().net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    return peer.transport.endpoints["tcp"], listening


def test_default_binding_is_loopback():
    for endpoint, listening in spawn(loopback_only, n=2):
        assert endpoint.startswith("tcp://127.0.0.1:")
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
