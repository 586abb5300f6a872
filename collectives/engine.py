"""The engine under one communicator's calls: sequence numbers, the life of one operation of
the group, and where it runs (the caller's thread, or the worker thread behind a Work).

Every call of a communicator, whether a method of the Communicator itself (allreduce,
allgather, broadcast, barrier: communicator.py) or an operation with a module of its own
(collectives/operations/: the neighbour exchange, the rooted calls, the coalesced and
compressed allreduces, the neighbour allgather), goes through the same steps, which live here
once, behind public methods:

1. local checks, then ``next_seq``: the next sequence number, taken *in the calling thread*,
   so peers that call the same operations in the same order agree on mailboxes even when the
   operations run concurrently (a shared-memory algorithm's is reserved in order too:
   algorithms/choice.py's OnHost);
2. ``launch``: run the body now (``wait=True``) or queue it on the worker thread and return a
   Work; a barrier first waits for ``last()``, so it implies the earlier ones finished;
3. ``execute``: inside the body, run the data movement as operation ``seq`` with its peers:
   its mailboxes opened, its activity recorded for the peers that ask, and on failure the
   other peers told (ABORT) so they raise at once instead of waiting out their timeout.

The engine owns that state (the sequence counter and its lock, the worker thread, the pool of
send buffers); the Communicator owns the engine and the shared-memory state it reserves in.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable, NoReturn

from collectives import defaults
from collectives.algorithms.choice import OnHost
from collectives.algorithms.p2p import Call
from collectives.arrays.adapter import ArrayAdapter
from collectives.errors import GossipError, OperationTimeout, PeerLost, ViewChanging
from collectives.notices import events
from collectives.staging import Staging, flat_of
from collectives.transport.transport import Transport
from collectives.transport.wire import ALLOWED_DTYPES
from collectives.work import Executor, Work

__all__ = ["Engine"]


class Engine:
    """Sequence numbers, operations and their threads for the communicator on ``channel`` of
    ``transport``; ``on_host``: the communicator's shared-memory allreduces, whose order is
    reserved as each sequence number is taken."""

    def __init__(self, transport: Transport, channel: int, on_host: OnHost) -> None:
        self.transport = transport
        self.rank = transport.rank
        self.world_size = transport.world_size
        self.channel = channel
        self.on_host = on_host
        #: Every other peer: the peers of a collective call.
        self.peers = tuple(r for r in range(self.world_size) if r != self.rank)
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._executor = Executor(f"gossip-ops-r{self.rank}")
        self._buffer_pool: dict[tuple, list] = {}  # free send-buffer sets, by shape

    @property
    def timeout(self) -> float:
        """The transport's timeout in seconds, for calls given none."""
        return self.transport.config.timeout

    def next_seq(self, algorithm: str = "") -> int:
        """The next sequence number (a shared-memory algorithm's reserved in order: choice.py)."""
        with self._lock:
            seq = next(self._seq)
            self.on_host.reserve(seq, algorithm)
            return seq

    def launch(self, description: str, body: Callable[[], Any], wait: bool,
               stage: Staging | None = None) -> Any:
        """Run ``body`` now or on the worker thread (a Work), then a ``stage``'s write-back."""
        if stage:
            run = body

            def body() -> Any:
                return stage.finish(run())
        if wait:
            return body()
        return self._executor.submit(body, Work(f"rank {self.rank}: {description}"))

    def done(self, result: Any, description: str, wait: bool,
             stage: Staging | None = None) -> Any:
        """A call that completed synchronously (NCCL enqueues on the stream), as its twin."""
        if stage:
            stage.finish()
        if wait:
            return result
        work = Work(f"rank {self.rank}: {description}")
        work.finish(result)
        return work

    def last(self) -> Work | None:
        """The most recently launched non-blocking operation (it finishes after the others)."""
        return self._executor.last()

    def call(self, seq: int, signature: str, dtype: str, shape: tuple,
             deadline: float = 0.0) -> Call:
        """Operation ``seq``'s Call on this engine's channel (what its messages must match)."""
        return Call(self.transport, self.channel, seq, signature, dtype, shape, deadline)

    def execute(self, seq: int, signature: str, dtype: str, shape: tuple, timeout: float | None,
                peers, body: Callable[[Call], Any], *, neighbours: bool = False) -> Any:
        """Run ``body`` as operation ``seq`` with ``peers`` (``neighbours``: only they take part,
        a neighbour exchange; else every peer)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        call = self.call(seq, signature, dtype, shape, deadline)
        transport = self.transport
        inbox, activity = transport.inbox, transport.activity
        inbox.begin(self.channel, seq)
        for src in activity.begin(self.channel, seq, signature,
                                  frozenset(peers) if neighbours else None):
            # It named this call before it began, though this call does not name it: it waits
            # for the answer (see algorithms/pattern.py); this call refuses itself there too.
            transport.answer_plan(src, self.channel, seq)
        # (The caller's array bytes: a codec's payload, whose dtype is off the wire's list,
        # counts none.)
        record = transport.recorder.begin(signature, self.channel, seq, peers,
                                          call.nbytes if dtype in ALLOWED_DTYPES else 0)
        failed: BaseException | None = None
        try:
            result = body(call)
            transport.succeeded()
            return result
        except BaseException as exc:
            failed = exc
            if not isinstance(exc, Exception):   # (KeyboardInterrupt, SystemExit)
                raise
            lost = exc.rank if isinstance(exc, PeerLost) else None
            late = exc.rank if isinstance(exc, OperationTimeout) else None
            if isinstance(exc, OperationTimeout):
                # What this peer did last, for the operator (flight_recorder.py).
                events.warning("%s", transport.recorder.describe())
            # Whatever failed here (a check of this peer's own, a reduction its arrays' type
            # cannot do, a bug), the peers hear of it now instead of waiting out the timeout.
            transport.abort(peers, self.channel, seq,
                            str(exc) if isinstance(exc, GossipError)
                            else f"{type(exc).__name__}: {exc}",
                            lost_rank=lost, late_rank=late,
                            view_change=isinstance(exc, ViewChanging))
            raise
        finally:
            transport.recorder.end(record, failed)
            activity.end(self.channel, seq, failed is not None)
            transport.retire(self.channel, seq, peers, ended=True)   # (inbox.begin's end)

    def take_buffers(self, key: tuple, adapter: ArrayAdapter, flat: Any) -> list:
        """A set of send buffers ``key`` = (kind, dtype, size, count) from the pool (an
        operation running concurrently gets its own), made on first use; give it back with
        give_buffers once the operation is done with it."""
        with self._lock:
            free = self._buffer_pool.get(key)
            if free:
                return free.pop()
        _, dtype, size, count = key
        return [adapter.empty(size, dtype, flat) for _ in range(count)]

    def give_buffers(self, key: tuple, buffers: list) -> None:
        """Return a set of send buffers taken with take_buffers to the pool."""
        with self._lock:
            self._buffer_pool.setdefault(key, []).append(buffers)

    def refuse(self, error: Exception, signature: str) -> NoReturn:
        """Raise ``error``, a check of this peer's own arguments that the others cannot see
        (a root's buffer, this peer's part against the counts, its out=), after failing a
        call of its own sequence number with it: the peers, in their call of that number,
        hear of it at once (its abort, naming this rank and the error) instead of waiting
        out their timeout, and every peer's next call has the same number, so the group
        stays in step. ``signature``: the refused call, as the flight recorder names it."""
        seq = self.next_seq()
        if self.world_size > 1:
            def fail(call: Call) -> None:
                raise error
            self.execute(seq, signature, "uint8", (0,), None, self.peers, fail)
        raise error

    def out_like(self, adapter: ArrayAdapter, dtype: str, count: int, out: Any, what: str,
                 needs: str, stage: Staging | None = None) -> Any:
        """The flat view of a caller's ``out``, which must be of x's family and dtype, with
        ``count`` elements and writable, else ValueError, refused as a call of its own
        (``refuse``: the peers, in their ``what`` call, raise too); through a stand-in of
        ``stage`` if not contiguous. A different dtype of the same itemsize would otherwise
        be filled with the bytes of another type, silently."""
        out_adapter, out_flat, out_dtype = (stage.flat(out) if stage is not None
                                            else flat_of(out))
        got = out_adapter.size(out_flat)
        if out_adapter.kind != adapter.kind or out_dtype != dtype or got != count:
            self.refuse(ValueError(f"rank {self.rank}: {what}: out must be a {adapter.kind} "
                                   f"array of {count} {dtype} elements ({needs}), got "
                                   f"{out_adapter.kind} {out_dtype} of {got}"), what)
        return out_flat

    def close(self, timeout: float = defaults.CLOSE_TIMEOUT) -> None:
        """Stop the worker thread; queued operations get up to ``timeout`` seconds to finish."""
        self._executor.close(timeout)
