"""Connections that send bad messages, and cutting them off.

libzmq's ROUTER cannot close one of its connections, but every message it hands over carries
the descriptor of the connection it came on (``zmq.SRCFD``: libzmq's message property "__fd",
read with ``Frame.get``), and shutting that socket down makes libzmq's own reader see the
connection end: it drops it at once (measured: its monitor reports the disconnection within
0.1 ms), as if the peer had left. So a connection that sends MAX_STRIKES malformed, foreign or
over-bound messages is cut for real, whatever identity it claims (a rank's, one of another
job, none), not only dropped message by message; its messages are still dropped, counted and
logged as before (dispatch.py, throttled_log.DropLog).

A connection is its descriptor and the remote address read from it when it first misbehaves
(``describe``: host and port; for a unix socket, the process id the kernel vouches for). A
sender that reconnects (libzmq's DEALER does, every few hundred milliseconds) comes back on a
new connection: it is counted afresh, but an identity already cut is cut again at its first bad
message, and so is a rank's identity the arrivals cut (``cut``). Every cut is counted by reason;
the first cut of an offender (its identity and host) is logged at WARNING with its address,
later ones only in the throttled summaries (throttled_log.ThrottledLog).

Descriptors are reused, and a closed connection's messages stay readable: libzmq keeps what it
had read from it queued in the ROUTER, under its routing id, while the kernel hands the closed
descriptor's number to the next connection accepted (measured: a closed sender's queued frames
and a new client's first one, read interleaved, all named descriptor 13). A message's
descriptor is therefore only trusted while its own connection is alive, and the ROUTER says
whether it is (``alive``): with ZMQ_ROUTER_MANDATORY, a send to the message's routing id fails
unless that id's pipe is still open, and an open connection's descriptor cannot have been
reused. Such a probe (an empty message to the offender, which a gossip DEALER never reads) is
sent only when a connection is about to be cut.
"""
from __future__ import annotations

import logging
import socket as pysocket
import struct
import time
from collections import OrderedDict
from typing import Callable

import zmq

from collectives import defaults
from collectives.transport.throttled_log import ThrottledLog

__all__ = ["Offenders", "describe", "source_descriptor"]

log = logging.getLogger("collectives")

_SRCFD = getattr(zmq, "SRCFD", 2)
_RECORDS = 4096     # connections remembered (by descriptor): past it the oldest go
_CONDEMNED = 1024   # identities remembered as cut, and offenders logged
_UCRED = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


def source_descriptor(frame) -> int | None:
    """The descriptor of the connection ``frame`` (a message part read with copy=False, not the
    ROUTER's identity frame) came on, or None if libzmq does not say (an inproc pipe, or a
    libzmq without the property)."""
    try:
        fd = frame.get(_SRCFD)
    except (zmq.ZMQError, AttributeError, TypeError):
        return None
    return fd if type(fd) is int and fd >= 0 else None


def describe(fd: int) -> tuple[str, str] | None:
    """(address, host) of the connection on descriptor ``fd``: ``"127.0.0.1:5555"`` and
    ``"127.0.0.1"`` for TCP, ``"a local process (pid 42)"`` and ``"pid 42"`` for a unix socket;
    None if ``fd`` is closed or not a connected socket. Reads the descriptor in place (the
    socket object is detached, never closed)."""
    try:
        sock = pysocket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if sock.family == pysocket.AF_UNIX:
            pid, _, _ = _UCRED.unpack(sock.getsockopt(pysocket.SOL_SOCKET,
                                                      pysocket.SO_PEERCRED, _UCRED.size))
            return f"a local process (pid {pid})", f"pid {pid}"
        name = sock.getpeername()
        if isinstance(name, tuple):
            host = name[0]
            return (f"[{host}]:{name[1]}" if ":" in host else f"{host}:{name[1]}"), host
        return str(name), str(name)
    except OSError:
        return None
    finally:
        sock.detach()


