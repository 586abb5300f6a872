"""The outer step: averaging parameters through their change since the last average.

Every replica keeps an *anchor* per bucket, the parameters of the last average (the same
bytes on every replica). An average sends the pseudo-gradient g_i = anchor - x_i (through the
policy's codec, with error feedback for top-k), allreduces its mean, and the outer optimizer
moves the anchor by it; every replica then continues from the new anchor. With
``SGD(lr=1)`` the new anchor is anchor - mean(anchor - x_i) = mean(x_i), plain averaging up to
float32 rounding; with ``SGD.diloco()`` it is DiLoCo. A codec here compresses the change
over a period, which is small and gradient-like, never the parameters themselves, so top-k
is meaningful too.

The anchors (float32) and the outer optimizer's buffers are policy state. At attach, the
anchors are the replicas' mean (one uncompressed allreduce), so they agree from the start;
a joiner takes them from the running job instead.
"""
from __future__ import annotations

from typing import Any

from collectives.arrays import adapter_for
from collectives.codecs import as_float32, write_back
from gossip.errors import PeerLost
from gossip.policies.base import BucketSet, Compression, PolicyHost
from gossip.policies.synchronous.outer_optimizer import SGD

__all__ = ["OuterStep"]


class OuterStep:
    """Anchors, pseudo-gradients and the outer optimizer of one policy's buckets."""

    def __init__(self, optimizer: SGD, compression: Compression) -> None:
        self.optimizer = optimizer
        self.compression = compression
        self._anchors: list[Any] = []
        self._deltas: list[Any] = []

    @staticmethod
    def _params32(b: Any) -> Any:
        adapter = adapter_for(b.flat)
        return as_float32(adapter, b.flat, adapter.dtype_name(b.flat))

    def setup(self, peer: PolicyHost, buckets: BucketSet, timeout: float) -> None:
        """Anchors from the replicas' mean (a collective; a joiner, which takes the running
        job's anchors afterwards, skips it)."""
        buckets.copy_in()
        self._anchors = [adapter_for(p).clone(p) for p in map(self._params32, buckets)]
        self._deltas = [adapter_for(a).clone(a) for a in self._anchors]
        if peer.world_size > 1 and not peer.joining:
            for a in self._anchors:
                peer.allreduce(a, op="mean", timeout=timeout)

    def average(self, peer: PolicyHost, buckets: BucketSet, timeout: float) -> None:
        """One outer step. A peer lost meanwhile (PeerLost) leaves parameters and anchors as
        they were: only the pseudo-gradient buffers are communicated."""
        buckets.copy_in()
        work = []
        for k, (b, anchor, delta) in enumerate(zip(buckets, self._anchors, self._deltas)):
            adapter = adapter_for(delta)
            adapter.copy(delta, anchor)
            adapter.axpy(delta, -1.0, self._params32(b))     # g_i = anchor - x_i
            work.append(peer.allreduce(delta, op="mean", wait=False, timeout=timeout,
                                       **self.compression.kwargs(k, delta)))
        lost = None
        for w in work:
            try:
                w.wait(timeout)
            except PeerLost as exc:
                lost = lost or exc
        if lost is not None:
            raise lost
        for k, (b, anchor, delta) in enumerate(zip(buckets, self._anchors, self._deltas)):
            self.optimizer.step(k, anchor, delta)
            adapter = adapter_for(b.flat)
            write_back(adapter, b.flat, anchor)
        buckets.copy_out()

    def state(self) -> dict:
        return {"anchors": [adapter_for(a).clone(a) for a in self._anchors],
                "optimizer": self.optimizer.state()}

    def load(self, state: Any) -> None:
        anchors = state.get("anchors") if isinstance(state, dict) else None
        if not isinstance(anchors, (list, tuple)) or len(anchors) != len(self._anchors) or \
                any(tuple(a.shape) != tuple(m.shape) for a, m in zip(anchors, self._anchors)):
            raise ValueError(f"outer step state needs {len(self._anchors)} anchors of the "
                             "buckets' sizes")
        self.optimizer.load(state.get("optimizer", {}))
        for mine, theirs in zip(self._anchors, anchors):
            adapter_for(mine).copy(mine, theirs)
