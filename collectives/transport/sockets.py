"""The sockets of one peer, and their one owner: the ZeroMQ context, the bound ROUTER that
everything inbound arrives on, one DEALER (a Link) per peer this peer talks to, and the CURVE ZAP
handler.

Data always flows DEALER(src) -> ROUTER(dst). A DEALER's routing id is ``gossip:<rank>``, so
the ROUTER knows which peer a message came from (the arrivals check that the header's ``src``
agrees). Which thread may touch which socket is the I/O loop's business (io_loop.py, link.py);
this module makes, configures and closes them.
"""
from __future__ import annotations

import logging
import glob
import os
import socket as pysocket
import sys
import tempfile
import threading
import uuid
from typing import Callable, Collection

import zmq

from collectives import defaults
from collectives.config import TransportConfig
from collectives.errors import PeerLost, RendezvousError
from collectives.security import ZapHandler
from collectives.transport.emulation import Pacer
from collectives.transport.flow_control import SendWindow, held_bounds
from collectives.transport.link import Link
from collectives.transport.liveness import MONITOR_EVENTS
from collectives.transport.refusals import Refusals
from collectives.transport.shm_ring import shm_supported

__all__ = ["Sockets", "remove_ipc_files", "IDENTITY_PREFIX", "identity_of", "rank_of_identity", "job_of_identity",
           "host_id"]

log = logging.getLogger("collectives")

IDENTITY_PREFIX = b"gossip:"


def host_id() -> str:
    """Identifies a host *and* network namespace: ipc sockets only work between peers that
    share both (network-namespace test hosts share the hostname and boot id)."""
    try:
        boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:
        boot = ""
    try:
        netns = str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        netns = ""
    return f"{pysocket.gethostname()}/{boot}/{netns}"


def identity_of(job_id: str, rank: int, view: int = 0) -> bytes:
    """The routing id of ``rank``'s connections in view ``view`` of job ``job_id``:
    ``gossip:RANK`` for view 0 of an unnamed job, ``gossip:JOB/RANK`` of a named one,
    ``gossip:JOB#VIEW/RANK`` after a view change. A ROUTER hands it over with every message,
    so a receiver knows sender, job and view by one dict lookup: nothing of another job or of
    an old view reaches a mailbox."""
    group = f"{job_id}#{view}" if view else job_id
    return IDENTITY_PREFIX + (f"{group}/{rank}" if group else str(rank)).encode()


def job_of_identity(identity: bytes) -> str | None:
    """The job a routing id of our spelling names ("" for an unnamed job; ``JOB#VIEW`` after a
    view change), or None if it is not of our spelling: for the log line naming both jobs."""
    if not identity.startswith(IDENTITY_PREFIX):
        return None
    job, slash, digits = identity[len(IDENTITY_PREFIX):].rpartition(b"/")
    if not digits.isdigit():
        return None
    try:
        return job.decode("ascii") if slash else ""
    except UnicodeDecodeError:
        return None


def rank_of_identity(identity: bytes, world_size: int, job_id: str = "",
                     view: int = 0) -> int | None:
    """The rank a DEALER's routing id names, or None if it names none of this group (view
    ``view`` of job ``job_id``)."""
    prefix = identity_of(job_id, 0, view)[:-1]
    if not identity.startswith(prefix):
        return None
    digits = identity[len(prefix):]
    if not digits.isdigit() or len(digits) > 9:
        return None
    rank = int(digits)
    return rank if rank < world_size else None