def _shutdown(fd: int) -> bool:
    """Shut down both directions of the socket on ``fd`` (libzmq's reader sees the end and
    closes it); False if it is no connected socket any more."""
    try:
        sock = pysocket.socket(fileno=fd)
    except OSError:
        return False
    try:
        sock.shutdown(pysocket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        sock.detach()


class _Connection:
    """What is known of one connection that misbehaved."""

    __slots__ = ("address", "host", "strikes", "first", "cut")

    def __init__(self, address: str, host: str, now: float) -> None:
        self.address, self.host = address, host
        self.strikes = 0
        self.first = now  # its first bad message
        self.cut = False  # shut down already (libzmq may not have seen it yet)


class Offenders:
    """The connections one ROUTER's reader found misbehaving, and their cuts (written by
    whichever thread reads the socket, one at a time). ``who`` names the socket's owner in log
    lines; ``alive(identity)`` says whether the ROUTER still has an open connection under that
    routing id (the module docstring: called by the reader, which owns the socket then)."""

    def __init__(self, who: int | str, alive: Callable[[bytes], bool], *,
                 strikes: int = defaults.MAX_STRIKES) -> None:
        self._alive = alive
        self._strikes = strikes
        self._log = ThrottledLog(who, "disconnected a sender", "disconnected senders:")
        self._records: OrderedDict[int, _Connection] = OrderedDict()   # by descriptor
        self._condemned: OrderedDict[bytes, str] = OrderedDict()       # identity -> reason
        self._logged: set[tuple[bytes, str]] = set()  # (identity, host) logged once already
        self.uncuttable = 0  # bad messages whose connection libzmq did not name

    # -- what the reader reports --------------------------------------------------------------
    def strike(self, frame, identity: bytes, reason: str, detail: str) -> None:
        """A bad message (``reason``: malformed, foreign, over-bound; ``detail`` for the log)
        arrived in ``frame`` from a sender calling itself ``identity``: count it against its
        connection, and cut the connection at MAX_STRIKES, or at once if ``identity`` was cut
        before."""
        found = self._connection(frame)
        if found is None:
            return
        fd, conn = found
        conn.strikes += 1
        if conn.strikes >= (1 if identity in self._condemned else self._strikes):
            self._cut(fd, conn, identity, reason, detail)

    def cut(self, frame, identity: bytes, reason: str, detail: str) -> None:
        """Cut the connection ``frame`` came on now, and every later connection of
        ``identity`` at its first bad message (a rank the arrivals cut after MAX_STRIKES on
        its identity, whatever connections they came on)."""
        self._condemn(identity, reason)
        found = self._connection(frame)
        if found is not None:
            self._cut(found[0], found[1], identity, reason, detail)

    def tick(self, *, final: bool = False) -> None:
        """Log the summary due, if any (the owner's loop, now and then; ``final``: at close)."""
        self._log.tick(final=final)

    # -- counters -------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        """Connections cut, all reasons together (one sender that reconnects counts again)."""
        return self._log.count

    @property
    def by_reason(self) -> dict[str, int]:
        """Connections cut, by the reason of the bad message that cut each."""
        return self._log.by_reason

    @property
    def offenders(self) -> int:
        """Distinct senders cut (identity and host)."""
        return len(self._logged)

    # -- internals -------------------------------------------------------------------------------
    def _connection(self, frame) -> tuple[int, _Connection] | None:
        """The descriptor ``frame`` came on and the record of the connection on it now (a new
        one where another address holds it), or None if it is closed or unknown."""
        fd = source_descriptor(frame)
        if fd is None:
            self.uncuttable += 1
            return None
        where = describe(fd)
        if where is None:
            return None  # gone already (it left, or was cut): nothing to cut
        records = self._records
        conn = records.get(fd)
        if conn is not None and conn.cut and conn.address == where[0]:
            return None  # what it sent before the cut took effect
        if conn is None or conn.address != where[0]:
            conn = records[fd] = _Connection(where[0], where[1], time.monotonic())
            records.move_to_end(fd)
            while len(records) > _RECORDS:
                records.popitem(last=False)
        return fd, conn

    def _condemn(self, identity: bytes, reason: str) -> None:
        # An identity libzmq made up for a client that set none (a zero byte, then a counter)
        # is new on every connection: nothing to remember.
        if identity[:1] == b"\0":
            return
        self._condemned[identity] = reason
        self._condemned.move_to_end(identity)
        while len(self._condemned) > _CONDEMNED:
            self._condemned.popitem(last=False)

    def _cut(self, fd: int, conn: _Connection, identity: bytes, reason: str,
             detail: str) -> None:
        # Only a message whose own connection is still open names its descriptor for sure
        # (the module docstring); read the address again after asking, in case it just went.
        if not self._alive(identity) or describe(fd) != (conn.address, conn.host) \
                or not _shutdown(fd):
            return
        conn.cut = True
        self._condemn(identity, reason)
        now = time.monotonic()
        offender = (b"" if identity[:1] == b"\0" else identity, conn.host)
        first = offender not in self._logged and len(self._logged) < _CONDEMNED
        if first:
            self._logged.add(offender)
        self._log.note(reason, f"{conn.address} (identity {identity[:60]!r}) after "
                               f"{conn.strikes} bad message{'s' * (conn.strikes != 1)} in "
                               f"{(now - conn.first) * 1000:.0f} ms (last: {detail})",
                       quiet=not first)
