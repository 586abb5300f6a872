"""Horovod's ``broadcast_optimizer_state``: root's torch optimizer state on every peer, never
pickled (a Snapshot of it: a manifest of plain values and its tensors' bytes).

    gossip.broadcast_parameters(model, root=0, peer=peer)
    gossip.broadcast_optimizer_state(opt, root=0, peer=peer)   # after a resume on rank 0
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from gossip.objects import allgather_object, broadcast_object
from gossip.optim import DistributedOptimizer, OptimizerPeer, require_peer
from gossip.snapshot import Snapshot, SnapshotReceiver

__all__ = ["broadcast_optimizer_state"]

log = logging.getLogger("gossip")


def broadcast_optimizer_state(optimizer: Any, root: int = 0, *,
                              peer: OptimizerPeer | None = None,
                              timeout: float | None = None) -> None:
    """Give every peer ``root``'s optimizer state (Horovod's ``broadcast_optimizer_state``):
    after it, each peer's ``optimizer.state_dict()`` is root's (momentum buffers, Adam's
    moments and steps, every param group's hyperparameters). ``optimizer``: a torch optimizer
    or a DistributedOptimizer (its wrapped optimizer's state; the policy's own stays each
    peer's). A collective: every peer calls it with an optimizer over the same parameters.

    Nothing is pickled: root's state travels as a Snapshot, a manifest of plain values
    (gossip.objects.broadcast_object) and its tensors' bytes in one broadcast, checked by
    digest where it lands. Every peer returns once every peer has loaded it, or raises,
    naming the ranks that could not (an optimizer over other parameters, say; theirs say
    why). Skipped, as broadcast_parameters is, on a peer that joins a running job (its
    optimizer's state comes with the state it takes when its policy attaches)."""
    peer = require_peer(peer, "broadcast_optimizer_state")
    inner = optimizer.optimizer if isinstance(optimizer, DistributedOptimizer) else optimizer
    if not hasattr(inner, "state_dict") or not hasattr(inner, "load_state_dict"):
        raise TypeError(f"rank {peer.rank}: broadcast_optimizer_state takes a torch optimizer "
                        f"or a DistributedOptimizer, got {type(optimizer).__name__}")
    if peer.entering:
        log.info("rank %d: broadcast_optimizer_state skipped: this peer joined a running job; "
                 "its optimizer state comes with the state it takes when its policy "
                 "attaches", peer.rank)
        return
    snapshot, manifest, failed = None, None, None
    if peer.rank == root:
        try:
            snapshot = Snapshot.of(optimizer=inner)
            manifest = snapshot.manifest
        except Exception as exc:   # the others must hear of it before anyone raises
            failed = f"{type(exc).__name__}: {exc}"
    total = snapshot.layout().total if snapshot is not None else 0
    manifest = broadcast_object(peer, {"manifest": manifest, "failed": failed,
                                       "total": total}, root, timeout=timeout)
    if manifest["failed"] is not None:
        raise RuntimeError(f"rank {peer.rank}: broadcast_optimizer_state: rank {root} could "
                           f"not describe its optimizer's state ({manifest['failed']})")
    error: Exception | None = None
    receiver = None
    if peer.rank != root:
        try:
            receiver = SnapshotReceiver(manifest["manifest"])
        except Exception as exc:
            error = exc
    # The bytes' size came with the manifest (a peer that could not read it still takes part).
    data = np.empty(int(manifest["total"]), dtype=np.uint8)
    if snapshot is not None:
        for offset, length in snapshot.layout().ranges(4 << 20):
            data[offset:offset + length] = np.frombuffer(snapshot.read(offset, length),
                                                         dtype=np.uint8)
    if data.size:
        peer.broadcast(data, root=root, timeout=timeout)
    if receiver is not None and error is None:
        try:
            if data.size:
                receiver.write(0, data)
            receiver.finish().restore_into(optimizer=inner)
        except Exception as exc:
            error = exc
    outcomes = allgather_object(peer, None if error is None else
                                f"{type(error).__name__}: {error}", timeout=timeout)
    if error is not None:
        raise error
    bad = [r for r, outcome in enumerate(outcomes) if outcome is not None]
    if bad:
        raise RuntimeError(f"rank {peer.rank}: broadcast_optimizer_state: rank(s) {bad} could "
                           f"not load rank {root}'s optimizer state ({outcomes[bad[0]]})")
