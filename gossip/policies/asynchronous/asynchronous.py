"""Asynchronous gossip: pairwise exchanges (AD-PSGD) or push-sum pushes in background threads;
the training loop never waits on a peer. What a pairwise peer publishes is pairs.py's, the
push (or request) in flight push.py's, the rotation of destinations rotation.py's, what pushes
bring inbound.py's; the class below holds the rest, its membership view changes too.

Its push-sum mass (the weights w beside the models m, which are the parameters themselves)
follows a join, the restart of a killed peer and a leave.

At a committed switch (gossip/membership/controller.py, take_switch), on the old view's
transport, before the new one is installed (``view_changing``; the training thread is there,
so no new push starts):

1. the push under way completes (bounded by ``send_timeout``);
2. the continuing members (members of the old view that are in the new one with the same
   name and incarnation: not a leaver, not a killed member whose restarted incarnation takes
   its place) tell each other how many pushes they sent (``_pushes_to_absorb``, as
   ``quiesce()`` does), and each waits until its receiver has absorbed every push they sent
   it, so no mass is in flight between them when the old communicators close;
3. the pusher and receiver threads stop (they hold the old view's communicators), what is
   still queued is absorbed on the training thread (pushes a dead or leaving member made
   before it went are the receiver's, as they are between changes), and what arrived, with
   a push that did not leave, is folded into (m, w). The old members that do not go on as
   themselves are dropped as the dead are: pushes made to them went down with them, so a
   member they left below ``min_weight`` restarts its weights ("Lost peers" in
   the class docstring), or flow control could hold every push of the new view back;
4. every member scales its weights by n_new / n_old (m unchanged: x = w m scales with w), so
   the consensus sum x / sum w is unchanged and the total weight follows the membership;
5. the source of a join with k joiners splits its weights into k + 1 shares: the state it
   sends carries the parameters (its m) and one share as ``weights``, each joiner takes
   that, and the source keeps the rest once the state is sent (``state_sent``; a transfer
   that fails takes nothing away from it). Exact when k + 1 or k is a power of two (2, 3,
   4, 5, 8, 9 sharing), otherwise off by the rounding of k shares (as PushSum's).

Under ``exchange="pairwise"`` the same steps hold with requests for pushes: step 1 waits
for this member's own exchange to be answered (its partner's receiving thread still runs),
step 2 counts requests and waits until each was answered or refused, so no answer is in
transit when the threads stop, and in step 3 requests still queued (from a leaver, the dead)
are taken unanswered: nobody waits for them. In the new view a member answers nothing until
its first step there.

With the new transport installed (``view_changed``), everything keyed by a rank is made
again for the new view, whose ranks are renumbered: the communicators, the rotation over
the topology recomputed for the new size, the sources, the push counts, the arrivals, the
dropped peers; then the threads start again. A user's quiesce() pause is its own flag and
survives the change.

What is not kept:

- A change at once (a leave: ``hands_off_at_leave`` is False, so ``peer.leave()`` takes
  effect at once under this policy; or a recovery) ends every member's waits on the old
  transport before it reaches its boundary, so step 2 cannot wait there. From the moment a
  member hears of it (``peer.changing_now()``) it pushes no more; at its boundary it
  absorbs what is queued; what is still in transit then is lost, with the leaver's own
  (m, w) and the pushes made to it before the members heard, as with a death ("Lost peers"
  in the class docstring). The total weight is then below n; with nothing in transit (every
  member quiesce()d before the leave) exactly the leaver's weight is gone, times n_new /
  n_old (tests/test_asynchronous_membership.py).
- A killed peer's mass died with it; its restarted process takes a share of the source's
  weights as any joiner does, so the total stays what the survivors held.
"""
from __future__ import annotations

import functools
import logging
import math
import random
from typing import TYPE_CHECKING, Any, Callable, Literal

import numpy as np

from collectives import Communicator
from collectives.arrays import adapter_for
from collectives.codecs import CodecSpec
from collectives.group import Switch, View
from gossip.errors import GossipError, OperationTimeout, PeerLost
from gossip.peer_channels import PeerChannel
from gossip.policies.asynchronous.inbound import Arrivals
from gossip.policies.asynchronous.pairs import TAIL, Pairs, Unanswered
from gossip.policies.asynchronous.push import Push
from gossip.policies.asynchronous.rotation import Rotation
from gossip.policies.base import (DEFAULT_BUCKET_BYTES, PEER_FAILURES, BackgroundPolicy,
                                  check_int, check_number)
from gossip.policies.neighborhood import ONE_PEER_EXPONENTIAL
from gossip.policies.push_sum import weights_from_state

if TYPE_CHECKING:
    from topologies import Topology

__all__ = ["Asynchronous", "EXCHANGES", "DEFAULT_EXCHANGES_PER_STEP", "DEFAULT_MAX_STALENESS"]

#: How asynchronous peers mix: ``pairwise`` (AD-PSGD's atomic pairwise average, in push-sum
#: form; the default) or ``push`` (one-way push-sum pushes of a fraction of the mass).
EXCHANGES = ("pairwise", "push")

#: Pairwise exchanges a peer starts per step (Asynchronous(exchanges_per_step=)).
DEFAULT_EXCHANGES_PER_STEP = 1

#: Asynchronous(max_staleness="auto") under exchange="pairwise": a step's exchange runs beside
#: the next step's compute and is over before the step after (AD-PSGD's schedule).
DEFAULT_MAX_STALENESS = 1

log = logging.getLogger("gossip")


