"""Several "hosts" on one machine, and real network faults between them.

Each host is a network namespace with one interface, ``eth0`` (10.77.0.<i+1>/24), the end of a
veth pair whose other end, ``p<i>``, is a port of the bridge ``br0`` in a namespace of its own
(the "switch"). Nothing is created in the root namespace: the pairs are made inside the switch
namespace with their host end placed directly in the host's, so traffic only flows between the
namespaces a test made, and two runs in parallel (each with its own switch) cannot meet even
though both use 10.77.0.0/24. Namespace names carry the test process's pid and a random tag;
namespaces left by a process that no longer exists (a run killed with SIGKILL) are removed by
the next run.

    with Network(4) as net:                      # or the `network` fixture of test_netns.py
        procs = [net.run(h, [sys.executable, "worker.py"], env) for h in net.hosts]
        net.cut(net.hosts[3])                    # pull host 3's cable (its switch port down)
        net.set_loss(0.05)                       # drop 5% of the packets each switch port sends
        net.start_delay_proxies(delay=0.01)      # 10 ms more on every byte a host receives

The faults and how they are made (the kernel here has no netem qdisc, nor iptables / nft):

- Cut: ``ip link set p<i> down`` in the switch namespace (``side="host"``: eth0 in the host's).
  The host keeps its address and its sockets see no error; its packets just vanish.
- Loss: on each switch port's egress, an htb qdisc whose filter, a classic-BPF program that
  loads a random number (``ld rand``), sends a packet to a class whose only queue, a pfifo of
  limit 0, drops it. Real packet loss as TCP sees it (the drop is in the forwarding path, not
  in the sender's own stack).
- Rate: ``shape(rate)`` gives every directed pair of hosts a link of its own (an htb class
  per destination on each host's eth0, chosen by a u32 filter), as the simulator models links;
  ``shape(rate, rates={(i, j): other})`` gives some of them another rate.
  ``congestion("reno")`` sets the hosts' TCP congestion control (each namespace has its own;
  a new one takes the machine's default, BBR on some machines, which on these links slows
  transfers that run both ways of a link at once: see ``congestion``).
- Latency on the wire: ``Network(n, wire_delay=d)`` makes each host's cable a pair of tap
  devices (the host's eth0, the switch's p<i>) joined by one "wire" process (``python
  netfault.py wire``) that hands every frame from one end to the other ``d`` seconds after it
  read it, both ways: a packet between two hosts crosses two cables, so their round trip is
  4 d, and TCP sees it end to end (its window, its acknowledgements, a long fat pipe's
  bandwidth-delay product), as it sees netem's. The cables' MTU is 65,000 bytes (taps carry
  no offloads, so this keeps the frames a second few enough for one Python process at
  1 Gbit/s); ``shape`` works on them as on the veths.
- Latency and stalls: a user-space TCP relay, one "sidecar" process per host, run as
  ``python netfault.py proxy``. The peer is told to listen on loopback only
  (GOSSIP_BIND_HOST=127.0.0.1; it still advertises its eth0 address, found by the runtime on
  its route to the rendezvous); the sidecar watches the namespace's /proc/net/tcp for loopback
  listeners and, for each, listens on the same port of the host's address and relays every
  connection, delivering each chunk ``delay`` seconds after it arrived (and, with a
  probability per chunk, ``stall`` seconds later still). No product hook is needed. The
  rendezvous (bound on every address by rank 0) is not relayed.

This module is stdlib-only (no pytest, no gossip), so a sidecar starts fast.
"""
from __future__ import annotations

import argparse
import collections
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from gossip.testing import wait_until

__all__ = ["Network", "Host", "netns_unavailable", "wire_unavailable",
           "remove_stale_namespaces", "PREFIX", "SUBNET", "WIRE_MTU", "proxy_main", "wire_main"]

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIRE_MTU = 65000        # the tap cables' MTU (Network(wire_delay=...))
PREFIX = "gnf"          # namespace names: gnf-<pid>-<tag>-sw / -h<i>
SUBNET = "10.77.0"      # host i is SUBNET.(i+1)/24
_CMD_TIMEOUT = 20.0     # seconds any one `ip` / `tc` command may take


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_CMD_TIMEOUT)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({proc.returncode}): "
                           f"{proc.stderr.strip()}")
    return proc


