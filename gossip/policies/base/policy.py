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

Policy is whole here: the step and its failure rule, what it reports (stats), what it saves
(state_dict) and how it takes part in a membership change (the hooks the peer's membership
controller calls, gossip/membership/contracts.py's MembershipParticipant). What it may ask of
the peer is base/policy_host.py's PolicyHost.
"""
from __future__ import annotations

import abc
import logging
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar, ContextManager, Protocol, TypeVar

import numpy as np

from collectives import defaults
from collectives.arrays import Array
from collectives.codecs import Codec, CodecSpec
from collectives.group import Switch
from gossip.errors import ExchangeIncomplete, PeerLost, ViewChanging
from gossip.policies.base.arguments import check_int, check_number
from gossip.policies.base.buckets import DEFAULT_BUCKET_BYTES, BucketSet
from gossip.policies.base.clock import PolicyClock
from gossip.policies.base.compression import Compression
from gossip.policies.base.failures import PEER_FAILURES, Attempt, tolerate
from gossip.policies.base.nan_guard import NanGuard
from gossip.policies.base.policy_host import PolicyHost
from gossip.policies.neighborhood import resize_topology, resolve_topology

if TYPE_CHECKING:
    import torch

    from topologies import Topology

__all__ = ["Policy", "ParameterSource"]

log = logging.getLogger("gossip")

_P = TypeVar("_P", bound="Policy")   # attach() returns the policy as its own class


class ParameterSource(Protocol):
    """What ``Policy.attach`` takes besides a list of arrays: an object whose
    ``parameters()`` are the arrays (a torch.nn.Module)."""

    def parameters(self) -> Iterable[Array]:
        """The parameters, in a fixed order."""
        ...


class Policy(abc.ABC):
    """Base of the averaging policies.

    ``attach(peer, params)`` packs ``params`` (a list of torch tensors or numpy arrays, or a
    torch module) into contiguous buckets once; see gossip/policies/base/buckets.py for what
    that does to the tensors (torch: ``param.data`` becomes a view of a bucket; numpy: the
    arrays are copied into the buckets before each communication and back after).

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

    Membership (gossip/membership/): a change of the group's view reaches every attached
    policy through its public hooks, in this order at a committed switch: ``view_changing``
    (old view's transport), ``view_changed`` (the new one installed), ``took_state`` or
    ``state_sent`` (the members the commit names), ``resume_at``, ``settle_view``; a planned
    leaver's ``hand_off`` at its boundary. ``elastic`` and ``min_peers`` are set by the
    policies that can re-form their group after a death.
    """

    #: The name under which gossip.policies.make() finds the policy.
    name: ClassVar[str] = "policy"
    #: Other names it answers to (registry.make, and the "policy" of a saved state dict).
    aliases: ClassVar[tuple[str, ...]] = ()
    #: True if the policy averages gradients, so torch gradients are packed into buckets too.
    uses_gradients: ClassVar[bool] = False
    #: True if every replica holds the same bytes after each step, so one peer's checkpoint
    #: serves them all (gossip.save_checkpoint then has rank 0 write alone).
    identical_replicas: ClassVar[bool] = False
    #: True if the peers' step counts are each their own (no peer waits for another, so they
    #: drift apart): a view change then takes each member at its next boundary instead of
    #: at one step count for all (collectives/group/changes.py, own_steps).
    own_steps: ClassVar[bool] = False

    #: What ``topology=None`` stands for (neighborhood.PEER_TOPOLOGY or
    #: ONE_PEER_EXPONENTIAL); None: the policy runs on no graph (allreduce policies).
    default_topology: ClassVar[str | None] = None

    #: True if the nan guard judges the averaged values (identical on every replica), so
    #: every peer skips the same steps; False: each peer judges its own before sending.
    _guard_after_communication: ClassVar[bool] = False
    #: The size of the first bucket, when it differs (Synchronous's small first gradient
    #: bucket); None: every bucket holds about bucket_bytes.
    _first_bucket_bytes: int | None = None

    #: Whether a PeerLost out of ``_after_step`` leaves the parameters and the policy's state
    #: as they were before the step's communication (this member's local update in them),
    #: so that the step can be completed in the re-formed view by running that
    #: communication again (the allreduce policies). False: an interrupted step's
    #: communication is abandoned where it stopped and the step is not counted; the next
    #: after_step() takes a new local update and communicates again.
    completes_interrupted_steps: ClassVar[bool] = False

    #: Whether a lost peer makes the survivors re-form the group (a view change) instead of
    #: failing the step; below ``min_peers`` members that is PeerLost.
    elastic: bool = False
    min_peers: int = 1
    #: Whether the policy follows a view change (a join, a restart, an elastic recovery).
    #: Those that do not yet make the group refuse joiners while they are attached.
    follows_view_changes: ClassVar[bool] = True

    # (Read-only properties, so that a policy may answer per instance: elastic averaging's
    # depend on its centre; a subclass answering for all its instances sets a class
    # attribute.)
    @property
    def hands_off_at_leave(self) -> bool:
        """Whether ``peer.leave()`` must be planned at a step boundary the group agrees on,
        the leaver taking rounds until then and handing its state to a member there
        (push-sum's mass); False: the leave takes effect at once
        (collectives/group/changes.py)."""
        return False

    @property
    def shared_state(self) -> bool:
        """Whether part of the state is the same bytes on every member although the models
        are each their own (elastic averaging's replicated centre, local SGD's last
        average): after a recovery a member behind the source's step count takes the
        source's state, as identical replicas do. A member behind is one whose collective
        failed where the others' completed (its last send to it was lost with the dead
        peer): going on from its own state would leave it out of a round the others counted
        it in."""
        return False

    def __init__(self, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 timeout: float | None = None, nan_guard: bool = False,
                 compression: CodecSpec = None) -> None:
        self._bucket_bytes = check_int("bucket_bytes", bucket_bytes)
        self._compression = Compression(compression)
        self._timeout_arg = check_number("timeout", timeout, lambda t: t > 0,
                                         "a positive number of seconds", optional=True)
        self._peer: PolicyHost | None = None
        self._buckets: BucketSet | None = None
        self._step = 0
        self._closed = False
        # The last consensus_distance() measured (stats() shows it; None before the first).
        self._consensus_last: float | None = None
        self._clock = PolicyClock()
        self._bytes0 = 0
        self._messages0 = 0
        self._codec0: dict[str, int] = {}
        self.nan_guard = bool(nan_guard)
        self._guard: NanGuard | None = None
        self._topology_arg: Topology | None = None   # graph policies: the topology= argument
        self._topology: Topology | None = None       # ... resolved at attach (default_topology)
        self._rounds_skipped = 0         # exchanges abandoned by the failure rule
        self._rounds_partial = 0         # exchanges completed without a lost peer (push-sum)
        self._recoveries = 0             # steps a lost peer cut off, recovered from (elastic)
        self._recovered = False          # after_backward's step was taken over by a recovery
        # The state holds an update of step self._step not yet combined (resume_at): the
        # step is completed by its communication alone, with no local update.
        self._owed = False
        #: The torch optimizer whose state travels with the policy's when a member takes
        #: another's state (DistributedOptimizer sets it): a joiner's momentum must be the
        #: replicas', or its steps would differ. None: the parameters and the policy only.
        self.transfer_optimizer: torch.optim.Optimizer | None = None

    # ------------------------------------------------------------------ lifetime
    def attach(self: _P, peer: PolicyHost, params: Iterable[Array] | ParameterSource, *,
               names: Sequence[str] | None = None) -> _P:
        """Pack ``params`` (a list of arrays or tensors, or a torch module: its parameters,
        named) into buckets and get ready to communicate with ``peer``'s group; returns the
        policy. ``names``: the parameters' names, one each, for errors (a joiner whose model
        differs is told which parameter). Every peer must attach together (some policies
        communicate here: Synchronous broadcasts rank 0's parameters, ElasticAveraging
        averages the initial centre)."""
        if self._closed:
            raise RuntimeError(f"{self.name}: attach() after close(); make a new policy")
        if self._peer is not None:
            raise RuntimeError(f"{self.name} is already attached; make one policy per model")
        for attr in ("rank", "world_size", "allreduce", "channel"):
            if not hasattr(peer, attr):
                raise TypeError(f"peer must be a gossip.Peer (from gossip.init()), got "
                                f"{type(peer).__name__}")
        if hasattr(params, "named_parameters") and callable(params.named_parameters):
            named = list(params.named_parameters())  # a torch module
            params = [p for _, p in named]
            names = names if names is not None else [n for n, _ in named]
        elif hasattr(params, "parameters") and callable(params.parameters):
            params = list(params.parameters())
        if not isinstance(params, Iterable):
            raise TypeError(f"params must be arrays or tensors, or a torch module, got "
                            f"{type(params).__name__}")
        buckets = BucketSet(params, bucket_bytes=self._bucket_bytes,
                            first_bucket_bytes=self._first_bucket_bytes,
                            gradients=self.uses_gradients, names=names)
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
        try:
            peer.register_policy(self)   # peer.close() closes the policy first
            peer.attached(self)          # a joiner takes the running job's state here
            if self._owed:
                # Admitted by a recovery whose source was inside a step: that step is the
                # members' next collective, and this joiner completes it with them.
                with self._clock.inside():
                    self._communicate()
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
                self._peer.unregister_policy(self)

    def _shutdown(self) -> None:
        """Subclasses stop their threads and remove their hooks here."""

    def __enter__(self: _P) -> _P:
        return self

    def __exit__(self, *exc: object) -> None:
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
                # Nothing of the step is in the parameters yet: unless the state taken holds
                # the source's update (after_step completes it), the step is begun again.
                self._recover(exc, pending=False)
                self._recovered = True
                return
            if self.nan_guard and not self._nan_guard().gradients_finite():
                self._nan_guard().skip("gradients")

    @property
    def skip_update(self) -> bool:
        """True between an after_backward() that found non-finite gradients (nan_guard) and
        the next after_step(): the optimizer step must be skipped (DistributedOptimizer
        does)."""
        return self._recovered or self._guard is not None and self._guard.skip_update

    def after_step(self) -> None:
        """Parameter-side communication: call after ``optimizer.step()``. Then, at this step
        boundary, a membership change that takes effect here (a joiner enters).

        A recovery that cuts the step's communication off (a death with ``elastic``, or a
        leave at once) ends with the group going on from one step count S, and the step is
        applied exactly once on every member: a member whose state holds an update of step
        S not yet combined (its own local update, with a policy that completes interrupted
        steps, or the update of the member whose state it took) completes step S in the new
        view, by the communication alone, and counts it; every other member begins step S
        again (after_step returns without counting it: the loop's next local update is step
        S's). collectives/group/changes.py has the protocol's side."""
        self._check_ready()
        with self._clock.inside():
            if self._recovered:   # after_backward's recovery took the step over
                self._recovered = False
                if not self._owed:   # begun again: the optimizer step was skipped
                    return
            else:
                self._packed().check_bound()
                if self.nan_guard and not self._guard_after_communication:
                    self._guard_parameters()   # before anything is sent
            self._communicate()

    def _communicate(self) -> None:
        """Step self._step's communication, then count it and take the boundary's view
        change; done again in each new view while a recovery leaves the step owed to it
        (after_step's docstring), returning without a count when the step is begun again."""
        while True:
            self._owed = False
            try:
                self._after_step(self._step)
            except PeerLost as exc:
                self._recover(exc, pending=self.completes_interrupted_steps)
                if self._owed:
                    continue
                return
            if self.nan_guard:
                if self._guard_after_communication:
                    self._guard_parameters()
                self._nan_guard().keep()
            self._nan_guard().skip_update = False
            self._step += 1
            if self._host().at_boundary(self, self._step):
                self._check_min_peers()
                if self._owed:   # it took a state holding the source's update of this step
                    continue
            return

    @abc.abstractmethod
    def _after_step(self, step: int) -> None:
        """Parameter-side work of step ``step`` (0 for the first call)."""

    def _after_backward(self) -> None:
        """Gradient-side work (only gradient policies have any)."""

    def zero_grad(self) -> bool:
        """Zero the policy's gradient buckets in place if it has any (Synchronous with torch)
        and return True; False means the optimizer's own zero_grad() applies."""
        return False

    def _check_ready(self) -> None:
        if self._peer is None:
            raise RuntimeError(f"{self.name}: call attach(peer, params) first")
        if self._closed:
            raise RuntimeError(f"{self.name}: the policy was closed")

    def _host(self) -> PolicyHost:
        """The peer the policy is attached to, for what runs attached (a step, a round, a
        view change's hook); RuntimeError before attach."""
        if self._peer is None:
            raise RuntimeError(f"{self.name}: call attach(peer, params) first")
        return self._peer

    def _packed(self) -> BucketSet:
        """The buckets the parameters were packed into at attach; RuntimeError before."""
        if self._buckets is None:
            raise RuntimeError(f"{self.name}: call attach(peer, params) first")
        return self._buckets

    def _graph(self) -> Topology:
        """The graph a graph policy runs on, resolved at attach (default_topology);
        RuntimeError before, or for a policy on no graph."""
        if self._topology is None:
            raise RuntimeError(f"{self.name}: no graph (before attach, or a policy on none)")
        return self._topology

    def _nan_guard(self) -> NanGuard:
        """The nan guard made at attach (it watches the buckets); RuntimeError before."""
        if self._guard is None:
            raise RuntimeError(f"{self.name}: call attach(peer, params) first")
        return self._guard

    # ------------------------------------------------------------------ nan guard
    def _guard_parameters(self) -> None:
        if self._nan_guard().restore_if_not_finite():
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
            log.warning("rank %d: %s %s completed without rank(s) %s: %s", self._host().rank,
                        self.name, what, sorted(exc.missing), exc)
            return
        self._rounds_skipped += 1
        log.warning("rank %d: %s %s skipped: %s", self._host().rank, self.name, what, exc)

    # ------------------------------------------------------------------ observability
    def stats(self, consensus: bool = False) -> dict:
        """Counters of this peer's policy. ``consensus=True`` also measures the consensus
        distance, which is a collective: every peer must call it together."""
        self._check_ready()
        counters = self._host().stats()
        sent = counters["bytes_sent"] - self._bytes0
        comm, compute = self._clock.comm_seconds, self._clock.compute_seconds
        out = {
            "policy": self.name,
            "rank": self._host().rank,
            "steps": self._step,
            "bytes_sent": sent,
            "messages_sent": counters["messages_sent"] - self._messages0,
            "bytes_per_step": sent / self._step if self._step else 0.0,
            "comm_seconds": comm,
            "compute_seconds": compute,
            "comm_fraction": comm / (comm + compute) if comm + compute > 0 else 0.0,
            "parameters_bytes": self._packed().nbytes,
            "lost_peers": sorted(self._host().lost_peers()),
            "skipped_steps": self._nan_guard().skipped_steps,
            "recoveries": self._recoveries,
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
        if self._consensus_last is not None:
            # The last consensus_distance() any caller measured (stats() itself measures
            # only when asked: it is a collective).
            out["consensus_distance_last"] = self._consensus_last
        return out

    def _extra_stats(self) -> dict:
        return {}

    def _consensus_buffers(self) -> list:
        """The flat buffers whose disagreement consensus_distance() measures: the
        parameters the model uses (de-biased ones, for push-sum)."""
        self._packed().copy_in()
        return [b.flat for b in self._packed()]

    def consensus_distance(self) -> float:
        """||x_i - mean_j x_j|| (over every parameter) averaged over the peers, by
        allreduces on the peer's main channel: a collective, so every peer must call it at
        the same point. Allocates a float64 copy of the parameters (a diagnostic, not a
        step)."""
        self._check_ready()
        peer, timeout = self._host(), self.timeout
        total = 0.0
        for flat in self._consensus_buffers():
            # In float64: a float32 mean rounds, and identical replicas would read as apart.
            if isinstance(flat, np.ndarray):
                mine = flat.astype(np.float64)
            else:
                mine = flat.detach().double().contiguous()
            mean = mine.copy() if isinstance(mine, np.ndarray) else mine.clone()
            peer.allreduce(mean, op="mean", timeout=timeout)
            diff = mine - mean
            total += float((diff * diff).sum())
        distance = np.array([math.sqrt(total)], dtype=np.float64)
        peer.allreduce(distance, op="mean", timeout=timeout)
        self._consensus_last = float(distance[0])
        return self._consensus_last

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """What the policy needs to resume (the parameters themselves live in the model's or
        the user's state): its name, the step count, and policy-specific state."""
        state = {"policy": self.name, "step": self._step}
        if self._peer is not None:
            state.update(self._extra_state())
            state.update(self._compression.state())
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict() returned (after attach). A state saved under one of the
        policy's aliases (an older name) loads too."""
        self._check_ready()
        if not isinstance(state, dict) or "step" not in state:
            raise ValueError("not a policy state dict: expected a dict with 'policy' and 'step'")
        if state.get("policy") not in (self.name, *self.aliases):
            raise ValueError(f"state dict of policy {state.get('policy')!r} cannot be loaded "
                             f"into {self.name!r}")
        step = state["step"]
        if not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"state dict step must be a non-negative int, got {step!r}")
        self._compression.load(state)
        self._load_extra_state(state)
        self._step = int(step)

    def _extra_state(self) -> dict:
        return {}

    def _load_extra_state(self, state: dict) -> None:
        pass

    # ------------------------------------------------------------------ membership
    def _recover(self, exc: PeerLost, pending: bool) -> None:
        """A peer was lost mid-step: without ``elastic``, that is the step's error; with it,
        agree with the survivors on the next view and go on from the state of the survivor
        that completed most steps (the same on every survivor), below ``min_peers`` raise.
        ``pending``: the parameters hold this member's update of the step, not yet combined;
        resume_at (called by the view change) says whether the step is owed."""
        # A change under way (a leave, a recovery at once), known here or heard of from a
        # member that it ended (ViewChanging: that member's notice came first).
        changing = self._host().changing_now() or isinstance(exc, ViewChanging)
        if not self.elastic and not changing:
            raise exc   # a failure of the group; a planned change (a leave) any policy takes
        self._recoveries += 1   # (stats()["recoveries"]; the events log has the death and views)
        log.warning("rank %d: %s lost a peer in step %d (%s): re-forming the group",
                    self._host().rank, self.name, self._step, exc)
        self._step = self._host().recover(self, self._step, pending)
        if self._host().world_size < self.min_peers:
            raise PeerLost(f"rank {self._host().rank}: {self.name}: {self._host().world_size} "
                           f"members left, fewer than min_peers={self.min_peers}") from exc

    def _check_min_peers(self) -> None:
        """After a view change taken at a step boundary (not in _recover: a member that was
        not in a collective when a peer died hears of the recovery there): fewer members than
        ``min_peers`` is PeerLost, as in _recover."""
        if self.elastic and self._host().world_size < self.min_peers:
            raise PeerLost(f"rank {self._host().rank}: {self.name}: {self._host().world_size} "
                           f"members left, fewer than min_peers={self.min_peers}")

    def max_drift(self) -> int | None:
        """The most steps a member of this policy's group can be ahead of another (a change is
        proposed that far ahead and a little more: collectives/group/margin.py); None: not
        bounded by the policy (the view's size is taken)."""
        return None

    def view_changing(self, switch: Switch) -> None:
        """A committed view change, before the peer installs it (its transport is still the
        old view's): what the policy must finish or take in the old view (push-sum: the
        exchange in flight, a leaver's mass) and how its state follows the switch."""

    def view_changed(self) -> None:
        """The group's view changed (the peer has its new transport and topology): graph
        policies follow the topology; policies with per-peer state override this."""
        if self.default_topology is not None:
            self._topology = resize_topology(self._graph(), self._host().world_size)

    def took_state(self, step: int) -> None:
        """The source's state was loaded into the buckets (gossip/membership/state_transfer.py):
        push it to the user's arrays and go on from ``step``."""
        self._packed().copy_out()
        self._step = int(step)
        # A residual is what its peer has not sent yet: taken over from the source, the
        # source's unsent error would reach the average twice. This peer starts without.
        self._compression.forget_residuals()
        if self.nan_guard:
            self._nan_guard().keep()

    def state_sent(self) -> None:
        """This member (the switch's source) sent its state to the receivers."""

    def resume_at(self, step: int, *, complete: bool = False) -> None:
        """Go on from step count ``step``, the new view's (one count for every member: a
        time-varying graph's phase depends on it). ``complete``: the parameters hold an
        update of step ``step`` not yet combined, so that step is completed by its
        communication alone (after_step), not begun again."""
        self._step = int(step)
        self._owed = bool(complete)

    def settle_view(self) -> None:
        """Every member of the new view, joiners too, once the state moved and before the
        barrier that ends the switch (the new view's transport): a policy whose state is
        spread over the members (the sharded EASGD centre) moves it here, in collectives
        every member makes in the same order."""

    def hand_off(self, to: int) -> None:
        """A planned leaver at its boundary: give what it holds to rank ``to`` of the view it
        leaves (-1: nobody takes it)."""

    # ------------------------------------------------------------------ attributes
    @property
    def compression(self) -> Codec | None:
        """The policy's codec (a collectives.codecs.Codec), None without one."""
        return self._compression.codec

    @property
    def peer(self) -> PolicyHost | None:
        """The Peer the policy is attached to (None before attach)."""
        return self._peer

    @property
    def topology(self) -> Topology | None:
        """The graph the policy runs on: after attach the resolved one (default_topology
        when none was given), before it the ``topology`` argument; None for policies on no
        graph."""
        return self._topology if self._topology is not None else self._topology_arg

    @property
    def buckets(self) -> BucketSet:
        """The packed parameters (numpy: refreshed from the user's arrays only around a
        communication)."""
        self._check_ready()
        return self._packed()

    @property
    def arrays(self) -> list:
        """The parameters as attached (torch: now views of the buckets; numpy: the user's own
        arrays, which the policy updates in place)."""
        self._check_ready()
        return list(self._packed().params)

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
