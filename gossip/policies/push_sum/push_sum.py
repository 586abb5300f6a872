"""Stochastic Gradient Push (SGP): push-sum gossip on directed and time-varying graphs, and
how its mass (numerators x, weights w) follows a membership view change exactly."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from collectives import NeighborPlan
from collectives.arrays import adapter_for
from collectives.codecs import CodecSpec
from collectives.group import Switch
from gossip.errors import ExchangeIncomplete
from gossip.peer_channels import PeerChannel
from gossip.policies.base import DEFAULT_BUCKET_BYTES, PEER_FAILURES, Policy
from gossip.policies.neighborhood import ONE_PEER_EXPONENTIAL, Neighborhood, Round

if TYPE_CHECKING:
    from topologies import Topology

__all__ = ["PushSum", "weights_from_state"]

log = logging.getLogger("gossip")


def weights_from_state(state: dict, count: int, policy: str) -> list[float]:
    """``state["weights"]`` as floats, checked: one per bucket (``count``), each finite and
    positive; ValueError naming ``policy`` otherwise. The one check of the weights a state
    dict carries, for the two push-sum policies (PushSum, Asynchronous), whose models are
    de-biased so the weights are all the state they need."""
    weights = state.get("weights")
    if not isinstance(weights, (list, tuple)) or len(weights) != count:
        raise ValueError(f"{policy} state needs {count} weights (one per bucket), got "
                         f"{weights!r}")
    if not all(np.isfinite(w) and w > 0 for w in weights):
        raise ValueError(f"{policy} weights must be positive, got {weights!r}")
    return [float(w) for w in weights]


def _as_like(src: Any, dst: Any) -> Any:
    """``src`` (an array of a received state: numpy or torch) as the kind of ``dst``."""
    if isinstance(dst, np.ndarray):
        return np.asarray(src)
    import torch
    return torch.as_tensor(src, device=dst.device)


class PushSum(Policy):
    """SGP (Assran et al. 2019): each peer keeps a push-sum numerator ``x`` and a weight ``w``
    (starting at 1); every step it keeps its own share ``p_ii`` of both and sends the share
    ``p_ji`` of both to each out-neighbour ``j`` (column ``i`` of a column-stochastic matrix:
    ``topology.push_weights``), then adds what its in-neighbours sent. The model uses the
    de-biased ``x / w``, which converges to the true average of the peers even on directed
    graphs where plain gossip converges to a biased one. The weight travels with the
    parameters as one extra element at the end of each bucket's message.

    The local optimizer step is applied to the numerator: after the optimizer moved the
    parameters from ``x/w`` to ``x/w + d``, ``x <- x + d`` (SGP's update of the biased
    variable), then the exchange, then ``x/w`` is written back into the parameters.

    ``overlap=True``: the exchange of step t is launched without waiting and completed at
    step t+1 (SGP's one-step-delayed overlap): the peer keeps ``p_ii`` of its own value at
    once and adds its in-neighbours' messages one step late, so the step never waits for
    the network unless the previous exchange is still running. ``flush()`` completes the
    exchange in flight (state_dict() and close() call it). With overlap the pair is kept in
    de-biased form, the parameters being x / w themselves and w one float per bucket: the
    optimizer's move needs no update of x, and a step costs two passes over the parameters
    (the received numerators folded in, m <- (w m + sum x_j) / (w + sum w_j), and the
    scaled copy that is sent) instead of five.

    Lost peers, exactly: push-sum keeps sum x and sum w over the peers plus what is in
    transit, so a dead peer d takes away exactly *what d held*: its pair (x_d, w_d) as of
    the last round it completed (a round is complete when its messages have reached their
    destinations), plus any share that left a survivor for d without the survivor's round
    failing on d. Everything else stays with the survivors: a share d sent that a survivor
    absorbed is the survivor's; a share a survivor meant for d in a round that failed on d
    (the receive from d, or the send to it, failed) stays with that survivor, since d
    absorbs a round only after its own sends of that round left, and it sent nothing; a
    neighbour known lost when the round is planned gets no share (the fold of
    neighborhood/rounds.py). So the survivors' total is the initial total minus (x_d, w_d),
    and x/w converges to their true mean. A round with a neighbour lost during it completes over the
    others (``partial=True`` exchanges, counted in ``stats()["rounds_partial"]``). The last
    clause is empty on undirected graphs (a round that sends to d also receives from d), and
    on directed or time-varying ones covers at most one share per in-neighbour of d per
    round until its death is noticed. Not exact: a death in the middle of a round (part of
    a message received: that bucket's round is abandoned), and a live neighbour silent past
    the timeout (left out of the round like a lost one, though it may still absorb what
    was sent to it): that round's shares on the link can be lost or counted twice.

    Views (membership changes, gossip/membership/), exactly: a view changes at a step
    boundary, where nothing is in transit (with overlap, the exchange in flight is completed
    first). A joiner takes half of its donor's pair: the donor keeps (x/2, w/2) and the
    joiner gets (x/2, w/2) with the donor's parameters (x / w, bitwise), so sum x, sum w and
    every model are unchanged; k joiners from one donor take a share (x, w) / (k + 1) each
    (exact when k + 1 or k is a power of two, else within half a unit in the last place per
    element). A ``peer.leave()`` is planned: the leaver takes rounds until the boundary the
    group agrees on, then hands its (x, w), everything it holds, to the next member, which
    adds it. Then every member scales its (x, w) by n_new / n_old: x / w and the consensus
    sum x / sum w stay as they were, and the total weight, n_old, becomes n_new, the number
    of members. The topology is recomputed over the new view. A death is no view change
    (see "Lost peers"); a later change that leaves the dead out scales the survivors' pairs
    by n_new / n_old like any other, so their total weight is then n_new times (1 - w_d /
    n_old). Not exact: a leave during a recovery (the leaver's mass is lost with it, as
    with a death) and a member lost while a view settles (what it held goes with it).

    When to use it: directed or time-varying graphs (the default OnePeerExponential: one
    message per step, exact average every log2(n) steps for n a power of two), and
    unreliable peers.

    Cost per step: one message per out-neighbour, ``deg_out * (P + one element)`` bytes per
    peer for P bytes of parameters; extra memory: two buffers of the parameters' size (the
    numerator and the exchange's scratch; with overlap, the message sent and the sum of those
    received).

    ``topology``: default ``OnePeerExponential(n)``; pass ``peer.topology`` (or any graph)
    to use another; its ``push_weights`` must be column-stochastic (the topologies' default
    for directed and time-varying graphs).
    """

    name = "push-sum"
    default_topology = ONE_PEER_EXPONENTIAL
    hands_off_at_leave = True

    def __init__(self, *, topology: Topology | None = None, overlap: bool = False,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout: float | None = None,
                 nan_guard: bool = False, compression: CodecSpec = None) -> None:
        if compression is not None:
            # Its shares are scaled per destination and carry mass (x, w): a lossy codec
            # would break the mass the de-biasing relies on (future work).
            raise ValueError("PushSum does not take compression yet (its shares carry mass, "
                             "which a lossy codec would not keep); Choco or Gossip do")
        super().__init__(bucket_bytes=bucket_bytes, timeout=timeout, nan_guard=nan_guard)
        self._topology_arg = topology
        self.overlap = bool(overlap)
        self._inflight: list[Any] | None = None
        self._inflight_equal = True   # the exchange in flight sent one scaled copy to all
        # A join's shares, not yet sent: (weights, numerators or None, parts).
        self._shares: tuple[list[float], list | None, int] | None = None

    # ------------------------------------------------------------------ set-up
    def _setup(self) -> None:
        self._packed().copy_in()
        if self.overlap:
            # The de-biased pair: the parameters are x / w, and w is kept here (float64).
            self._w = [1.0] * len(self._packed())
            self._z = None
            self._send = [b.new(extra=1) for b in self._packed()]   # (share * x, share * w)
        else:
            # z = [x (numerator), w]: one buffer, so x and w travel in one message.
            self._z = []
            for b in self._packed():
                z = b.new(extra=1)
                adapter_for(z).copy(z[:-1], b.flat)
                z[-1] = 1.0
                self._z.append(z)
        # Without overlap: the exchange's scratch. With overlap: where the in-neighbours'
        # messages add up (the exchange's out), folded into the parameters one step later.
        self._scratch = [b.new(extra=1) for b in self._packed()]
        self._neighborhood = Neighborhood(self._host(), self._graph(), push=True,
                                          timeout=self.timeout)

    def _shutdown(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # closing must not fail on a peer that is gone
            log.warning("rank %d: push-sum exchange in flight at close failed: %s",
                        self._host().rank, exc)

    # ------------------------------------------------------------------ views
    @property
    def numerators(self) -> list:
        """The push-sum numerators x, one flat buffer per bucket (live views; with overlap,
        copies made now: w times the parameters)."""
        self._check_ready()
        if self.overlap:
            self._packed().copy_in()
            out = []
            for b, w in zip(self._packed(), self._w):
                x = b.new()
                adapter_for(x).scaled_copy(x, w, b.flat)
                out.append(x)
            return out
        return [z[:-1] for z in self._z]

    @property
    def weights(self) -> list[float]:
        """The push-sum weights w, one per bucket (all equal unless a bucket's message was
        lost)."""
        self._check_ready()
        if self.overlap:
            return list(self._w)
        return [float(z[-1]) for z in self._z]

    # ------------------------------------------------------------------ the step
    def _local_update(self) -> None:
        """(Without overlap.) x <- x + (params - x/w): the optimizer's move, applied to the
        numerator. Written as x * (1 - 1/w) + params so it needs no temporary (and is exact
        when w == 1)."""
        for b, z in zip(self._packed(), self._z):
            x, w = z[:-1], float(z[-1])
            adapter = adapter_for(x)
            if w == 1.0:
                adapter.copy(x, b.flat)   # regular schedules keep w at exactly one
            else:
                adapter.scale(x, 1.0 - 1.0 / w)
                adapter.axpy(x, 1.0, b.flat)

    def _debias(self) -> None:
        for b, z in zip(self._packed(), self._z):
            adapter_for(z).divide_into(b.flat, z[:-1], float(z[-1]))

    def _after_step(self, step: int) -> None:
        self._packed().copy_in()
        if self.overlap:
            # The optimizer moved the parameters, x / w: the move is in already.
            self._absorb()
            self._launch(self._neighborhood.round(step))
        else:
            self._local_update()
            # partial: see "Lost peers" above.
            plan = self._neighborhood.round(step).plan(partial=True)
            for k, (z, scratch) in enumerate(zip(self._z, self._scratch)):
                # partial: a neighbour lost during the round is left out of it and the
                # share meant for it stays here (see "Lost peers" above). Every bucket is
                # still called, to keep sequence numbers in step.
                with self._tolerate(f"round {step}, bucket {k}"):
                    self._host().neighbor_exchange(z, plan, scratch=scratch,
                                                   timeout=self.timeout)
            self._debias()
        self._packed().copy_out()

    def _launch(self, plan: Round) -> None:
        """(Overlap.) Send each out-neighbour its share of (x, w) and keep the rest: the
        parameters, x / w, stay as they are, and only w shrinks."""
        keep, shares = plan.self_weight, plan.dst_weights
        if shares is None:
            raise ValueError(f"{self.name}: a push round gives each destination its share "
                             "(dst_weights); this one has none")
        # One scaled copy serves every out-neighbour when they get equal shares (always, for
        # the topologies' push weights); otherwise the exchange scales one per destination.
        equal = len(set(shares.values())) <= 1
        share = next(iter(shares.values()), 0.0)
        work = []
        for i, (b, s, received) in enumerate(zip(self._packed(), self._send, self._scratch)):
            w = self._w[i]
            if shares:
                if equal:
                    adapter_for(s).scaled_copy(s[:-1], share * w, b.flat)
                    s[-1] = share * w
                    # What left, as the buffer's dtype holds it (float32 rounds it), so the
                    # weights kept and sent add up to w to float64 precision.
                    self._w[i] = w - len(shares) * float(s[-1])
                else:
                    adapter_for(s).scaled_copy(s[:-1], w, b.flat)
                    s[-1] = w
                    self._w[i] = w * keep
            # self_weight 0 and out=received: when it completes, received holds only what
            # the in-neighbours sent; s is only read.
            exchange = NeighborPlan(0.0, plan.src_weights, plan.dst_ranks,
                                    None if equal else shares, partial=True)
            work.append(self._host().neighbor_exchange(s, exchange, out=received, wait=False,
                                                       timeout=self.timeout))
        self._inflight = work
        self._inflight_equal = equal

    def _absorb(self) -> None:
        """(Overlap.) Complete the exchange in flight and fold what arrived, the sum of the
        in-neighbours' (x_j, w_j), into the de-biased pair:
        m <- (w m + sum x_j) / (w + sum w_j), w <- w + sum w_j."""
        work, self._inflight = self._inflight, None
        if work is None:
            return
        for i, (exchange, b, received) in enumerate(zip(work, self._packed(), self._scratch)):
            with self._tolerate(f"exchange of bucket {i}") as attempt:
                exchange.wait(self.timeout)
            if isinstance(attempt.error, ExchangeIncomplete):
                # Completed without a lost neighbour: what the others sent is in received.
                # With equal shares the exchange sent s itself, so the share of a missing
                # destination comes back here as its weight (x / w is unchanged by it);
                # with unequal ones the exchange added it to received already.
                if self._inflight_equal:
                    self._w[i] += len(attempt.error.missing_destinations) * float(
                        self._send[i][-1])
            elif attempt.failed:
                continue   # abandoned mid-message (a death mid-round): see "Lost peers"
            kept, arrived = self._w[i], float(received[-1])
            total = kept + arrived
            adapter_for(b.flat).scale_add(b.flat, kept, received[:-1])   # w m + sum x_j
            adapter_for(b.flat).scale(b.flat, 1.0 / total)
            self._w[i] = total

    def flush(self) -> None:
        """Complete the exchange in flight (overlap=True) and write the de-biased result into
        the parameters. A no-op without overlap."""
        if self._peer is None or self._inflight is None:
            return
        self._packed().copy_in()
        self._absorb()
        self._packed().copy_out()

    # ------------------------------------------------------------------ membership
    # At a committed switch (gossip/membership/controller.py, take_switch), before the new
    # view is installed:
    #
    # 1. the exchange in flight completes in the old view (``flush``, overlap=True);
    # 2. a member the commit names (``switch.handoffs``) takes a planned leaver's (x, w) on
    #    the old view's transport, adds it to its own, and acknowledges it;
    # 3. every member scales its (x, w) by n_new / n_old (x / w and the consensus sum
    #    x / sum w are unchanged, and the total weight, n_old, becomes n_new);
    # 4. the source of a join with k joiners splits its pair into k + 1 shares: each joiner
    #    takes one (the policy state it is sent: the weights and, without overlap, the
    #    numerators themselves), and the source keeps the rest once the state is sent
    #    (``state_sent``; a transfer that fails takes nothing away from it).

    def view_changing(self, switch: Switch) -> None:
        self.flush()
        self._shares = None   # a donation of a switch that failed is void: it never left
        me = switch.transport.rank
        for receiver, leaver in switch.handoffs:
            if receiver == me:
                self._take_handoff(leaver)
        old, new = self._host().world_size, len(switch.view)
        if new != old:
            self._scale(new / old)
        if me == switch.source and switch.receivers:
            self._split(len(switch.receivers) + 1)

    def view_changed(self) -> None:
        super().view_changed()   # the topology over the new view
        self._neighborhood = Neighborhood(self._host(), self._graph(), push=True,
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
        for b, z in zip(self._packed(), self._z):
            s = b.new(extra=1)
            adapter_for(s).divide_into(s, z, float(parts))
            shares.append(s)
        self._shares = ([float(s[-1]) for s in shares], [s[:-1] for s in shares], parts)

    def state_sent(self) -> None:
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
        # (No numerators: overlap=True, whose x stays in the parameters: _split.)
        if parts & given == 0:   # a power of two: (x, w) = parts * share exactly
            if numerators is None:
                self._w = list(weights)
            else:
                for z, x, w in zip(self._z, numerators, weights):
                    adapter_for(z).copy(z[:-1], x)
                    z[-1] = w
            return
        if numerators is None:
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
    def hand_off(self, to: int) -> None:
        """A planned leaver at its boundary: send each bucket's (x, w) to rank ``to`` on the
        transport of the view it leaves, wait for the acknowledgement, and hold nothing."""
        self.flush()
        if to < 0:
            log.warning("rank %d: %s: nobody takes its mass (a leave in a recovery): lost "
                        "with it, as with a death", self._host().rank, self.name)
            return
        comm = self._host().channel(PeerChannel.HANDOFF)
        try:
            for i, b in enumerate(self._packed()):
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
                        "it, as with a death", self._host().rank, self.name, to, exc)
            return
        if self.overlap:
            self._w = [0.0] * len(self._w)
        else:
            for z in self._z:
                adapter_for(z).scale(z, 0.0)
        log.info("rank %d: %s: handed its mass to rank %d", self._host().rank, self.name, to)

    def _take_handoff(self, leaver: int) -> None:
        """(The member a planned leave names.) Add rank ``leaver``'s (x, w), bucket by bucket,
        then acknowledge; a leaver lost meanwhile takes what did not arrive with it."""
        comm = self._host().channel(PeerChannel.HANDOFF)
        self._packed().copy_in()
        try:
            for i, (b, got) in enumerate(zip(self._packed(), self._scratch)):
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
                        "is lost with it", self._host().rank, self.name, leaver, exc)
        finally:
            self._packed().copy_out()

    # ------------------------------------------------------------------ checkpoints
    def _extra_state(self) -> dict:
        # x = w * (x/w) and x/w is in the parameters, so the weights are all that is needed.
        self.flush()
        return self._with_shares({"weights": self.weights})

    def _load_extra_state(self, state: dict) -> None:
        weights = weights_from_state(state, len(self._packed()), self.name)
        self.flush()
        if self.overlap:
            self._w = weights   # the parameters are x / w already
            return
        # A joiner's share, sent as it is (the parameters came with it, into the buckets:
        # no copy_in, which would take the user's arrays from before it).
        if self._load_numerators(state, weights):
            return
        self._packed().copy_in()
        for b, z, w in zip(self._packed(), self._z, weights):
            adapter_for(z).scaled_copy(z[:-1], float(w), b.flat)
            z[-1] = float(w)

    def _consensus_buffers(self) -> list:
        self.flush()
        return super()._consensus_buffers()

    def _extra_stats(self) -> dict:
        return {"weights": self.weights if self._peer is not None else [],
                "rounds_skipped": self._rounds_skipped,
                "rounds_partial": self._rounds_partial, "overlap": self.overlap,
                "topology": repr(self.topology),
                "healed_links": self._neighborhood.linked()
                if self._peer is not None else []}
