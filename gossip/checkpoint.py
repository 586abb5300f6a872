"""Checkpoints of a whole job: every peer's training state saved as snapshots in one
directory and loaded back, each a collective (every peer calls it at the same step).

    gossip.save_checkpoint("ckpt", peer=peer, model=model, optimizer=opt, extra={"step": t})
    ...                                            # a new job, same world size
    extra = gossip.load_checkpoint("ckpt", peer=peer, model=model, optimizer=opt)

Who writes: with a policy whose replicas are bitwise identical (Synchronous) rank 0 alone
writes one snapshot that every peer loads; otherwise each peer writes its own shard
("shard-<rank>"). Either way every peer returns only once every write has succeeded, and
raises if any failed, so a checkpoint is complete when save_checkpoint returns anywhere.
Each save carries an id drawn by rank 0; on load the peers compare theirs, so a directory
that mixes shards of two saves (a job killed between two ranks' writes) is an error, not a
silent mix. The directory must be one every peer can read (a shared filesystem), unless
each peer writes its own shard.
"""
from __future__ import annotations

import os
import secrets
from typing import Any, Sequence

import numpy as np

from gossip.errors import SnapshotError, SnapshotMismatch
from gossip.snapshot.files import base_name
from gossip.snapshot.snapshot import Snapshot

__all__ = ["save_checkpoint", "load_checkpoint"]


def save_checkpoint(directory: str, *, peer: Any = None, model: Any = None,
                    optimizer: Any = None, policy: Any = None,
                    params: Sequence[Any] | None = None, extra: Any = None,
                    per_peer: bool | None = None, timeout: float | None = None) -> str | None:
    """Save this peer's state (see Snapshot.of for ``model``, ``optimizer``, ``policy``,
    ``params``, ``extra``) under ``directory``. ``per_peer``: each peer writes its own shard
    (default: unless the policy keeps replicas identical). ``timeout``: how long a peer waits
    for the others' writes (default: the peer's). Returns the manifest file this peer wrote
    (None for a peer that did not write). Without a peer, a world of one."""
    rank, world = (peer.rank, peer.world_size) if peer is not None else (0, 1)
    owner = policy if policy is not None else getattr(optimizer, "policy", None)
    if per_peer is None:
        per_peer = world > 1 and not getattr(owner, "identical_replicas", False)
    token = secrets.randbits(62)
    if world > 1:   # every shard of one save carries rank 0's id
        token = int(peer.broadcast(np.array([token], dtype=np.int64), root=0,
                                   timeout=timeout)[0])
    path, error = None, None
    if per_peer or rank == 0:
        try:
            info = {"id": token, "rank": rank, "world_size": world, "per_peer": bool(per_peer)}
            snapshot = Snapshot.of(model=model, optimizer=optimizer, policy=policy,
                                   params=params, extra={"checkpoint": info, "user": extra})
            path = snapshot.save(directory, shard=rank if per_peer else None)
        except Exception as exc:   # the others must hear of it before anyone raises
            error = exc
    _agree(peer, error, "save", 0, timeout)
    return path


def load_checkpoint(directory: str, *, peer: Any = None, model: Any = None,
                    optimizer: Any = None, policy: Any = None,
                    params: Sequence[Any] | None = None, timeout: float | None = None) -> Any:
    """Load what save_checkpoint wrote into what is given (see Snapshot.restore_into) and
    return the ``extra`` it was saved with. Each peer reads its own shard if there is one,
    else the one snapshot. Raises on every peer if any peer could not load (its error on it,
    SnapshotError elsewhere) or if the peers loaded checkpoints of different saves
    (SnapshotMismatch)."""
    rank, world = (peer.rank, peer.world_size) if peer is not None else (0, 1)
    token, user, error = 0, None, None
    try:
        own = os.path.join(directory, base_name(rank) + ".msgpack")
        snapshot = Snapshot.load(directory, shard=rank if os.path.exists(own) else None)
        info = _info(snapshot, directory)
        if info["per_peer"] and (info["rank"], info["world_size"]) != (rank, world):
            raise SnapshotMismatch(f"rank {rank}/{world}: the shard in {directory} is rank "
                                   f"{info['rank']}'s of a world of {info['world_size']}")
        snapshot.restore_into(model=model, params=params, optimizer=optimizer, policy=policy)
        token, user = info["id"], snapshot.extra["user"]
    except Exception as exc:   # the others must hear of it before anyone raises
        error = exc
    ids = _agree(peer, error, "load", token, timeout)
    if len(set(ids)) > 1:
        raise SnapshotMismatch(f"rank {rank}: the peers loaded checkpoints of different saves "
                               f"from {directory} (save id by rank: {ids}); the directory "
                               "mixes two saves")
    return user


def _info(snapshot: Snapshot, directory: str) -> dict:
    extra = snapshot.extra
    info = extra.get("checkpoint") if isinstance(extra, dict) else None
    if not (isinstance(info, dict) and isinstance(info.get("id"), int)
            and isinstance(info.get("per_peer"), bool)
            and isinstance(info.get("rank"), int) and isinstance(info.get("world_size"), int)
            and "user" in extra):
        raise SnapshotError(f"the snapshot in {directory} is not a checkpoint "
                            "(save_checkpoint writes one; use Snapshot.load for others)")
    return info


def _agree(peer: Any, error: BaseException | None, what: str, value: int,
           timeout: float | None) -> list[int]:
    """Every peer's ``value``, once every peer has said whether its part of ``what``
    succeeded; raises ``error`` here, or SnapshotError naming the ranks that failed."""
    if peer is None or peer.world_size == 1:
        if error is not None:
            raise error
        return [value]
    mine = np.array([0 if error is None else 1, value], dtype=np.int64)
    try:
        table = peer.allgather(mine, timeout=timeout)
    except Exception:
        if error is not None:   # this peer's own failure says more than a lost neighbour
            raise error from None
        raise
    if error is not None:
        raise error
    failed = [r for r in range(peer.world_size) if table[r, 0]]
    if failed:
        raise SnapshotError(f"rank {peer.rank}: the checkpoint {what} failed on rank(s) "
                            f"{failed} (their own errors say why)")
    return [int(v) for v in table[:, 1]]
