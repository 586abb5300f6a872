"""Moving a member's training state to the members that need it after a view change (a
joiner; after a recovery, a member that did not finish the step the source finished).

The state is what the attached policy says it is (``Policy._transfer_state``): named arrays
(the parameters' buckets, the policy's own arrays, with DistributedOptimizer the optimizer's
state too) and a manifest of plain values. The source sends, on a communicator of its own
(PeerChannel.MEMBERSHIP), first the manifest (msgpack: names, dtypes, shapes and a blake2b
digest of each array; never a pickle), then every array, point to point. The receiver checks
the manifest against its own arrays before anything is written (a model of other shapes is
a ValueError naming the first tensor that differs, and the group is unaffected: the source
only sends), receives each array straight into its own buffer, and checks every digest; a
corrupted array is a ProtocolError naming it.
"""
from __future__ import annotations

import hashlib
import logging
from typing import Any

import msgpack
import numpy as np

from gossip.channels import PeerChannel
from gossip.errors import ProtocolError

__all__ = ["send_state", "receive_state", "digest_of", "TransferState"]

log = logging.getLogger("gossip")

_MAX_MANIFEST = 64 << 20


class TransferState:
    """What a policy hands over: ``arrays`` (name -> contiguous numpy array, in a fixed
    order) and ``values`` (msgpack-able plain values)."""

    def __init__(self, arrays: dict[str, np.ndarray], values: dict[str, Any]) -> None:
        self.arrays = arrays
        self.values = values


def digest_of(array: np.ndarray) -> str:
    """blake2b of an array's dtype, shape and bytes (hashlib releases the GIL)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{array.dtype.str}{tuple(array.shape)}".encode())
    h.update(memoryview(np.ascontiguousarray(array)).cast("B"))
    return h.hexdigest()


def send_state(peer: Any, state: TransferState, receivers: list[int], step: int,
               timeout: float) -> None:
    """Send ``state`` to each of ``receivers`` (ranks of the peer's current view)."""
    comm = peer.channel(PeerChannel.MEMBERSHIP)
    tracked = {name: obj.state_dict() for name, obj in peer.tracked_state.items()}
    manifest = {"step": step, "values": state.values, "tracked": tracked,
                "arrays": [[name, a.dtype.str, list(a.shape), digest_of(a)]
                           for name, a in state.arrays.items()]}
    raw = np.frombuffer(msgpack.packb(manifest, use_bin_type=True), dtype=np.uint8).copy()
    for r in receivers:
        comm.send(r, raw, timeout=timeout)
        for a in state.arrays.values():
            comm.send(r, np.ascontiguousarray(a), timeout=timeout)
    log.info("rank %d: sent its state (%d arrays, %.1f MiB) to ranks %s", peer.rank,
             len(state.arrays), sum(a.nbytes for a in state.arrays.values()) / 2**20,
             receivers)


def receive_state(peer: Any, source: int, mine: TransferState,
                  timeout: float) -> tuple[int, dict[str, Any]]:
    """Receive ``source``'s state into ``mine``'s arrays (in place); returns (the source's
    step, its values)."""
    comm = peer.channel(PeerChannel.MEMBERSHIP)
    raw = comm.recv(source, timeout=timeout)
    if raw.nbytes > _MAX_MANIFEST:
        raise ProtocolError(f"rank {peer.rank}: rank {source}'s state manifest is "
                            f"{raw.nbytes} bytes")
    try:
        manifest = msgpack.unpackb(raw.tobytes(), raw=False, strict_map_key=False)
        entries = manifest["arrays"]
        step = int(manifest["step"])
    except Exception as exc:
        raise ProtocolError(f"rank {peer.rank}: rank {source}'s state manifest is "
                            f"malformed: {exc}") from None
    names = list(mine.arrays)
    if len(entries) != len(names):
        raise ValueError(f"rank {peer.rank}: rank {source}'s state has {len(entries)} arrays, "
                         f"this peer's {len(names)}: not the same model or policy")
    for (name, dtype, shape, _), own in zip(entries, names):
        a = mine.arrays[own]
        if name != own or np.dtype(dtype) != a.dtype or tuple(shape) != tuple(a.shape):
            raise ValueError(f"rank {peer.rank}: the state of rank {source} does not fit: its "
                             f"{name!r} is {dtype} {tuple(shape)}, this peer's {own!r} is "
                             f"{a.dtype.str} {tuple(a.shape)} (the first tensor that differs)")
    for (name, _, _, digest), own in zip(entries, names):
        a = mine.arrays[own]
        comm.recv(source, out=a, timeout=timeout)
        if digest_of(a) != digest:
            raise ProtocolError(f"rank {peer.rank}: {name!r} from rank {source} does not "
                                "match its digest: corrupted in transfer")
    tracked = manifest.get("tracked") or {}
    for name, obj in peer.tracked_state.items():
        if name in tracked:
            obj.load_state_dict(tracked[name])
    return step, manifest.get("values", {})
