"""The averaging-policy interface: how a training loop hands its parameters to the runtime and
where the communication happens in a step.

    policy = gossip.policies.Gossip().attach(peer, list(model.parameters()))
    for batch in data:
        loss(model, batch).backward()
        policy.after_backward()          # gradient-side communication (Synchronous)
        optimizer.step()
        policy.after_step()              # parameter-side communication (the others)
        optimizer.zero_grad()
    policy.close()

``gossip.DistributedOptimizer`` makes those two calls for you. Every peer of the group must
attach the same policy (same class and arguments) to the same model and call it in step.
"""
from __future__ import annotations

import abc
import logging
from typing import Any, ClassVar, ContextManager

from collectives import defaults
from collectives.arrays import adapter_for
from gossip.errors import ExchangeIncomplete, PeerLost
from gossip.policies.arguments import check_int, check_number
from gossip.policies.buckets import DEFAULT_BUCKET_BYTES, BucketSet
from gossip.policies.clock import PolicyClock
from gossip.policies.compression import Compression
from gossip.policies.membership_hooks import MembershipHooks
from gossip.policies.observability import PolicyStats
from gossip.policies.failures import PEER_FAILURES, Attempt, tolerate
from gossip.policies.nan_guard import NanGuard
from gossip.policies.neighborhood import resolve_topology
from gossip.policies.outer_step import OuterStep
from gossip.policies.policy_state import PolicyState

__all__ = ["Policy"]

log = logging.getLogger("gossip")



