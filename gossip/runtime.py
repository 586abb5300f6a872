"""gossip.init(): from launcher variables (or arguments) to a connected Peer."""
from __future__ import annotations

import logging
import os
import re
import socket
import warnings
from typing import Any

from collectives import defaults
from collectives.config import TransportConfig
from collectives.rendezvous import JobRunning, rendezvous as exchange_addresses
from collectives.security import ClusterKey, InsecureWarning, insecure_requested, load_cluster_key
from collectives.transport.emulation import parse_link
from collectives.transport.transport import Transport, host_id
from gossip.errors import TopologyError
from gossip.logs import configure_logging
from gossip.membership import PeerMembership, member_identity
from gossip.peer import Peer
from gossip.policies.neighborhood import resize_topology
from gossip.settings import LaunchSettings, is_loopback, resolve_settings
from gossip.snapshot import crc
from gossip.stacks import install_stack_dump
from topologies import Topology

__all__ = ["init", "resolve_topology", "DEFAULT_TIMEOUT"]

log = logging.getLogger("gossip")

DEFAULT_TIMEOUT = defaults.TIMEOUT  # the documented default: collectives/defaults.py


def resolve_topology(topology: Topology | str | None, world_size: int) -> Topology:
    """A Topology from an object, a spec string, GOSSIP_TOPOLOGY, or the default ring."""
    import topologies
    from topologies.errors import TopologyError as PureTopologyError

    if topology is None:
        topology = os.environ.get("GOSSIP_TOPOLOGY") or "ring"
    try:
        if isinstance(topology, str):
            return topologies.parse(topology, world_size)
    except PureTopologyError as exc:
        raise TopologyError(str(exc)) from None
    if getattr(topology, "size", None) != world_size:
        raise TopologyError(f"topology {topology!r} has {getattr(topology, 'size', '?')} peers "
                            f"but the world size is {world_size}")
    return topology


def _remote_endpoint(settings: LaunchSettings, join: Any) -> tuple[str, int] | None:
    """The (host, port) of another machine this process reaches first (the rendezvous, or the
    first member door a joiner names: GOSSIP_JOIN=tcp://h:p,...), or None when it is on
    loopback: then the peer listens on loopback only."""
    if join not in (None, True, "1"):
        door = str(join).split(",")[0].strip()
        host, _, port = door.removeprefix("tcp://").rpartition(":")
        if is_loopback(host):
            return None
        return host.strip("[]"), int(port) if port.isdigit() else settings.master_port
    if settings.is_local:
        return None
    return settings.master_addr, settings.master_port


def _route_address(master_addr: str, port: int) -> str:
    """This host's address on the route to the rendezvous (no packet is sent: a UDP connect
    only asks the kernel which interface it would use)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master_addr, port))
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def _port_range(text: str) -> tuple[int, int]:
    """GOSSIP_PORT_RANGE: "LO-HI" (inclusive), the ports data sockets may bind."""
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)) <= 65535:
        raise ValueError(f"GOSSIP_PORT_RANGE={text!r}: expected LO-HI with "
                         f"1 <= LO <= HI <= 65535, e.g. 30000-30099")
    return int(match.group(1)), int(match.group(2))


def _socket_buffer(text: str) -> int:
    """GOSSIP_SOCKET_BUFFER: bytes, or with a K/M/G suffix (powers of 1024); 0: the
    kernel's own sizing (its autotuning, up to net.ipv4.tcp_wmem / tcp_rmem)."""
    from gossip.bench.sizes import parse_size
    if text.strip() == "0":
        return 0
    try:
        return parse_size(text)
    except ValueError as exc:
        raise ValueError(f"GOSSIP_SOCKET_BUFFER={text!r}: {exc}") from None


#: Where Linux keeps the most a process may ask of a socket's buffers (SO_SNDBUF, SO_RCVBUF).
KERNEL_BUFFER_CAPS = {"net.core.wmem_max": "/proc/sys/net/core/wmem_max",
                      "net.core.rmem_max": "/proc/sys/net/core/rmem_max"}