class Asynchronous(BackgroundPolicy):
    """Asynchronous gossip (AD-PSGD, asynchronous SGP): the training loop never waits on a
    peer. Each peer holds a push-sum pair in de-biased form: the parameters themselves are
    the model m = x / w, and w (one float per bucket, starting at 1) is kept beside them.
    Two ways to mix, ``exchange``:

    ``"pairwise"`` (the default; pairs.py): AD-PSGD's atomic pairwise average, in push-sum
    form. Each ``after_step()`` adds to the parameters what exchanges changed since the last
    step (the optimizer's move stays on top), publishes the result, and, unless its last
    exchange is still under way, asks a random live out-neighbour of the topology to average
    with it. The neighbour's receiving thread pools the request with the pair it published
    (W = w_i + w_j, M = (w_i m_i + w_j m_j) / W), keeps (M, W - g) and answers (M, g); the
    asker's pushing thread takes the answer. Each exchange is atomic on both sides (one
    lock) and leaves the sums of x and of w unchanged; g = W / 2, so with every weight at 1
    (no view change) it is AD-PSGD's x_i, x_j <- (x_i + x_j) / 2. A peer whose own
    exchange is under way answers one request (per bucket) before its answer comes and
    refuses the others (the asker's pair stays as it was): the mix of the three is then
    doubly stochastic and every weight stays positive (pairs.py). (Splitting the pool by the
    two peers' step rates, so that a straggler's stale model would weigh less in the next
    pool, was tried: the weights swung between 0.06 and 3.3 with the noise of the step
    times, and neither the demo nor benchmarks/asynchronous_mixing.py came out better: not
    taken.) ``exchanges_per_step`` (default 1): the exchanges a step starts; the ones after
    the first run back to back on the pushing thread, each with a random live partner, on
    the pair as the previous one left it (AD-PSGD takes one per step; more mix more per
    step for more bytes). A step waits for the last exchanges to be over before it starts
    its own (``max_staleness``; with None it starts none while they are under way).
    Cost: about ``exchanges_per_step`` exchanges started and as many answered per peer per
    step, each a request and an answer of P bytes (+ 2 elements); memory: five buffers of
    P. Answers that come late are taken by the pushing thread as soon as they arrive.
    A peer answers only after its first step (and its first step in a new view), when
    what it publishes is its model.

    ``"push"``: one-way push-sum. Each step (1) ``after_backward()``, before the optimizer
    moves, folds in what arrived since the last step: the arrivals are kept as their
    weighted average (A, W), and the fold is one pass, m <- m + W/(w+W) (A - m),
    w <- w + W (push-sum's x_i + sum x_j, de-biased); (2) ``after_step()``, if the last push
    is through, posts m with the weight f w (``push_fraction`` f; one copy), keeping (m,
    (1 - f) w), to one peer through ``peer.channel(channel)``: a peer that pushed here since
    this one last pushed to it (push-pull, rotation.py's ``owed``), else the next
    out-neighbour of the topology in turn. A push still in flight skips the round. Posting
    never blocks (push.py: the pushing thread only sees it through). A receiving thread
    averages each message into what the next step folds in (inbound.py). A loop that calls
    only ``after_step()`` (numpy arrays) gets the same update: m <- m + W/(w+W) (A - a), a
    being the parameters as the last after_step left them (one more buffer, two more passes).
    ``push_fraction`` (default 1/4, not push-sum's usual 1/2) and ``min_weight`` (default
    1/2): when a push is in transit for several steps (short steps, a busy machine), the mass
    in flight is what a step does not move, and its model goes stale on the way; flow
    control (a peer below ``min_weight`` skips its push until pushes to it arrive) keeps
    w >= (1 - f) min_weight = 3/8. Measured on issue #15's task (4 peers on 2 cores, a
    10-16-2 MLP, 200 steps, mean accuracy on the peers' own samples over 6-8 runs; alone
    0.990, Gossip 0.987): f 1/2 and min_weight 1/16, 0.954-0.966; f 1/4, 0.967; min_weight
    1/4, 0.981; 1/2, 0.986. SGP's step scaling (the move divided by w) was tried: 0.987 on
    that task, but with momentum 0.9 beside a 4x straggler peers diverged: not taken. Cost:
    one message of P bytes (+ one element) per peer per step; memory: four buffers of P,
    five without after_backward().

    Either way the optimizer's move needs no bookkeeping: it updates m, the parameters, in
    place, which is push-sum's x <- x + w * move with the gradient taken before the mix (as
    D-PSGD does), and only the training thread ever touches the parameters, so the
    optimizer never sees a half-mixed buffer.

    Lost peers: a neighbour found lost (peer.lost_peers()), or one an exchange with it
    timed out (``send_timeout``), is dropped from the rotation (its own out-neighbours join
    it: see rotation.py). Push: what was not delivered to it comes back, and the survivors'
    sums of w m and of w are the initial totals minus exactly what the dead peer d held: its
    pair, its unsent part, and the pushes that reached it not yet folded in; a peer that
    such pushes left below ``min_weight`` restarts its weights (w <- 1, m unchanged;
    ``weights_restarted`` in stats()): only one that pushed to d since its last quiesce()
    (before that, every push was absorbed), so after a quiesce() the survivors' totals stay
    exact whatever their weights. Pairwise: an exchange that d did not answer leaves
    the asker's pair as it was, so the survivors lose exactly d's pair (and the half of an
    exchange d answered and whose answer did not arrive).

    ``max_staleness``: after_step() waits (at most ``timeout``, then OperationTimeout) for
    the exchange (or push) under way to be over before it starts the next, and until one
    that includes the step ``max_staleness`` steps ago is over (answered or refused; a
    refusal is rare with the one overlap of pairs.py, and counting only answered ones could
    leave peers that all wait refusing each other). No peer runs ahead of its mixing. The
    default, ``"auto"``, is 1 under pairwise (``DEFAULT_MAX_STALENESS``: AD-PSGD's schedule,
    a step's exchange beside the next step's compute) and None under push; None never
    waits: a step whose exchange is still under way starts none, and on a loaded machine,
    where a round trip lasts several steps, the peers then mix once in several steps
    (issue #39, `python benchmarks/asynchronous_mixing.py --repeats 3`, 2026-12-05: 4 peers
    on 2 cores, one 4x slower; None: 0.19 exchanges per fast step, consensus distance 5.34x
    gossip's at 2.55x its speed; 1: 1.00 per step, 3.58x at 1.16x). While paused
    (quiesce()) it does not wait.

    Views: joins, a killed peer's restart and leaves are followed, the mass kept exact
    across a join (the module docstring: what is in flight between members settled, the
    weights scaled by n_new / n_old, a joiner taking a share of its source's); a leave
    takes effect at once and loses the leaver's mass, as a death does.

    When to use it: heterogeneous or unreliable peers (stragglers, preemption).
    ``topology``: default ``OnePeerExponential(n)``. ``close()`` (and ``peer.close()``)
    stops both threads within an operation in progress. ``channel`` (the requests or
    pushes; ``channel + 1``: quiesce()'s counts; ``channel + 2``: answers),
    ``poll_interval``: see BackgroundPolicy.
    """

    name = "asynchronous"
    default_topology = ONE_PEER_EXPONENTIAL
    own_steps = True   # the training loop never waits on a peer: counts drift apart
    worker_name = "asynchronous gossip thread"

    def __init__(self, *, topology: Topology | None = None,
                 max_staleness: int | None | Literal["auto"] = "auto",
                 exchange: str = "pairwise", push_fraction: float | None = None,
                 min_weight: float | None = None, exchanges_per_step: int | None = None,
                 channel: int = PeerChannel.ASYNCHRONOUS, poll_interval: float = 0.25,
                 send_timeout: float | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 timeout: float | None = None, nan_guard: bool = False,
                 compression: CodecSpec = None) -> None:
        if compression is not None:
            # Pushes move mass: a lossy codec would break the accounting the weights rely on.
            raise ValueError("Asynchronous does not take compression yet (its pushes carry "
                             "mass, which a lossy codec would not keep)")
        super().__init__(channel=channel, poll_interval=poll_interval,
                         bucket_bytes=bucket_bytes, timeout=timeout, nan_guard=nan_guard)
        self._topology_arg = topology
        if max_staleness == "auto":
            max_staleness = DEFAULT_MAX_STALENESS if exchange == "pairwise" else None
        self.max_staleness = check_int("max_staleness", max_staleness, 0, optional=True)
        if exchange not in EXCHANGES:
            raise ValueError(f"Asynchronous(exchange={exchange!r}): expected one of "
                             f"{', '.join(EXCHANGES)}")
        self.exchange = exchange
        if exchange == "pairwise":
            for name, value in (("push_fraction", push_fraction), ("min_weight", min_weight)):
                if value is not None:
                    raise ValueError(f"Asynchronous({name}={value!r}) applies to "
                                     "exchange='push' only (a pairwise exchange moves half of "
                                     "the two peers' pooled mass, and never leaves a peer light)")
        if exchange == "push" and exchanges_per_step is not None:
            raise ValueError(f"Asynchronous(exchanges_per_step={exchanges_per_step!r}) applies "
                             "to exchange='pairwise' only (a push moves a fraction of the mass "
                             "once per step: push_fraction)")
        self.exchanges_per_step = check_int(
            "exchanges_per_step",
            DEFAULT_EXCHANGES_PER_STEP if exchanges_per_step is None else exchanges_per_step, 1)
        self.min_weight = check_number(
            "min_weight", 1 / 2 if min_weight is None else min_weight, lambda w: 0 < w <= 1,
            "in (0, 1]")
        self.push_fraction = check_number(
            "push_fraction", 1 / 4 if push_fraction is None else push_fraction,
            lambda f: 0 < f < 1, "in (0, 1)")
        self._pairs: Pairs | None = None   # (pairwise) what this peer offers to exchanges
        self._unanswered: dict[int, Unanswered] = {}   # (pairwise) partner -> late answers
        self._round_trip = 0.0   # (pairwise) seconds an answered exchange took (average)
        self._rng = random.Random()        # (pairwise) partners: seeded by rank at attach
        self._partners: list[int] = []     # (pairwise) whom this step's exchanges may ask
        self._send_timeout_arg = check_number("send_timeout", send_timeout, lambda t: t > 0,
                                              "a positive number", optional=True)
        self._paused = False
        self._job: Push | None = None   # the push in flight
        self._returned: int | None = None   # first bucket of a failed push not delivered
        self._drained_check = False   # a peer was dropped: did it take this peer's mass?
        self._restarts = 0            # weight restarts after such drops
        self._mixed_step = 0     # steps included in the last push (or exchange)
        self._rounds = self._turns = self._held_back = self._staleness_waits = 0   # (turns:
        self._receiver_wakeups = 0   # pushes along the rotation, not answering: owed())
        self._lightest = 1.0     # the smallest weight an after_step() has seen
        self._background_seconds = 0.0
        self._sent_to: list[int] = []        # messages pushed, per destination
        # ... of which each destination had absorbed all at the last quiesce() (a peer
        # dropped with none beyond that took none of this peer's mass with it).
        self._confirmed_to: list[int] = []
        # Per view (_for_view): what arrives, the rotation, the channels, every other rank.
        self._arrivals: Arrivals | None = None
        self._members: View | None = None   # the view whose ranks they use (None: a bare peer)
        # A join's source: (the joiners' weights, parts), not yet sent.
        self._shares: tuple[list[float], int] | None = None

    # ------------------------------------------------------------------ set-up
    def _primitives(self) -> None:
        super()._primitives()
        self._answers_lock = self._concurrency.lock()   # (pairwise) one reader of answers
        self._kick = self._concurrency.event()

    @property
    def send_timeout(self) -> float:
        """Seconds a push may take before its neighbour counts as silent (default: the
        policy's timeout, at most 5 s, so close() and a silent neighbour do not stall the
        thread long)."""
        if self._send_timeout_arg is not None:
            return float(self._send_timeout_arg)
        return min(self.timeout, 5.0)

    def _setup(self) -> None:
        nb = len(self._packed())
        self._w = [1.0] * nb   # the push-sum weight of each bucket (training thread's; push)
        self._folded = False     # after_backward() folded the arrivals in this step
        self._out = [b.new(extra=1) for b in self._packed()]   # the push, or request, in flight
        # For loops without after_backward() (push): the parameters as the last after_step
        # left them (the move since then is m - anchor: _fold_in); dropped at after_backward().
        self._anchor: list[Any] | None = None
        if self.exchange == "pairwise":
            host = self._host()
            self._pairs = Pairs(self._packed(), rank=host.rank, world_size=host.world_size,
                                cond=self._cond, lock=self._concurrency.lock())
            self._rng = random.Random(0x5EED + host.rank)
            # (Pairwise messages: the model, the exchange's number, the weight: pairs.TAIL.)
            self._out = [b.new(extra=TAIL) for b in self._packed()]      # the request
            self._answer = [b.new(extra=TAIL) for b in self._packed()]   # its answers
            self._request = [b.new(extra=TAIL) for b in self._packed()]  # others' requests
            self._next_request: dict[int, int] = {}   # source -> bucket of its next request
        else:
            self._anchor = [adapter_for(b.flat).clone(b.flat) for b in self._packed()]
        self._for_view()   # rotation, communicators, arrivals; the threads start

    def _stop_seconds(self) -> float:
        # The receiver sleeps at most poll_interval; the pusher's wait is bounded by send_timeout.
        return max(1.0, self.send_timeout + 0.5)

    def _wake(self) -> None:
        self._kick.set()

    # ------------------------------------------------------------------ training loop side
    def _after_backward(self) -> None:
        self._check_worker()
        if self._pairs is not None:
            return   # the exchanges' changes are added at after_step, on top of the move
        self._packed().copy_in()
        self._fold_in(moved=False)
        self._packed().copy_out()
        self._folded = True
        self._anchor = None   # not needed while after_backward() folds in

    def _after_step(self, step: int) -> None:
        self._check_worker()
        self._packed().copy_in()
        if self.max_staleness is not None:
            # A push of this step must leave: wait for the one under way to finish (before
            # the sync, so that what an exchange brought is in this step's parameters).
            with self._cond:
                self._wait_locked(lambda: self._job is None, self.timeout, 0.1,
                                  lambda: ("the push in progress did not finish",
                                           "asynchronous after_step"), stoppable=True)
        if self._pairs is not None:
            self._pairs.sync(self._packed())
        folded, self._folded = self._folded, False
        if self._pairs is not None:
            folded = True   # nothing to fold: sync added the exchanges' changes
        if not folded:   # a loop without after_backward(): fold in past the move
            self._fold_in(moved=self._anchor is not None)
        if not self._paused:
            self._hand_over(step + 1)
        self._packed().copy_out()
        if not folded:
            self._keep_anchor()
        if self.max_staleness is not None and not self._paused:
            self._wait_fresh(step + 1 - self.max_staleness)

    def _keep_anchor(self) -> None:
        """(Loops without after_backward().) The parameters as they are now: the next
        after_step's move is measured from here."""
        if self._anchor is None:
            self._anchor = [adapter_for(b.flat).clone(b.flat) for b in self._packed()]
        else:
            for b, anchor in zip(self._packed().buckets, self._anchor):
                adapter_for(anchor).copy(anchor, b.flat)

    def _fold_in(self, moved: bool) -> None:
        """(Training thread.) Fold what arrived since the last call into (m, w), with what a
        failed push brought back.

        Arrivals, averaged to (A, W), mix with the model as it was before this step's
        optimizer move, and the move applies on top, undiluted. Before the move (``moved``
        False): m <- m + W/(w+W) (A - m), one pass. After it (``moved``, the anchor a being
        the parameters before the move): m <- m + W/(w+W) (A - a), which is the same mix with
        the move d = m - a added back. Either way a step counts fully however much mass is
        in transit, as if the pair had absorbed each message the moment it arrived.

        Pairwise: what the exchanges changed since the last sync is added (Pairs.sync)."""
        if self._pairs is not None:
            self._pairs.sync(self._packed())
            return
        self._inbox().drain(self._comm, self._sources, self.send_timeout)
        arrivals = self._inbox().take()
        with self._cond:
            returned, self._returned = self._returned, None
            check, self._drained_check = self._drained_check, False
        anchor = self._anchor if moved else None   # a (kept whenever moved)
        for k, b in enumerate(self._packed().buckets):
            got, weight = arrivals[k] or (None, 0.0)
            if returned is not None and k >= returned:   # a push that did not leave
                back, back_weight = self._out[k][:-1], float(self._out[k][-1])
                if got is None:
                    got = back
                else:
                    adapter_for(got).lerp(got, back, back_weight / (weight + back_weight))
                weight += back_weight
            if got is None:
                continue
            total = self._w[k] + weight
            adapter = adapter_for(b.flat)
            if anchor is not None:
                adapter.axpy(b.flat, weight / total, got)
                adapter.axpy(b.flat, -weight / total, anchor[k])
            else:
                adapter.lerp(b.flat, got, weight / total)
            self._w[k] = total
        if check and min(self._w) < self.min_weight:
            # Pushes taken for a dead peer went down with it; flow control would wait for
            # ever. w <- 1 changes the survivors' mass, so only then.
            log.warning("rank %d: asynchronous gossip: weight %.3g below min_weight after a "
                        "drop: restarting the weights", self._host().rank, min(self._w))
            self._w = [1.0] * len(self._w)
            self._restarts += 1
        self._lightest = min(self._lightest, min(self._w))

    def _hand_over(self, included: int) -> None:
        """(Training thread.) If the last push is through: post (m, f w) and keep the rest
        (or skip the round: alone, or too light)."""
        with self._cond:
            job = self._job
        if job is not None and self._pairs is None and job.complete():
            # (Push: its messages taken, it is over. An exchange is over only when its
            # answers are in: the pushing thread settles it.)
            self._push_over(job, len(job.requests))
        with self._cond:
            if self._job is not None or self._returned is not None:
                # Still sending the last one (or what it could not deliver is still in the
                # send buffer, to be folded back next step): this round is skipped.
                return
        alive = functools.partial(self._alive, lost=self._host().lost_peers())   # read once
        self._rotation.heal(alive)
        self._rounds += 1
        if self._pairs is not None:
            self._start_exchange(included, alive)
            return
        light = min(self._w) < self.min_weight   # flow control (class docstring)
        dst = None   # (owed() marks the peer answered: asked only when this round pushes)
        if not light:
            dst = self._rotation.owed(self._inbox().absorbed_from, alive)
            if dst is None:
                dst = self._rotation.next(self._turns, alive)
                self._turns += 1
        # A change at once under way (a leave): this transport's inboxes are closing, and a
        # push now may reach nobody (the leaver, or a member past its last drain).
        changing = self._host().changing_now()
        if dst is None or light or changing:   # alone, too light to push, or changing
            self._held_back += light
            with self._cond:
                self._mixed_step = included
                self._cond.notify_all()
            return
        for k, (b, out) in enumerate(zip(self._packed(), self._out)):
            w = self._w[k]
            adapter_for(out).copy(out[:-1], b.flat)   # push m with weight f w ...
            out[-1] = w * self.push_fraction
            # ... and keep the rest: m unchanged, w less what left as the buffer's dtype
            # holds it (float32 rounds f w), so kept + sent is w to float64 precision.
            self._w[k] = w - float(out[-1])
        push = Push(self._comm, dst, included, self._out, self.send_timeout)
        with self._cond:
            self._job = push
        self._kick.set()

    def _start_exchange(self, included: int, alive: Any) -> None:
        """(Training thread, pairwise.) Ask a random live neighbour to average with this
        peer (AD-PSGD); none while a change at once is under way, or when alone."""
        # Not a partner whose last answer is still due (stalled, or its policy closed).
        live = [j for j in self._rotation.ranks if alive(j) and j not in self._unanswered]
        if not live or self._host().changing_now():
            with self._cond:
                self._mixed_step = included
                self._cond.notify_all()
            if self._unanswered:
                self._kick.set()   # the pushing thread takes the answers that came since
            return
        self._partners = live   # (the pushing thread's for the step's further exchanges)
        push = self._begin_exchange(live, included)
        with self._cond:
            self._job = push
        self._kick.set()

    def _begin_exchange(self, live: list[int], included: int) -> Push:
        """(Pairwise.) Publish this peer's pair as the next exchange's request to a random
        one of ``live`` and post it (the requests leave at once, the answers are the pushing
        thread's to take)."""
        dst = live[self._rng.randrange(len(live))]
        self._turns += 1
        assert self._pairs is not None
        self._pairs.begin(dst, self._out, self._turns)
        return Push(self._comm, dst, included, self._out, self.send_timeout)

    def _wait_fresh(self, wanted: int) -> None:
        with self._cond:
            if self._mixed_step >= wanted:
                return
            self._staleness_waits += 1
            self._wait_locked(
                lambda: self._mixed_step >= wanted, self.timeout, 0.1,
                lambda: (f"no push including step {wanted} (max_staleness="
                         f"{self.max_staleness})", "asynchronous after_step"), stoppable=True)

    # ------------------------------------------------------------------ background thread
    def _run(self) -> None:
        """The pusher: sees through what after_step posted (stop: its generation's)."""
        stop = self._stop
        while not stop.is_set():
            kicked = self._kick.wait(1.0)
            if stop.is_set():
                break
            if self._pairs is not None and self._unanswered:
                # Late answers complete their exchanges here too, not only before the next
                # exchange starts: with every partner's answer due, none would start.
                with self._answers_lock:
                    self._take_late_answers(0.0)
            if not kicked:
                continue
            self._kick.clear()
            with self._cond:
                job = self._job
            if job is None:
                continue
            start = self._concurrency.monotonic()
            delivered = [0]
            if self._pairs is not None:
                self._see_exchange_through(job, delivered)
                self._further_exchanges(job)
            else:
                with self._tolerate(f"push to rank {job.dst}", rank=job.dst):
                    job.see_through(delivered)
            self._push_over(job, delivered[0])
            self._background_seconds += self._concurrency.monotonic() - start

    def _further_exchanges(self, job: Push) -> None:
        """(Pushing thread, pairwise.) The step's exchanges after its first, back to back,
        each with a random live partner of the step's (none is asked whose answer is still
        due), on the pair as it is then: ``exchanges_per_step`` in all, fewer if this peer
        pauses, stops or changes view meanwhile. Each counts in _sent_to as the first does."""
        for _ in range(self.exchanges_per_step - 1):
            if self._paused or self._stop.is_set() or self._host().changing_now():
                break
            lost = self._host().lost_peers()
            live = [j for j in self._partners
                    if j not in lost and j not in self._dropped and j not in self._unanswered]
            if not live:
                break
            further = self._begin_exchange(live, job.included)
            delivered = [0]
            self._see_exchange_through(further, delivered)
            with self._cond:
                self._sent_to[further.dst] += delivered[0]

    @property
    def answer_wait(self) -> float:
        """(Pairwise.) Seconds an exchange waits for its partner's answer before it goes on
        without it (the answer is taken whenever it comes: Unanswered): ten times the
        exchanges' round trip (a moving average), at least 20 ms, at most poll_interval and
        send_timeout. A partner that stalls, or closed its policy (as a peer that finished
        its share of the steps does), holds a peer up no longer than that: while it waits
        it answers one request (pairs.py) and starts no exchange."""
        wait = max(0.02, 10 * self._round_trip) if self._round_trip else self._poll
        return min(wait, self._poll, self.send_timeout)

    def _see_exchange_through(self, job: Push, delivered: list[int]) -> None:
        """(Pushing thread, pairwise.) Send the request, then take the partner's answer to
        each bucket in turn. A partner found lost is dropped, and what it did not answer
        leaves this peer's pair as it was; one that does not answer within answer_wait is
        not asked again until its answers come (Unanswered)."""
        assert self._pairs is not None
        try:
            with self._answers_lock:
                self._take_late_answers(0.0)
                with self._tolerate(f"exchange with rank {job.dst}", rank=job.dst,
                                    drop=(PeerLost,)):
                    start = self._concurrency.monotonic()
                    job.see_through(delivered)
                    for k, (sent, got) in enumerate(zip(self._out, self._answer)):
                        try:
                            why = self._take_answer(job.dst, sent, got, self.answer_wait)
                        except OperationTimeout:
                            self._answer_late(job.dst, k)
                            break
                        if why is not None:
                            log.warning("rank %d: asynchronous gossip: dropped an answer from "
                                        "rank %d: %s", self._host().rank, job.dst, why)
                            continue
                        self._pairs.apply(k, sent, got)
                    else:   # every answer came in time
                        took = self._concurrency.monotonic() - start
                        self._round_trip = took if not self._round_trip else \
                            0.8 * self._round_trip + 0.2 * took
        finally:
            self._pairs.end()

    def _answer_late(self, dst: int, first: int) -> None:
        """(Pairwise, holding _answers_lock.) The answers of ``dst`` from bucket ``first``
        on did not come within answer_wait: keep what was sent, to complete the exchange
        when they come."""
        if not self._unanswered:
            log.info("rank %d: asynchronous gossip: rank %d did not answer within %gs; not "
                     "asked again until it does", self._host().rank, dst, self.answer_wait)
        self._unanswered[dst] = Unanswered(
            dst, [(k, adapter_for(self._out[k]).clone(self._out[k]))
                  for k in range(first, len(self._out))])

    def _take_late_answers(self, timeout: float) -> None:
        """(Pairwise, holding _answers_lock.) Complete the exchanges whose answers were
        late with those that came: all waiting ones (``timeout`` 0), or waiting up to
        ``timeout`` for each (quiesce(), a view change: the partners answered every
        request by then). A partner found lost takes its part with it."""
        assert self._pairs is not None
        for dst, late in list(self._unanswered.items()):
            while late.buckets:
                k, sent = late.buckets[0]
                got = self._answer[k]
                try:
                    if timeout == 0.0 and not self._answers.probe(dst):
                        break
                    why = self._take_answer(dst, sent, got, timeout or self.send_timeout)
                except OperationTimeout:
                    break
                except PeerLost:
                    late.buckets.clear()
                    break
                late.buckets.pop(0)
                if why is None:
                    self._pairs.apply(k, sent, got)
            if not late.buckets:
                del self._unanswered[dst]

    def _take_answer(self, src: int, sent: Any, got: Any, timeout: float) -> str | None:
        """(Pairwise, holding _answers_lock.) Receive into ``got`` the answer of ``src``
        to the request ``sent``, passing over answers to other requests (a hostile
        sender's); why it cannot be used, or None."""
        while True:
            try:
                self._answers.recv(src, got, timeout=timeout)
            except PEER_FAILURES:
                raise
            except GossipError as exc:   # (a bucket of another size: an earlier answer's)
                log.warning("rank %d: asynchronous gossip: passed over a message of rank %d "
                            "on the answers' channel: %s", self._host().rank, src, exc)
                continue
            if float(got[-2]) == float(sent[-2]):
                break
            log.warning("rank %d: asynchronous gossip: passed over an answer of rank %d to "
                        "exchange %g (this one is %g)", self._host().rank, src,
                        float(got[-2]), float(sent[-2]))
        weight = float(got[-1])
        if not (math.isfinite(weight) and 0.0 <= weight <= self._host().world_size):
            return f"push-sum weight {weight!r} out of [0, n]"
        return None

    def _receive(self) -> None:
        """The receiver: sleeps until a message from any peer is waiting, then absorbs it
        (push) or answers it (pairwise)."""
        # Its view's (a view change halts it before they are replaced).
        stop, comm, sources = self._stop, self._comm, self._sources
        take: Callable[[int], None]
        if self._pairs is not None:
            what = "answer to"

            def take(src: int) -> None:
                self._answer_waiting(comm, src)
        else:
            arrivals = self._inbox()
            what = "receive from"

            def take(src: int) -> None:
                arrivals.absorb_from(comm, src, self.send_timeout)
        while not stop.is_set():
            # Dropped and lost sources too: what they sent before dying is mass (a lost
            # source with nothing queued never wakes this thread).
            src = self._next_source(comm, sources)
            self._receiver_wakeups += 1
            if stop.is_set():
                break
            if src is None:
                continue
            start = self._concurrency.monotonic()
            with self._tolerate(f"{what} rank {src}", rank=src, drop=(PeerLost,)):
                take(src)
            self._background_seconds += self._concurrency.monotonic() - start

    def _answer_waiting(self, comm: Communicator, src: int) -> None:
        """(Receiving thread, pairwise.) Answer every request waiting from ``src``."""
        while comm.probe(src):
            self._answer_one(comm, src, reply=True)

    def _answer_one(self, comm: Communicator, src: int, *, reply: bool) -> None:
        """Take the next request of ``src`` and (``reply``) answer it: pooled, or refused
        (busy, or malformed: logged)."""
        assert self._pairs is not None
        k = self._next_request.get(src, 0)
        self._next_request[src] = (k + 1) % len(self._request)
        request = self._request[k]
        why = None
        try:
            comm.recv(src, request, timeout=self.send_timeout)
        except PEER_FAILURES:
            raise
        except GossipError as exc:
            why = f"bad message: {exc}"
        if why is None:
            weight = float(request[-1])
            if not (math.isfinite(weight) and 0.0 < weight <= self._host().world_size):
                why = f"push-sum weight {weight!r} out of (0, n]"
        if why is not None:
            log.warning("rank %d: asynchronous gossip: refused a request of rank %d: %s",
                        self._host().rank, src, why)
            request[-1] = 0
        elif reply:
            self._pairs.answer(k, request)
        try:
            if reply:
                self._answers.send(src, request, timeout=self.send_timeout)
        finally:
            self._pairs.handled(src)

    def _dropped_peer(self, rank: int) -> None:
        if self._may_hold_mass(rank):
            self._drained_check = True   # see _fold_in

    def _may_hold_mass(self, rank: int) -> bool:
        """(Under _cond.) Whether pushes of this peer to ``rank`` may have died with it: it
        was pushed to since the last quiesce(), whose collective saw every earlier push
        absorbed. Otherwise this peer's weight is all there (a weight below min_weight is
        flow control's, which pushes to it resolve) and restarting it would change the
        survivors' mass: it did, in CI, when a survivor that had pushed nothing to the
        dead peer since quiesce() happened to be light as it dropped it."""
        return self._sent_to[rank] > self._confirmed_to[rank]

    def _push_over(self, job: Push, sent: int) -> None:
        """``job`` is over with its first ``sent`` messages taken (settled once: the other
        thread may have seen it through already)."""
        with self._cond:
            if self._job is not job:
                return
            self._sent_to[job.dst] += sent
            if sent < len(self._out) and self._pairs is None:
                self._returned = sent   # what did not leave goes back into the pair
            self._job = None
            self._mixed_step = max(self._mixed_step, job.included)
            self._cond.notify_all()

    # ------------------------------------------------------------------ quiescence
    def quiesce(self, timeout: float | None = None) -> None:
        """Stop pushing until every push a live peer made to this one is absorbed (the weights
        then add up to n, less what the dead held): a collective of the live peers
        (_pushes_to_absorb: a dead peer does not stop it). ``resume()`` undoes it."""
        self._check_ready()
        timeout = self.timeout if timeout is None else timeout
        self._paused = True
        with self._cond:        # a push in progress completes first
            self._wait_locked(lambda: self._job is None, timeout, 0.5,
                              lambda: ("quiesce: the push in progress did not finish",
                                       "asynchronous quiesce"))
            sent = list(self._sent_to)
        expected = self._pushes_to_absorb(sent, timeout)
        absorbed = self._taken_from()
        with self._cond:
            self._wait_locked(
                lambda: all(absorbed[j] >= count for j, count in expected.items()),
                timeout, 0.5,
                lambda: (f"quiesce: took {[absorbed[j] for j in expected]} of the "
                         f"{list(expected.values())} messages ranks {list(expected)} sent "
                         "it", "asynchronous quiesce"))
        self._settle_late_answers(timeout)
        with self._cond:   # every push sent before is absorbed (its peer is in quiesce too)
            self._confirmed_to = sent
        # Fold the absorbed mass into the parameters (no move since the last step).
        self._packed().copy_in()
        self._fold_in(moved=False)
        self._packed().copy_out()
        if self._anchor is not None:
            self._keep_anchor()

    def _settle_late_answers(self, timeout: float) -> None:
        """(Pairwise; no exchange under way, every request answered.) The answers that
        came late are all sent: take them."""
        if self._pairs is not None and self._unanswered:
            with self._answers_lock:
                self._take_late_answers(timeout)
            if self._unanswered:
                log.warning("rank %d: asynchronous gossip: no answer from rank(s) %s within "
                            "%gs: their part of those exchanges is lost", self._host().rank,
                            sorted(self._unanswered), timeout)
                self._unanswered = {}

    def _taken_from(self) -> list[int]:
        """Messages of each source taken by the receiver (pushes absorbed, or requests
        answered), under _cond."""
        if self._pairs is not None:
            return self._pairs.handled_from
        return self._inbox().absorbed_from

    def resume(self) -> None:
        """Push again after quiesce()."""
        self._check_ready()
        self._paused = False

    def _pushes_to_absorb(self, sent_to: list[int], timeout: float,
                          partners: list[int] | None = None) -> dict[int, int]:
        """Every live peer j (not in peer.lost_peers()) -> the pushes j sent to this peer,
        given ``sent_to`` (this peer's pushes per destination). A collective of the live
        peers, or of ``partners`` (ranks; a view change: the members that go on in the next
        view, which each name the same set). Each peer tells every other how many pushes it
        sent it, point to point, so a dead peer stops nothing, where an allreduce of the
        counts would fail on it; the counts travel on a communicator of their own
        (``_counts``, channel + 1), never the peer's: a user's own ``peer.send`` still
        outstanding there would meet them. A peer lost meanwhile is left out and dropped
        (the failure rule); a live one too slow to answer raises OperationTimeout, as any
        collective."""
        peer, comm = self._host(), self._counts
        if partners is None:
            lost = peer.lost_peers()
            live = [j for j in range(peer.world_size) if j != peer.rank and j not in lost]
        else:
            live = [j for j in partners if j != peer.rank]
        for j in live:   # all sends first: no peer waits for another's receive
            try:
                comm.send(j, np.array([sent_to[j]], dtype=np.int64), timeout=timeout)
            except PeerLost as exc:
                self._exchange_failed(f"quiesce: count to rank {j}", exc, j)
        expected: dict[int, int] = {}
        for j in live:
            try:
                expected[j] = int(comm.recv(j, np.zeros(1, dtype=np.int64),
                                            timeout=timeout)[0])
            except PeerLost as exc:
                self._exchange_failed(f"quiesce: count from rank {j}", exc, j)
        return expected

    # ------------------------------------------------------------------ per view
    def _for_view(self) -> None:
        """(Attach, and after each view change.) What depends on the view's ranks and size;
        then start the threads."""
        n, rank = self._host().world_size, self._host().rank
        self._members = self._host().view
        self._rotation = Rotation(self._graph(), rank)   # one push per round, in turn
        # Every other peer: a healed graph sends from peers that were not in-neighbours.
        self._sources = [j for j in range(n) if j != rank]
        self._sent_to = [0] * n
        self._confirmed_to = [0] * n
        self._comm = self._host().channel(self._channel_number)
        self._counts = self._host().channel(self._channel_number + 1)   # quiesce()'s
        self._answers = self._host().channel(self._channel_number + 2)  # (pairwise)
        if self._pairs is not None:
            self._pairs.renumber(rank, n)
            self._next_request = {}
        elif self._arrivals is None:
            self._arrivals = Arrivals(self._packed(), rank=rank, world_size=n, cond=self._cond,
                                      locks=(self._concurrency.lock(), self._concurrency.lock()))
        else:
            self._arrivals.renumber(rank, n)
        self._start(self._run, "gossip-async")
        self._start(self._receive, "gossip-async-recv")

    # ------------------------------------------------------------------ the switch
    def view_changing(self, switch: Switch) -> None:
        self._shares = None   # a donation of a switch that failed is void: it never left
        self._settle(switch)
        # Everything up to now is in what this member holds: max_staleness counts from here.
        self._mixed_step = int(switch.step)
        old, new = self._host().world_size, len(switch.view)
        if new != old:
            if self._pairs is not None:
                self._pairs.scale_weights(new / old)
            else:
                self._w = [w * (new / old) for w in self._w]
        if switch.transport.rank == switch.source and switch.receivers:
            parts = len(switch.receivers) + 1
            self._shares = ([w / parts for w in self.weights], parts)

    def view_changed(self) -> None:
        super().view_changed()   # the topology over the new view
        with self._cond:
            self._job = self._returned = None   # (settled: nothing under way or to give back)
            self._unanswered = {}   # (settled at the switch; ranks renumber)
            self._drained_check = False
            self._dropped = {}    # old ranks: the new view's members are all live
        self._kick.clear()
        if self._pairs is not None:
            self._pairs.close()   # until this member's first step in the view
        self._for_view()

    def state_sent(self) -> None:
        """The k joiners have their share s = fl(w / (k + 1)): keep w - k s (exact when
        k + 1 is a power of two: the source keeps s itself; or when k is: Sterbenz)."""
        if self._shares is None:
            return
        shares, parts = self._shares
        self._shares = None
        given = parts - 1
        if parts & given == 0:
            kept = list(shares)
        else:
            kept = [w - given * s for w, s in zip(self.weights, shares)]
        self._set_weights(kept)

    def _set_weights(self, weights: list[float]) -> None:
        if self._pairs is not None:
            self._pairs.set_weights(weights)
        else:
            self._w = list(weights)

    def _continuing(self, switch: Switch) -> list[int]:
        """Ranks, in the old view, of the other members that go on in ``switch``'s view as
        themselves (same name and incarnation)."""
        old, new, me = self._members, switch.view, self._host().rank
        if old is None:
            return []
        out = []
        for r, m in enumerate(old.members[:self._host().world_size]):
            j = new.rank_of(m.name)
            if r != me and j is not None and new.member(j).incarnation == m.incarnation:
                out.append(r)
        return out

    def _settle(self, switch: Switch) -> None:
        """Steps 1-3 of the module docstring. Never raises for what it waits on: a member
        that does not answer in time is logged, and what it did not deliver is lost."""
        deadline = self._concurrency.monotonic() + self.timeout
        with self._cond:   # the push under way completes (its send is bounded)
            while self._job is not None and self._error is None \
                    and self._concurrency.monotonic() < deadline:
                self._cond.wait(min(0.5, max(0.0, deadline - self._concurrency.monotonic())))
            sent = list(self._sent_to)
        partners = self._continuing(switch)
        if partners and not switch.at_once:
            try:
                expected = self._pushes_to_absorb(sent, self.timeout, partners)
                absorbed = self._taken_from()
                with self._cond:
                    self._wait_locked(
                        lambda: all(absorbed[j] >= c for j, c in expected.items()),
                        max(0.0, deadline - self._concurrency.monotonic()), 0.5,
                        lambda: (f"view change: absorbed {[absorbed[j] for j in expected]} "
                                 f"of the {list(expected.values())} pushes ranks "
                                 f"{list(expected)} sent it", "asynchronous view change"))
                for j in [j for j in self._unanswered if j not in partners]:
                    del self._unanswered[j]   # (gone: its part went with it)
                self._settle_late_answers(max(0.1, deadline - self._concurrency.monotonic()))
            except (OperationTimeout, RuntimeError) as exc:
                log.warning("rank %d: %s: the pushes in flight did not all arrive before "
                            "view %d (%s): what did not is lost", self._host().rank, self.name,
                            switch.view.number, exc)
        gone = [r for r in range(self._host().world_size) if r != self._host().rank
                and r not in partners and self._members is not None]
        for r in gone:
            self._drop(r, f"not in view {switch.view.number} as itself")
        with self._cond:   # (dropped earlier too: checked again before the view's ranks go)
            if any(self._may_hold_mass(r) for r in gone):
                self._drained_check = True   # see _fold_in
        self._halt()
        for src in self._sources:   # what is queued still (from a leaver, the dead, ...)
            try:
                if self._pairs is not None:   # requests nobody waits for any more
                    while self._comm.probe(src):
                        self._answer_one(self._comm, src, reply=False)
                else:
                    self._inbox().absorb_from(self._comm, src, self.send_timeout)
            except PEER_FAILURES:
                pass   # lost with nothing queued, or the inbox closed by a change at once
        self._packed().copy_in()
        self._fold_in(moved=False)   # at a boundary: the parameters are the anchor
        self._packed().copy_out()
        if self._anchor is not None:
            self._keep_anchor()

    # ------------------------------------------------------------------ state sent
    def _extra_state(self) -> dict:
        # The model is the parameters themselves: the weights are all there is to send (a
        # join's source: its joiners' share).
        if self._shares is not None:
            return {"weights": list(self._shares[0])}
        return {"weights": self.weights}

    def _load_extra_state(self, state: dict) -> None:
        self._set_weights(weights_from_state(state, len(self._w), self.name))
        if self._anchor is not None:
            # From the user's arrays, not via copy_in: a joiner's buckets hold the state
            # just received, and its arrays get it only in took_state.
            if self._packed().kind == "numpy":
                for b, anchor in zip(self._packed().buckets, self._anchor):
                    for s in b.placements:
                        np.copyto(b.view(s, anchor), self._packed().params[s.index])
            else:
                self._keep_anchor()   # (torch: the parameters are the buckets)

    def took_state(self, step: int) -> None:
        super().took_state(step)   # the source's model into the user's arrays
        if self._pairs is not None:
            self._packed().copy_in()
            self._pairs.reset(self._packed())
        if self._anchor is not None:
            self._keep_anchor()     # the joiner's moves count from the source's model
        self._mixed_step = self._step

    # ------------------------------------------------------------------ state and stats
    @property
    def healed_around(self) -> set[int]:
        """Lost out-neighbours whose own out-neighbours joined the rotation."""
        return set(self._rotation.healed)

    @property
    def weights(self) -> list[float]:
        """The push-sum weights, one per bucket."""
        self._check_ready()
        if self._pairs is not None:
            return self._pairs.weights()
        return list(self._w)

    def _restored(self) -> None:
        # The nan guard put the last good parameters back: no move to fold in.
        if self._anchor is not None:
            self._keep_anchor()

    def _inbox(self) -> Arrivals:
        """What arrived from the other peers (made at attach, renumbered at a view change)."""
        if self._arrivals is None:
            raise RuntimeError(f"{self.name}: call attach(peer, params) first")
        return self._arrivals

    def _extra_stats(self) -> dict:
        out = {"exchange": self.exchange, "background_rounds": self._rounds,
               "background_seconds": self._background_seconds,
               "staleness_waits": self._staleness_waits,
               "receiver_wakeups": self._receiver_wakeups,
               "messages_sent_to": list(self._sent_to),   # (in this view)
               "messages_absorbed_from": list(self._taken_from()),
               "dropped_peers": sorted(self._dropped), "rotation": list(self._rotation.ranks),
               "healed_around": sorted(self._rotation.healed),
               "weights": self.weights, "topology": repr(self.topology)}
        pairs = self._pairs
        if pairs is not None:
            # Messages that changed this peer's pair: answers to its requests, and the
            # requests it answered.
            out.update({"messages_absorbed": pairs.completed + pairs.answered,
                        "lightest_weight": min(pairs.weights()),
                        "exchanges_started": self._turns,
                        "exchange_answers_taken": pairs.completed,
                        "exchange_refusals_taken": pairs.declined,
                        "requests_answered": pairs.answered, "requests_refused": pairs.refused,
                        "answers_due_from": sorted(self._unanswered),
                        "exchange_round_trip": self._round_trip,
                        "exchanges_per_step": self.exchanges_per_step,
                        "answer_wait": self.answer_wait})
        else:
            out.update({"messages_absorbed": self._inbox().absorbed,
                        "pushes_held_back": self._held_back, "lightest_weight": self._lightest,
                        "min_weight": self.min_weight, "weights_restarted": self._restarts})
        return out
