"""Local SGD: local steps, parameters averaged by allreduce every ``period`` steps; with an
outer optimizer, DiLoCo."""
from __future__ import annotations

import warnings


from collectives.codecs import CodecSpec
from gossip.policies.base import DEFAULT_BUCKET_BYTES, check_int
from gossip.policies.synchronous.allreduce_policy import AllreducePolicy
from gossip.policies.synchronous.outer_optimizer import SGD, resolve_outer_optimizer

__all__ = ["LocalSGD"]


class LocalSGD(AllreducePolicy):
    """Each peer takes ``period`` local optimizer steps, then the parameters are averaged by
    allreduce (as torch's PeriodicModelAverager; Lin et al., "Don't use large mini-batches,
    use local SGD"). During the first ``warmup_steps`` steps they are averaged every step, which
    stabilises the early, high-curvature phase.

    When to use it: communication is the bottleneck and the peers are of equal speed; a
    larger period trades accuracy for bandwidth. A lost peer fails the averaging step with
    PeerLost, unless ``elastic=True``: then the survivors re-form the group as Synchronous's do
    (fewer than ``min_peers``: PeerLost): the averaging cut by the death is completed over
    the survivors in the new view, their local updates of that step applied once (the
    step is counted; AllreducePolicy), a survivor behind the others (its averaging failed
    where theirs completed) takes the state of the one that completed most steps, and
    joiners take a member's state at a step boundary. The outer step of DiLoCo likewise:
    a failed one leaves anchors and momentum as they were, and is completed. Optimizer state (momentum, Adam moments) stays local and is not averaged.

    Cost: one allreduce of the parameters every ``period`` steps, i.e. about
    ``2 (n-1)/n * P / period`` bytes sent per peer per step for P bytes of parameters; the
    steps in between cost nothing.

    ``outer_optimizer`` (DiLoCo, Douillard et al. 2023): an average becomes an outer step.
    Each replica's pseudo-gradient, anchor - x_i (anchor: the parameters after the last
    outer step, identical everywhere), is averaged by allreduce, and the outer optimizer
    moves the anchor by it; the replicas continue from the new anchor. ``"diloco"`` or
    ``SGD.diloco()`` is DiLoCo's: Nesterov momentum 0.9, lr 0.7 (gossip.policies.DILOCO);
    ``SGD(lr=1)`` is plain LocalSGD (to float32 rounding). Anchors and momentum buffers are
    policy state (checkpoints, joiners); attach averages the start once to agree on the
    anchor. ``compression``: the pseudo-gradient goes through the codec (any codec, top-k
    with error feedback); with a codec and no outer optimizer, SGD(lr=1) is used.
    Overlapping the outer step with the next inner steps (streaming DiLoCo) is not done.
    """

    name = "local-sgd"
    # After a death a survivor may still be inside an averaging the others completed (the
    # dead peer's last message to it was lost): it holds its model from before that average,
    # so it must take the source's state, not go on from its own (seen: 7/3 for 2.5 on every
    # replica after the averaging was done again).
    shared_state = True

    def __init__(self, period: int = 4, *, warmup_steps: int = 0,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout: float | None = None,
                 nan_guard: bool = False, elastic: bool = False, min_peers: int = 1,
                 outer_optimizer: SGD | str | None = None, compression: CodecSpec = None) -> None:
        super().__init__(bucket_bytes=bucket_bytes, timeout=timeout, nan_guard=nan_guard,
                         elastic=elastic, min_peers=min_peers, compression=compression)
        self.outer_optimizer = resolve_outer_optimizer(outer_optimizer)
        self.period = check_int("period", period, 1)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, 0)
        if period == 1 and self.outer_optimizer is None and compression is None:
            # As torch's PeriodicModelAverager: legal, but not what the user likely meant.
            warnings.warn("LocalSGD(period=1) averages the parameters after every step: that "
                          "is plain synchronous SGD (use Synchronous, which also overlaps "
                          "communication with backward)", UserWarning, stacklevel=2)

    def max_drift(self) -> int:
        return self.period   # the steps between averagings wait on nobody

    def averages_at(self, step: int) -> bool:
        """Whether after_step() of step ``step`` (0-based) averages the parameters."""
        if step < self.warmup_steps:
            return True
        return (step - self.warmup_steps + 1) % self.period == 0

    def _setup(self) -> None:
        if self.outer_optimizer is not None or self.compression is not None:
            self._use_outer_step(self.outer_optimizer or SGD())

    def _after_step(self, step: int) -> None:
        if not self.averages_at(step):
            return
        self._average_parameters()

    def _extra_stats(self) -> dict:
        return {"period": self.period, "warmup_steps": self.warmup_steps,
                "outer_optimizer": repr(self.outer_optimizer) if self.outer_optimizer
                else None}