def _check_socket_buffers(asked: int, rank: int) -> None:
    """A run across machines (the first peer of each host): warn if the kernel caps the tcp
    connections' buffers below ``asked`` (socket_buffer_bytes). One connection keeps at most
    about its send buffer in flight, so such a cap silently bounds every link to cap / round
    trip: 4 MiB over 50 ms is 670 Mbit/s, Linux's default 208 KiB 34 Mbit/s."""
    if not asked:
        return
    caps = {}
    for name, path in KERNEL_BUFFER_CAPS.items():
        try:
            with open(path) as f:
                caps[name] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return   # (not Linux, or not readable: nothing to say)
    low = {name: cap for name, cap in caps.items() if cap < asked}
    if low:
        cap = min(low.values())
        log.warning(
            "rank %d: each tcp connection asks for %d KiB socket buffers "
            "(GOSSIP_SOCKET_BUFFER / socket_buffer_bytes), but this host's kernel caps them "
            "at %s: one connection then keeps at most about %d KiB in flight, %.0f Mbit/s "
            "over a 50 ms round trip (%.0f over 1 ms). To fill a long fat link, raise the caps "
            "as root: sysctl -w %s", rank, asked >> 10,
            ", ".join(f"{n}={c}" for n, c in low.items()), cap >> 10, cap * 8 / 0.05 / 1e6,
            cap * 8 / 0.001 / 1e6, " ".join(f"{n}={asked}" for n in low))


def init(*, rank: int | None = None, world_size: int | None = None,
         rendezvous: str | None = None, topology: Topology | str | None = None,
         timeout: float | None = None,
         key: str | os.PathLike | ClusterKey | None = None, transport: str | None = None,
         config: TransportConfig | None = None, job_id: str | None = None,
         join: bool | str | None = None, link: str | None = None) -> Peer:
    """Join the group and return this process's Peer.

    Every argument defaults from the environment (see gossip.settings for the order of
    launcher conventions): ``rendezvous`` is ``tcp://HOST:PORT`` of rank 0, ``topology`` a
    Topology or spec string (GOSSIP_TOPOLOGY, default "ring"), ``timeout`` the deadline of
    every blocking call (GOSSIP_TIMEOUT, default 60 s), ``key`` a cluster key file that turns
    on CURVE encryption and authentication for every socket (GOSSIP_KEY), ``transport``
    "auto" | "tcp" | "ipc" (GOSSIP_TRANSPORT), ``job_id`` the job this peer belongs to
    (GOSSIP_JOB_ID, or the launcher's: see gossip.settings): peers of another job are refused
    at the rendezvous and on every connection.

    ``link`` (GOSSIP_LINK): emulate a slow network on one machine, ``"RATE,LATENCY"`` such as
    ``"1gbit,2ms"``: every message this peer sends waits for its bytes at that rate (a token
    bucket per destination) plus the one-way latency before it leaves
    (collectives/transport/emulation.py). Off by default.

    ``join`` (GOSSIP_JOIN): join a running job instead of forming one: True asks the members
    at the rendezvous address, a string lists member doors (``tcp://h:p,tcp://h2:p2``). A
    process started again with the variables of its first start needs no flag: a running
    member answers at the rendezvous address and it joins (gossip/membership/).

    Without a key, a process of a group of several (or a joiner) warns once
    (InsecureWarning): its rendezvous and data ports are open to anyone who reaches them.
    ``gossip run``, gossip.testing.spawn and the demo hand their peers a key; under torchrun,
    SLURM or mpirun set GOSSIP_KEY (``gossip keygen PATH``), or GOSSIP_INSECURE=1 when an
    open group is meant.

    In the main thread it also makes SIGUSR1 write every thread's stack to stderr, the
    process running on (``gossip run`` passes the signal on to its peers), unless
    GOSSIP_STACKS_ON_SIGUSR1=0 or the signal has a handler already (gossip/stacks.py).
    """
    configure_logging()
    install_stack_dump()   # first: a peer stuck in the rendezvous shows where
    settings = resolve_settings(rank=rank, world_size=world_size, rendezvous=rendezvous,
                                job_id=job_id)
    topo = resolve_topology(topology, settings.world_size)
    if timeout is None:
        timeout = float(os.environ.get("GOSSIP_TIMEOUT") or DEFAULT_TIMEOUT)
    key = key if key is not None else (os.environ.get("GOSSIP_KEY") or None)
    if key is not None and not isinstance(key, ClusterKey):
        key = load_cluster_key(key)
    join = join if join is not None else (os.environ.get("GOSSIP_JOIN") or None)
    joining = join not in (None, False, "0", "")
    if key is None and (settings.world_size > 1 or joining) and not insecure_requested():
        _warn_open(settings, joining)
    transport = transport or os.environ.get("GOSSIP_TRANSPORT") or None
    changes: dict[str, Any] = {"timeout": timeout}
    if settings.job_source != "none":   # else a config= of the caller's may name the job
        changes["job_id"] = settings.job_id
    if key is not None:
        changes["key"] = key
    if transport:
        changes["transport"] = transport
    where = "link="
    if link is None:
        link, where = os.environ.get("GOSSIP_LINK"), "GOSSIP_LINK"
    if link:
        changes["link"] = parse_link(link, where)   # the error names the setting
    if os.environ.get("GOSSIP_PORT_RANGE"):
        changes["data_ports"] = _port_range(os.environ["GOSSIP_PORT_RANGE"])
    if os.environ.get("GOSSIP_SOCKET_BUFFER"):
        changes["socket_buffer_bytes"] = _socket_buffer(os.environ["GOSSIP_SOCKET_BUFFER"])
    far = _remote_endpoint(settings, join if joining else None)
    across = False
    if (settings.world_size > 1 or joining) and far is not None:
        # A run across machines (or a joiner of one, started by hand with a world of one):
        # listen everywhere, advertise the address others can reach.
        across = True
        changes["bind_host"] = os.environ.get("GOSSIP_BIND_HOST", "0.0.0.0")
        changes["advertise_host"] = os.environ.get("GOSSIP_HOST") or _route_address(*far)
    cfg = (config or TransportConfig()).with_(**changes)
    if across and settings.local_rank == 0:   # (a host's kernel: its first peer says it)
        _check_socket_buffers(cfg.socket_buffer_bytes, settings.rank)

    # Without a rank from a launcher there is no slot to come back to: a name of its own.
    name, incarnation = member_identity(settings.rank if settings.rank_given else None)

    def make_transport(rank: int, size: int, view: int, hosts: list[str]) -> Transport:
        transport = Transport(rank, size, cfg.with_(view=view))
        here = transport.endpoints["host"]
        transport.expect_on_host([r for r, host in enumerate(hosts) if host == here])
        # A view that changes may move a member's state, whose digest is summed on every
        # core: their threads start now, while the members wait for the commit, not when
        # the state is sent (a thread took up to 3 ms to start under load here).
        crc.warm()
        return transport

    # The host as the transports name it: a joiner's shows which members share its memory.
    membership = PeerMembership(name, incarnation, cfg, make_transport, timeout,
                                host=host_id())
    try:
        if joining:
            doors = [settings.rendezvous] if join in (True, "1") else str(join).split(",")
            return _join(membership, doors, topo, settings, cfg)
        tr = Transport(settings.rank, settings.world_size, cfg)
        try:
            table = exchange_addresses(tr, settings.rendezvous, timeout=timeout, info={
                # A digest of the actual neighbour lists and weights: equal on every peer
                # that built the same graph, whatever way it was described.
                "topology": f"{topo!r} [{topo.fingerprint}]",
                "encrypted": key is not None,
            }, extra=membership.entry_fields())
        except JobRunning as running:
            tr.close()
            log.info("rank %d of job %s: the job is running (view %s): joining it",
                     settings.rank, cfg.job_id or "(unnamed)", running.view.get("number"))
            return _join(membership, running.doors, topo, settings, cfg)
        except BaseException:
            tr.close()
            raise
    except BaseException:
        membership.close()
        raise
    membership.start(tr, table, cfg.job_id, settings.rendezvous)
    log.info("rank %d/%d of job %s joined via %s (%s), topology %r", settings.rank,
             settings.world_size, cfg.job_id or "(unnamed)", settings.rendezvous,
             settings.source, topo)
    return _with_metrics(Peer(tr, topo, settings, membership=membership))


