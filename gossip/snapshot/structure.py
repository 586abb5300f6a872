"""State dicts as a manifest tree: nested dicts, lists, tuples and scalars kept as msgpack
values, every array replaced by a reference to the snapshot's list of arrays, so a state dict
comes back exactly as it went (a tuple as a tuple, int keys as ints, a 0-d step tensor as a
tensor of its dtype, a numpy scalar as a numpy scalar of its dtype) and nothing is pickled.

Tags: a one-key map whose key starts with "$". ``{"$a": i}`` is array i; ``{"$s": i}`` is the
numpy scalar held as 0-d array i; ``{"$t": [...]}`` a tuple; ``{"$m": [[k, v], ...]}`` a dict
whose keys are not all strings (optimizer state is keyed by int) or that could pass for a
tag. Any other map is a dict of str keys; a list is a list.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from gossip.errors import SnapshotError
from gossip.snapshot.array_specs import is_array

__all__ = ["encode", "decode"]

_SCALARS = (str, bool, int, float, bytes, type(None))
_INT_RANGE = (-(1 << 63), (1 << 64) - 1)   # what msgpack can carry
_MAX_DEPTH = 64


def encode(obj: Any, path: str, add_array: Callable[[str, Any], int]) -> Any:
    """The tree of ``obj``; ``add_array(name, array)`` stores an array found at ``name``
    ("optimizer/state/3/exp_avg": the path of keys) and returns its index. TypeError naming
    the path for anything that is neither a scalar, a container nor an array."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, float, bytes)):
        return obj
    if isinstance(obj, int):
        if not _INT_RANGE[0] <= obj <= _INT_RANGE[1]:
            raise TypeError(f"{path}: the int {obj} does not fit 64 bits")
        return int(obj)
    if isinstance(obj, np.generic):
        return {"$s": add_array(path, np.asarray(obj))}
    if is_array(obj):
        return {"$a": add_array(path, obj)}
    if isinstance(obj, tuple):
        return {"$t": [encode(v, f"{path}/{i}", add_array) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode(v, f"{path}/{i}", add_array) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        for key in obj:
            if not isinstance(key, _SCALARS) or isinstance(key, bytes):
                raise TypeError(f"{path}: a key of type {type(key).__name__} ({key!r:.80}); "
                                "keys must be str, int, float, bool or None")
        items = [(k, encode(v, f"{path}/{k}", add_array)) for k, v in obj.items()]
        if all(isinstance(k, str) and not k.startswith("$") for k in obj):
            return dict(items)
        return {"$m": [[encode(k, path, add_array), v] for k, v in items]}
    raise TypeError(f"{path}: cannot put a {type(obj).__name__} in a snapshot (scalars, "
                    "lists, tuples, dicts, numpy arrays and torch tensors only)")


def decode(tree: Any, arrays: list, clone: bool, depth: int = 0) -> Any:
    """The object ``tree`` describes, with ``arrays`` for its references (copies of them if
    ``clone``: the caller keeps what it gets without aliasing the snapshot). SnapshotError for
    a malformed tree (a manifest may come from a damaged file or another peer)."""
    if depth > _MAX_DEPTH:
        raise SnapshotError(f"manifest tree deeper than {_MAX_DEPTH}")
    if isinstance(tree, _SCALARS):
        return tree
    if isinstance(tree, list):
        return [decode(v, arrays, clone, depth + 1) for v in tree]
    if not isinstance(tree, dict):
        raise SnapshotError(f"malformed manifest tree: a {type(tree).__name__}")
    if len(tree) == 1:
        (tag, value), = tree.items()
        if tag in ("$a", "$s"):
            if type(value) is not int or not 0 <= value < len(arrays):
                raise SnapshotError(f"manifest refers to array {value!r:.80}; it has "
                                    f"{len(arrays)}")
            array = arrays[value]
            if tag == "$s":
                if not isinstance(array, np.ndarray) or array.ndim:
                    raise SnapshotError(f"manifest scalar {value} is not a 0-d numpy array")
                return array[()]
            return array.copy() if clone and isinstance(array, np.ndarray) else (
                array.clone() if clone else array)
        if tag == "$t":
            return tuple(decode(value, arrays, clone, depth + 1))
        if tag == "$m":
            if not isinstance(value, list) or not all(
                    isinstance(kv, list) and len(kv) == 2 for kv in value):
                raise SnapshotError("malformed manifest map")
            return {_key(decode(k, arrays, clone, depth + 1)): decode(v, arrays, clone,
                                                                      depth + 1)
                    for k, v in value}
    if any(not isinstance(k, str) or k.startswith("$") for k in tree):
        raise SnapshotError(f"malformed manifest tree: keys {list(tree)!r:.200}")
    return {k: decode(v, arrays, clone, depth + 1) for k, v in tree.items()}


def _key(key: Any) -> Any:
    if not isinstance(key, _SCALARS) or isinstance(key, bytes):
        raise SnapshotError(f"malformed manifest map key {key!r:.80}")
    return key
