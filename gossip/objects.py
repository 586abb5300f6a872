"""Plain Python values from one peer to every other, or from every peer to every other, as
Horovod's ``broadcast_object`` and ``allgather_object`` do, but never pickled: a value travels
as msgpack, so it may hold None, bools, ints, floats, strings, bytes, lists, tuples (they come
back as lists) and dicts of those (any such keys). An array or any other object is a
TypeError, on every peer, naming the rank whose value it was.

    step = peer.broadcast_object({"epoch": 3, "lr": 0.1} if peer.rank == 0 else None)
    names = peer.allgather_object(socket.gethostname())     # every peer's, rank order

Each is a collective of the peer's communicator: the value's packed bytes travel as uint8
arrays (broadcast: their length, then them; allgather: ``allgather(variable=True)``), so a
peer that does not call it, or calls another collective, fails the call on every peer as any
collective does. The sending peer gets its own value back as it gave it; the others get what
msgpack makes of it.
"""
from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

__all__ = ["broadcast_object", "allgather_object"]

_PLAIN, _REFUSED = 0, 1   # the first byte of what travels: a value, or why there is none


def broadcast_object(peer: Any, obj: Any, root: int = 0, *,
                     timeout: float | None = None) -> Any:
    """``root``'s ``obj`` on every peer (``obj`` is ignored elsewhere): root gets its own
    back, the others a copy made of plain values. TypeError on every peer if root's value is
    not plain values (module docstring); ValueError if ``root`` is not a rank."""
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < peer.world_size:
        raise ValueError(f"rank {peer.rank}: broadcast_object: root must be a rank in "
                         f"[0, {peer.world_size}), got {root!r}")
    if peer.world_size == 1:   # (the same TypeError as with others)
        _unpack(peer.rank, "broadcast_object", root, _alone(obj))
        return obj
    mine = _pack_or_refuse(obj) if peer.rank == root else b""
    size = np.array([len(mine)], dtype=np.int64)
    peer.broadcast(size, root=root, timeout=timeout)
    data = (np.frombuffer(bytearray(mine), dtype=np.uint8) if peer.rank == root
            else np.empty(int(size[0]), dtype=np.uint8))
    peer.broadcast(data, root=root, timeout=timeout)
    value = _unpack(peer.rank, "broadcast_object", root, data)
    return obj if peer.rank == root else value


def allgather_object(peer: Any, obj: Any, *, timeout: float | None = None) -> list[Any]:
    """Every peer's ``obj``, in rank order (this peer's own as it gave it, the others' made
    of plain values). TypeError on every peer, naming the ranks, if any peer's value is not
    plain values (module docstring)."""
    if peer.world_size == 1:
        _unpack(peer.rank, "allgather_object", peer.rank, _alone(obj))
        return [obj]
    mine = np.frombuffer(bytearray(_pack_or_refuse(obj)), dtype=np.uint8)
    parts = peer.allgather(mine, variable=True, timeout=timeout)
    refused = [j for j, part in enumerate(parts) if int(part[0]) != _PLAIN]
    if refused:
        why = "; ".join(f"rank {j}: {bytes(parts[j][1:]).decode('utf-8', 'replace')}"
                        for j in refused)
        raise TypeError(f"rank {peer.rank}: allgather_object: the value of rank(s) {refused} "
                        f"cannot travel ({why})")
    return [obj if j == peer.rank else _unpack(peer.rank, "allgather_object", j, part)
            for j, part in enumerate(parts)]


def _pack(obj: Any) -> bytes:
    """``obj`` as msgpack, else TypeError saying what is not a plain value."""
    try:
        return msgpack.packb(obj, use_bin_type=True, strict_types=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"only plain values travel (None, bool, int, float, str, bytes, "
                        f"lists, tuples, dicts; never pickled): {exc}") from None


def _pack_or_refuse(obj: Any) -> bytes:
    """What travels: the marker and ``obj`` packed, or the refusal and why (so every peer
    hears of it and raises, rather than wait for a value that never comes)."""
    try:
        return bytes([_PLAIN]) + _pack(obj)
    except TypeError as exc:
        return bytes([_REFUSED]) + str(exc).encode("utf-8")


def _alone(obj: Any) -> np.ndarray:
    return np.frombuffer(_pack_or_refuse(obj), dtype=np.uint8)


def _unpack(rank: int, what: str, source: int, data: np.ndarray) -> Any:
    """The value ``source`` sent in ``data``, or TypeError (on every peer alike) if it could
    not send one."""
    raw = data.tobytes()
    if raw[:1] != bytes([_PLAIN]):
        raise TypeError(f"rank {rank}: {what}: the value of rank {source} cannot travel "
                        f"({raw[1:].decode('utf-8', 'replace')})")
    return msgpack.unpackb(raw[1:], raw=False, strict_map_key=False)
