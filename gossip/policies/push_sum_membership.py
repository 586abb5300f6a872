"""PushSum's side of a membership view change: the push-sum mass (numerators x, weights w)
follows a join or a planned leave exactly. A mixin of PushSum (gossip/policies/push_sum.py,
whose docstring states the rule); the attributes it reads (_peer, _buckets, _z, _w, _send,
_scratch, overlap) are PushSum's and Policy's.

At a committed switch (gossip/elastic.py take_switch), before the new view is installed:

1. the exchange in flight completes in the old view (``flush``, overlap=True);
2. a member the commit names (``switch.handoffs``) takes a planned leaver's (x, w) on the
   old view's transport, adds it to its own, and acknowledges it;
3. every member scales its (x, w) by n_new / n_old (x / w and the consensus sum x / sum w
   are unchanged, and the total weight, n_old, becomes n_new);
4. the source of a join with k joiners splits its pair into k + 1 shares: each joiner takes
   one (the policy state it is sent: the weights and, without overlap, the numerators
   themselves), and the source keeps the rest once the state is sent (``_state_sent``;
   a transfer that fails takes nothing away from it).
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from collectives.arrays import adapter_for
from gossip.channels import PeerChannel
from gossip.policies.failures import PEER_FAILURES

__all__ = ["PushSumMembership"]

log = logging.getLogger("gossip")


def _as_like(src: Any, dst: Any) -> Any:
    """``src`` (an array of a received state: numpy or torch) as the kind of ``dst``."""
    if isinstance(dst, np.ndarray):
        return np.asarray(src)
    import torch
    return torch.as_tensor(src, device=dst.device)


class PushSumMembership:
    """PushSum's membership hooks (see the module docstring)."""

    hands_off_at_leave = True
    _shares: Any = None   # (weights, numerators or None, parts): a join's shares, not yet sent

    # ------------------------------------------------------------------ the switch
    def _view_changing(self, switch: Any) -> None:
        self.flush()
        self._shares = None   # a donation of a switch that failed is void: it never left
        me = switch.transport.rank
        for receiver, leaver in switch.handoffs:
            if receiver == me:
                self._take_handoff(leaver)
        old, new = self._peer.world_size, len(switch.view)
        if new != old:
            self._scale(new / old)
        if me == switch.source and switch.receivers:
            self._split(len(switch.receivers) + 1)

    def _view_changed(self) -> None:
        from gossip.policies.neighborhood import Neighborhood
        super()._view_changed()   # the topology over the new view
        self._neighborhood = Neighborhood(self._peer, self._topology, push=True,
                                          timeout=self.timeout)

    def _scale(self, factor: float) -> None:
        """(x, w) <- factor (x, w) on every bucket; the parameters, x / w, stay as they are."""
        if self.overlap:
            self._w = [w * factor for w in self._w]
            return
        for z in self._z:
            adapter_for(z).scale(z, factor)

    def _split(self, parts: int) -> None:
        """The share of each joiner: (x, w) / parts (exact when parts is a power of two)."""
        if self.overlap:
            self._shares = ([w / parts for w in self._w], None, parts)
            return
        shares = []
        for b, z in zip(self._buckets, self._z):
            s = b.new(extra=1)
            adapter_for(s).divide_into(s, z, float(parts))
            shares.append(s)
        self._shares = ([float(s[-1]) for s in shares], [s[:-1] for s in shares], parts)

    def _state_sent(self) -> None:
        """The k joiners have their shares s = fl(v / (k + 1)) (v: x or w): keep v - k s.
        Exact when k + 1 is a power of two (s is exact: the source keeps s itself) or k is
        (k s is exact, and so is v - k s, by Sterbenz's lemma: k s lies in [v / 2, v]): 2,
        3, 4, 5, 8, 9, ... members sharing; otherwise v - fl(k s), off by the rounding of
        k s, at most half a unit in the last place of v, per element."""
        if self._shares is None:
            return
        weights, numerators, parts = self._shares
        self._shares = None
        given = parts - 1
        if parts & given == 0:   # a power of two: (x, w) = parts * share exactly
            if self.overlap:
                self._w = list(weights)
            else:
                for z, x, w in zip(self._z, numerators, weights):
                    adapter_for(z).copy(z[:-1], x)
                    z[-1] = w
            return
        if self.overlap:
            self._w = [w - given * s for w, s in zip(self._w, weights)]
            return
        for z, x, w in zip(self._z, numerators, weights):
            adapter_for(z).axpy(z[:-1], -float(given), x)
            z[-1] = float(z[-1]) - given * w

    # ------------------------------------------------------------------ state sent
    def _with_shares(self, state: dict) -> dict:
        """PushSum's state dict, as the source of a join sends it: the joiners' share."""
        if self._shares is not None:
            weights, numerators, _ = self._shares
            state["weights"] = list(weights)
            if numerators is not None:
                state["numerators"] = list(numerators)
        return state

    def _load_numerators(self, state: dict, weights: list[float]) -> bool:
        """(Without overlap.) The numerators a donor sent, if any, into the pairs: True if
        they were there (else the caller rebuilds x = w * params)."""
        numerators = state.get("numerators")
        if numerators is None:
            return False
        if not isinstance(numerators, list) or len(numerators) != len(self._z):
            raise ValueError(f"{self.name} state needs {len(self._z)} numerators (one per "
                             f"bucket), got {type(numerators).__name__}")
        numerators = [_as_like(x, z) for x, z in zip(numerators, self._z)]
        for k, (z, x) in enumerate(zip(self._z, numerators)):   # all checked, then loaded
            if tuple(x.shape) != (z.shape[0] - 1,) or str(x.dtype) != str(z.dtype):
                raise ValueError(f"{self.name} numerator {k}: {tuple(x.shape)} {x.dtype}, "
                                 f"expected ({z.shape[0] - 1},) {z.dtype}")
        for z, x, w in zip(self._z, numerators, weights):
            adapter_for(z).copy(z[:-1], x)
            z[-1] = float(w)
        return True

    # ------------------------------------------------------------------ planned leaves
    def _hand_off(self, to: int) -> None:
        """A planned leaver at its boundary: send each bucket's (x, w) to rank ``to`` on the
        transport of the view it leaves, wait for the acknowledgement, and hold nothing."""
        self.flush()
        if to < 0:
            log.warning("rank %d: %s: nobody takes its mass (a leave in a recovery): lost "
                        "with it, as with a death", self._peer.rank, self.name)
            return
        comm = self._peer.channel(PeerChannel.HANDOFF)
        try:
            for i, b in enumerate(self._buckets):
                if self.overlap:
                    s = self._send[i]
                    adapter_for(s).scaled_copy(s[:-1], self._w[i], b.flat)
                    s[-1] = self._w[i]
                else:
                    s = self._z[i]
                comm.send(to, s, timeout=self.timeout)
            comm.recv(to, np.zeros(1), timeout=self.timeout)
        except PEER_FAILURES as exc:
            log.warning("rank %d: %s: handing its mass to rank %d failed (%s): lost with "
                        "it, as with a death", self._peer.rank, self.name, to, exc)
            return
        if self.overlap:
            self._w = [0.0] * len(self._w)
        else:
            for z in self._z:
                adapter_for(z).scale(z, 0.0)
        log.info("rank %d: %s: handed its mass to rank %d", self._peer.rank, self.name, to)

    def _take_handoff(self, leaver: int) -> None:
        """(The member a planned leave names.) Add rank ``leaver``'s (x, w), bucket by bucket,
        then acknowledge; a leaver lost meanwhile takes what did not arrive with it."""
        comm = self._peer.channel(PeerChannel.HANDOFF)
        self._buckets.copy_in()
        try:
            for i, (b, got) in enumerate(zip(self._buckets, self._scratch)):
                comm.recv(leaver, out=got, timeout=self.timeout)
                if self.overlap:   # m <- (w m + x_l) / (w + w_l), as an exchange's fold
                    kept, total = self._w[i], self._w[i] + float(got[-1])
                    adapter_for(b.flat).scale_add(b.flat, kept, got[:-1])
                    adapter_for(b.flat).scale(b.flat, 1.0 / total)
                    self._w[i] = total
                else:
                    z = self._z[i]
                    adapter_for(z).axpy(z, 1.0, got)
                    adapter_for(z).divide_into(b.flat, z[:-1], float(z[-1]))
            comm.send(leaver, np.ones(1), timeout=self.timeout)
        except PEER_FAILURES as exc:
            log.warning("rank %d: %s: rank %d's mass did not all arrive (%s): what did not "
                        "is lost with it", self._peer.rank, self.name, leaver, exc)
        finally:
            self._buckets.copy_out()
