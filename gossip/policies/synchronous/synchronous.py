"""Synchronous data parallelism: gradients averaged by allreduce every step."""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

from collectives.codecs import CodecSpec
from gossip.policies.base import DEFAULT_BUCKET_BYTES
from gossip.policies.synchronous.allreduce_policy import AllreducePolicy
from gossip.policies.synchronous.outer_optimizer import SGD

__all__ = ["Synchronous", "FIRST_BUCKET_BYTES"]

# The first gradient bucket (the last layers') is small, as DDP's, so its allreduce starts
# early in the backward pass instead of waiting for 25 MiB of gradients.
FIRST_BUCKET_BYTES = 1 << 20


def _at_end_of_backward(fn: Any) -> None:
    """Run ``fn`` once the running backward pass has accumulated every gradient (called from
    a gradient hook; autograd's engine runs it before backward() returns, as DDP's reducer
    has its own final callback run)."""
    from torch.autograd import Variable   # (torch only: the hooks are torch's)
    Variable._execution_engine.queue_callback(fn)


class Synchronous(AllreducePolicy):
    """Average the gradients of every peer by allreduce each step (as torch's
    DistributedDataParallel): every replica takes the same step, so replicas stay bitwise
    identical (our allreduce delivers identical bytes to every peer).

    When to use it: a fast, reliable network and peers of equal speed; it is the reference
    the other policies are measured against. A lost peer fails the step with PeerLost.

    Cost per step: one allreduce of all gradients, ``2 (n-1)/n * P`` bytes sent per peer for
    P bytes of gradients. With torch, gradients are packed into buckets of ``bucket_bytes``
    (25 MiB; the first one 1 MiB, as DDP) and each bucket's allreduce starts (``wait=False``)
    as soon as autograd has accumulated its last gradient
    (``register_post_accumulate_grad_hook``), so communication overlaps the rest of the
    backward pass; the end of backward() waits for them (as DDP's does), so between
    ``loss.backward()`` and ``optimizer.step()`` every replica's gradients hold the mean
    (``clip_grad_norm_``, a GradScaler's unscale and checks of the gradients see the same
    values everywhere). A lost peer's error is not raised by backward(): after_backward
    (``optimizer.step()`` of a DistributedOptimizer) raises it or recovers. Buckets are
    launched in a fixed order on every peer (a bucket ready early waits for the ones before
    it), because collectives meet by sequence number.

    With numpy arrays there is no autograd: ``after_step()`` averages the parameters instead.

    ``compression``: the gradients' allreduce goes through the codec (each peer's gradient
    encoded once, summed in float32: collectives/algorithms/compressed.py; top-k with error
    feedback, its residual per bucket in state_dict()); replicas stay identical. numpy:
    the change of the parameters since the last step is compressed (outer_step.py).

    ``broadcast_start``: at attach, copy rank 0's parameters to every peer, as DDP does, since
    synchronous replicas must start identical.

    ``elastic=True``: a lost peer does not end training. The survivors agree on a new view
    (gossip/membership/) and go on from the state of the survivor that completed most steps
    (a member that finished a step the others did not hands them its state, which holds
    it), and the step the death cut off is applied exactly once on every member. With
    torch, whose gradients are averaged in after_backward, that step is begun again: its
    optimizer step is skipped (``skip_update``), after_step() does not count it, and the
    loop's next batch is that step's again (an ElasticSampler hands the step's positions out
    again, cut over the new view). With numpy, whose parameters are averaged in after_step,
    the members' own updates of that step are averaged in the new view and the step is
    counted (a dead member's update of it is lost with it). A planned ``peer.leave()``
    without ``elastic`` is taken the same way. Fewer than ``min_peers`` left raise
    PeerLost. Processes that join later (or a restarted one)
    take the running state at a step boundary. Drive the loop by ``policy.step`` (or
    ``opt.policy.step``), not by a counter of your own: after a recovery every replica goes
    on from the same step count. For gradient accumulation over several
    backward passes, run all but the last inside ``with policy.no_sync():``.
    """

    name = "synchronous"
    uses_gradients = True
    identical_replicas = True

    def max_drift(self) -> int:
        return 1   # a member's next step waits on every other's allreduce
    # The averaged gradients/parameters are the same bytes everywhere: judged after the
    # allreduce, every replica skips the same steps.
    _guard_after_communication = True

    def __init__(self, *, broadcast_start: bool = True,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout: float | None = None,
                 nan_guard: bool = False, elastic: bool = False, min_peers: int = 1,
                 compression: CodecSpec = None) -> None:
        super().__init__(bucket_bytes=bucket_bytes, timeout=timeout, nan_guard=nan_guard,
                         elastic=elastic, min_peers=min_peers, compression=compression)
        self._first_bucket_bytes = min(FIRST_BUCKET_BYTES, bucket_bytes)
        self._broadcast_start = bool(broadcast_start)
        self._hooks: list[Any] = []
        self._lock = threading.Lock()
        self._sync = True
        self._finish_queued = False   # _finish_averaging is queued to end this backward
        self._refused: str | None = None   # why _on_grad refused a gradient this step

    # ------------------------------------------------------------------ set-up
    def _setup(self) -> None:
        buckets = self._packed()
        # A joiner takes the running job's state instead (Peer.attached, after this).
        if self._broadcast_start and self._host().world_size > 1 and not self._host().joining:
            buckets.copy_in()
            for b in buckets:
                self._host().broadcast(b.flat, root=0, timeout=self.timeout)
            buckets.copy_out()
        self._work: list[Any] = [None] * len(buckets)
        self._next = 0
        if buckets.kind != "torch":
            if self.compression is not None:
                # numpy has no gradients: the change since the last average is compressed.
                self._use_outer_step(SGD())
            return
        params = buckets.params
        # How many gradients each bucket waits for (parameters that require one).
        self._need = [sum(1 for s in b.placements if params[s.index].requires_grad)
                      for b in buckets]
        self._count = [0] * len(buckets)
        self._seen: set[int] = set()
        for p in params:
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))

    def _shutdown(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        # Finish what is in flight, so no operation writes into the buckets after close().
        for work in getattr(self, "_work", []):
            if work is not None:
                try:
                    work.wait(self.timeout)
                except Exception:
                    pass

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (no communication) inside the block; the next
        backward outside it averages the accumulated gradients."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    # ------------------------------------------------------------------ hooks (autograd)
    def _on_grad(self, param: Any) -> None:
        # Runs in autograd's thread once the parameter's gradient is fully accumulated.
        b, _ = self._packed().locate(param)
        self._packed().bind_grad(param)
        if not self._sync:
            return
        with self._lock:
            key = id(param)
            refusal = None
            if key in self._seen:
                refusal = ("a gradient was accumulated twice before after_backward(): its "
                           "bucket's allreduce may already be running; for gradient "
                           "accumulation run the extra backward passes inside `with "
                           "policy.no_sync():`")
            elif b.index < self._next:
                # Its bucket went without it (the end of an earlier backward pass launches
                # every bucket): averaged now, it would not be; kept local, replicas drift.
                refusal = ("a gradient was accumulated after its bucket's allreduce began: a "
                           "second backward pass before after_backward() "
                           "(optimizer.step()); run the earlier backward passes inside `with "
                           "policy.no_sync():`")
            if refusal is not None:
                # The gradient is in its bucket already (the hook runs after accumulating):
                # the step is refused too, so no replica applies it.
                self._refused = refusal
                raise RuntimeError(f"rank {self._host().rank}: {refusal}")
            self._seen.add(key)
            self._count[b.index] += 1
            self._launch_ready()
            if not self._finish_queued:
                # As DDP: the averaging ends inside backward(), so what the loop does between
                # backward() and step() (clip_grad_norm_, a check of the gradients) sees the
                # mean on every replica, not this replica's own gradients or a partial sum.
                self._finish_queued = True
                _at_end_of_backward(self._finish_averaging)

    def _launch_ready(self) -> None:
        buckets = self._packed().buckets
        while self._next < len(buckets) and (self._count[self._next] >= self._need[self._next]):
            self._launch(self._next)
            self._next += 1

    def _launch(self, k: int) -> None:
        b = self._packed().buckets[k]
        if self._need[k] == 0:
            return  # frozen parameters only: nothing to average
        self._work[k] = self._host().allreduce(b.grad, op="mean", wait=False,
                                               timeout=self.timeout,
                                               **self._compression.kwargs(k, b.grad))

    def _finish_averaging(self) -> None:
        """The end of a backward pass that averages (autograd runs it once every gradient is
        accumulated): launch the buckets not launched yet and wait for every bucket's
        allreduce, so the gradients hold the mean when backward() returns. An error is left
        for after_backward (the same Work raises it again there), where a lost peer is
        recovered from: backward() itself does not raise it."""
        self._finish_queued = False
        with self._lock:
            self._launch_rest()
            work = list(self._work)
        for w in work:
            if w is not None:
                try:
                    w.wait(self.timeout)
                except Exception:   # after_backward raises it (Work keeps its error)
                    return

    def _launch_rest(self) -> None:
        # (under _lock) Parameters that got no gradient this step (unused in the forward
        # pass, or no backward at all) take part with a zero gradient, so every peer launches
        # the same buckets and every replica applies the same update.
        if self._next < len(self._packed()):
            for p in self._packed().params:
                if p.requires_grad and id(p) not in self._seen:
                    self._packed().bind_grad(p)
            while self._next < len(self._packed()):
                self._launch(self._next)
                self._next += 1

    # ------------------------------------------------------------------ the step
    def _after_backward(self) -> None:
        if self._packed().kind != "torch":
            return
        with self._lock:
            self._launch_rest()   # (done already where a backward pass ended)
            work, self._work = self._work, [None] * len(self._packed())
            self._next = 0
            self._count = [0] * len(self._packed())
            self._seen.clear()
        for w in work:
            if w is not None:
                w.wait(self.timeout)
        refused, self._refused = self._refused, None
        if refused is not None:
            raise RuntimeError(f"rank {self._host().rank}: this step's gradients are not the "
                               f"replicas' mean, so the step is refused: {refused}")

    def _after_step(self, step: int) -> None:
        if self._packed().kind == "torch":
            return
        # numpy: no gradients to hook, so the replicas are averaged after the local step.
        self._average_parameters()

    def zero_grad(self) -> bool:
        """Zero the gradient buckets in place (keeping ``param.grad`` bound to them, so the
        next backward accumulates straight into the buckets: no copy). Returns False when
        there are no gradient buckets (numpy)."""
        self._check_ready()
        if self._packed().kind != "torch":
            return False
        self._packed().zero_grads()
        return True
