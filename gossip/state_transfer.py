"""Moving a member's training state to the members that need it after a view change (a
joiner; after a recovery, a replica that did not finish the step the source finished).

The state is a Snapshot (gossip/snapshot): the parameters' buckets, the optimizer's state
when a DistributedOptimizer drives the policy (momentum, Adam's moments: without them a
joiner's updates would differ from the replicas'), and the policy's own state. The source
sends, on a communicator of its own (PeerChannel.MEMBERSHIP), first a manifest (msgpack:
every array's name, dtype, shape and digest, the state dicts' structure, the step, the
peer's tracked objects such as an ElasticSampler's cursor; never a pickle), then the
snapshot's bytes in chunks that never cross an array's end, each read in place. The
receiver checks the manifest's parameters against its own before anything is allocated (a
model of other shapes is a SnapshotMismatch, a ValueError, naming the first tensor that
differs; the group is unaffected: the source only sends), receives each chunk straight into
the array it belongs to, checks every array's digest (SnapshotCorrupt naming the first bad
one), then loads the optimizer and the policy.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

import msgpack
import numpy as np

from gossip.channels import PeerChannel
from gossip.errors import ProtocolError
from gossip.snapshot import Snapshot, SnapshotReceiver

__all__ = ["send_state", "receive_state", "Prefetch", "state_of", "load_state", "CHUNK_BYTES"]

log = logging.getLogger("gossip")

# Bytes per message of a transfer: the transport's whole-message size, so none is cut again.
CHUNK_BYTES = 4 << 20
_MAX_MANIFEST = 64 << 20


def _flats(policy: Any) -> list:
    """numpy views of a policy's bucket buffers (a torch CPU tensor shares its memory)."""
    return [b.flat if isinstance(b.flat, np.ndarray) else b.flat.detach().numpy()
            for b in policy.buckets]


def state_of(policy: Any) -> Snapshot:
    """A member's state as a Snapshot: the parameters' buckets, the optimizer's state if a
    DistributedOptimizer drives the policy (``policy._transfer_optimizer``), and the policy's
    own state (its step included)."""
    policy.buckets.copy_in()
    return Snapshot.of(params=_flats(policy), optimizer=policy._transfer_optimizer,
                       policy=policy)


def load_state(policy: Any, snapshot: Snapshot, step: int) -> None:
    """Load the source's ``snapshot`` (checked already) into the policy's buckets, its
    optimizer and itself, then go on from ``step``."""
    optimizer = policy._transfer_optimizer if "optimizer" in snapshot.parts else None
    snapshot.restore_into(params=_flats(policy), optimizer=optimizer, policy=policy)
    policy._took_state(step)


def send_state(peer: Any, snapshot: Snapshot, receivers: list[int], step: int,
               timeout: float) -> None:
    """Send ``snapshot`` to each of ``receivers`` (ranks of the peer's current view)."""
    comm = peer.channel(PeerChannel.MEMBERSHIP)
    tracked = {name: obj.state_dict() for name, obj in peer.tracked_state.items()}
    manifest = {"snapshot": snapshot.manifest, "step": step, "tracked": tracked}
    raw = np.frombuffer(msgpack.packb(manifest, use_bin_type=True), dtype=np.uint8)
    ranges = snapshot.layout().ranges(CHUNK_BYTES)
    for r in receivers:
        comm.send(r, raw, timeout=timeout)
        for offset, length in ranges:
            comm.send(r, np.frombuffer(snapshot.read(offset, length), dtype=np.uint8),
                      timeout=timeout)
    log.info("rank %d: sent its state (%d arrays, %.1f MiB) to ranks %s", peer.rank,
             len(snapshot.names), snapshot.nbytes / 2**20, receivers)


def receive_state(peer: Any, source: int, mine: Snapshot,
                  timeout: float) -> tuple[int, Snapshot]:
    """Receive ``source``'s state, checked against ``mine`` (this peer's own, for the
    parameters' names, dtypes and shapes) before anything is allocated; returns (the
    source's step, its snapshot), and loads the tracked objects' state."""
    step, snapshot, tracked = _receive(peer, source, timeout, mine)
    _load_tracked(peer, tracked)
    return step, snapshot


class Prefetch:
    """A joiner's state, received in a thread of its own from the moment it is admitted, so
    the transfer overlaps the joiner building its model (its arrays are the snapshot's, then
    copied into the model at attach). ``result(mine)`` waits for it, then checks it against
    this peer's own state as receive_state does."""

    def __init__(self, peer: Any, source: int, timeout: float) -> None:
        self._outcome: tuple | BaseException | None = None
        self._timeout = timeout
        self.seconds = 0.0   # from the admission to the last digest checked
        self.nbytes = 0
        self._thread = threading.Thread(target=self._run, args=(peer, source, timeout),
                                        name="gossip state prefetch", daemon=True)
        self._thread.start()

    def _run(self, peer: Any, source: int, timeout: float) -> None:
        start = time.monotonic()
        try:
            self._outcome = _receive(peer, source, timeout, None)
            self.nbytes = self._outcome[1].nbytes
        except BaseException as exc:  # handed to result()
            self._outcome = exc
        self.seconds = time.monotonic() - start

    def result(self, peer: Any, mine: Snapshot) -> tuple[int, Snapshot]:
        self._thread.join(self._timeout)
        outcome = self._outcome
        if outcome is None:
            raise ProtocolError(f"rank {peer.rank}: the running job's state did not arrive "
                                f"within {self._timeout:g}s")
        if isinstance(outcome, BaseException):
            raise outcome
        step, snapshot, tracked = outcome
        mine.check_compatible(snapshot.manifest, parts=("params",))
        _load_tracked(peer, tracked)
        return step, snapshot


def _receive(peer: Any, source: int, timeout: float,
             mine: Snapshot | None) -> tuple[int, Snapshot, dict]:
    comm = peer.channel(PeerChannel.MEMBERSHIP)
    raw = comm.recv(source, timeout=timeout)
    if raw.nbytes > _MAX_MANIFEST:
        raise ProtocolError(f"rank {peer.rank}: rank {source}'s state manifest is "
                            f"{raw.nbytes} bytes")
    try:
        manifest = msgpack.unpackb(raw.tobytes(), raw=False, strict_map_key=False)
        theirs, step = manifest["snapshot"], int(manifest["step"])
    except Exception as exc:
        raise ProtocolError(f"rank {peer.rank}: rank {source}'s state manifest is "
                            f"malformed: {exc}") from None
    if mine is not None:
        # This peer's fresh optimizer has no state yet: only the parameters must agree.
        mine.check_compatible(theirs, parts=("params",))
    receiver = SnapshotReceiver(theirs)
    for offset, length in receiver.layout.ranges(CHUNK_BYTES):
        comm.recv(source, out=np.frombuffer(receiver.target(offset, length), dtype=np.uint8),
                  timeout=timeout)
        receiver.wrote(offset, length)
    return step, receiver.finish(), manifest.get("tracked") or {}


def _load_tracked(peer: Any, tracked: dict) -> None:
    """The tracked objects' state (an ElasticSampler's cursor) into those registered; the
    others' waits in ``peer.pending_tracked`` for their registration."""
    for name, state in tracked.items():
        obj = peer.tracked_state.get(name)
        if obj is not None:
            obj.load_state_dict(state)
        else:
            peer.pending_tracked[name] = state