class Policy(PolicyStats, PolicyState, MembershipHooks, abc.ABC):
    """Base of the averaging policies.

    ``attach(peer, params)`` packs ``params`` (a list of torch tensors or numpy arrays, or a
    torch module) into contiguous buckets once; see gossip/policies/buckets.py for what that
    does to the tensors (torch: ``param.data`` becomes a view of a bucket; numpy: the arrays are
    copied into the buckets before each communication and back after).

    Observability: ``stats()`` reports steps, bytes sent (deltas of ``peer.stats()``, so any
    other traffic of the peer in the meantime is counted too), the wall time spent inside the
    policy's calls (``comm_seconds``: the communication the training loop *waits* for) and
    between them (``compute_seconds``), and with ``consensus=True`` the consensus distance.

    Timeouts: ``timeout`` (default: the peer's) bounds every wait of the policy; a wait past
    it raises gossip.OperationTimeout or gossip.PeerLost naming the rank and operation.

    ``nan_guard=True``: a step whose gradients (torch, checked in after_backward) or whose
    updated parameters (checked in after_step, before anything is sent) contain NaN or inf is
    skipped: a RuntimeWarning names the rank and step, the parameters go back to what they
    were after the previous step (a copy of the parameters is kept for that), and
    ``skip_update`` tells DistributedOptimizer not to call the optimizer. So a peer never sends
    non-finite parameters to its neighbours. Synchronous decides collectively: it checks the
    *averaged* gradients (or parameters), which are the same bytes on every replica, so a
    non-finite value on any peer makes every replica skip the same step and they stay
    identical. Skipped steps still communicate, keeping every peer's calls in step.

    ``compression`` ("fp16" | "bf16" | "int8" | "topk:RATIO" or a collectives.codecs codec):
    what the policy sends goes through that codec (each policy's docstring says what it
    compresses); top-k's error-feedback residuals are policy state (state_dict()).
    """

    #: The name under which gossip.policies.make() finds the policy.
    name: ClassVar[str] = "policy"
    #: True if the policy averages gradients, so torch gradients are packed into buckets too.
    uses_gradients: ClassVar[bool] = False
    #: True if every replica holds the same bytes after each step, so one peer's checkpoint
    #: serves them all (gossip.save_checkpoint then has rank 0 write alone).
    identical_replicas: ClassVar[bool] = False
    #: True if the peers' step counts are each their own (no peer waits for another, so they
    #: drift apart): a view change then takes each member at its next boundary instead of
    #: at one step count for all (collectives/membership/changes.py, own_steps).
    own_steps: ClassVar[bool] = False

    #: What ``topology=None`` stands for (neighborhood.PEER_TOPOLOGY or
    #: ONE_PEER_EXPONENTIAL); None: the policy runs on no graph (allreduce policies).
    default_topology: ClassVar[str | None] = None

    #: True if the nan guard judges the averaged values (identical on every replica), so
    #: every peer skips the same steps; False: each peer judges its own before sending.
    _guard_after_communication: ClassVar[bool] = False

    def __init__(self, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 timeout: float | None = None, nan_guard: bool = False,
                 compression: Any = None) -> None:
        self._bucket_bytes = check_int("bucket_bytes", bucket_bytes)
        self._compression = Compression(compression)
        self._outer: OuterStep | None = None   # averages through anchors (outer_step.py)
        self._timeout_arg = check_number("timeout", timeout, lambda t: t > 0,
                                         "a positive number of seconds", optional=True)
        self._peer: Any = None
        self._buckets: BucketSet | None = None
        self._step = 0
        self._closed = False
        self._clock = PolicyClock()
        self._bytes0 = 0
        self._messages0 = 0
        self.nan_guard = bool(nan_guard)
        self._guard: NanGuard | None = None
        self._topology_arg: Any = None   # graph policies: the topology= argument
        self._topology: Any = None       # ... resolved at attach (default_topology)
        self._rounds_skipped = 0         # exchanges abandoned by the failure rule
        self._rounds_partial = 0         # exchanges completed without a lost peer (push-sum)
        self._recovered = False          # the step in progress was taken over by a recovery
        self._before_average: list | None = None   # _average_parameters' copy, for a loss

    # ------------------------------------------------------------------ lifetime
    def attach(self, peer: Any, params: Any) -> "Policy":
        """Pack ``params`` into buckets and get ready to communicate with ``peer``'s group;
        returns the policy. Every peer must attach together (some policies communicate
        here: Synchronous broadcasts rank 0's parameters, ElasticAveraging averages the
        initial centre)."""
        if self._closed:
            raise RuntimeError(f"{self.name}: attach() after close(); make a new policy")
        if self._peer is not None:
            raise RuntimeError(f"{self.name} is already attached; make one policy per model")
        for attr in ("rank", "world_size", "allreduce", "channel"):
            if not hasattr(peer, attr):
                raise TypeError(f"peer must be a gossip.Peer (from gossip.init()), got "
                                f"{type(peer).__name__}")
        if hasattr(params, "parameters") and callable(params.parameters):
            params = list(params.parameters())  # a torch module
        buckets = BucketSet(params, bucket_bytes=self._bucket_bytes,
                            first_bucket_bytes=getattr(self, "_first_bucket_bytes", None),
                            gradients=self.uses_gradients)
        self._peer, self._buckets = peer, buckets
        self._guard = NanGuard(buckets, gradients=self.uses_gradients,
                               who=lambda: (peer.rank, self._step, self.name))
        counters = peer.stats()
        self._bytes0, self._messages0 = counters["bytes_sent"], counters["messages_sent"]
        self._codec0 = dict(counters.get("codec", {}))
        try:
            if self.default_topology is not None:
                self._topology = resolve_topology(self._topology_arg, peer,
                                                  self.default_topology)
            self._setup()
            if self.nan_guard:
                self._guard.keep()
        except BaseException:
            self._peer = self._buckets = self._topology = None
            raise
        register = getattr(peer, "register_policy", None)
        if register is not None:
            try:
                register(self)   # peer.close() closes the policy first
                attached = getattr(peer, "attached", None)
                if attached is not None:
                    attached(self)   # a joiner takes the running job's state here
            except BaseException:
                self.close()
                raise
        return self

    def _setup(self) -> None:
        """After the buckets exist: allocate the policy's own buffers, start threads."""

    def close(self) -> None:
        """Stop background threads and remove hooks; idempotent. The parameters stay where
        they are (torch: views of the buckets, which the tensors keep alive)."""
        if self._closed:
            return
        self._closed = True
        if self._peer is not None:
            try:
                self._shutdown()
            finally:
                unregister = getattr(self._peer, "unregister_policy", None)
                if unregister is not None:
                    unregister(self)

    def _shutdown(self) -> None:
        """Subclasses stop their threads and remove their hooks here."""

    def __enter__(self) -> "Policy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ the step
    def after_backward(self) -> None:
        """Gradient-side communication: call after ``loss.backward()``, before
        ``optimizer.step()``. With nan_guard, then check the gradients: see skip_update."""
        self._check_ready()
        with self._clock.inside():
            try:
                self._after_backward()
            except PeerLost as exc:
                self._recover(exc)
                return
            if self.nan_guard and not self._guard.gradients_finite():
                self._guard.skip("gradients")

    @property
    def skip_update(self) -> bool:
        """True between an after_backward() that found non-finite gradients (nan_guard) and
        the next after_step(): the optimizer step must be skipped (DistributedOptimizer
        does)."""
        return self._recovered or self._guard is not None and self._guard.skip_update

    def after_step(self) -> None:
        """Parameter-side communication: call after ``optimizer.step()``. Then, at this step
        boundary, a membership change that takes effect here (a joiner enters)."""
        self._check_ready()
        with self._clock.inside():
            if self._recovered:   # the step was taken over by the recovery: nothing to add
                self._recovered = False
                return
            self._buckets.check_bound()
            guard = self.nan_guard
            if guard and not self._guard_after_communication:
                self._guard_parameters()   # before anything is sent
            try:
                self._after_step(self._step)
            except PeerLost as exc:
                self._recover(exc)
                self._recovered = False
                return
            if guard:
                if self._guard_after_communication:
                    self._guard_parameters()
                self._guard.keep()
            self._guard.skip_update = False
            self._step += 1
            at_boundary = getattr(self._peer, "at_boundary", None)
            if at_boundary is not None and at_boundary(self, self._step):
                self._check_min_peers()

    # ------------------------------------------------------------------ nan guard
    def _guard_parameters(self) -> None:
        if self._guard.restore_if_not_finite():
            self._restored()

    def _restored(self) -> None:
        """After the guard put the last good parameters back (policies with state derived
        from the parameters resynchronise it here)."""

    # ------------------------------------------------------------------ failure rule
    def _tolerate(self, what: str, *, rank: int | None = None,
                  drop: tuple[type[BaseException], ...] = PEER_FAILURES
                  ) -> ContextManager[Attempt]:
        """The failure rule of a step (see failures.py) around the exchange ``what``:
        ``_exchange_failed`` says what a failure costs, given ``rank`` (the peer the
        exchange was with) when the failure is one of ``drop``."""
        return tolerate(lambda exc: self._exchange_failed(
            what, exc, rank if isinstance(exc, drop) else None))

    def _exchange_failed(self, what: str, exc: BaseException, rank: int | None) -> None:
        """A round skipped: the buffers keep what they held (what reached the live
        neighbours is theirs), the next round's plan leaves the lost peer out. Policies with
        per-peer partners drop ``rank`` instead. A partial exchange (ExchangeIncomplete,
        push-sum) completed over the peers that took part: it is counted, not skipped."""
        if isinstance(exc, ExchangeIncomplete):
            self._rounds_partial += 1
            log.warning("rank %d: %s %s completed without rank(s) %s: %s", self._peer.rank,
                        self.name, what, sorted(exc.missing), exc)
            return
        self._rounds_skipped += 1
        log.warning("rank %d: %s %s skipped: %s", self._peer.rank, self.name, what, exc)

    def _after_backward(self) -> None:
        """Gradient-side work (only gradient policies have any)."""

    def zero_grad(self) -> bool:
        """Zero the policy's gradient buckets in place if it has any (Synchronous with torch)
        and return True; False means the optimizer's own zero_grad() applies."""
        return False

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
            self._outer.average(self._peer, self._buckets, self.timeout)
            return
        buckets = self._buckets
        buckets.copy_in()
        keep = buckets.kind != "numpy"
        if keep and self._before_average is None:
            self._before_average = [b.new() for b in buckets]
        for b, kept in zip(buckets, self._before_average if keep else ()):
            adapter_for(kept).copy(kept, b.flat)
        work = [self._peer.allreduce(b.flat, op="mean", wait=False, timeout=self.timeout)
                for b in buckets]
        lost = None
        for w in work:
            try:
                w.wait(self.timeout)
            except PeerLost as exc:   # the others end too: none writes after the restore
                lost = lost or exc
        if lost is not None:
            if keep:
                for b, kept in zip(buckets, self._before_average):
                    adapter_for(kept).copy(b.flat, kept)
            else:
                buckets.copy_in()
            raise lost
        buckets.copy_out()

    @abc.abstractmethod
    def _after_step(self, step: int) -> None:
        """Parameter-side work of step ``step`` (0 for the first call)."""

    def _check_ready(self) -> None:
        if self._peer is None:
            raise RuntimeError(f"{self.name}: call attach(peer, params) first")
        if self._closed:
            raise RuntimeError(f"{self.name}: the policy was closed")

    # ------------------------------------------------------------------ attributes
    def _use_outer_step(self, optimizer: Any) -> None:
        """From _setup: _average_parameters goes through anchors and ``optimizer`` (a
        collective at attach: the anchors start at the replicas' mean)."""
        self._outer = OuterStep(optimizer, self._compression)
        self._outer.setup(self._peer, self._buckets, self.timeout)

    @property
    def compression(self) -> Any:
        """The policy's codec (a collectives.codecs.Codec), None without one."""
        return self._compression.codec

    @property
    def peer(self) -> Any:
        """The Peer the policy is attached to (None before attach)."""
        return self._peer

    @property
    def topology(self) -> Any:
        """The graph the policy runs on: after attach the resolved one (default_topology
        when none was given), before it the ``topology`` argument; None for policies on no
        graph."""
        return self._topology if self._topology is not None else self._topology_arg

    @property
    def buckets(self) -> BucketSet:
        """The packed parameters (numpy: refreshed from the user's arrays only around a
        communication)."""
        self._check_ready()
        return self._buckets

    @property
    def arrays(self) -> list:
        """The parameters as attached (torch: now views of the buckets; numpy: the user's own
        arrays, which the policy updates in place)."""
        self._check_ready()
        return list(self._buckets.params)

    @property
    def step(self) -> int:
        """Number of completed after_step() calls."""
        return self._step

    @property
    def timeout(self) -> float:
        """Seconds any wait of the policy may take (default: the peer's)."""
        if self._timeout_arg is not None:
            return self._timeout_arg
        return float(self._peer.timeout) if self._peer is not None else defaults.TIMEOUT

    @property
    def attached(self) -> bool:
        """True between attach() and close()'s end (also after close: the peer stays)."""
        return self._peer is not None

    @property
    def closed(self) -> bool:
        """True after close()."""
        return self._closed

    def __repr__(self) -> str:
        where = (f"attached to rank {self._peer.rank}/{self._peer.world_size}"
                 if self._peer is not None else "not attached")
        return f"<{type(self).__name__} {where}, step {self._step}>"

