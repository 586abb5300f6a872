"""What a policy reports about itself (Policy.stats): steps, traffic, the split of wall time
between communication and computation, and on request the consensus distance. A mixin of
Policy; the attributes it reads (_peer, _buckets, _clock, ...) are Policy's."""
from __future__ import annotations

from gossip.policies.consensus import consensus_distance

__all__ = ["PolicyStats"]


class PolicyStats:
    """Policy's observability side."""

    def stats(self, consensus: bool = False) -> dict:
        """Counters of this peer's policy. ``consensus=True`` also measures the consensus
        distance, which is a collective: every peer must call it together."""
        self._check_ready()
        counters = self._peer.stats()
        sent = counters["bytes_sent"] - self._bytes0
        comm, compute = self._clock.comm_seconds, self._clock.compute_seconds
        out = {
            "policy": self.name,
            "rank": self._peer.rank,
            "steps": self._step,
            "bytes_sent": sent,
            "messages_sent": counters["messages_sent"] - self._messages0,
            "bytes_per_step": sent / self._step if self._step else 0.0,
            "comm_seconds": comm,
            "compute_seconds": compute,
            "comm_fraction": comm / (comm + compute) if comm + compute > 0 else 0.0,
            "parameters_bytes": self._buckets.nbytes,
            "lost_peers": sorted(self._peer.lost_peers()),
            "skipped_steps": self._guard.skipped_steps,
        }
        out.update(self._compression.stats())
        codec = counters.get("codec")
        if self._compression.codec is not None and codec:
            # What the policy's codec took in (float32 bytes) and gave out, per step: the
            # wire's own count is bytes_per_step.
            steps = max(self._step, 1)
            out["codec_bytes_per_step"] = {
                what: (codec[what] - self._codec0.get(what, 0)) / steps
                for what in ("raw_bytes", "encoded_bytes")}
        out.update(self._extra_stats())
        if consensus:
            out["consensus_distance"] = self.consensus_distance()
        return out

    def _extra_stats(self) -> dict:
        return {}

    def _consensus_buffers(self) -> list:
        """The flat buffers whose disagreement consensus_distance() measures: the
        parameters the model uses (de-biased ones, for push-sum)."""
        self._buckets.copy_in()
        return [b.flat for b in self._buckets]

    def consensus_distance(self) -> float:
        """||x_i - mean_j x_j|| (over every parameter) averaged over the peers, by two
        allreduces on the peer's main channel: a collective, so every peer must call it at
        the same point. Allocates a copy of the parameters (a diagnostic, not a step)."""
        self._check_ready()
        return consensus_distance(self._peer, self._consensus_buffers(), self.timeout)
