"""Settings of one peer's transport. Timeouts derive from one another (the rules and values live
in collectives/defaults.py), so a single ``timeout`` is usually all a user sets."""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from collectives import defaults
from collectives.security import ClusterKey

__all__ = ["TransportConfig", "check_job_id", "MAX_JOB_ID"]

# A job id travels in every connection's routing id (at most 255 bytes with the rank) and in
# log lines: short, printable, no separators of our own spelling ("/").
MAX_JOB_ID = 64
_JOB_ID = re.compile(r"[A-Za-z0-9._:@+-]*")


def check_job_id(job_id: object) -> str:
    """``job_id`` if it can name a job (up to MAX_JOB_ID of letters, digits and ``._:@+-``;
    empty: an unnamed job), else ValueError saying why."""
    if not isinstance(job_id, str) or len(job_id) > MAX_JOB_ID or not _JOB_ID.fullmatch(job_id):
        raise ValueError(f"job id {job_id!r}: use at most {MAX_JOB_ID} letters, digits and "
                         "'._:@+-'")
    return job_id


@dataclass(frozen=True)
class TransportConfig:
    """The settings of one peer's transport, each field with its default (every field's
    meaning: the settings page of the documentation, or the comments in collectives/config.py).
    Usually made by ``gossip.init`` from its arguments and the environment; ``with_`` gives a
    validated copy with some fields changed."""

    # Seconds any blocking wait (receive, send backpressure, operation) may take before raising.
    timeout: float = defaults.TIMEOUT
    # Silence after which a connection is dropped and its peer declared lost. Default:
    # defaults.heartbeat_timeout(timeout), so a silent peer is PeerLost, not a timeout.
    heartbeat_timeout: float | None = None
    # Period of ZMTP heartbeats (PING/PONG answered by libzmq's own thread, so a peer busy in
    # Python still answers). Default: defaults.heartbeat_interval(heartbeat timeout).
    heartbeat_interval: float | None = None
    # Arrays travel in chunks of this many bytes: the receiver's allocator recycles chunk
    # buffers instead of mapping fresh pages for one huge message, and chunks pipeline.
    chunk_bytes: int = 1 << 20
    # A message up to this size travels whole, as one chunk: the receiver can hand it over
    # without a copy, and nothing is gained by cutting it (measured: benchmarks/transport.py).
    # To a peer on this host, at most one shared-memory slot (shm_chunk_bytes) a chunk.
    whole_message_bytes: int = 4 << 20
    # Largest array a header may announce; bigger ones are refused before any allocation.
    max_message_bytes: int = 16 << 30
    # libzmq's queue bound of each outgoing link, in messages (chunks): what a slow receiver
    # can make a sender queue inside libzmq (64 MiB of 1 MiB chunks). A receiver's queues are
    # unbounded in libzmq and bounded by the send window instead (transport/sockets.py).
    send_hwm: int = 64
    # Kernel socket buffers (SO_SNDBUF/SO_RCVBUF) in bytes; 0 keeps the system default. Larger
    # buffers mean fewer wake-ups per megabyte moved, and a tcp connection keeps at most about
    # this much in flight: a long fat link needs its bandwidth x round trip (GOSSIP_SOCKET_BUFFER;
    # the kernel caps them at net.core.wmem_max / rmem_max, and gossip.init warns).
    socket_buffer_bytes: int = 4 << 20
    # "auto": shared memory for payloads between peers on the same host (control messages over
    # ipc), tcp between hosts; or force "shm", "ipc" or "tcp" (measured in benchmarks/).
    transport: str = "auto"
    # Shared-memory rings (one per peer this peer sends to on its host): slots of
    # shm_chunk_bytes each, so a ring costs up to shm_slots * shm_chunk_bytes of memory (pages
    # are only committed when touched). Bigger chunks mean fewer messages per byte; 8 x 4 MiB
    # measured best on 2 cores (benchmarks/allreduce.py). 1 to 512 slots of 4 KiB to 1 GiB.
    shm_slots: int = 8
    shm_chunk_bytes: int = 4 << 20
    # Address the data socket binds; loopback unless the run spans machines.
    bind_host: str = "127.0.0.1"
    # Address other peers use to reach this one; default: bind_host, or this host's address
    # on the route to the rendezvous when bind_host is 0.0.0.0.
    advertise_host: str | None = None
    # Ports the data socket may take (inclusive), for firewalls between machines
    # (GOSSIP_PORT_RANGE=LO-HI); one port per peer, so give at least as many as peers per host.
    data_ports: tuple[int, int] = (20000, 64999)
    # Cluster key: when set, every socket uses CURVE and admits only key holders.
    key: ClusterKey | None = field(default=None, repr=False)
    # The job this peer belongs to (gossip.settings says where it comes from): part of the
    # rendezvous and of every connection's routing id, so peers of two jobs never mix, even
    # when they meet at one address. Empty: an unnamed job (meets only unnamed ones).
    job_id: str = ""
    # The membership view this transport serves (collectives/group): part of the routing
    # id too, so messages of an old view never reach a new view's transport.
    view: int = 0
    # Link emulation (collectives/transport/emulation.py; GOSSIP_LINK, init(link=)): every link
    # from this peer behaves as one of this rate and one-way latency, e.g. "1gbit,2ms", so a
    # run on one machine costs what it would on a cluster. A string is parsed into a LinkSpec;
    # None or "": off (the default, at no cost).
    link: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.link, str):
            # Imported here: the transport package imports this module.
            from collectives.transport.emulation import parse_link
            object.__setattr__(self, "link", parse_link(self.link, "link"))
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout!r}")
        if self.transport not in ("auto", "tcp", "ipc", "shm"):
            raise ValueError(f"transport must be 'auto', 'shm', 'ipc' or 'tcp', got "
                             f"{self.transport!r}")
        lo, hi = self.data_ports
        if not 1 <= lo <= hi <= 65535:
            raise ValueError(f"data_ports must be (lo, hi) with 1 <= lo <= hi <= 65535, got "
                             f"{self.data_ports!r}")
        check_job_id(self.job_id)
        if self.chunk_bytes < 4096:
            raise ValueError(f"chunk_bytes must be at least 4096, got {self.chunk_bytes}")
        for name in ("heartbeat_timeout", "heartbeat_interval"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds (or None: derived from "
                                 f"timeout), got {value!r}")
        for name in ("whole_message_bytes", "send_hwm", "socket_buffer_bytes", "view"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be > 0, got {self.max_message_bytes!r}")
        # Imported here, as above. A ring beyond these would be refused by its receiver.
        from collectives.transport.shm_ring import MAX_SLOT_BYTES, MAX_SLOTS
        if not 1 <= self.shm_slots <= MAX_SLOTS:
            raise ValueError(f"shm_slots must be 1 to {MAX_SLOTS}, got {self.shm_slots!r}")
        if not 4096 <= self.shm_chunk_bytes <= MAX_SLOT_BYTES:
            raise ValueError(f"shm_chunk_bytes must be 4096 to {MAX_SLOT_BYTES} (1 GiB), got "
                             f"{self.shm_chunk_bytes!r}")

    @property
    def effective_heartbeat_timeout(self) -> float:
        """``heartbeat_timeout``, or when unset the one derived from ``timeout``."""
        if self.heartbeat_timeout is not None:
            return self.heartbeat_timeout
        return defaults.heartbeat_timeout(self.timeout)

    @property
    def effective_heartbeat_interval(self) -> float:
        """``heartbeat_interval``, or when unset the one derived from the effective heartbeat
        timeout."""
        if self.heartbeat_interval is not None:
            return self.heartbeat_interval
        return defaults.heartbeat_interval(self.effective_heartbeat_timeout)

    def with_(self, **changes) -> "TransportConfig":
        """A copy with ``changes`` applied, validated again."""
        return replace(self, **changes)