class Sockets:
    """Makes, holds and closes every socket of one peer. ``links`` (rank -> Link) and
    ``addresses`` (rank -> endpoint) are read without a lock (a dict lookup is atomic); links
    are added under a lock, so one is made once per peer."""

    def __init__(self, rank: int, config: TransportConfig,
                 on_sent: Callable[[int, int, int], None]) -> None:
        self.rank = rank
        self.config = config
        self._on_sent = on_sent  # a link's traffic counter: (rank, messages, payload bytes)
        self.addresses: dict[int, str] = {}
        self.links: dict[int, Link] = {}  # outgoing connections, by destination
        self._links_lock = threading.Lock()
        self._accepting = True
        self.context = zmq.Context()
        self.router = self.socket(zmq.ROUTER, server=True)
        # The ROUTER never sends but to ask whether a routing id's connection is open (alive):
        # then a send to an id without an open pipe must fail, not vanish.
        self.router.router_mandatory = 1
        # Monitored before it binds, so no refused handshake goes unseen.
        self.refusals = Refusals(rank, self.router)
        self.zap = (ZapHandler(self.context, config.key, on_denied=self.refusals.zap_denied)
                    if config.key else None)
        # The ROUTER's pipes are unbounded: flow control is ours (flow_control.py: the send
        # window and HOLD bound what each source has in flight), and a bounded pipe is fatal.
        # libzmq (4.3.5 and its master) stops reading a connection whose pipe is full; if that
        # connection then hangs up, the next ZMTP heartbeat on it, ours or one already read
        # from the peer, aborts the process (stream_engine_base.cpp, `!_io_error`). Measured:
        # a sender killed while this peer's reader was stalled for a second took this peer
        # with it (tests/collectives/test_transport.py).
        self.router.rcvhwm = 0
        # libzmq allocates a frame before we can look at its header: cap what a connection
        # may make us allocate. Legitimate frames are chunks of at most whole_message_bytes
        # (or chunk_bytes); the margin tolerates peers configured differently. Bigger frames
        # make libzmq drop that connection.
        self.router.maxmsgsize = max(64 << 20, 4 * max(config.whole_message_bytes,
                                                       config.chunk_bytes))
        self._ipc_path: str | None = None
        self.endpoints = self._bind()

    def socket(self, kind: int, *, server: bool = False) -> zmq.Socket:
        """A socket with linger 0, the configured buffers and CURVE; a client (a DEALER)
        also with ZMTP heartbeats, which the server answers (libzmq's own thread answers a
        PING, so a peer busy in Python still does)."""
        cfg = self.config
        sock = self.context.socket(kind)
        sock.linger = 0
        if cfg.socket_buffer_bytes:
            sock.sndbuf = sock.rcvbuf = cfg.socket_buffer_bytes
        if not server:
            # Liveness comes from the DEALERs' heartbeats (liveness.py), and their TTL makes
            # the ROUTER drop a connection that went silent. The ROUTER pings no one: libzmq
            # (4.3.5 and its master) aborts the process when a connection's heartbeat timer
            # comes due after the connection stopped reading (its pipe to a socket being
            # closed refused a frame) and then hung up (stream_engine_base.cpp, `!_io_error`),
            # which is what a ROUTER closed at a view change, while its peers still send and
            # then close theirs, meets (tests/collectives/test_transport.py, -k pings).
            sock.setsockopt(zmq.HEARTBEAT_IVL, int(cfg.effective_heartbeat_interval * 1000))
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(cfg.effective_heartbeat_timeout * 1000))
            sock.setsockopt(zmq.HEARTBEAT_TTL, int(cfg.effective_heartbeat_timeout * 1000))
        if cfg.key is not None:
            if server:
                cfg.key.apply_server(sock)
            else:
                cfg.key.apply_client(sock)
        return sock

    def _bind(self) -> dict:
        cfg = self.config
        lo, hi = cfg.data_ports
        try:
            # max_port is exclusive; a narrow range is tried port by port at most 200 times.
            port = self.router.bind_to_random_port(f"tcp://{cfg.bind_host}", min_port=lo,
                                                   max_port=hi + 1, max_tries=200)
        except zmq.ZMQError as exc:
            raise RendezvousError(f"rank {self.rank}: cannot bind a data socket on "
                                  f"{cfg.bind_host} in ports {lo}-{hi} (GOSSIP_PORT_RANGE): "
                                  f"{exc}") from None
        advertise = cfg.advertise_host or cfg.bind_host
        endpoints = {"tcp": f"tcp://{advertise}:{port}", "ipc": None, "host": host_id(),
                     "shm": cfg.transport in ("auto", "shm") and shm_supported()}
        if cfg.transport in ("auto", "ipc", "shm"):
            path = _ipc_path(os.getpid(), self.rank)
            try:
                self.router.bind(f"ipc://{path}")
                self._ipc_path = None if path.startswith("@") else path
                endpoints["ipc"] = f"ipc://{path}"
            except zmq.ZMQError as exc:
                if cfg.transport in ("ipc", "shm"):
                    raise RendezvousError(f"rank {self.rank}: cannot bind ipc://{path}: {exc}")
                log.info("rank %d: no ipc endpoint (%s); using tcp only", self.rank, exc)
        log.debug("rank %d: listening at %s%s", self.rank, endpoints["tcp"],
                  f" and {endpoints['ipc']}" if endpoints["ipc"] else "")
        return endpoints

    def alive(self, identity: bytes) -> bool:
        """Whether the ROUTER has an open connection under routing id ``identity`` (only the
        thread reading the ROUTER may ask: it sends an empty message there, which a gossip
        DEALER never reads; offenders.py)."""
        try:
            self.router.send_multipart((identity, b""), zmq.NOBLOCK)
            return True
        except zmq.ZMQError:  # EHOSTUNREACH: none open; EAGAIN: its queue is full (unknown)
            return False

    def address(self, rank: int) -> str:
        """The endpoint this peer reaches ``rank`` at; "<unknown address>" before the table has it,
        so an error message can always name one."""
        return self.addresses.get(rank, "<unknown address>")

    def open_link(self, rank: int, prepare: Callable[[Link], None]) -> tuple[Link, bool]:
        """The link to ``rank`` and whether it is new; a new one gets ``prepare(link)`` before
        any other thread can see it (its first messages go first)."""
        with self._links_lock:
            link = self.links.get(rank)
            if link is not None:
                return link, False
            if not self._accepting:
                raise PeerLost(f"rank {self.rank}: connection to rank {rank} after close()",
                               rank=rank)
            if rank not in self.addresses:
                raise ValueError(f"rank {self.rank}: no address for rank {rank}; the rendezvous "
                                 f"table has ranks {sorted(self.addresses)}")
            dealer = self.socket(zmq.DEALER)
            dealer.routing_id = identity_of(self.config.job_id, self.rank, self.config.view)
            dealer.sndhwm = self.config.send_hwm
            dealer.setsockopt(zmq.RECONNECT_IVL, int(defaults.RECONNECT_INTERVAL * 1000))
            monitor = dealer.get_monitor_socket(MONITOR_EVENTS)
            log.debug("rank %d: connecting to rank %d at %s", self.rank, rank,
                      self.address(rank))
            dealer.connect(self.address(rank))
            bounds = held_bounds(self.config.key)
            link = Link(rank, dealer, monitor, self._on_sent,
                        None if self.config.link is None else Pacer(self.config.link),
                        window=SendWindow(bounds.window, bounds.ack_every))
            prepare(link)
            self.links[rank] = link
        return link, True

    def stop_connecting(self) -> None:
        """close() began: no new links."""
        with self._links_lock:
            self._accepting = False

    # -- closing (the I/O thread, as it stops) ----------------------------------------------
    def close_links(self, lost: Collection[int] = ()) -> None:
        """Close every link, lingering briefly so a goodbye already queued still leaves; a
        link to a ``lost`` rank (dead, closed) at once: nothing leaves to it any more."""
        with self._links_lock:
            links = list(self.links.values())
        for link in links:
            # A short linger lets the goodbye out; a dead peer cannot hold us longer. Behind
            # data still unacknowledged (up to a send window, which under CURVE takes a while
            # to encrypt and send) the goodbye gets GOODBYE_FLUSH: libzmq closes a socket
            # whose queue is empty at once, so a live peer costs nothing more. A lost peer's
            # unacknowledged data never leaves: lingering on it only held the context's term
            # for GOODBYE_FLUSH (every member of a view change that replaced a killed member
            # stood still 0.5 s after the switch, while the restarted one went on alone).
            if link.rank in lost:
                wait = 0.0
            elif link.window.in_flight:
                wait = defaults.GOODBYE_FLUSH
            else:
                wait = defaults.GOODBYE_LINGER
            link.close(linger_ms=int(wait * 1000))

    def close_router(self) -> None:
        """Close the ROUTER and its monitor (the caller holds the loop's reader lock)."""
        self.refusals.close()
        self.router.close(linger=0)

    def close_zap(self) -> None:
        """Close the ZAP handler, if there is one (a cluster key is set)."""
        if self.zap:
            self.zap.close()

    def destroy(self, timeout: float = defaults.CLOSE_TIMEOUT) -> None:
        """Terminate the context and remove the ipc socket file, where it is one (after the
        I/O thread). libzmq's term waits for every socket of the context to close: one that
        another thread opened on it after the others were closed would hold it for ever (a
        peer stuck there in a view change, in CI). So the term runs in a thread of its own
        and is waited for ``timeout`` seconds; past that the context is left to the process
        and a warning says so."""
        def term() -> None:
            try:
                self.context.destroy(linger=0)
            except zmq.ZMQError:
                pass

        thread = threading.Thread(target=term, name="gossip-zmq-term", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            log.warning("rank %d: the transport's ZeroMQ context did not terminate within %gs (a "
                        "socket opened on it is still open): left to the process", self.rank,
                        timeout)
        if self._ipc_path:
            try:
                os.unlink(self._ipc_path)
            except FileNotFoundError:
                pass


def _ipc_name(pid: int, rank: int) -> str:
    """The name of a peer's ipc socket: its process id first, so that whoever started the
    process can remove its file (remove_ipc_files) when the peer died without closing."""
    return f"gossip-{pid}-r{rank}-{uuid.uuid4().hex[:8]}.sock"


def _ipc_path(pid: int, rank: int) -> str:
    """Where a peer's ipc socket lives. On Linux in the abstract namespace ("@name"): the
    kernel removes it with the last descriptor, however the process ends. A socket file in
    TMPDIR outlived every peer that ended without close(): killed, os._exit (a torchrun rank
    leaving at once), an uncaught exception under a launcher that did not clean up after it;
    thousands piled up in /tmp. An abstract socket is reachable by any process of the network
    namespace, as the peer's tcp port on the same host already is (CURVE, when on, guards
    both alike); ipc is only chosen between peers of one host and network namespace
    (host_id), which is where abstract sockets are shared. Elsewhere: a file in TMPDIR."""
    name = _ipc_name(pid, rank)
    if sys.platform.startswith("linux"):
        return "@" + name
    return os.path.join(tempfile.gettempdir(), name)


def remove_ipc_files(pids, folder: str | None = None) -> int:
    """Remove the ipc socket files of the peer processes ``pids`` (dead: a live peer's socket
    would stop accepting), in ``folder`` (their TMPDIR; default this process's); returns how
    many. A peer that closes removes its own; one killed, or ending on an exception without
    close(), leaves its file behind (where sockets are files: not on Linux, see _ipc_path)."""
    removed = 0
    folder = folder or tempfile.gettempdir()
    for pid in pids:
        for path in glob.glob(os.path.join(folder, f"gossip-{int(pid)}-r*.sock")):
            try:
                os.unlink(path)
                removed += 1
            except OSError:
                pass
    return removed
