"""The wire of tests/netfault.py (``Network(wire_delay=d)``): each host's cable a pair of tap
devices joined by a user-space process that holds every frame ``d`` seconds, so TCP between
two hosts sees a round trip of 4 d end to end (what benchmarks/link_capacity.py --rtt
measures the collectives against iperf3 on; the kernel here has no netem).

Checked with real TCP between two namespaces: bytes arrive intact in order through frames of
the cables' large MTU, and no round trip is shorter than the wire's 4 d (a lower bound: the
wire can hold a frame longer on a loaded machine, never less). Needs root, `ip netns` and
/dev/net/tun; skips otherwise.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # tests/
import netfault  # noqa: E402

DELAY = 0.005   # each cable, each way: a round trip of 20 ms
PORT = 29611

# One host's side: the server echoes 1-byte pings, then sinks a bulk transfer and returns
# its digest; the client times the pings (each a full round trip) and sends the bulk.
SCRIPT = r"""
import hashlib, json, socket, sys, time
role, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
PINGS, BULK = 20, 8 << 20
if role == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(1); print("listening", flush=True)
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(PINGS):
        c.sendall(c.recv(1))
    h, got = hashlib.sha256(), 0
    while got < BULK:
        chunk = c.recv(1 << 20)
        h.update(chunk); got += len(chunk)
    c.sendall(h.hexdigest().encode())
else:
    c = socket.create_connection((addr, port), timeout=30)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(PINGS):
        t = time.perf_counter(); c.sendall(b"x"); c.recv(1); rtts.append(time.perf_counter() - t)
    data = bytes(range(256)) * (BULK // 256)
    c.sendall(data)
    digest = c.recv(64).decode()
    print(json.dumps({"rtts": rtts, "intact": digest == hashlib.sha256(data).hexdigest()}))
"""


@pytest.fixture(scope="module")
def netns_ok():
    reason = netfault.wire_unavailable()
    if reason:
        pytest.skip(reason)


def test_the_wire_holds_every_frame_and_tcp_sees_the_round_trip(netns_ok, tmp_path):
    script = tmp_path / "side.py"
    script.write_text(SCRIPT)
    with netfault.Network(2, wire_delay=DELAY, wire_log=str(tmp_path / "wire.log")) as net:
        a, b = net.hosts
        mtu = net.ns_exec(a, "cat", "/sys/class/net/eth0/mtu").stdout.strip()
        assert mtu == str(netfault.WIRE_MTU)
        server = net.run(b, [sys.executable, str(script), "server", b.addr, str(PORT)],
                         dict(os.environ), log_path=str(tmp_path / "server.log"))
        from gossip.testing import wait_until
        wait_until(lambda: "listening" in (tmp_path / "server.log").read_text(), 30.0,
                   what="the server listening")
        client = net.run(a, [sys.executable, str(script), "client", b.addr, str(PORT)],
                         dict(os.environ), log_path=str(tmp_path / "client.log"))
        assert client.wait(120) == 0, (tmp_path / "client.log").read_text()
        assert server.wait(30) == 0, (tmp_path / "server.log").read_text()
    result = json.loads((tmp_path / "client.log").read_text().splitlines()[-1])
    assert result["intact"]   # 8 MiB through the taps and the bridge, in order
    # Each round trip crosses a cable four times (a's out, b's in, b's out, a's in).
    assert min(result["rtts"]) >= 4 * DELAY, result["rtts"]
