"""A peer's flight recorder: its last calls (collectives and point-to-point receives), each
with its operation, sequence, peers, bytes, state and times, and per operation the totals an
operator counts (calls, failures, bytes, a latency histogram).

One recorder per peer: the transport of each view owns one, and a view change carries the
old one's records and totals into the new (``continue_from``), so a peer's history is one
whatever its views. The engine (engine.py) records every collective as it executes it; the
point-to-point receive records itself (operations/send_recv.py); a send is counted
(``count``), never recorded (it does not wait on anyone).

Cheap on the hot path: a record is a small object put in a bounded deque and a few integer
additions, without a lock (CPython's deque append and dict item updates are atomic; the totals
of two operations of one name ending at the same instant in two threads may lose one
increment, which a monitor can afford). A snapshot (``records``, ``running``, ``totals``)
copies under no lock either and may miss a call that ends while it is taken.

What reads it: ``gossip status`` (the peer's answer to a status request: what it runs now and
how long it has waited, and its last calls, merged across peers into who waits on whom), the
metrics exporter (``totals``), and the dump a peer writes on OperationTimeout and SIGUSR1.
"""
from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections import deque
from typing import Any, Iterable

__all__ = ["FlightRecorder", "CallRecord", "LATENCY_BUCKETS", "DEFAULT_CAPACITY"]

DEFAULT_CAPACITY = 256
"""How many calls a recorder keeps (the oldest go first)."""

LATENCY_BUCKETS: tuple[float, ...] = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds (seconds) of the latency histogram's buckets; a last one is +Inf."""


class CallRecord:
    """One call: ``op`` its signature (``allreduce(sum,ring)``, ``recv from rank 2``),
    ``channel`` and ``seq`` where its messages meet, ``peers`` the ranks it waits on,
    ``nbytes`` the caller's array bytes, ``state`` running/done/failed, ``started`` (wall
    clock, seconds since the epoch), ``seconds`` (its duration once ended), ``error`` (the
    failure's text), ``thread`` (the thread that ran it)."""

    __slots__ = ("id", "op", "channel", "seq", "peers", "nbytes", "state", "start",
                 "seconds", "error", "thread")

    def __init__(self, id: int, op: str, channel: int, seq: int, peers: tuple[int, ...],
                 nbytes: int) -> None:
        # (The fewest calls that say it all: the wall clock and the thread's name are
        # derived when a snapshot is taken, from the monotonic start and the thread id.)
        self.id = id
        self.op = op
        self.channel = channel
        self.seq = seq
        self.peers = peers
        self.nbytes = nbytes
        self.state = "running"
        self.start = time.monotonic()
        self.seconds: float | None = None
        self.error: str | None = None
        self.thread = threading.get_ident()

    @property
    def name(self) -> str:
        """The operation's name without its arguments: ``allreduce``, ``recv``."""
        return _name_of(self.op)

    def as_dict(self, now: float | None = None,
                names: dict[int | None, str] | None = None) -> dict[str, Any]:
        """A plain dict (msgpack- and JSON-able): ``started`` in seconds since the epoch,
        ``thread`` the thread's name (from ``names``, id -> name, where given); a running
        call's ``waited`` is how long it has run so far."""
        now = time.monotonic() if now is None else now
        out: dict[str, Any] = {
            "id": self.id, "op": self.op, "channel": self.channel, "seq": self.seq,
            "peers": list(self.peers), "bytes": self.nbytes, "state": self.state,
            "started": time.time() - (now - self.start), "seconds": self.seconds,
            "thread": (names or {}).get(self.thread, str(self.thread))}
        if self.error is not None:
            out["error"] = self.error
        if self.state == "running":
            out["waited"] = now - self.start
        return out


def _name_of(op: str) -> str:
    return op.split("(", 1)[0].split(" ", 1)[0]


def _thread_names() -> dict[int | None, str]:
    return {t.ident: t.name for t in threading.enumerate()}


class _Totals:
    """Per operation name: calls, failures, bytes, seconds and the latency histogram."""

    __slots__ = ("calls", "failed", "bytes", "seconds", "buckets")

    def __init__(self) -> None:
        self.calls = 0
        self.failed = 0
        self.bytes = 0
        self.seconds = 0.0
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)

    def add(self, nbytes: int, seconds: float, failed: bool) -> None:
        self.calls += 1
        self.bytes += nbytes
        self.seconds += seconds
        if failed:
            self.failed += 1
        self.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1

    def merge(self, other: "_Totals") -> None:
        self.calls += other.calls
        self.failed += other.failed
        self.bytes += other.bytes
        self.seconds += other.seconds
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets)]

    def as_dict(self) -> dict[str, Any]:
        cumulative = list(itertools.accumulate(self.buckets))
        return {"calls": self.calls, "failed": self.failed, "bytes": self.bytes,
                "seconds": self.seconds,
                "buckets": [[le, n] for le, n in zip(LATENCY_BUCKETS, cumulative)]
                + [[float("inf"), cumulative[-1]]]}


