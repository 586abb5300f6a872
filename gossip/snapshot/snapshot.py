"""A peer's whole training state as one value: named arrays and a manifest that says how they
fit together, with one digest over both."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from gossip.errors import SnapshotError, SnapshotMismatch
from gossip.optim import DistributedOptimizer
from gossip.snapshot import files, manifest as mf
from gossip.snapshot.array_specs import (ArraySpec, byte_view, digest_of_pieces, is_array, prepare,
                                    spec_of, sums_of)
from gossip.snapshot.layout import Layout
from gossip.snapshot.structure import decode, encode

__all__ = ["Snapshot"]


def _split(optimizer: Any, policy: Any) -> tuple[Any, Any, bool]:
    """(the torch optimizer, the policy, whether the policy was named explicitly): a
    DistributedOptimizer stands for its wrapped optimizer and its policy."""
    if isinstance(optimizer, DistributedOptimizer):
        if policy is not None and policy is not optimizer.policy:
            raise ValueError("policy= is not the DistributedOptimizer's own policy")
        return optimizer.optimizer, optimizer.policy, policy is not None
    return optimizer, policy, policy is not None


class Snapshot:
    """An ordered list of named arrays (numpy arrays, torch CPU tensors) and the parts they
    belong to: ``model`` (a module's state dict), ``params`` (a list of arrays), ``optimizer``
    (a torch optimizer's state dict), ``policy`` (Policy.state_dict()) and ``extra`` (your
    own values: scalars, containers, arrays). Made by Snapshot.of(), Snapshot.load() or
    SnapshotReceiver.finish().

    By default a snapshot refers to the live arrays (no copy): it describes the state as long
    as training does not move, so take it and use it between steps, or pass ``copy=True``.
    Digests are computed on first use (``digest``, ``manifest``, ``save``) and kept, in the
    scheme of the snapshot's format ``version`` (manifest.VERSION for a new one; a loaded or
    received one keeps its manifest's, so a version-2 checkpoint keeps its digests).
    """

    def __init__(self, arrays: Sequence[tuple[str, Any]], parts: dict, *,
                 digests: Sequence[str] | None = None, version: int = mf.VERSION) -> None:
        names = [n for n, _ in arrays]
        seen: set[str] = set()
        for name in names:
            if name in seen:   # names are paths of keys: {"a/b": x} and {"a": {"b": y}} meet
                raise ValueError(f"two arrays would be named {name!r} (a key with a '/'?)")
            seen.add(name)
        self._arrays = [prepare(a, copy=False) for _, a in arrays]   # contiguous, on the CPU
        self._specs = [spec_of(n, a) for n, a in zip(names, self._arrays)]
        self._parts = parts
        self._digests = list(digests) if digests is not None else None
        self._version = version
        self._sums: list[list[int]] | None = None
        self._views: list[memoryview] | None = None
        self._layout = Layout.of(names, [s.nbytes for s in self._specs])

    # ------------------------------------------------------------------ building
    @classmethod
    def of(cls, *, model: Any = None, optimizer: Any = None, policy: Any = None,
           params: Sequence[Any] | None = None, extra: Any = None,
           copy: bool = False) -> "Snapshot":
        """The state of whatever is given: ``model`` (a torch module: its state_dict(), names
        "model/<key>"), ``params`` (flat arrays a policy is attached to: "params/<i>"),
        ``optimizer`` (a torch optimizer, or a gossip.DistributedOptimizer, which brings its
        policy: "optimizer/state/<i>/exp_avg"), ``policy`` ("policy/<key>"), ``extra``
        (msgpack-able values and arrays: "extra/<key>"). ``copy=True`` copies every array, so
        the snapshot stays as it is while training goes on."""
        optimizer, policy, _ = _split(optimizer, policy)
        arrays: list[tuple[str, Any]] = []

        def add(name: str, x: Any) -> int:
            arrays.append((name, prepare(x, copy) if copy else x))
            return len(arrays) - 1

        def no_arrays(name: str, x: Any) -> int:
            raise TypeError(f"{name}: an array in a module's state dict metadata")

        parts: dict[str, Any] = {}
        if model is not None:
            state = model.state_dict()
            metadata = getattr(state, "_metadata", None)
            parts["model"] = {"state": encode(dict(state), "model", add),
                              "metadata": encode(dict(metadata or {}), "model", no_arrays)}
        if params is not None:
            parts["params"] = encode(_param_list(params), "params", add)
        if optimizer is not None:
            parts["optimizer"] = encode(optimizer.state_dict(), "optimizer", add)
        if policy is not None:
            parts["policy"] = encode(policy.state_dict(), "policy", add)
        if extra is not None:
            parts["extra"] = encode(extra, "extra", add)
        return cls(arrays, parts)

    # ------------------------------------------------------------------ restoring
    def restore_into(self, *, model: Any = None, params: Sequence[Any] | None = None,
                     optimizer: Any = None, policy: Any = None) -> None:
        """Load the snapshot's parts into what is given, in this order: the model
        (load_state_dict, strict), the params (copied in place), the optimizer (a
        DistributedOptimizer: its optimizer and, if the snapshot has one, its policy's state),
        the policy (after the parameters: push-sum rebuilds its numerators from them).
        SnapshotMismatch, before anything is loaded, for a part the snapshot lacks or naming
        the first tensor of the model or params whose name, dtype or shape differ (the
        optimizer's and policy's own load_state_dict check theirs); the optimizer and policy
        get copies of the snapshot's arrays, never the arrays themselves."""
        optimizer, policy, explicit_policy = _split(optimizer, policy)
        if not explicit_policy and "policy" not in self._parts:
            policy = None   # a DistributedOptimizer saved as a plain torch optimizer
        for part, target in (("model", model), ("params", params), ("optimizer", optimizer),
                             ("policy", policy)):
            if target is not None and part not in self._parts:
                raise SnapshotMismatch(f"the snapshot holds no {part} state (it has "
                                       f"{self.parts or 'no parts'})")
        # Every check before the first load: a mismatch leaves the targets as they were.
        if model is not None:
            tree = self._parts["model"]
            if not isinstance(tree, dict) or set(tree) != {"state", "metadata"}:
                raise SnapshotError("malformed manifest: the model part")
            self._check_target(Snapshot.of(model=model), "model", "the model")
        if params is not None:
            params = _param_list(params)
            self._check_target(Snapshot.of(params=params), "params", "the params")
        if model is not None:
            model.load_state_dict(_ModuleState(
                self._decode(tree["state"], clone=False),
                OrderedDict(self._decode(tree["metadata"], clone=False))))
        if params is not None:
            for dst, src in zip(params, self._decode(self._parts["params"], clone=False)):
                _copy_into(dst, src)
        if optimizer is not None:
            optimizer.load_state_dict(self._decode(self._parts["optimizer"], clone=True))
        if policy is not None:
            policy.load_state_dict(self._decode(self._parts["policy"], clone=True))

    def _check_target(self, target: "Snapshot", part: str, what: str) -> None:
        mf.compare(target._specs, self._specs, what, "the snapshot", prefixes=(part,))

    def _decode(self, tree: Any, clone: bool) -> Any:
        return decode(tree, self._arrays, clone)

    # ------------------------------------------------------------------ what it holds
    @property
    def names(self) -> list[str]:
        """The arrays' names, in snapshot (and byte-layout) order."""
        return list(self._layout.names)

    @property
    def arrays(self) -> dict[str, Any]:
        """name -> array (the snapshot's own: read them, do not modify them)."""
        return dict(zip(self._layout.names, self._arrays))

    @property
    def parts(self) -> list[str]:
        """The parts present, among model, params, optimizer, policy, extra."""
        return [p for p in mf.PARTS if p in self._parts]

    @property
    def extra(self) -> Any:
        """The ``extra`` given to Snapshot.of() (None if none), arrays included."""
        tree = self._parts.get("extra")
        return None if tree is None else self._decode(tree, clone=False)

    @property
    def nbytes(self) -> int:
        """Bytes of all the arrays (the layout's total)."""
        return self._layout.total

    @property
    def specs(self) -> list[ArraySpec]:
        """Each array's name, kind, dtype and shape."""
        return list(self._specs)

    # ------------------------------------------------------------------ digests
    def _byte_views(self) -> list[memoryview]:
        if self._views is None:
            self._views = [byte_view(a) for a in self._arrays]
        return self._views

    @property
    def version(self) -> int:
        """The snapshot format version its digests are in (manifest.VERSION, or a loaded
        one's)."""
        return self._version

    @property
    def digests(self) -> list[str]:
        """Each array's digest (over kind, dtype, shape and its pieces' checksums, array_specs.py),
        hex."""
        if self._digests is None:
            self._digests = [digest_of_pieces(s, c, self._version)
                             for s, c in zip(self._specs, self.piece_crcs)]
        return list(self._digests)

    @property
    def piece_crcs(self) -> list[list[int]]:
        """Each array's pieces' checksums (array_specs.PIECE_BYTES each; XXH3-64 in version 3,
        CRC-32 in version 2), what its digest is over: a receiver that compares its own
        learns which pieces are bad, not only which array."""
        if self._sums is None:
            self._sums = sums_of(self._byte_views(), self._version)
        return [list(c) for c in self._sums]

    @property
    def manifest(self) -> dict:
        """The description a receiver or a reader needs (msgpack-able values only)."""
        return mf.build(self._specs, self.digests, self._parts, self._version)

    @property
    def digest(self) -> str:
        """One digest of the whole snapshot: over the manifest, which holds every array's."""
        return mf.digest(self.manifest)

    def check_compatible(self, other: "Snapshot | dict", *,
                         parts: Sequence[str] | None = None) -> None:
        """SnapshotMismatch naming the first tensor whose name is on one side only, or whose
        kind, dtype or shape differ, between this snapshot and ``other`` (a Snapshot or a
        manifest, e.g. a donor's); ``parts`` limits it to those parts (("model",): a joiner
        whose fresh optimizer has no state yet). Digests are not compared: see ``digest``."""
        theirs = other._specs if isinstance(other, Snapshot) else mf.parse(other)[0]
        mf.compare(self._specs, theirs, "this snapshot", "the other", prefixes=parts)

    # ------------------------------------------------------------------ bytes
    def layout(self) -> Layout:
        """Where each array lies in the snapshot's flat byte space (``total`` bytes)."""
        return self._layout

    def read(self, offset: int, length: int) -> memoryview | bytes:
        """Bytes [offset, offset + length) of the flat space: a read-only memoryview of the
        array itself when the range lies within one array (no copy; see
        Layout.ranges()), else bytes joined from the arrays it covers."""
        pieces = list(self._layout.pieces(offset, length))
        views = self._byte_views()
        if len(pieces) == 1:
            i, lo, hi = pieces[0]
            return views[i][lo:hi].toreadonly()
        return b"".join(views[i][lo:hi] for i, lo, hi in pieces)

    # ------------------------------------------------------------------ disk
    def save(self, directory: str, *, shard: int | None = None) -> str:
        """Write the snapshot under ``directory`` (made if missing), atomically: the data file
        first (temp name, fsync, rename), then the manifest, which is the commit. ``shard``:
        files named for one rank ("shard-3.msgpack"), so every peer can save its own in one
        directory; default one "snapshot.msgpack". Returns the manifest file's path."""
        return files.write(directory, shard, self._byte_views(), lambda: self.manifest)

    @classmethod
    def load(cls, directory: str, *, shard: int | None = None) -> "Snapshot":
        """Read what save() wrote, checking the manifest's digest, the data file's size and
        every array's digest: SnapshotCorrupt naming the file (a torn one) or the first
        corrupted tensor, never a silently wrong snapshot."""
        specs, arrays, digests, parts, version = files.read(directory, shard)
        return cls([(s.name, a) for s, a in zip(specs, arrays)], parts, digests=digests,
                   version=version)

    def __repr__(self) -> str:
        return (f"<Snapshot {len(self._specs)} arrays, {self._layout.total} bytes, parts "
                f"{self.parts}, version {self._version}>")


class _ModuleState(OrderedDict):
    """A torch module's state dict as Module.state_dict() gives it: the tensors by key, and
    torch's ``_metadata`` (each submodule's version), which load_state_dict reads."""

    def __init__(self, state: Any, metadata: OrderedDict) -> None:
        super().__init__(state)
        self._metadata = metadata


def _param_list(params: Any) -> list:
    # One array is refused rather than taken for a list of its rows.
    params = None if is_array(params) else list(params)
    if params is None or not all(is_array(p) for p in params):
        raise TypeError("params must be a list of numpy arrays or torch tensors")
    return params


def _copy_into(dst: Any, src: Any) -> None:
    # The specs were compared first: dst and src are of one kind, dtype and shape. A snapshot
    # received into dst itself (SnapshotReceiver's ``into``) is already there.
    if isinstance(dst, np.ndarray):
        if not (isinstance(src, np.ndarray) and dst.__array_interface__["data"][0] ==
                src.__array_interface__["data"][0] and dst.strides == src.strides):
            np.copyto(dst, src)
        return
    import torch
    if isinstance(src, torch.Tensor) and dst.data_ptr() == src.data_ptr() \
            and dst.stride() == src.stride():
        return
    with torch.no_grad():
        dst.copy_(src)
