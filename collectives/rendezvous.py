"""The address exchange: rank 0 hosts a short-lived table at the rendezvous address; every peer
registers its endpoints and gets the whole table back. After it, no peer is special.

Messages are msgpack maps over a ROUTER (rank 0) / DEALER (others) pair created in the peer's
own ZeroMQ context, so a cluster key secures the rendezvous exactly like the data sockets.
Every failure is a RendezvousError that says what went wrong and who was involved: ranks that
never came (named), a duplicate rank, a world size or configuration that disagrees, a port
already in use. Every rank hears it: a rank 0 that fails early goes on answering the
registrations still coming with its verdict (defaults.VERDICT_LINGER, or until every rank
heard it).

Every registration names its job (TransportConfig.job_id). Rank 0 refuses a peer of another
job (that peer only: it is not a failure of this job) and tells it why; the refused peer tries
again until its own deadline, since its own rank 0 may take the address once the other job's
rendezvous is over. Two jobs started at one address at the same moment thus never mix; a peer
that never meets its own job's rank 0 fails naming both jobs.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

import msgpack
import zmq

from collectives import defaults
from collectives.errors import RendezvousError
from collectives.notices import LongWait
from collectives.transport.refusals import Refusals
from collectives.transport.transport import Transport

__all__ = ["rendezvous", "bind_address", "RENDEZVOUS_VERSION", "JobRunning"]

log = logging.getLogger("collectives")

RENDEZVOUS_VERSION = 1
_MAX_MESSAGE = 64 * 1024
# A client waits ``timeout`` plus this; once rank 0 has answered its registration with the time
# rank 0 has left, the client waits that plus this, so rank 0's verdict (which ranks are
# missing) reaches it even when rank 0 started later. A client that never hears from rank 0
# (absent, or its port held by another program) fails after timeout + this, not later.
_CLIENT_GRACE = defaults.RENDEZVOUS_CLIENT_GRACE
# A peer refused by another job's rank 0 asks again this often.
_REFUSED_RETRY = 0.05
# A restarted rank 0 whose port is held asks this long whether its own job holds it (a door
# answers in milliseconds; rank 0 must still fail at once when another program holds it).
_PROBE_HELD = 0.3


class JobRunning(RendezvousError):
    """The rendezvous address is held by a running member of this job (a door, see
    collectives/group/door.py): this process should join it. ``view`` is the job's view
    (its wire form) and ``doors`` where its members listen."""

    def __init__(self, message: str, view: dict, doors: list[str]) -> None:
        super().__init__(message)
        self.view = view
        self.doors = doors


class _PortHeld(RendezvousError):
    """Rank 0 found the rendezvous port taken (by a member of its own running job, or not)."""


def _pack(obj: dict) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(raw: bytes) -> dict | None:
    if len(raw) > _MAX_MESSAGE:
        return None
    try:
        obj = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=_MAX_MESSAGE,
                              max_str_len=_MAX_MESSAGE)
    except Exception:
        return None
    return obj if isinstance(obj, dict) else None


def rendezvous(transport: Transport, address: str, *, timeout: float,
               info: dict[str, Any] | None = None,
               extra: dict[str, Any] | None = None) -> dict[int, dict]:
    """Exchange endpoints with every peer through ``address`` (``tcp://host:port``).

    ``info`` is compared across peers: any key whose value differs (a topology spec, a
    protocol setting) fails the rendezvous on every peer, naming the ranks that disagree.
    ``extra`` joins this peer's entry (its membership door and identity). Returns rank ->
    {"tcp", "ipc", "host", "pid", ...} and installs it in the transport. JobRunning if a
    running member of the job answers at ``address`` instead of a rank 0 that gathers.
    """
    entry = dict(transport.endpoints, pid=os.getpid(), **(extra or {}))
    me = {"v": RENDEZVOUS_VERSION, "rank": transport.rank, "world_size": transport.world_size,
          "job": transport.config.job_id, "entry": entry, "info": info or {}}
    log.debug("rank %d: rendezvous of job %s at %s, %d peers, timeout %gs", transport.rank,
              _job_name(me["job"]), address, transport.world_size, timeout)
    if transport.world_size == 1:
        table = {0: entry}
    elif transport.rank == 0:
        try:
            table = _serve(transport, address, timeout, me)
        except _PortHeld as held:
            # A restarted rank 0: a running member of its job may hold the address (a door
            # listening there). Ask briefly as a client; anything else holds it: say so.
            log.debug("rank 0: %s; asking for %gs whether a member of this job holds it",
                      held, _PROBE_HELD)
            _probe_running(transport, address, me)
            raise RendezvousError(str(held), address_in_use=True) from None
    else:
        table = _register(transport, address, timeout, me)
    transport.set_peers(table)
    return table


def bind_address(address: str) -> str:
    """What to bind to listen at ``address`` (loopback stays loopback)."""
    host, _, port = address[len("tcp://"):].rpartition(":")
    if host in ("localhost", "127.0.0.1", "::1", "[::1]") or host.startswith("127."):
        return f"tcp://{'127.0.0.1' if host == 'localhost' else host}:{port}"
    return f"tcp://*:{port}"  # rank 0 may know itself under another name than MASTER_ADDR


def _serve(transport: Transport, address: str, timeout: float, me: dict) -> dict[int, dict]:
    n = transport.world_size
    sock = transport.context.socket(zmq.ROUTER)
    sock.linger = 0
    if transport.config.key is not None:
        transport.config.key.apply_server(sock)
    # A client with another server key, or without CURVE, is refused in the handshake before
    # any message: the monitor is how rank 0 can log it (see refusals.py).
    refusals = Refusals(transport.rank, sock)
    bind = bind_address(address)
    try:
        sock.bind(bind)
    except zmq.ZMQError as exc:
        refusals.close()
        sock.close()
        hint = ("another job or a previous run still holds it; choose another port with "
                "--master-port / MASTER_PORT / GOSSIP_MASTER_PORT"
                if exc.errno == zmq.EADDRINUSE else "is the address one of this host's?")
        message = (f"rank 0: cannot bind the rendezvous at {bind} ({address}): "
                   f"{exc.strerror}; {hint}")
        if exc.errno == zmq.EADDRINUSE:
            raise _PortHeld(message, address_in_use=True) from None
        raise RendezvousError(message) from None
    log.debug("rank 0: serving the rendezvous at %s (bound %s); waits up to %gs for ranks "
              "1-%d", address, bind, timeout, transport.world_size - 1)
    try:
        return _collect(sock, refusals, transport, address, timeout, me, n)
    finally:
        refusals.close()
        sock.close()   # (linger 0, or what _tell_late_comers set)
        # Counted with the data socket's in the peer's stats()["handshakes_refused"].
        transport.count_rendezvous_refusals(refusals.by_reason)


def _collect(sock, refusals, transport, address, timeout, me, n) -> dict[int, dict]:
    start = time.monotonic()
    deadline = start + timeout
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(refusals.monitor, zmq.POLLIN)
    registered: dict[int, dict] = {0: me}
    identities: dict[int, bytes] = {}
    refused: set = set()  # (job, rank) of other jobs' peers refused, each logged once
    everyone: list[bytes] = []  # every client heard from, so a failure reaches them all
    told: set[int] = set()      # ... and the ranks they registered as
    notice = LongWait(lambda: f"rank 0: the rendezvous of job {_job_name(me['job'])} at "
                              f"{address}: waiting for ranks "
                              f"{_ranges(sorted(set(range(n)) - set(registered)))} "
                              f"({len(registered)} of {n} registered)", start, deadline)

    def fail(reason: str, linger: bool = True) -> RendezvousError:
        for ident in everyone:
            sock.send_multipart([ident, _pack({"error": reason})], zmq.NOBLOCK)
        if linger:   # the ranks still on their way hear the verdict too, not a silence
            _tell_late_comers(sock, me, reason, told, n, deadline)
        return RendezvousError(f"rank 0 (rendezvous {address}): {reason}")

    while len(registered) < n:
        notice.check()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = sorted(set(range(n)) - set(registered))
            log.debug("rank 0: the rendezvous at %s timed out after %gs, ranks %s missing",
                      address, timeout, _ranges(missing))
            raise fail(f"ranks {_ranges(missing)} never came within {timeout:g}s "
                       f"({len(registered)} of {n} registered); check that every peer was "
                       f"started with the same world size and rendezvous address",
                       linger=False)   # (the missing are not coming)
        events = dict(poller.poll(min(remaining, defaults.RENDEZVOUS_POLL) * 1000))
        if refusals.monitor in events:
            refusals.on_events()
        refusals.tick()
        if sock not in events:
            continue
        frames = sock.recv_multipart()
        if len(frames) != 2:
            continue
        ident, msg = frames[0], _unpack(frames[1])
        if msg is not None and msg.get("job", "") == me["job"]:
            running = _running(msg, transport, address, me)
            if running is not None:
                # A running member of this job: this rank 0 was started again while the
                # others went on (its old address was free); it joins them instead.
                raise running
        everyone.append(ident)
        if msg is None or msg.get("v") != RENDEZVOUS_VERSION:
            log.warning("rendezvous: ignored a malformed registration")
            continue
        rank, size = msg.get("rank"), msg.get("world_size")
        if type(rank) is not int or type(size) is not int:
            continue
        if msg.get("job", "") != me["job"]:
            _refuse_other_job(sock, ident, msg, me, rank, address, refused)
            everyone.pop()   # not one of ours: our failure is none of its business
            continue
        told.add(rank)
        if size != n:
            raise fail(f"rank {rank} says world size {size}, rank 0 says {n}")
        if not 0 <= rank < n:
            raise fail(f"a peer registered rank {rank}, outside world size {n}")
        if rank in registered:
            first = registered[rank]["entry"]
            other = msg.get("entry", {})
            raise fail(f"rank {rank} registered twice (pid {first.get('pid')} on "
                       f"{first.get('tcp')} and pid {other.get('pid')} on {other.get('tcp')}); "
                       f"every peer needs its own rank")
        for name, value in me["info"].items():
            theirs = msg.get("info", {}).get(name)
            if theirs != value:
                raise fail(f"rank {rank} has {name}={theirs!r} but rank 0 has {value!r}; "
                           "every peer must use the same setting")
        registered[rank] = msg
        identities[rank] = ident
        if log.isEnabledFor(logging.DEBUG):
            entry = msg.get("entry")   # (a registration is checked no further: .get safely)
            log.debug("rank 0: rank %d registered from %s (%d of %d)", rank,
                      entry.get("tcp") if isinstance(entry, dict) else "?", len(registered), n)
        # Tell the client how long rank 0 still waits: it stretches its own deadline to hear
        # the verdict, instead of every client waiting a fixed, larger margin.
        sock.send_multipart([ident, _pack({"wait": max(0.0, deadline - time.monotonic())})],
                            zmq.NOBLOCK)

    table = {r: registered[r]["entry"] for r in range(n)}
    # Installed before anyone hears of it: peers start sending the moment they have it.
    transport.set_peers(table)
    packed = _pack({"table": {str(r): e for r, e in table.items()}})
    for ident in identities.values():
        sock.send_multipart([ident, packed])
    # Wait for every acknowledgement, so closing the socket cannot drop a table in flight.
    pending = set(identities.values())
    while pending and time.monotonic() < deadline + _CLIENT_GRACE:
        if sock.poll(200):
            frames = sock.recv_multipart()
            pending.discard(frames[0])
    log.debug("rank 0: sent the table of %d peers; %d acknowledgement(s) missing", n,
              len(pending))
    return table


def _tell_late_comers(sock, me: dict, reason: str, told: set[int], n: int,
                      deadline: float) -> None:
    """After rank 0 failed the rendezvous: answer every registration of this job that comes
    with ``reason`` until each of ranks 1..n-1 heard it (``told``), VERDICT_LINGER
    passed or the rendezvous' deadline; a rank that registered after the failure would
    otherwise wait out its timeout and blame an absent rank 0."""
    until = min(deadline, time.monotonic() + defaults.VERDICT_LINGER)
    packed = _pack({"error": reason})
    while not set(range(1, n)) <= told and time.monotonic() < until:
        # Never below 0: a negative timeout is zmq_poll's "for ever" (time passes between
        # the loop's test and this line: under load it hung here for good, in CI).
        left = max(0.0, until - time.monotonic())
        if not sock.poll(min(defaults.RENDEZVOUS_POLL, left) * 1000):
            continue
        frames = sock.recv_multipart()
        msg = _unpack(frames[-1]) if len(frames) == 2 else None
        if msg is None or msg.get("job", "") != me["job"] or type(msg.get("rank")) is not int:
            continue
        sock.send_multipart([frames[0], packed], zmq.NOBLOCK)
        told.add(msg["rank"])
    sock.linger = int(defaults.RENDEZVOUS_CLIENT_GRACE * 1000)   # the last answers leave


def _job_name(job: Any) -> str:
    return repr(job) if job else "(unnamed)"


def _refuse_other_job(sock, ident: bytes, msg: dict, me: dict, rank: int, address: str,
                      refused: set) -> None:
    """Tell a peer of another job that this rendezvous is not its job's (it tries again)."""
    theirs = msg.get("job", "")
    theirs = theirs[:80] if isinstance(theirs, str) else "?"
    reason = (f"the rendezvous at {address} belongs to job {_job_name(me['job'])}; this peer "
              f"belongs to job {_job_name(theirs)}")
    if (theirs, rank) not in refused:
        refused.add((theirs, rank))
        log.warning("rank 0 of job %s: refused rank %d of job %s at the rendezvous %s",
                    _job_name(me["job"]), rank, _job_name(theirs), address)
    sock.send_multipart([ident, _pack({"refused": reason})], zmq.NOBLOCK)


def _running(msg: dict, transport, address: str, me: dict) -> JobRunning | None:
    """The JobRunning a running member's answer ``msg`` means, or None if it is not one."""
    if not (isinstance(msg.get("running"), dict) and isinstance(msg.get("doors"), list)):
        return None
    return JobRunning(f"rank {transport.rank}: job {_job_name(me['job'])} is already running "
                      f"at {address}", msg["running"],
                      [d for d in msg["doors"] if isinstance(d, str)][:64])


def _probe_running(transport, address: str, me: dict) -> None:
    """Raise JobRunning if a running member of this job answers at ``address`` within
    _PROBE_HELD; return otherwise."""
    sock = _client_socket(transport, address)
    try:
        sock.send(_pack(me))
        if sock.poll(_PROBE_HELD * 1000):
            running = _running(_unpack(sock.recv()) or {}, transport, address, me)
            if running is not None:
                raise running
    finally:
        sock.close()


def _client_socket(transport, address):
    sock = transport.context.socket(zmq.DEALER)
    sock.linger = 0
    if transport.config.key is not None:
        transport.config.key.apply_client(sock)
    sock.connect(address)
    return sock


def _register(transport, address, timeout, me) -> dict[int, dict]:
    start = time.monotonic()
    deadline = start + timeout + _CLIENT_GRACE
    refusal = None   # the last "not your job" heard, for the error at the deadline
    heard = False    # rank 0 took the registration (it waits for the others)
    notice = LongWait(lambda: f"rank {transport.rank}: the rendezvous at {address}: " + (
        "rank 0 took its registration; waiting for the other ranks" if heard else
        "waiting for rank 0 to answer (is it running, and reachable there?)"), start,
        deadline)
    sock = _client_socket(transport, address)
    log.debug("rank %d: registering at the rendezvous %s; waits up to %gs for rank 0",
              transport.rank, address, deadline - start)
    try:
        sock.send(_pack(me))
        while True:
            now = time.monotonic()
            remaining = deadline - now
            if remaining > 0 and notice.until(deadline) < deadline \
                    and not sock.poll(max(0.0, notice.until(deadline) - now) * 1000):
                notice.check()   # (its own deadline may move: rank 0 said how long it waits)
                continue
            if remaining <= 0 or not sock.poll(remaining * 1000):
                waited = time.monotonic() - start
                log.debug("rank %d: the rendezvous at %s timed out after %.3gs",
                          transport.rank, address, waited)
                if refusal is not None:
                    raise RendezvousError(
                        f"rank {transport.rank} of job {_job_name(me['job'])}: never met its "
                        f"own job's rank 0 at {address} within {waited:.3g}s: {refusal} (two "
                        "jobs on one address: give each its own --master-port, or the same "
                        "GOSSIP_JOB_ID to every peer of one job)")
                raise RendezvousError(
                    f"rank {transport.rank}: no answer from the rendezvous at {address} within "
                    f"{waited:.3g}s; is rank 0 running and reachable there"
                    f"? (A peer without the group's cluster key, or with another one, gets no "
                    f"answer either: check GOSSIP_KEY / key= on every peer.)")
            msg = _unpack(sock.recv())
            if msg is None:
                continue
            wait = msg.get("wait")
            if isinstance(wait, (int, float)) and not isinstance(wait, bool) \
                    and 0 <= wait < 1e6:  # NaN fails the comparison
                deadline = max(deadline, time.monotonic() + wait + _CLIENT_GRACE)
                heard = True
                log.debug("rank %d: rank 0 took the registration; the table within %.3gs",
                          transport.rank, deadline - time.monotonic())
                continue
            running = _running(msg, transport, address, me)
            if running is not None:
                raise running
            if "refused" in msg:
                # Another job's rank 0 holds the address: ours may take it once that job's
                # rendezvous is over. Ask again on a fresh connection (the old one is that
                # rank 0's until it closes).
                if refusal is None:   # (asked again every _REFUSED_RETRY: logged once)
                    log.debug("rank %d: refused at %s: %s; asking again until the deadline",
                              transport.rank, address, msg["refused"])
                refusal = str(msg["refused"])[:300]
                sock.close()
                time.sleep(min(_REFUSED_RETRY, max(0.0, deadline - time.monotonic())))
                sock = _client_socket(transport, address)
                sock.send(_pack(me))
                continue
            if "error" in msg:
                raise RendezvousError(f"rank {transport.rank}: rendezvous at {address} failed: "
                                      f"{msg['error']}")
            if "table" in msg:
                log.debug("rank %d: got the table from the rendezvous at %s", transport.rank,
                          address)
                sock.send(b"ack")
                # Let the acknowledgement leave before the socket closes.
                sock.linger = 500
                return {int(r): e for r, e in msg["table"].items()}
    finally:
        sock.close()


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5' so a report on 1000 peers stays readable."""
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(out)