def netns_unavailable() -> str | None:
    """Why namespaces cannot be used here, or None if they can (one is made and removed)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    name = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}-probe"
    proc = _ip("netns", "add", name, check=False)
    if proc.returncode != 0:
        return f"`ip netns add` is not permitted here: {proc.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


def network_or_skip(n: int, **kwargs):
    """For a pytest fixture (``yield from network_or_skip(4)``): ``n`` hosts, closed after the
    test, or the test skipped, saying why, where network namespaces cannot be made."""
    reason = netns_unavailable()
    if reason:
        import pytest
        pytest.skip(reason)
    with Network(n, **kwargs) as net:
        yield net


def wire_unavailable() -> str | None:
    """Why ``Network(wire_delay=...)`` cannot be used here, or None if it can (namespaces,
    and a tap device made and removed in one)."""
    reason = netns_unavailable()
    if reason:
        return reason
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun: tap devices cannot be made"
    name = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}-probe"
    _ip("netns", "add", name)
    try:
        proc = _ip("-n", name, "tuntap", "add", "dev", "tap0", "mode", "tap", check=False)
        if proc.returncode != 0:
            return f"`ip tuntap add` is not permitted here: {proc.stderr.strip()}"
    finally:
        _ip("netns", "del", name, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_namespaces() -> list[str]:
    """Delete the namespaces of runs whose process is gone (a SIGKILLed pytest). Returns
    their names. Namespaces of live processes, including other runs in parallel, stay."""
    proc = _ip("netns", "list", check=False)
    removed = []
    for line in proc.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) >= 3 and parts[0] == PREFIX and parts[1].isdigit() \
                and not _pid_alive(int(parts[1])):
            _kill_namespace_processes(name)
            if _ip("netns", "del", name, check=False).returncode == 0:
                removed.append(name)
    return removed


def _kill_namespace_processes(ns: str) -> None:
    """SIGKILL the processes still inside namespace ``ns`` (only ever ours: the namespace
    was made by a run of this module)."""
    proc = _ip("netns", "pids", ns, check=False)
    for word in proc.stdout.split():
        if word.isdigit():
            try:
                os.kill(int(word), signal.SIGKILL)
            except ProcessLookupError:
                pass


@dataclass
class Host:
    """One namespace "machine": ``ns`` its namespace, ``addr`` its IPv4 address on eth0,
    ``port`` the name of its bridge port in the switch namespace."""
    index: int
    ns: str
    addr: str
    port: str
    cut: bool = False

    def __str__(self) -> str:
        return f"host {self.index} ({self.ns}, {self.addr})"


@dataclass
class Network:
    """``n`` hosts on one switch; every namespace, process and qdisc it made is removed by
    ``close()`` (also on exit of the ``with`` block), whatever state the test left."""
    n: int
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    hosts: list = field(default_factory=list)
    procs: list = field(default_factory=list)
    switch: str = ""
    loss: float = 0.0
    wire_delay: float | None = None   # seconds a frame spends on each cable (tap cables)
    wire_log: str | None = None       # the wire process's output (default: discarded)

    def __post_init__(self) -> None:
        if not 1 <= self.n <= 250:
            raise ValueError(f"1 to 250 hosts, got {self.n}")
        remove_stale_namespaces()
        base = f"{PREFIX}-{os.getpid()}-{self.tag}"
        self.switch = f"{base}-sw"
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for i in range(self.n):
                host = Host(i, f"{base}-h{i}", f"{SUBNET}.{i + 1}", f"p{i}")
                _ip("netns", "add", host.ns)
                self.hosts.append(host)
                if self.wire_delay is None:
                    # Made in the switch namespace, host end placed straight into the host's:
                    # no name in the root namespace, so parallel runs cannot collide.
                    _ip("-n", self.switch, "link", "add", host.port, "type", "veth",
                        "peer", "name", "eth0", "netns", host.ns)
                else:   # a tap at each end; the wire process joins them
                    for ns, name in ((self.switch, host.port), (host.ns, "eth0")):
                        _ip("-n", ns, "tuntap", "add", "dev", name, "mode", "tap")
                        _ip("-n", ns, "link", "set", name, "mtu", str(WIRE_MTU))
                _ip("-n", self.switch, "link", "set", host.port, "master", "br0")
                _ip("-n", self.switch, "link", "set", host.port, "up")
                _ip("-n", host.ns, "link", "set", "lo", "up")
                _ip("-n", host.ns, "addr", "add", f"{host.addr}/24", "dev", "eth0")
                _ip("-n", host.ns, "link", "set", "eth0", "up")
            if self.wire_delay is not None:
                self._start_wire()
        except BaseException:
            self.close()
            raise

    def _start_wire(self) -> None:
        """The wire process (``wire_main``), in the switch namespace; returns once it has
        every cable's two taps open (it says so on its first line)."""
        argv = [sys.executable, "-P", os.path.abspath(__file__), "wire", "--delay",
                repr(self.wire_delay), "--parent", str(os.getpid())]
        for host in self.hosts:
            argv += ["--cable", f"{host.ns},eth0,{self.switch},{host.port}"]
        log = self.wire_log or os.path.join(
            tempfile.mkdtemp(prefix="netfault-wire-"), "wire.log")
        proc = self.run(self.switch, argv, dict(os.environ, PYTHONPATH=_REPO), log_path=log)
        self._wait_for_sidecar(proc, log, first="wire ", what="wire process")

    # ------------------------------------------------------------------ lifetime
    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop every process started here (SIGTERM, then SIGKILL), then anything else left in
        the namespaces, then delete the namespaces (which deletes the veths and the bridge).
        Idempotent; never raises."""
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.terminate()
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 3.0
        for proc in self.procs:
            try:
                proc.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                try:
                    proc.wait(5.0)
                except subprocess.TimeoutExpired:
                    pass
        for name in [h.ns for h in self.hosts] + ([self.switch] if self.switch else []):
            try:
                _kill_namespace_processes(name)
                _ip("netns", "del", name, check=False)
            except Exception:  # teardown goes on with the next namespace
                pass
        self.hosts = []
        self.switch = ""

    # ------------------------------------------------------------------ processes
    def run(self, host: Host | str, argv: list[str], env: dict[str, str], *,
            log_path: str | None = None) -> subprocess.Popen:
        """Start ``argv`` inside ``host`` (or a namespace named so; ``ip netns exec`` execs
        it, so the Popen's pid is the program's). Output goes to ``log_path`` (or is
        discarded)."""
        ns = host.ns if isinstance(host, Host) else host
        out = open(log_path, "wb") if log_path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], env=env,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            if log_path:
                out.close()
        self.procs.append(proc)
        return proc

    def start_peers(self, argv, *, port: int, log_dir: str, placement: list[int] | None = None,
                    timeout: float = 60.0,
                    env: dict[str, str] | None = None) -> list[subprocess.Popen]:
        """A gossip job: rank r on host ``placement[r]`` (default: one a host, rank r on host
        r), running ``argv`` (a list, or a function of the rank giving one) with the launcher's
        variables of a job whose rendezvous is rank 0's host at ``port``, GOSSIP_TIMEOUT
        ``timeout``, the repository on PYTHONPATH, the transport left to "auto" (it must find
        tcp itself), and ``env`` on top; rank r's output in ``log_dir``/log.<r>."""
        where = list(range(len(self.hosts))) if placement is None else placement
        procs = []
        for r, h in enumerate(where):
            peer_env = dict(os.environ, GOSSIP_RANK=str(r), GOSSIP_WORLD_SIZE=str(len(where)),
                            GOSSIP_MASTER_ADDR=self.hosts[where[0]].addr,
                            GOSSIP_MASTER_PORT=str(port), GOSSIP_TIMEOUT=f"{timeout:g}",
                            PYTHONPATH=_REPO, PYTHONUNBUFFERED="1", **(env or {}))
            peer_env.pop("GOSSIP_TRANSPORT", None)
            procs.append(self.run(self.hosts[h], argv(r) if callable(argv) else list(argv),
                                  peer_env, log_path=os.path.join(log_dir, f"log.{r}")))
        return procs

    @staticmethod
    def peers_failed(procs: list[subprocess.Popen], log_dir: str, limit: float) -> str | None:
        """Wait up to ``limit`` seconds in all for start_peers' job to end; None if every
        rank exited 0, else which did not, each with the end of its log."""
        deadline = time.monotonic() + limit
        bad = []
        for r, proc in enumerate(procs):
            try:
                code = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None
            if code != 0:
                path = os.path.join(log_dir, f"log.{r}")
                log = open(path, errors="replace").read()[-2000:] if os.path.exists(path) else ""
                bad.append(f"--- rank {r}: " + ("still running" if code is None
                                                  else f"exit code {code}") + f"\n{log}")
        return "\n".join(bad) or None

    def ns_exec(self, host_or_ns, *argv: str) -> subprocess.CompletedProcess:
        ns = host_or_ns.ns if isinstance(host_or_ns, Host) else host_or_ns
        return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True,
                              text=True, timeout=_CMD_TIMEOUT)

    # ------------------------------------------------------------------ faults
    def cut(self, host: Host, *, side: str = "switch") -> float:
        """Pull ``host``'s cable: its bridge port down (``side="switch"``) or its own eth0
        (``side="host"``). Returns time.monotonic() just after the link went down (the clock is
        shared by every namespace of the machine)."""
        if side == "switch":
            _ip("-n", self.switch, "link", "set", host.port, "down")
        elif side == "host":
            _ip("-n", host.ns, "link", "set", "eth0", "down")
        else:
            raise ValueError(f"side must be 'switch' or 'host', got {side!r}")
        host.cut = True
        return time.monotonic()

    def heal(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.port, "up")
        _ip("-n", host.ns, "link", "set", "eth0", "up")
        host.cut = False

    def set_loss(self, probability: float, hosts: list | None = None) -> None:
        """Drop each packet the switch sends to ``hosts`` (default: all) with ``probability``,
        independently. A packet between two hosts crosses one such port, so that is its loss
        probability. ``probability=0`` removes the loss."""
        if not 0.0 <= probability < 1.0:
            raise ValueError(f"loss probability must be in [0, 1), got {probability!r}")
        for host in hosts or self.hosts:
            tc = ["tc", "-n", self.switch]
            subprocess.run([*tc, "qdisc", "del", "dev", host.port, "root"],
                           capture_output=True, timeout=_CMD_TIMEOUT)
            if probability == 0:
                continue
            # classic BPF: A = random u32; if A > keep_below: return -1 (the filter's classid,
            # the dropping class), else 0 (no match: the default class, which passes).
            keep_below = min(int((1.0 - probability) * 2 ** 32), 2 ** 32 - 1)
            bytecode = f"4,32 0 0 {0xfffff000 + 56},37 0 1 {keep_below},6 0 0 {2**32 - 1},6 0 0 0,"
            for cmd in (
                ["qdisc", "add", "dev", host.port, "root", "handle", "1:", "htb", "default",
                 "1", "r2q", "100000"],
                ["class", "add", "dev", host.port, "parent", "1:", "classid", "1:1", "htb",
                 "rate", "10gbit"],
                ["class", "add", "dev", host.port, "parent", "1:", "classid", "1:2", "htb",
                 "rate", "10gbit"],
                ["qdisc", "add", "dev", host.port, "parent", "1:2", "handle", "20:", "pfifo",
                 "limit", "0"],
                ["filter", "add", "dev", host.port, "parent", "1:", "protocol", "all", "prio",
                 "1", "bpf", "bytecode", bytecode, "classid", "1:2"],
            ):
                proc = subprocess.run([*tc, *cmd], capture_output=True, text=True,
                                      timeout=_CMD_TIMEOUT)
                if proc.returncode != 0:
                    raise RuntimeError(f"`tc {' '.join(cmd)}` failed: {proc.stderr.strip()}")
        self.loss = probability

    def shape(self, rate: str, queue: int = 50,
              rates: dict[tuple[int, int], str] | None = None) -> None:
        """Give every directed pair of hosts a link of its own of ``rate`` (a tc rate such as
        "100mbit"): on each host's eth0, an htb class per destination at that rate (ceil the
        same), chosen by a u32 filter on the destination address, queueing at most ``queue``
        packets (the kernel here has neither fq_codel nor netem: a pfifo; 50 packets are 6 ms
        at 100 Mbit/s, where the default 1,000 put 120 ms before the TCP acknowledgements of
        a link whose reverse direction carries data); what has no IP destination (ARP) takes
        an unshaped class. A host sending to two others at once fills two links,
        as in the simulator's link model (gossip/simulation/fabric.py). ``rates``: links of
        another rate, by (source host, destination host) index, e.g. ``{(0, 1): "100mbit"}``
        (one direction each). Replaces any earlier shaping of the hosts' eth0."""
        for host in self.hosts:
            tc = ["tc", "-n", host.ns]
            subprocess.run([*tc, "qdisc", "del", "dev", "eth0", "root"], capture_output=True,
                           timeout=_CMD_TIMEOUT)
            cmds = [["qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default",
                     "99", "r2q", "100000"],
                    ["class", "add", "dev", "eth0", "parent", "1:", "classid", "1:99", "htb",
                     "rate", "10gbit"]]
            for other in self.hosts:
                if other is host:
                    continue
                classid = f"1:{10 + other.index}"
                link = (rates or {}).get((host.index, other.index), rate)
                cmds += [["class", "add", "dev", "eth0", "parent", "1:", "classid", classid,
                          "htb", "rate", link, "ceil", link],
                         ["qdisc", "add", "dev", "eth0", "parent", classid, "handle",
                          f"{10 + other.index}:", "pfifo", "limit", str(queue)],
                         ["filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip",
                          "prio", "1", "u32", "match", "ip", "dst", f"{other.addr}/32",
                          "flowid", classid]]
            for cmd in cmds:
                proc = subprocess.run([*tc, *cmd], capture_output=True, text=True,
                                      timeout=_CMD_TIMEOUT)
                if proc.returncode != 0:
                    raise RuntimeError(f"`tc {' '.join(cmd)}` in {host}: {proc.stderr.strip()}")

    def congestion(self, name: str) -> str:
        """Set every host's TCP congestion control (``net.ipv4.tcp_congestion_control`` in its
        namespace; connections opened afterwards take it) and return the one each had before.

        Measured on the 100 Mbit/s links of ``shape`` (2026-12-05): a gossip round on a ring of
        4, where each host sends 2.46 MB to both neighbours and hears from both (both
        directions of every link busy at once), takes 206-209 ms under reno or cubic, what
        the bytes need at iperf3's rate, and 244-342 ms under BBR (v1, this kernel's), without
        a packet dropped or retransmitted: BBR paces by the rate its acknowledgements show, and
        the acknowledgements of one direction queue behind the other direction's data. A ring
        allreduce (each link one way) takes the same under all three. Outside the machine's
        root namespace only the congestion controls of
        ``net.ipv4.tcp_allowed_congestion_control`` can be set (reno always is)."""
        before = ""
        for host in self.hosts:
            proc = self.ns_exec(host, "sysctl", "-n", "net.ipv4.tcp_congestion_control")
            before = proc.stdout.strip()
            proc = self.ns_exec(host, "sysctl", "-q", "-w",
                                f"net.ipv4.tcp_congestion_control={name}")
            if proc.returncode != 0:
                allowed = self.ns_exec(host, "sysctl", "-n",
                                       "net.ipv4.tcp_allowed_congestion_control").stdout.strip()
                raise RuntimeError(f"cannot set TCP congestion control {name!r} in {host}: "
                                   f"{proc.stderr.strip()} (allowed: {allowed})")
        return before

    def dropped_packets(self) -> dict[str, int]:
        """Packets the loss filters dropped so far, per switch port."""
        out = {}
        for host in self.hosts:
            proc = subprocess.run(["tc", "-n", self.switch, "-s", "qdisc", "show", "dev",
                                   host.port], capture_output=True, text=True,
                                  timeout=_CMD_TIMEOUT)
            dropped = 0
            lines = proc.stdout.splitlines()
            for i, line in enumerate(lines):
                if line.startswith("qdisc pfifo 20:") and i + 1 < len(lines):
                    words = re.sub(r"[(),]", " ", lines[i + 1]).split()
                    if "dropped" in words:
                        dropped = int(words[words.index("dropped") + 1])
            out[host.port] = dropped
        return out

    def start_delay_proxies(self, *, delay: float, stall_probability: float = 0.0,
                            stall: float = 0.2, log_dir: str | None = None) -> list:
        """One relay sidecar per host (see the module docstring): every byte a host receives
        over a relayed connection arrives ``delay`` seconds late. The peers must bind loopback
        (GOSSIP_BIND_HOST=127.0.0.1). Returns the sidecar processes."""
        procs = []
        for host in self.hosts:
            # -P: the script's folder (tests/, which holds a tests/collectives/ folder) is not
            # put first on sys.path, where it would shadow the collectives package
            argv = [sys.executable, "-P", os.path.abspath(__file__), "proxy", "--addr", host.addr,
                    "--delay", repr(delay), "--stall-probability", repr(stall_probability),
                    "--stall", repr(stall), "--seed", str(host.index),
                    "--parent", str(os.getpid())]
            log = os.path.join(log_dir, f"proxy-{host.index}.log") if log_dir else None
            env = dict(os.environ, PYTHONPATH=_REPO)
            procs.append(self.run(host, argv, env, log_path=log))
        if log_dir:
            for host, proc in zip(self.hosts, procs):
                self._wait_for_sidecar(proc, os.path.join(log_dir, f"proxy-{host.index}.log"))
        return procs

    @staticmethod
    def _wait_for_sidecar(proc: subprocess.Popen, log: str, *, first: str = "proxy on ",
                          what: str = "relay sidecar") -> None:
        """Wait until a sidecar (a relay, the wire) printed its first line, which begins with
        ``first``; one that exits first (an import error, a bad argument) fails here with its
        log, not later as peers that never finish."""
        def started() -> bool:
            if proc.poll() is not None:
                return True
            with open(log, errors="replace") as f:
                return f.read().startswith(first)
        wait_until(started, 30.0, interval=0.02, what=f"the {what} writing {log}")
        if proc.poll() is not None:
            with open(log, errors="replace") as f:
                raise RuntimeError(f"{what} exited with {proc.returncode}:\n{f.read()}")


