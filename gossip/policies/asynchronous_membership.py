"""Asynchronous's side of a membership view change: its push-sum mass (the weights w beside
the models m, which are the parameters themselves) follows a join, the restart of a killed
peer and a leave. A mixin of Asynchronous (gossip/policies/asynchronous.py states the
push-sum rule); the attributes it reads (_peer, _buckets, _w, _comm, _counts, _arrivals,
_job, _sent_to, ...) are Asynchronous's, BackgroundPolicy's and Policy's. Apart from
asynchronous.py, which holds the steady state, because a view change is a concept of its own
(as push_sum_membership.py is PushSum's).

At a committed switch (gossip/elastic.py take_switch), on the old view's transport, before
the new one is installed (``_view_changing``; the training thread is there, so no new push
starts):

1. the push under way completes (bounded by ``send_timeout``);
2. the continuing members (members of the old view that are in the new one with the same
   name and incarnation: not a leaver, not a killed member whose restarted incarnation takes
   its place) tell each other how many pushes they sent (quiescence.py), and each waits
   until its receiver has absorbed every push they sent it, so no mass is in flight between
   them when the old communicators close;
3. the pusher and receiver threads stop (they hold the old view's communicators), what is
   still queued is absorbed on the training thread (pushes a dead or leaving member made
   before it went are the receiver's, as they are between changes), and what arrived, with
   a push that did not leave, is folded into (m, w). The old members that do not go on as
   themselves are dropped as the dead are: pushes made to them went down with them, so a
   member they left below ``min_weight`` restarts its weights ("Lost peers" in
   asynchronous.py), or flow control could hold every push of the new view back;
4. every member scales its weights by n_new / n_old (m unchanged: x = w m scales with w), so
   the consensus sum x / sum w is unchanged and the total weight follows the membership;
5. the source of a join with k joiners splits its weights into k + 1 shares: the state it
   sends carries the parameters (its m) and one share as ``weights``, each joiner takes
   that, and the source keeps the rest once the state is sent (``_state_sent``; a transfer
   that fails takes nothing away from it). Exact when k + 1 or k is a power of two (2, 3,
   4, 5, 8, 9 sharing), otherwise off by the rounding of k shares (push_sum_membership.py).

With the new transport installed (``_view_changed``), everything keyed by a rank is made
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
  in asynchronous.py). The total weight is then below n; with nothing in transit (every
  member quiesce()d before the leave) exactly the leaver's weight is gone, times n_new /
  n_old (tests/test_asynchronous_membership.py).
- A killed peer's mass died with it; its restarted process takes a share of the source's
  weights as any joiner does, so the total stays what the survivors held.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from gossip.errors import OperationTimeout
from gossip.policies.arrivals import Arrivals
from gossip.policies.failures import PEER_FAILURES
from gossip.policies.push_sum_weights import weights_from_state
from gossip.policies.quiescence import pushes_to_absorb
from gossip.policies.rotation import Rotation

__all__ = ["AsynchronousMembership"]

log = logging.getLogger("gossip")


class AsynchronousMembership:
    """Asynchronous's membership hooks and per-view state (see the module docstring)."""

    follows_view_changes = True
    hands_off_at_leave = False   # a leave at once: the leaver's mass goes with it
    _shares: tuple[list[float], int] | None = None   # (a joiner's weights, parts): not yet sent
    _arrivals: Arrivals | None = None
    _members: Any = None   # the view whose ranks the per-view state uses (None: a bare peer)

    # ------------------------------------------------------------------ per view
    def _for_view(self) -> None:
        """(Attach, and after each view change.) What depends on the view's ranks and size;
        then start the threads."""
        n, rank = self._peer.world_size, self._peer.rank
        self._members = getattr(self._peer, "view", None)
        self._rotation = Rotation(self._topology, rank)   # one push per round, in turn
        # Every other peer: a healed graph sends from peers that were not in-neighbours.
        self._sources = [j for j in range(n) if j != rank]
        self._sent_to = [0] * n
        self._comm = self._peer.channel(self._channel_number)
        self._counts = self._peer.channel(self._channel_number + 1)   # quiesce()'s
        if self._arrivals is None:
            self._arrivals = Arrivals(self._buckets, rank=rank, world_size=n, cond=self._cond)
        else:
            self._arrivals.renumber(rank, n)
        self._start(self._run, "gossip-async")
        self._start(self._receive, "gossip-async-recv")

    # ------------------------------------------------------------------ the switch
    def _view_changing(self, switch: Any) -> None:
        self._shares = None   # a donation of a switch that failed is void: it never left
        self._settle(switch)
        # Everything up to now is in what this member holds: max_staleness counts from here.
        self._mixed_step = int(switch.step)
        old, new = self._peer.world_size, len(switch.view)
        if new != old:
            self._w = [w * (new / old) for w in self._w]
        if switch.transport.rank == switch.source and switch.receivers:
            parts = len(switch.receivers) + 1
            self._shares = ([w / parts for w in self._w], parts)

    def _view_changed(self) -> None:
        super()._view_changed()   # the topology over the new view
        with self._cond:
            self._job = self._returned = None   # (settled: nothing under way or to give back)
            self._drained_check = False
            self._dropped = {}    # old ranks: the new view's members are all live
        self._kick.clear()
        self._for_view()

    def _state_sent(self) -> None:
        """The k joiners have their share s = fl(w / (k + 1)): keep w - k s (exact when
        k + 1 is a power of two: the source keeps s itself; or when k is: Sterbenz)."""
        if self._shares is None:
            return
        shares, parts = self._shares
        self._shares = None
        given = parts - 1
        if parts & given == 0:
            self._w = list(shares)
        else:
            self._w = [w - given * s for w, s in zip(self._w, shares)]

    def _continuing(self, switch: Any) -> list[int]:
        """Ranks, in the old view, of the other members that go on in ``switch``'s view as
        themselves (same name and incarnation)."""
        old, new, me = self._members, switch.view, self._peer.rank
        if old is None:
            return []
        out = []
        for r, m in enumerate(old.members[:self._peer.world_size]):
            j = new.rank_of(m.name)
            if r != me and j is not None and new.member(j).incarnation == m.incarnation:
                out.append(r)
        return out

    def _settle(self, switch: Any) -> None:
        """Steps 1-3 of the module docstring. Never raises for what it waits on: a member
        that does not answer in time is logged, and what it did not deliver is lost."""
        deadline = time.monotonic() + self.timeout
        with self._cond:   # the push under way completes (its send is bounded)
            while self._job is not None and self._error is None \
                    and time.monotonic() < deadline:
                self._cond.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            sent = list(self._sent_to)
        partners = self._continuing(switch)
        if partners and not getattr(switch, "at_once", False):
            try:
                expected = pushes_to_absorb(self._peer, self._counts, sent, self.timeout,
                                            self._exchange_failed, partners)
                absorbed = self._arrivals.absorbed_from
                with self._cond:
                    self._wait_locked(
                        lambda: all(absorbed[j] >= c for j, c in expected.items()),
                        max(0.0, deadline - time.monotonic()), 0.5,
                        lambda: (f"view change: absorbed {[absorbed[j] for j in expected]} "
                                 f"of the {list(expected.values())} pushes ranks "
                                 f"{list(expected)} sent it", "asynchronous view change"))
            except (OperationTimeout, RuntimeError) as exc:
                log.warning("rank %d: %s: the pushes in flight did not all arrive before "
                            "view %d (%s): what did not is lost", self._peer.rank, self.name,
                            switch.view.number, exc)
        gone = [r for r in range(self._peer.world_size) if r != self._peer.rank
                and r not in partners and self._members is not None]
        for r in gone:
            self._drop(r, f"not in view {switch.view.number} as itself")
        if gone:   # (dropped earlier too: the check is made again before the view's ranks go)
            with self._cond:
                self._drained_check = True   # see _fold_in
        self._halt()
        for src in self._sources:   # what is queued still (from a leaver, the dead, ...)
            try:
                self._arrivals.absorb_from(self._comm, src, self.send_timeout)
            except PEER_FAILURES:
                pass   # lost with nothing queued, or the inbox closed by a change at once
        self._buckets.copy_in()
        self._fold_in(moved=False)   # at a boundary: the parameters are the anchor
        self._buckets.copy_out()
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
        self._w = weights_from_state(state, len(self._w), self.name)
        if self._anchor is not None:
            # From the user's arrays, not via copy_in: a joiner's buckets hold the state
            # just received, and its arrays get it only in _took_state.
            if self._buckets.kind == "numpy":
                for b, anchor in zip(self._buckets.buckets, self._anchor):
                    for s in b.placements:
                        np.copyto(b.view(s, anchor), self._buckets.params[s.index])
            else:
                self._keep_anchor()   # (torch: the parameters are the buckets)

    def _took_state(self, step: int) -> None:
        super()._took_state(step)   # the source's model into the user's arrays
        if self._anchor is not None:
            self._keep_anchor()     # the joiner's moves count from the source's model
        self._mixed_step = self._step