def _with_metrics(peer: Peer) -> Peer:
    """Start the metrics the environment asks for (gossip/metrics/); a peer whose metrics
    cannot start (a bad setting, tensorboard missing) closes, and the error goes up."""
    try:
        peer.start_metrics()
    except BaseException:
        peer.close()
        raise
    return peer


def _warn_open(settings: LaunchSettings, joining: bool) -> None:
    """The one warning of a group without a key (see init)."""
    what = "joins a running job" if joining else f"is rank {settings.rank} of {settings.world_size}"
    warnings.warn(
        f"gossip: this process {what} without a cluster key: its rendezvous at "
        f"{settings.rendezvous} and its data ports are open, and anyone who can reach them "
        "can take a rank, read and inject data. Make a key with `gossip keygen PATH`, give "
        "every process the same file as GOSSIP_KEY=PATH (or gossip.init(key=PATH)); or set "
        "GOSSIP_INSECURE=1 if an open group is meant (a trusted network)",
        InsecureWarning, stacklevel=3)


def _join(membership: PeerMembership, doors: list[str], topology: Topology,
          settings: LaunchSettings,
          cfg: TransportConfig) -> Peer:
    """Join a running job through ``doors``: admitted at a step boundary of its members, with
    a rank in the new view; the state comes when a policy attaches (Peer.attached)."""
    switch = membership.join(doors)
    membership.use(switch.transport)
    topo = resize_topology(topology, len(switch.view))
    log.info("%s joined job %s as rank %d of %s", membership.name, cfg.job_id or "(unnamed)",
             switch.transport.rank, switch.view.describe())
    return _with_metrics(Peer(switch.transport, topo, settings, membership=membership,
                              joined=switch))
