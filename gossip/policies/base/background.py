"""The background worker of the threaded policies (Asynchronous, ElasticAveraging): threads that
communicate while the training loop computes, and what the training thread needs from them.

- Threads, locks, conditions, events and the clock come from the host's ``concurrency``
  (gossip/policies/base/concurrency.py: the standard library's, or a simulated peer's virtual
  ones), bound at attach (``_primitives``); nothing here blocks on anything else.
- Lifetime: ``_start(body, name)`` runs ``body`` in a daemon thread; ``close()`` sets the
  stop flag, wakes the threads (``_wake``) and joins them all under one deadline
  (``_stop_seconds``), warning about any still running. ``_halt()`` does the same without
  closing the policy, and gives the next threads ``_start`` starts a stop flag of their own
  (a view change: the threads hold the old view's communicators, which close).
- Error hand-off: an exception in a thread is kept and raised on the training thread by
  ``_check_worker()`` (as RuntimeError from it); ``_wait_locked`` waits on the shared
  condition and gives up when the thread failed or the policy stopped.
- Partners: ``_alive(rank, lost)`` drops a peer the transport found lost (``lost``: the
  step's peer.lost_peers(), read once), the failure rule drops the partner of a failed
  exchange (``_exchange_failed``), ``dropped_peers`` says who and why. A policy hears of
  each new drop through ``_dropped_peer``.
- ``_next_source(comm, live)`` sleeps in the inbox until a message from one of ``live``
  waits (at most poll_interval, so the stop flag is seen promptly).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, Callable, ClassVar, TypeVar

from collectives import Communicator
from collectives.arrays import Array
from collectives.codecs import CodecSpec
from gossip.errors import OperationTimeout
from gossip.policies.base.arguments import check_int, check_number
from gossip.policies.base.buckets import DEFAULT_BUCKET_BYTES
from gossip.policies.base.concurrency import (REAL_CONCURRENCY, Concurrency, ThreadHandle,
                                              ThreadKilled)
from gossip.policies.base.policy import ParameterSource, Policy
from gossip.policies.base.policy_host import PolicyHost

__all__ = ["BackgroundPolicy"]

log = logging.getLogger("gossip")

_B = TypeVar("_B", bound="BackgroundPolicy")


class BackgroundPolicy(Policy):
    """Base of the policies with background threads. ``channel``: the peer.channel() number
    of the threads' traffic (every peer uses the same); ``poll_interval``: the longest a
    thread sleeps before it looks at the stop flag and lost peers again (arrivals wake it at
    once)."""

    #: How errors and logs name the threads, e.g. "asynchronous gossip thread".
    worker_name: ClassVar[str] = "background thread"

    def __init__(self, *, channel: int, poll_interval: float,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout: float | None = None,
                 nan_guard: bool = False, compression: CodecSpec = None) -> None:
        super().__init__(bucket_bytes=bucket_bytes, timeout=timeout, nan_guard=nan_guard,
                         compression=compression)
        check_int("channel", channel, note=" (0 is the peer's own)")
        check_number("poll_interval", poll_interval, lambda s: 0 < s <= 1, "in (0, 1] seconds")
        self._channel_number = int(channel)
        self._poll = float(poll_interval)
        self._threads: list[ThreadHandle] = []
        self._concurrency: Concurrency = REAL_CONCURRENCY   # (the host's, from attach)
        self._primitives()
        self._error: BaseException | None = None
        self._dropped: dict[int, str] = {}

    # ------------------------------------------------------------------ lifetime
    def _primitives(self) -> None:
        """Make the locks, conditions and events shared with the threads, from
        ``self._concurrency`` (subclasses add theirs, calling this)."""
        self._cond = self._concurrency.condition(self._concurrency.lock())   # shared state
        self._stop = self._concurrency.event()

    def attach(self: _B, peer: PolicyHost, params: Iterable[Array] | ParameterSource, *,
               names: Sequence[str] | None = None) -> _B:
        """Policy.attach, the threads and their primitives from ``peer.concurrency`` (a
        simulated peer's run on virtual time)."""
        concurrency = getattr(peer, "concurrency", REAL_CONCURRENCY)   # (attach checks peer)
        if concurrency is not self._concurrency and self._peer is None and not self._closed:
            self._concurrency = concurrency
            self._primitives()
        return super().attach(peer, params, names=names)

    def _start(self, body: Callable[[], None], name: str) -> None:
        """Run ``body`` in a daemon thread named ``name``-r<rank>; its exception, unless the
        policy is stopping, is handed to the training thread."""
        thread = self._concurrency.thread(self._guarded, f"{name}-r{self._host().rank}",
                                          args=(body, self._stop))
        self._threads.append(thread)
        thread.start()

    def _guarded(self, body: Callable[[], None], stop: Any) -> None:
        try:
            body()
        except ThreadKilled:   # (its process died: nothing to report, nobody to tell)
            return
        except BaseException as exc:  # handed to the training loop at its next step
            if not stop.is_set():   # (its own generation's flag: see _halt)
                log.exception("rank %d: %s failed", self._host().rank, self.worker_name)
                self._error = exc
                with self._cond:
                    self._cond.notify_all()

    def _stop_seconds(self) -> float:
        """How long close() waits for the threads, all together."""
        return max(1.0, self._poll * 4)

    def _wake(self) -> None:
        """Wake threads that sleep on something other than the stop flag and the inbox."""

    def _shutdown(self) -> None:
        self._join_threads("close()")

    def _halt(self) -> None:
        """Stop the threads without closing the policy; ``_start`` starts the next ones.
        Their stop flag stays set: a new one is made for the next threads, so a thread that
        outlived the wait (warned about) can never run on beside them."""
        self._join_threads("a halt")
        self._threads = []
        self._stop = self._concurrency.event()

    def _join_threads(self, after: str) -> None:
        self._stop.set()
        self._wake()
        clock = self._concurrency.monotonic
        end = clock() + self._stop_seconds()
        for thread in self._threads:
            thread.join(max(0.0, end - clock()))
            if thread.is_alive():
                log.warning("rank %d: %s %s still running after %s", self._host().rank,
                            self.worker_name, thread.name, after)

    # ------------------------------------------------------------------ error hand-off
    def _check_worker(self) -> None:
        """(Training thread.) Raise what a thread failed with, as RuntimeError from it."""
        if self._error is not None:
            raise RuntimeError(f"rank {self._host().rank}: the {self.worker_name} failed: "
                               f"{self._error!r}") from self._error

    def _wait_locked(self, done: Callable[[], bool], timeout: float, slice_s: float,
                     what: Callable[[], tuple[str, str]], *,
                     stoppable: bool = False) -> None:
        """(Holding _cond.) Wait until ``done()``; RuntimeError if a thread failed (or, with
        ``stoppable``, the policy is stopping), OperationTimeout naming ``what()``
        (message, operation) after ``timeout`` seconds."""
        clock = self._concurrency.monotonic
        deadline = clock() + timeout
        while not done():
            if self._error is not None or (stoppable and self._stop.is_set()):
                raise RuntimeError(f"rank {self._host().rank}: the {self.worker_name} stopped: "
                                   f"{self._error!r}") from self._error
            left = deadline - clock()
            if left <= 0:
                message, operation = what()
                raise OperationTimeout(f"rank {self._host().rank}: {self.name}: {message} "
                                       f"within {timeout:g}s", operation=operation)
            self._cond.wait(min(left, slice_s))

    # ------------------------------------------------------------------ partners
    def _alive(self, rank: int, lost: dict[int, str]) -> bool:
        """False for a dropped peer; a peer in ``lost`` (peer.lost_peers(), read once per
        step) is dropped now."""
        if rank in self._dropped:
            return False
        reason = lost.get(rank)
        if reason is not None:
            if self._drop(rank, reason):
                log.info("rank %d: %s drops rank %d: %s", self._host().rank, self.name, rank,
                         reason)
            return False
        return True

    def _drop(self, rank: int, reason: str) -> bool:
        """Stop exchanging with ``rank``; True if it was not dropped before."""
        with self._cond:
            if rank in self._dropped:
                return False
            self._dropped[rank] = reason
            self._dropped_peer(rank)
            return True

    def _dropped_peer(self, rank: int) -> None:
        """(Holding _cond.) ``rank`` was just dropped."""

    def _exchange_failed(self, what: str, exc: BaseException, rank: int | None) -> None:
        if rank is None:
            super()._exchange_failed(what, exc, rank)
            return
        self._drop(rank, str(exc))
        log.warning("rank %d: %s drops rank %d (%s failed): %s", self._host().rank, self.name,
                    rank, what, exc)

    @property
    def dropped_peers(self) -> dict[int, str]:
        """Peers this policy stopped exchanging with (lost, or an exchange with them
        failed), with why."""
        return dict(self._dropped)

    def _next_source(self, comm: Communicator, live: list[int]) -> int | None:
        """(A thread.) Sleep until a message from one of ``live`` waits and return its
        source; None after poll_interval (a plain sleep when there is no one to wait for or
        the peer is closed)."""
        if not live or self._host().closed:
            self._stop.wait(self._poll)
            return None
        src = comm.wait_any(live, self._poll)
        if src is None and self._host().transport.interrupted:
            # A view change at once closed the inbox (its queued messages still come out):
            # wait_any no longer sleeps, so sleep here until this member reaches its boundary.
            self._stop.wait(self._poll)
        return src
