"""Asynchronous gossip: push-sum averaging in a background thread; the training loop never
waits on a peer."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from gossip.errors import GossipError, OperationTimeout, PeerLost
from gossip.policies.base import Policy
from gossip.policies.buckets import (DEFAULT_BUCKET_BYTES, copy_into, divide_into,
                                     subtract_scaled)
from gossip.policies.decentralized import check_topology

__all__ = ["Asynchronous"]

log = logging.getLogger("gossip")


class Asynchronous(Policy):
    """Asynchronous push-sum gossip (in the spirit of AD-PSGD and asynchronous SGP): a
    background thread owns a push-sum pair (x, w), w starting at 1. Once per training step
    (woken by after_step, never more often: a thread that falls behind skips rounds) it keeps
    half of (x, w) and pushes the other half to one out-neighbour, rotating through the
    topology's out-neighbours, through ``peer.channel(channel)``; between pushes it adds
    whatever any peer pushed to it: a second background thread sleeps in
    ``Communicator.wait_any`` (woken by the inbox when a message arrives, never polling) and
    adds each message to the pair as it comes.

    The race between the optimizer and the mixing is settled by mixing *deltas*: the policy
    keeps an anchor, the parameters as it last wrote them. ``after_step()`` takes the lock
    for a few vector operations: ``x += w * (params - anchor)`` (the optimizer's move since
    the last step, folded into the background pair; scaled by w so the de-biased value moves
    by exactly that much), then ``params = anchor = x / w`` (the latest mixed, de-biased
    value). The optimizer never sees a half-mixed buffer and the thread never sees a
    half-updated one. The training loop does not wait for any peer: a slow neighbour only
    makes its own pushes rarer.

    Lost peers: a neighbour found lost (peer.lost_peers()), or one a push to it timed out
    (``send_timeout``), is dropped from the rotation and the half meant for it is kept, so
    the pair stays consistent and training goes on; mass a dead peer held is lost together
    with its weight, and so is what was pushed to it before its death was noticed. A peer
    that drops a neighbour therefore restarts its weight (x <- x / w, w <- 1: its model x/w
    is unchanged), so flow control does not wait for mass that will never come. The graph
    heals around the gap: the lost neighbour's own out-neighbours join the rotation (on a
    ring, the dead rank's two neighbours push to each other). No agreement is needed for
    that, because every peer absorbs pushes from any peer, not only its in-neighbours.

    ``quiesce()`` (a collective) stops the pushes and waits until every push sent anywhere
    has been absorbed, so the weights of the live peers add up to n exactly (push-sum keeps
    mass); ``resume()`` starts pushing again.

    Flow control: a push never leaves a peer with less than ``min_weight / 2`` of weight; a
    peer below ``min_weight`` skips its push until its in-neighbours' pushes arrive. Without
    it, a peer whose thread pushes faster than its neighbours' halves its weight towards
    zero: float underflow (x / w = 0 / 0), and its own steps, folded in as ``w * move``,
    would no longer reach anyone.

    ``max_staleness``: if set, after_step() waits (at most ``timeout``, then OperationTimeout)
    until the background thread has pushed a state that includes the step ``max_staleness``
    steps ago; None (default) never waits.

    When to use it: heterogeneous or unreliable peers (stragglers, preemption). Cost: one
    message of P bytes (+ one element) per peer per step, sent in the background; memory:
    four buffers of the parameters' size (pair, anchor, send and receive buffers).

    ``topology``: default ``OnePeerExponential(n)``. ``close()`` (also called by
    ``peer.close()``) wakes both threads and stops them within an operation in progress.
    ``poll_interval`` is the longest the receiving thread sleeps before it looks at the stop
    flag and newly lost peers again (arrivals wake it at once).
    """

    name = "asynchronous"

    def __init__(self, *, topology: Any = None, max_staleness: int | None = None,
                 min_weight: float = 1 / 16, channel: int = 1, poll_interval: float = 0.25,
                 send_timeout: float | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 timeout: float | None = None, nan_guard: bool = False) -> None:
        super().__init__(bucket_bytes=bucket_bytes, timeout=timeout, nan_guard=nan_guard)
        if max_staleness is not None and (isinstance(max_staleness, bool)
                                          or not isinstance(max_staleness, int)
                                          or max_staleness < 0):
            raise ValueError(f"max_staleness must be None or an int >= 0, got {max_staleness!r}")
        if isinstance(min_weight, bool) or not isinstance(min_weight, (int, float)) \
                or not 0 < min_weight <= 1:
            raise ValueError(f"min_weight must be in (0, 1], got {min_weight!r}")
        if isinstance(channel, bool) or not isinstance(channel, int) or channel < 1:
            raise ValueError(f"channel must be an int >= 1 (0 is the peer's own), got "
                             f"{channel!r}")
        if not (isinstance(poll_interval, (int, float)) and 0 < poll_interval <= 1):
            raise ValueError(f"poll_interval must be in (0, 1] seconds, got {poll_interval!r}")
        if send_timeout is not None and not (isinstance(send_timeout, (int, float))
                                             and send_timeout > 0):
            raise ValueError(f"send_timeout must be a positive number, got {send_timeout!r}")
        self._topology_arg = topology
        self.topology = topology   # resolved at attach (None: OnePeerExponential(n))
        self.max_staleness = max_staleness
        self.min_weight = float(min_weight)
        self._channel_number = channel
        self._poll = float(poll_interval)
        self._send_timeout_arg = send_timeout
        self._cond = threading.Condition(threading.Lock())
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._receiver: threading.Thread | None = None
        self._paused = False
        self._push_lock = threading.Lock()   # held by the pusher for a whole push
        self._error: BaseException | None = None
        self._dropped: dict[int, str] = {}
        self._rescale = False  # a peer was dropped: restart the weights (see _push)
        self._trainer_step = 0   # steps folded into the pair
        self._mixed_step = 0     # steps included in the last push
        self._rounds = 0
        self._held_back = 0
        self._lightest = 1.0     # the smallest weight an after_step() has seen
        self._absorbed = 0
        self._background_seconds = 0.0
        self._staleness_waits = 0
        self._receiver_wakeups = 0
        self._sent_to: list[int] = []        # messages pushed, per destination
        self._absorbed_from: list[int] = []  # messages absorbed (or dropped as bad), per source

    # ------------------------------------------------------------------ set-up
    @property
    def send_timeout(self) -> float:
        """Seconds a push may take before its neighbour counts as silent (default: the
        policy's timeout, at most 5 s, so close() and a silent neighbour do not stall the
        thread long)."""
        if self._send_timeout_arg is not None:
            return float(self._send_timeout_arg)
        return min(self.timeout, 5.0)

    def _setup(self) -> None:
        n, rank = self._peer.world_size, self._peer.rank
        if self._topology_arg is None:
            import topologies
            self.topology = topologies.OnePeerExponential(n)
        else:
            self.topology = check_topology(self._topology_arg, n)
        period = getattr(self.topology, "period", 1)
        self._phases = period
        # One push per round, rotating through every out-neighbour of the schedule.
        self._rotation = [j for phase in range(period)
                          for j in self.topology.out_neighbors(rank, phase)]
        self._healed: set[int] = set()   # lost out-neighbours whose own ones joined the rotation
        # Every other peer: a healed graph sends from peers that were not in-neighbours.
        self._sources = [j for j in range(n) if j != rank]
        self._sent_to = [0] * n
        self._absorbed_from = [0] * n
        self._comm = self._peer.channel(self._channel_number)
        self._buckets.copy_in()
        self._pair, self._anchor, self._out, self._in = [], [], [], []
        for b in self._buckets:
            pair = b.new(extra=1)
            copy_into(pair[:-1], b.flat)
            pair[-1] = 1.0
            anchor = b.new()
            copy_into(anchor, b.flat)
            self._pair.append(pair)
            self._anchor.append(anchor)
            self._out.append(b.new(extra=1))
            self._in.append(b.new(extra=1))
        # Per source: which bucket its next message is for (messages from one source arrive
        # in order, bucket after bucket).
        self._next_bucket = {j: 0 for j in self._sources}
        self._thread = threading.Thread(target=self._guarded, args=(self._run,), daemon=True,
                                        name=f"gossip-async-r{rank}")
        self._receiver = threading.Thread(target=self._guarded, args=(self._receive,),
                                          daemon=True, name=f"gossip-async-recv-r{rank}")
        self._thread.start()
        self._receiver.start()

    def _shutdown(self) -> None:
        self._stop.set()
        self._kick.set()
        end = time.monotonic() + max(1.0, self.send_timeout + 0.5)
        for thread in (self._thread, self._receiver):
            if thread is None:
                continue
            # The receiver sleeps in the inbox for at most poll_interval; the pusher wakes on
            # the kick and finishes a push in progress (bounded by send_timeout).
            thread.join(max(0.0, end - time.monotonic()))
            if thread.is_alive():
                log.warning("rank %d: asynchronous gossip thread %s still running after "
                            "close()", self._peer.rank, thread.name)

    # ------------------------------------------------------------------ training loop side
    def _after_step(self, step: int) -> None:
        if self._error is not None:
            raise RuntimeError(f"rank {self._peer.rank}: the asynchronous gossip thread "
                               f"failed: {self._error!r}") from self._error
        self._buckets.copy_in()
        with self._cond:
            self._fold()
            self._trainer_step = step + 1
        self._buckets.copy_out()
        self._kick.set()
        if self.max_staleness is not None:
            self._wait_fresh(step + 1 - self.max_staleness)

    def _fold(self) -> None:
        """(Holding _cond.) The optimizer's move since the last fold goes into (x, w), and
        the parameters become the latest de-biased mix x / w."""
        for b, pair, anchor in zip(self._buckets, self._pair, self._anchor):
            w = float(pair[-1])
            self._lightest = min(self._lightest, w)
            anchor -= b.flat                          # -(the optimizer's move)
            subtract_scaled(pair[:-1], w, anchor)     # x += w * move
            divide_into(b.flat, pair[:-1], w)         # params = x / w, the latest mix
            copy_into(anchor, b.flat)

    def _wait_locked(self, done, timeout: float, slice_s: float, stopped, what) -> None:
        """(Holding _cond.) Wait until ``done()``; RuntimeError if the thread failed (or
        ``stopped()``), OperationTimeout naming ``what()`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not done():
            if self._error is not None or stopped():
                raise RuntimeError(f"rank {self._peer.rank}: the asynchronous gossip thread "
                                   f"stopped: {self._error!r}") from self._error
            left = deadline - time.monotonic()
            if left <= 0:
                message, operation = what()
                raise OperationTimeout(f"rank {self._peer.rank}: asynchronous gossip: "
                                       f"{message} within {timeout:g}s", operation=operation)
            self._cond.wait(min(left, slice_s))

    def _wait_fresh(self, wanted: int) -> None:
        with self._cond:
            if self._mixed_step >= wanted:
                return
            self._staleness_waits += 1
            self._wait_locked(
                lambda: self._mixed_step >= wanted, self.timeout, 0.1, self._stop.is_set,
                lambda: (f"no push including step {wanted} (max_staleness="
                         f"{self.max_staleness})", "asynchronous after_step"))

    # ------------------------------------------------------------------ background thread
    def _guarded(self, body) -> None:
        try:
            body()
        except BaseException as exc:  # handed to the training loop at its next after_step
            if not self._stop.is_set():
                log.exception("rank %d: asynchronous gossip thread failed", self._peer.rank)
                self._error = exc
                with self._cond:
                    self._cond.notify_all()

    def _run(self) -> None:
        """The pusher: one push per kick (after_step), never more often."""
        while not self._stop.is_set():
            if not self._kick.wait(1.0):
                continue
            if self._stop.is_set():
                break
            self._kick.clear()
            start = time.perf_counter()
            with self._push_lock:
                if not self._paused:
                    self._push()
            self._background_seconds += time.perf_counter() - start

    def _receive(self) -> None:
        """The receiver: sleeps until a message from any peer is waiting, then absorbs it."""
        comm = self._comm
        while not self._stop.is_set():
            live = [j for j in self._sources if j not in self._dropped]
            src = comm.wait_any(live, self._poll) if live else None
            self._receiver_wakeups += 1
            if self._stop.is_set():
                break
            if src is None:
                if not live or self._peer.closed:
                    self._stop.wait(self._poll)
                continue
            start = time.perf_counter()
            self._absorb_from(src)
            self._background_seconds += time.perf_counter() - start

    def _alive(self, rank: int) -> bool:
        if rank in self._dropped:
            return False
        reason = self._peer.lost_peers().get(rank)
        if reason is not None:
            self._drop(rank, reason)
            log.info("rank %d: asynchronous gossip drops rank %d: %s", self._peer.rank, rank,
                     reason)
            return False
        return True

    def _heal(self) -> None:
        """Out-neighbours dropped since the last push hand their place in the rotation to
        their own out-neighbours, so the graph stays connected around the gap."""
        rank = self._peer.rank
        for d in [j for j in self._rotation if j not in self._healed and not self._alive(j)]:
            self._healed.add(d)
            added = []
            for phase in range(self._phases):
                for q in self.topology.out_neighbors(d, phase):
                    if q != rank and q not in self._rotation and self._alive(q):
                        self._rotation.append(q)
                        added.append(q)
            if added:
                log.info("rank %d: asynchronous gossip heals around lost rank %d: now also "
                         "pushes to %s", rank, d, added)

    def _drop(self, rank: int, reason: str) -> None:
        if rank not in self._dropped:
            self._dropped[rank] = reason
            self._rescale = True

    def _push(self) -> None:
        self._heal()
        dst = None
        for k in range(len(self._rotation)):
            candidate = self._rotation[(self._rounds + k) % len(self._rotation)]
            if self._alive(candidate):
                dst = candidate
                break
        self._rounds += 1
        with self._cond:
            if self._rescale:
                # Pushes to a peer between its death and our noticing it took mass with
                # them, and so did the dead peer's own share: the live peers' weights no
                # longer add up to their number, and flow control (below) would soon hold
                # every push back for mass that never comes. Restart push-sum from the
                # de-biased values: x <- x / w, w <- 1 (the model x / w is unchanged).
                for pair in self._pair:
                    pair /= float(pair[-1])
                self._rescale = False
            # Flow control: a peer that pushes faster than its in-neighbours push to it
            # would halve its weight towards zero (float underflow, and its own gradient
            # steps, folded in as w * move, would count for nothing). Below min_weight it
            # waits for their mass instead, so w stays within [min_weight / 2, n].
            light = min(float(pair[-1]) for pair in self._pair) < self.min_weight
            if dst is None or light:   # alone (no live out-neighbour), or too light to push
                self._held_back += light
                self._mixed_step = self._trainer_step
                self._cond.notify_all()
                return
            for pair, out in zip(self._pair, self._out):
                pair *= 0.5           # keep half of (x, w) ...
                copy_into(out, pair)  # ... and push the other half
            included = self._trainer_step
        sent = 0
        try:
            for out in self._out:
                self._comm.send(dst, out, timeout=self.send_timeout)
                sent += 1
                self._sent_to[dst] += 1
        except (PeerLost, OperationTimeout) as exc:
            # What did not leave stays here: the pair is whole again for those buckets.
            with self._cond:
                for pair, out in zip(self._pair[sent:], self._out[sent:]):
                    pair += out
            self._drop(dst, str(exc))
            log.warning("rank %d: asynchronous gossip drops rank %d: %s", self._peer.rank,
                        dst, exc)
        with self._cond:
            self._mixed_step = max(self._mixed_step, included)
            self._cond.notify_all()

    def _absorb_from(self, src: int) -> None:
        nb = len(self._pair)
        comm = self._comm
        while comm.probe(src):
            k = self._next_bucket.setdefault(src, 0)
            try:
                comm.recv(src, self._in[k], timeout=self.send_timeout)
            except (PeerLost, OperationTimeout) as exc:
                if isinstance(exc, PeerLost):
                    self._drop(src, str(exc))
                return
            except GossipError as exc:  # a malformed message: drop it, keep serving
                log.warning("rank %d: asynchronous gossip: bad message from rank %d: %s",
                            self._peer.rank, src, exc)
                self._next_bucket[src] = (k + 1) % nb
                with self._cond:
                    self._absorbed_from[src] += 1
                    self._cond.notify_all()
                continue
            with self._cond:
                self._pair[k] += self._in[k]
                self._absorbed_from[src] += 1
                self._cond.notify_all()
            self._next_bucket[src] = (k + 1) % nb
            self._absorbed += 1

    # ------------------------------------------------------------------ quiescence
    def quiesce(self, timeout: float | None = None) -> None:
        """Stop pushing and wait until every push any peer made has been absorbed by its
        destination: then no mass is in flight and the live peers' weights add up to n.
        A collective on the peer's main channel (an allreduce of per-destination message
        counts): every peer calls it together. ``resume()`` undoes it."""
        self._check_ready()
        timeout = self.timeout if timeout is None else timeout
        peer = self._peer
        with self._push_lock:        # a push in progress completes first
            self._paused = True
            sent = np.array(self._sent_to, dtype=np.float64)
        peer.allreduce(sent, op="sum", timeout=timeout)
        expected = int(sent[peer.rank])
        with self._cond:
            self._wait_locked(
                lambda: sum(self._absorbed_from) >= expected, timeout, 0.5, lambda: False,
                lambda: (f"quiesce: absorbed {sum(self._absorbed_from)} of the {expected} "
                         f"messages pushed to it", "asynchronous quiesce"))
        # Fold the absorbed mass into the parameters, as after_step would.
        self._buckets.copy_in()
        with self._cond:
            self._fold()
        self._buckets.copy_out()

    def resume(self) -> None:
        """Push again after quiesce()."""
        self._check_ready()
        with self._push_lock:
            self._paused = False

    # ------------------------------------------------------------------ state and stats
    @property
    def healed_around(self) -> set[int]:
        """Lost out-neighbours whose own out-neighbours joined the rotation."""
        return set(self._healed)

    @property
    def dropped_peers(self) -> dict[int, str]:
        """Peers this policy stopped pushing to (lost, or a push to them failed), with why."""
        return dict(self._dropped)

    @property
    def weights(self) -> list[float]:
        """The push-sum weights of the background pair, one per bucket."""
        self._check_ready()
        with self._cond:
            return [float(p[-1]) for p in self._pair]

    def _extra_state(self) -> dict:
        return {"weights": self.weights}

    def _load_extra_state(self, state: dict) -> None:
        weights = state.get("weights")
        if not isinstance(weights, (list, tuple)) or len(weights) != len(self._pair):
            raise ValueError(f"asynchronous state needs {len(self._pair)} weights (one per "
                             f"bucket), got {weights!r}")
        if not all(np.isfinite(w) and w > 0 for w in weights):
            raise ValueError(f"asynchronous weights must be positive, got {weights!r}")
        self._buckets.copy_in()
        with self._cond:
            for b, pair, anchor, w in zip(self._buckets, self._pair, self._anchor, weights):
                copy_into(pair[:-1], b.flat)
                pair[:-1] *= float(w)
                pair[-1] = float(w)
                copy_into(anchor, b.flat)

    def _extra_stats(self) -> dict:
        return {"background_rounds": self._rounds, "pushes_held_back": self._held_back,
                "messages_absorbed": self._absorbed, "lightest_weight": self._lightest,
                "min_weight": self.min_weight,
                "background_seconds": self._background_seconds,
                "staleness_waits": self._staleness_waits,
                "receiver_wakeups": self._receiver_wakeups,
                "messages_sent_to": list(self._sent_to),
                "messages_absorbed_from": list(self._absorbed_from),
                "dropped_peers": sorted(self._dropped),
                "rotation": list(self._rotation),
                "healed_around": sorted(self._healed),
                "weights": self.weights, "topology": repr(self.topology)}
