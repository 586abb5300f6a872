"""Elastic averaging SGD (EASGD): workers tied to a centre variable by an elastic force."""
from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

from collectives.arrays import adapter_for
from gossip.channels import PeerChannel
from gossip.errors import PeerLost
from gossip.policies.arguments import check_int, check_number
from gossip.policies.buckets import DEFAULT_BUCKET_BYTES
from gossip.policies.elastic_sharded import ShardedCentre
from gossip.policies.elastic_sharded_membership import ShardedCentreMembership
from gossip.policies.worker import BackgroundPolicy

__all__ = ["ElasticAveraging", "CENTERS", "DEFAULT_BETA"]

log = logging.getLogger("gossip")

CENTERS = ("replicated", "sharded")
# The paper's moving rate beta = n * alpha (Zhang et al. use 0.9 in every experiment).
DEFAULT_BETA = 0.9


class ElasticAveraging(ShardedCentreMembership, ShardedCentre, BackgroundPolicy):
    """EASGD (Zhang, Choromanska, LeCun 2015). Each worker i trains its own x_i; every
    ``period`` (tau) steps it is pulled towards a centre c and the centre towards it:
    ``d_i = alpha (x_i - c); x_i -= d_i; c += d_i``. The workers explore around the centre,
    which is the model to evaluate (``policy.center``, or load_center()).

    ``center="replicated"`` (synchronous EASGD): every peer keeps the whole centre; one
    allreduce of the elastic differences per round, ``c += sum_i d_i``, keeps the centres
    bitwise identical. Invariant of a round: ``sum_i x_i + c`` is unchanged (the workers lose
    exactly what the centre gains). Cost: one allreduce of P bytes every tau steps.
    ``compression`` (replicated only): the differences d_i travel encoded (top-k with error
    feedback); the centre gains their decoded sum, identical everywhere, so the invariant
    holds to the codec's error per round (plus the residuals, with top-k).

    ``center="sharded"`` (asynchronous EASGD): peer r owns segment r of each flat bucket of
    the centre. At its elastic step a worker sends its segment s to owner s (on
    ``peer.channel(channel)``); the owner's background thread computes
    ``d = alpha (x_s - c_s)``, applies ``c_s += d`` and answers d (on channel + 1), which the
    worker subtracts. Requests are served one at a time, whenever they arrive, so a worker
    waits only for the owners' server threads, never for another worker's training step.
    Cost: P bytes out and P bytes back per elastic step, spread over the owners; each peer
    stores 1/n of the centre. Close the policies after a barrier: a worker still training
    cannot reach the shard of a peer that has closed (it then skips that shard; with
    ``elastic=True`` the closed peer is a death, and the others re-form without it). With
    ``elastic=True`` every owner also keeps a backup of its shard at the next rank: each
    update d it applies, in the order it applies them, is forwarded to that rank (on
    channel + 3), whose thread adds it to its replica, so the replica stays the primary's
    bytes and a death loses no centre (see elastic_sharded_membership.py). That costs P more
    bytes per elastic step of every worker (each d once more), off the training thread.

    Defaults: ``alpha = 0.9 / n`` (the paper's beta = n alpha = 0.9), ``period=4``. The
    centre starts at the workers' mean (an allreduce at attach).

    Stability (the paper's linear analysis of synchronous EASGD on f(x) = h x^2 / 2 with step
    eta, tau = 1): the workers' mean m and the centre evolve by
    ``[[1 - eta h - alpha, alpha], [beta, 1 - beta]]``, stable iff ``eta h > 0``,
    ``beta > 0``, ``|det| < 1`` and ``(2 - eta h)(2 - beta) > 2 alpha``. With no gradient at
    all that is ``alpha + beta < 2``: past it the elastic exchange diverges by itself whatever
    the learning rate, so the replicated form refuses it (ValueError), as it refuses alpha
    outside (0, 1) (the disagreement x_i - m shrinks by 1 - alpha per round). ``beta >= 1``
    is legal but suspicious (the centre overshoots the mean and the condition tightens to
    ``eta h < 2 - 2 alpha / (2 - beta)``): a warning. The sharded form applies the elastic
    move one worker at a time, each a convex combination for 0 < alpha < 1, so only alpha is
    restricted there.

    Membership (replicated centre): a joiner takes a member's state (its worker, optimizer
    and the centre) at a step boundary. ``elastic=True``: a lost peer does not end training;
    the survivors agree on a new view at once and go on (fewer than ``min_peers``: PeerLost).
    A round's allreduce that a death ends changes nothing on the peers where it failed (the
    elastic move applies only once the whole round arrived), so the centre is the round's
    either everywhere it completed or nowhere; a survivor whose round failed while others'
    completed is behind their step count, and takes the state of the survivor that
    completed most steps, centre included (``shared_state``). Without ``elastic`` a death
    in a round raises PeerLost, as Synchronous's.

    Membership (sharded centre): at every view change the centre is cut again over the new
    view's dense ranks, and a joiner takes its model from a member and its shards from the
    members; a planned ``peer.leave()`` hands the leaver's shards over; with ``elastic=True``
    a death is a view change and the dead owner's shards come from their backups. The
    assembled centre is the same bytes after a change as before it.
    elastic_sharded_membership.py has the rules and what each costs. Without ``elastic`` a
    death costs the dead owner's shards until the next view change (its workers skip them,
    see ``dropped_peers``), which rebuilds them from the workers.
    """

    name = "elastic"
    worker_name = "elastic-averaging server thread"

    def __init__(self, *, alpha: float | None = None, period: int = 4,
                 center: str = "replicated", channel: int = PeerChannel.ELASTIC_REQUESTS,
                 poll_interval: float = 0.25,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout: float | None = None,
                 nan_guard: bool = False, elastic: bool = False, min_peers: int = 1,
                 compression: Any = None) -> None:
        super().__init__(channel=channel, poll_interval=poll_interval,
                         bucket_bytes=bucket_bytes, timeout=timeout, nan_guard=nan_guard,
                         compression=compression)
        if compression is not None and center != "replicated":
            raise ValueError("compression needs center='replicated' (its allreduce of the "
                             "elastic differences is compressed); the sharded centre's "
                             "point-to-point shards are not")
        self.elastic = bool(elastic)
        self.min_peers = check_int("min_peers", min_peers, 1)
        if alpha is not None:
            check_number("alpha", alpha, lambda a: 0 < a < 1, "in (0, 1)",
                         note=": the elastic move x -= alpha (x - c) overshoots the centre "
                              "for alpha >= 1")
            if alpha < 1e-4:
                warnings.warn(f"alpha={alpha:g} is so small that the workers barely feel the "
                              "centre: they train almost independently", UserWarning,
                              stacklevel=2)
        check_int("period", period)
        if center not in CENTERS:
            raise ValueError(f"center must be one of {', '.join(map(repr, CENTERS))}, got "
                             f"{center!r}")
        self._alpha_arg = None if alpha is None else float(alpha)
        self.period = period
        self.center_mode = center
        self._lock = threading.Lock()   # the centre shard, between server and training thread
        self._served = 0
        self._rounds = 0

    # ------------------------------------------------------------------ set-up
    @property
    def alpha(self) -> float:
        """The elastic rate (default 0.9 / n, known once attached: RuntimeError before)."""
        if self._alpha_arg is not None:
            return self._alpha_arg
        if self._peer is None:
            raise RuntimeError("alpha defaults to 0.9 / n: attach the policy first")
        return DEFAULT_BETA / self._peer.world_size

    @property
    def beta(self) -> float:
        """The paper's moving rate of the centre, n * alpha."""
        return self.alpha * self._peer.world_size

    def _check_stability(self) -> None:
        n, alpha = self._peer.world_size, self.alpha
        if not 0 < alpha < 1:  # the default 0.9 / n with n = 1 is 0.9
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        if self.center_mode != "replicated":
            return
        beta = n * alpha
        if alpha + beta >= 2:
            raise ValueError(
                f"alpha={alpha:g} with {n} peers gives beta = n alpha = {beta:g}: the "
                f"replicated elastic exchange diverges when alpha + beta >= 2 (the centre-mean "
                f"mode is multiplied by 1 - alpha - beta = {1 - alpha - beta:g} per round); "
                f"use alpha < {2 / (n + 1):.4g}, e.g. the default 0.9 / n = {0.9 / n:.4g}")
        if beta >= 1:
            warnings.warn(f"beta = n alpha = {beta:g} >= 1: the centre overshoots the workers' "
                          "mean each round, and stability then needs a smaller learning rate "
                          "than plain SGD; the paper uses beta = 0.9", UserWarning, stacklevel=4)

    #: Both centres follow a view change. The replicated one: every member holds all of it
    #: (the same bytes), so a joiner takes it with a member's state and the next round's
    #: allreduce runs over the new view (alpha's default, 0.9 / n, follows n). The sharded
    #: one is cut again over the new view (elastic_sharded_membership.py).
    follows_view_changes = True

    @property
    def shared_state(self) -> bool:
        """The replicated centre is the same bytes on every member (see MembershipHooks)."""
        return self.center_mode == "replicated"

    def max_drift(self) -> int | None:
        # The replicated centre's rounds are allreduces every period steps.
        return self.period if self.center_mode == "replicated" else None

    def _setup(self) -> None:
        self._check_stability()
        peer, buckets = self._peer, self._buckets
        n, rank = peer.world_size, peer.rank
        buckets.copy_in()
        # The centre starts at the workers' mean; a joiner's comes with the running job's
        # state (Peer.attached, after this), so it makes no collective call here.
        joining = getattr(peer, "joining", False)
        means = []
        for b in buckets:
            m = adapter_for(b.flat).clone(b.flat)
            if not joining:
                peer.allreduce(m, op="mean", timeout=self.timeout)
            means.append(m)
        if self.center_mode == "replicated":
            self._center = means
            self._diff = [b.new() for b in buckets]   # sum_i d_i, by allreduce
            self._own = [b.new() for b in buckets]    # this worker's d_i
            return
        # A joiner's centre is cut from the members' shards once it has its state
        # (_settle_view): until then nothing serves, and these means are placeholders.
        self._lay_out(means, start=not joining)

    # ------------------------------------------------------------------ the step
    def _after_step(self, step: int) -> None:
        if (step + 1) % self.period:
            return
        self._check_worker()
        self._buckets.copy_in()
        if self.center_mode == "replicated":
            self._replicated_round()
        else:
            self._sharded_round()
        self._buckets.copy_out()
        self._rounds += 1

    def _replicated_round(self) -> None:
        """d_i = alpha (x_i - c) summed by allreduce; then x_i -= d_i and c += sum_i d_i,
        only once every bucket's sum arrived: a round a lost peer ended (PeerLost) leaves x
        and c as they were, so no survivor holds a centre that is half of a round."""
        alpha = self.alpha
        work = []
        for b, c, d, own in zip(self._buckets, self._center, self._diff, self._own):
            adapter = adapter_for(own)
            adapter.copy(own, b.flat)
            own -= c
            own *= alpha        # d_i = alpha (x_i - c)
            adapter.copy(d, own)
            # With a codec the differences are encoded (top-k: with error feedback); the
            # centre gains their decoded sum, identical on every peer.
            work.append(self._peer.allreduce(d, op="sum", wait=False, timeout=self.timeout,
                                             **self._compression.kwargs(len(work), d)))
        lost = None
        for w in work:
            try:
                w.wait(self.timeout)
            except PeerLost as exc:   # the others end too: none writes after this
                lost = lost or exc
        if lost is not None:
            raise lost
        for b, c, d, own in zip(self._buckets, self._center, self._diff, self._own):
            b.flat -= own       # x_i -= d_i
            c += d              # c += sum_i d_i: the same bytes on every peer

    # ------------------------------------------------------------------ centre access
    @property
    def center(self) -> list:
        """The centre variable this peer holds, one flat buffer per bucket (replicated: the
        whole centre; sharded: this peer's segment of each bucket). Live; do not modify."""
        self._check_ready()
        return list(self._center)

    def load_center(self) -> None:
        """Copy the centre into the parameters (e.g. to evaluate it). Replicated: local.
        Sharded: a collective (an allreduce assembles the shards), every peer must call it.
        The workers then restart from the centre."""
        self._check_ready()
        buckets = self._buckets
        if self.center_mode == "replicated":
            for b, c in zip(buckets, self._center):
                adapter_for(c).copy(b.flat, c)
        else:
            rank = self._peer.rank
            for b, segs, c in zip(buckets, self._segs, self._center):
                lo, hi = segs[rank]
                b.flat[:] = 0
                with self._lock:
                    adapter_for(c).copy(b.flat[lo:hi], c)
                self._peer.allreduce(b.flat, op="sum", timeout=self.timeout)
        buckets.copy_out()

    # ------------------------------------------------------------------ state and stats
    def _extra_state(self) -> dict:
        if self._plan is not None:
            # The source of a view change: its joiners take their shards from the members
            # by this plan (elastic_sharded_membership.py), not this member's shard.
            return {"reshard": self._plan, "center_mode": self.center_mode,
                    "alpha": self.alpha}
        with self._lock:
            return {"center": [adapter_for(c).clone(c) for c in self._center],
                    "center_mode": self.center_mode, "alpha": self.alpha}

    def _load_extra_state(self, state: dict) -> None:
        center = state.get("center")
        if state.get("center_mode") != self.center_mode:
            raise ValueError(f"state dict has center={state.get('center_mode')!r}, this policy "
                             f"center={self.center_mode!r}")
        if self.center_mode == "sharded" and self._plan_state(state):
            return
        if not isinstance(center, (list, tuple)) or len(center) != len(self._center):
            raise ValueError(f"elastic state needs {len(self._center)} centre buffers, got "
                             f"{type(center).__name__}")
        for mine, theirs in zip(self._center, center):
            if tuple(mine.shape) != tuple(theirs.shape):
                raise ValueError(f"centre buffer of shape {tuple(theirs.shape)} does not fit "
                                 f"{tuple(mine.shape)}")
        with self._lock:
            for mine, theirs in zip(self._center, center):
                adapter_for(mine).copy(mine, theirs)

    def _view_changed(self) -> None:
        # A fixed alpha that was stable for the old n may not be for the new one.
        if self.center_mode == "replicated":
            try:
                self._check_stability()
            except ValueError as exc:
                log.warning("rank %d: elastic averaging after the view change: %s",
                            self._peer.rank, exc)
        super()._view_changed()

    def _extra_stats(self) -> dict:
        return {"alpha": self.alpha, "beta": self.beta, "period": self.period,
                "center": self.center_mode, "elastic_rounds": self._rounds,
                "elastic": self.elastic, "min_peers": self.min_peers,
                "requests_served": self._served, "dropped_peers": sorted(self._dropped),
                "backup_forwards": self._forwards, "reshards": self._reshards,
                "segments_rebuilt": self._rebuilt}