# ---------------------------------------------------------------------- the relay sidecar
_LISTEN = "0A"
_LOOPBACK_HEX = "0100007F"


def loopback_listeners(path: str = "/proc/net/tcp") -> set[int]:
    """Ports with a socket listening on 127.0.0.1 in this process's network namespace."""
    ports = set()
    with open(path) as f:
        next(f, None)
        for line in f:
            words = line.split()
            if len(words) > 3 and words[3] == _LISTEN:
                addr, _, port = words[1].partition(":")
                if addr == _LOOPBACK_HEX:
                    ports.add(int(port, 16))
    return ports


class _Pipe:
    """One direction of a relayed connection: a reader thread stamps each chunk with the time
    it may leave; a writer thread sends it then, in order."""

    def __init__(self, src: socket.socket, dst: socket.socket, delay: float,
                 stall_probability: float, stall: float, rng: random.Random,
                 on_close) -> None:
        self.src, self.dst = src, dst
        self.delay, self.stall_probability, self.stall = delay, stall_probability, stall
        self.rng = rng
        self.on_close = on_close
        self.queue: collections.deque = collections.deque()
        self.cond = threading.Condition()
        self.last_due = 0.0
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                data = self.src.recv(1 << 16)
                now = time.monotonic()
                due = now + self.delay
                if data and self.stall_probability and self.rng.random() < self.stall_probability:
                    due += self.stall
                due = max(due, self.last_due)  # a stream: nothing overtakes what came first
                self.last_due = due
                with self.cond:
                    self.queue.append((due, data))
                    self.cond.notify()
                if not data:
                    return
        except OSError:
            with self.cond:
                self.queue.append((0.0, None))
                self.cond.notify()

    def _write(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.queue:
                        self.cond.wait()
                    due, data = self.queue.popleft()
                if data is None:   # the source failed: reset both sides
                    self.on_close()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:       # orderly end: pass the FIN on
                    self.dst.shutdown(socket.SHUT_WR)
                    return
                self.dst.sendall(data)
        except OSError:
            self.on_close()


def _relay(client: socket.socket, port: int, args, rng: random.Random) -> None:
    try:
        upstream = socket.create_connection(("127.0.0.1", port), timeout=5.0)
        upstream.settimeout(None)
    except OSError:
        client.close()
        return
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    closed = threading.Event()

    def close_both() -> None:
        if closed.is_set():
            return
        closed.set()
        for s in (client, upstream):
            try:
                s.close()
            except OSError:
                pass

    _Pipe(client, upstream, args.delay, args.stall_probability, args.stall, rng, close_both)
    _Pipe(upstream, client, args.delay, args.stall_probability, args.stall, rng, close_both)


def _serve_port(listener: socket.socket, port: int, args, rng: random.Random) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        _relay(client, port, args, rng)


def proxy_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="netfault.py proxy")
    parser.add_argument("--addr", required=True, help="this host's address to listen on")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds added to each chunk")
    parser.add_argument("--stall-probability", type=float, default=0.0)
    parser.add_argument("--stall", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parent", type=int, default=0, help="exit when this pid is gone")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    mirrored: dict[int, socket.socket] = {}
    print(f"proxy on {args.addr}: delay {args.delay}s, stalls {args.stall_probability} x "
          f"{args.stall}s", flush=True)
    while not args.parent or _pid_alive(args.parent):
        try:
            # No event tells when a port starts listening: watch /proc, and look at the
            # parent again every second.
            ports = wait_until(lambda: loopback_listeners() - set(mirrored), 1.0,
                               interval=0.005, what="a new listening port")
        except TimeoutError:
            continue
        for port in ports:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind((args.addr, port))
            except OSError as exc:
                print(f"cannot mirror port {port}: {exc}", flush=True)
                listener.close()
                mirrored[port] = None
                continue
            listener.listen(64)
            mirrored[port] = listener
            print(f"relaying {args.addr}:{port} -> 127.0.0.1:{port}", flush=True)
            threading.Thread(target=_serve_port, args=(listener, port, args, rng),
                             daemon=True).start()
    return 0


# ---------------------------------------------------------------------- the wire process
_TUNSETIFF = 0x400454CA
_IFF_TAP, _IFF_NO_PI = 0x0002, 0x1000
_CLONE_NEWNET = 0x40000000


def _open_tap(ns: str, name: str) -> int:
    """An open, non-blocking fd of the persistent tap ``name`` in namespace ``ns`` (this
    process enters the namespace to attach to it; the fd stays the device's after)."""
    import ctypes
    import fcntl
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/var/run/netns/{ns}") as nsf:
        if libc.setns(nsf.fileno(), _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({ns})")
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TAP | _IFF_NO_PI))
    return fd


