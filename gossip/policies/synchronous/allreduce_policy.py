"""The allreduce policies' common base (Synchronous, LocalSGD): every replica's parameters
replaced by the replicas' mean, directly or through an outer step (outer_step.py: a codec,
or DiLoCo's outer optimizer), and the elastic re-forming of the group after a death."""
from __future__ import annotations

from typing import Any

from collectives.arrays import adapter_for
from collectives.codecs import CodecSpec
from gossip.errors import PeerLost
from gossip.policies.base import DEFAULT_BUCKET_BYTES, Policy, check_int
from gossip.policies.synchronous.outer_step import OuterStep

__all__ = ["AllreducePolicy"]


class AllreducePolicy(Policy):
    """A policy whose replicas agree by allreduce. ``elastic=True``: a lost peer does not end
    training; the survivors agree on a new view and go on (fewer than ``min_peers``:
    PeerLost). The outer step's anchors and optimizer state are policy state
    (``state_dict()["outer"]``).

    A step whose averaging a recovery cuts off is completed in the new view: an averaging
    that fails leaves every member's parameters (its local update in them) and the outer
    step's state as they were (_average_parameters), so it is run again over the members
    of the new view and counted, and the step's local update is applied once (Policy's
    after_step). With a top-k codec the error-feedback residuals an attempt that failed
    had updated stay so, and that step's compressed update is not exact."""

    completes_interrupted_steps = True

    def __init__(self, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 timeout: float | None = None, nan_guard: bool = False, elastic: bool = False,
                 min_peers: int = 1, compression: CodecSpec = None) -> None:
        super().__init__(bucket_bytes=bucket_bytes, timeout=timeout, nan_guard=nan_guard,
                         compression=compression)
        self.elastic = bool(elastic)
        self.min_peers = check_int("min_peers", min_peers, 1)
        self._outer: OuterStep | None = None   # averages through anchors (outer_step.py)
        self._before_average: list | None = None   # _average_parameters' copy, for a loss

    def _use_outer_step(self, optimizer: Any) -> None:
        """From _setup: _average_parameters goes through anchors and ``optimizer`` (a
        collective at attach: the anchors start at the replicas' mean)."""
        self._outer = OuterStep(optimizer, self._compression)
        self._outer.setup(self._host(), self._packed(), self.timeout)

    def _average_parameters(self) -> None:
        """Replace every replica's parameters by their mean: one non-blocking allreduce per
        bucket, all in flight at once, then wait for them (each bounded by the timeout).

        A peer lost meanwhile (PeerLost) leaves the parameters as they were before: an
        allreduce ended half-way holds partial sums in the buckets (x_i + x_j after a first
        recursive-doubling stage), and a torch model's parameters are views of them, so an
        elastic recovery (or a leave) would go on from those sums (seen: LocalSGD's replicas
        at twice their mean after a death, its model saturated). torch: costs one copy of the
        parameters per averaging, into buffers kept from the first; numpy: none, the user's
        arrays are the copy (the buckets are packed from them again). With an outer step (a
        codec, or LocalSGD's outer optimizer) the change since the last average travels
        instead (outer_step.py)."""
        if self._outer is not None:
            self._outer.average(self._host(), self._packed(), self.timeout)
            return
        buckets = self._packed()
        buckets.copy_in()
        keep = buckets.kind != "numpy"
        if keep and self._before_average is None:
            self._before_average = [b.new() for b in buckets]
        copies = (self._before_average or []) if keep else []
        for b, kept in zip(buckets, copies):
            adapter_for(kept).copy(kept, b.flat)
        work = [self._host().allreduce(b.flat, op="mean", wait=False, timeout=self.timeout)
                for b in buckets]
        lost = None
        for w in work:
            try:
                w.wait(self.timeout)
            except PeerLost as exc:   # the others end too: none writes after the restore
                lost = lost or exc
        if lost is not None:
            if keep:
                for b, kept in zip(buckets, copies):
                    adapter_for(kept).copy(b.flat, kept)
            else:
                buckets.copy_in()
            raise lost
        buckets.copy_out()

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        state = super().state_dict()
        if self._peer is not None and self._outer is not None:
            state["outer"] = self._outer.state()
        return state

    def _load_extra_state(self, state: dict) -> None:
        if self._outer is not None:
            self._outer.load(state.get("outer"))