class FlightRecorder:
    """The last ``capacity`` calls of one peer (rank ``rank``) and its per-operation totals."""

    def __init__(self, rank: int, capacity: int = DEFAULT_CAPACITY) -> None:
        self.rank = rank
        self.capacity = capacity
        self._calls: deque[CallRecord] = deque(maxlen=capacity)
        self._running: dict[int, CallRecord] = {}
        self._ids = itertools.count(1)
        self._totals: dict[str, _Totals] = {}     # by operation name
        self._by_op: dict[str, _Totals] = {}      # the same objects, by whole signature
        #: Seconds this peer spent waiting on each other rank (a message not there yet, a
        #: shared-memory counter not moved yet): who it waits on, summed.
        self.waited: dict[int, float] = {}
        #: The highest sequence each channel has begun (what a peer behind has not reached).
        self.begun: dict[int, int] = {}

    # -- the hot path ------------------------------------------------------------------------
    def begin(self, op: str, channel: int, seq: int, peers: Iterable[int],
              nbytes: int) -> CallRecord:
        """A call starts: record it as running."""
        record = CallRecord(next(self._ids), op, channel, seq, tuple(peers), nbytes)
        self._calls.append(record)
        self._running[record.id] = record
        if seq > self.begun.get(channel, -1):
            self.begun[channel] = seq
        return record

    def end(self, record: CallRecord, error: BaseException | str | None = None, *,
            nbytes: int | None = None) -> None:
        """A call ends (``error``: it failed, with that error; ``nbytes``: its bytes, where
        they were not known as it began, a receive's)."""
        if nbytes is not None:
            record.nbytes = nbytes
        record.seconds = time.monotonic() - record.start
        if error is not None:
            record.state = "failed"
            record.error = f"{type(error).__name__}: {error}" \
                if isinstance(error, BaseException) else str(error)
        else:
            record.state = "done"
        self._running.pop(record.id, None)
        self._total(record.op).add(record.nbytes, record.seconds, error is not None)

    def count(self, op: str, nbytes: int) -> None:
        """A call that is counted, not recorded (a send: it waits on no one)."""
        self._total(op).add(nbytes, 0.0, False)

    def waited_on(self, rank: int, seconds: float) -> None:
        """This peer waited ``seconds`` on ``rank``."""
        self.waited[rank] = self.waited.get(rank, 0.0) + seconds

    def _total(self, op: str) -> _Totals:
        """The totals of ``op``'s name (looked up by the whole signature first: one dict get
        on the hot path)."""
        totals = self._by_op.get(op)
        if totals is None:
            totals = self._totals.setdefault(_name_of(op), _Totals())
            if len(self._by_op) < 4096:   # signatures are few; a bound all the same
                self._by_op[op] = totals
        return totals

    # -- snapshots -----------------------------------------------------------------------------
    def records(self, last: int | None = None) -> list[dict[str, Any]]:
        """The recorded calls, oldest first (the ``last`` ones only if given)."""
        now, names = time.monotonic(), _thread_names()
        calls = list(self._calls)
        if last is not None:
            calls = calls[-last:] if last > 0 else []
        return [record.as_dict(now, names) for record in calls]

    def running(self) -> list[dict[str, Any]]:
        """The calls running now, the longest running first."""
        now, names = time.monotonic(), _thread_names()
        calls = sorted(list(self._running.values()), key=lambda r: r.start)
        return [record.as_dict(now, names) for record in calls]

    def totals(self) -> dict[str, dict[str, Any]]:
        """Per operation name: calls, failed, bytes, seconds, and the latency histogram as
        cumulative ``[upper bound, count]`` pairs (the last bound is +inf)."""
        return {name: totals.as_dict() for name, totals in list(self._totals.items())}

    def continue_from(self, earlier: "FlightRecorder") -> None:
        """Carry an earlier view's recorder's records, totals and waits into this one (a view
        change: the peer's history stays one); called before this one records."""
        older = list(earlier._calls)
        self._calls.extendleft(reversed(older[-(self.capacity - len(self._calls)):])
                               if len(self._calls) < self.capacity else [])
        for name, totals in list(earlier._totals.items()):
            self._totals.setdefault(name, _Totals()).merge(totals)
        for rank, seconds in list(earlier.waited.items()):
            self.waited_on(rank, seconds)
        top = max((r.id for r in older), default=0)
        self._ids = itertools.count(max(top + 1, next(self._ids)))

    def describe(self, last: int = 16) -> str:
        """A few lines for a log: what runs now and the last ``last`` calls."""
        calls = self.records(last)
        lines = [f"rank {self.rank}: flight recorder: the last {len(calls)} calls "
                 f"({len(self._running)} running)"]
        for call in calls:
            took = (f"{call['state']} in {call['seconds'] * 1e3:.3f} ms"
                    if call["seconds"] is not None else f"running for {call['waited']:.3f} s")
            lines.append(f"  #{call['id']} {call['op']} channel {call['channel']} seq "
                         f"{call['seq']} peers {call['peers']} {call['bytes']} B {took}"
                         + (f" ({call['error']})" if call.get("error") else ""))
        return "\n".join(lines)