def wire_main(argv: list[str]) -> int:
    """Join each cable's two taps: every frame read at one end is written at the other
    ``--delay`` seconds later, in order (one queue a direction; epoll's timeout, 1 ms
    granularity, is the only wait)."""
    import select

    parser = argparse.ArgumentParser(prog="netfault.py wire")
    parser.add_argument("--delay", type=float, required=True, help="seconds on each cable")
    parser.add_argument("--cable", action="append", default=[],
                        help="HOST_NS,HOST_TAP,SWITCH_NS,SWITCH_TAP")
    parser.add_argument("--parent", type=int, default=0, help="exit when this pid is gone")
    args = parser.parse_args(argv)
    other: dict[int, int] = {}
    for cable in args.cable:
        host_ns, host_tap, switch_ns, switch_tap = cable.split(",")
        a, b = _open_tap(host_ns, host_tap), _open_tap(switch_ns, switch_tap)
        other[a], other[b] = b, a
    queues: dict[int, collections.deque] = {fd: collections.deque() for fd in other}
    poller = select.epoll()
    for fd in other:
        poller.register(fd, select.EPOLLIN)
    print(f"wire {len(args.cable)} cables, {args.delay}s each way", flush=True)
    frames, dropped, checked = 0, 0, time.monotonic()
    while True:
        now = time.monotonic()
        due = min((q[0][0] for q in queues.values() if q), default=now + 1.0)
        for fd, _ in poller.poll(max(0.0, due - now)):
            now = time.monotonic()
            for _ in range(256):
                try:
                    frame = os.read(fd, WIRE_MTU + 64)
                except BlockingIOError:
                    break
                queues[other[fd]].append((now + args.delay, frame))
                frames += 1
        now = time.monotonic()
        for out, queue in queues.items():
            while queue and queue[0][0] <= now:
                try:
                    os.write(out, queue[0][1])
                except BlockingIOError:
                    break   # (the device's queue is full: the frame waits for the next turn)
                except OSError:
                    dropped += 1
                queue.popleft()
        if now - checked > 1.0:
            checked = now
            if args.parent and not _pid_alive(args.parent):
                print(f"wire: {frames} frames, {dropped} dropped; the parent is gone",
                      flush=True)
                return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "proxy":
        sys.exit(proxy_main(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "wire":
        sys.exit(wire_main(sys.argv[2:]))
    sys.exit("usage: netfault.py proxy --addr ADDR [--delay S] [--stall-probability P]\n"
             "       netfault.py wire --delay S --cable HOST_NS,TAP,SWITCH_NS,TAP ...")
