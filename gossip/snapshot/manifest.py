"""The manifest: a snapshot's description in msgpack-able values only (its arrays' names,
kinds, dtypes, shapes and digests, and the trees of its parts), what the snapshot's digest is
taken over, and the one comparison of two snapshots' arrays.

    {"format": "gossip-snapshot", "version": 3,
     "arrays": [{"name": "model/0.weight", "kind": "torch", "dtype": "float32",
                 "shape": [32, 20], "digest": "<64 hex>"}, ...],
     "parts": {"model": {...}, "optimizer": {...}, "policy": {...}, "params": [...],
               "extra": {...}}}
"""
from __future__ import annotations

import hashlib
from typing import Any, Sequence

import msgpack

from gossip.errors import SnapshotError, SnapshotMismatch
from gossip.snapshot.array_specs import DIGEST_BYTES, DIGEST_VERSIONS, ArraySpec

__all__ = ["FORMAT", "VERSION", "PARTS", "build", "parse", "version_of", "digest", "pack",
           "unpack", "compare"]

FORMAT = "gossip-snapshot"
#: The version written. 3: array digests over pieces' XXH3-64 (array_specs.PIECE_BYTES); 2: over
#: their CRC-32 (read and verified still: array_specs.DIGEST_VERSIONS); 1: blake2b of the bytes.
VERSION = 3
#: The parts a snapshot may hold, in the order they are stored and restored.
PARTS = ("model", "params", "optimizer", "policy", "extra")
# A manifest describes, it does not carry: 64 MiB of msgpack is millions of arrays.
_MAX_MANIFEST_BYTES = 64 << 20


def build(specs: Sequence[ArraySpec], digests: Sequence[str], parts: dict,
          version: int = VERSION) -> dict:
    """The manifest of arrays whose digests were taken in ``version``'s scheme."""
    return {"format": FORMAT, "version": version,
            "arrays": [s.to_manifest(d) for s, d in zip(specs, digests)], "parts": parts}


def version_of(manifest: Any) -> int:
    """The version of a manifest this gossip reads (its digests' scheme); SnapshotError for
    anything else."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SnapshotError(f"not a {FORMAT} manifest")
    version = manifest.get("version")
    if type(version) is not int or version not in DIGEST_VERSIONS:
        raise SnapshotError(f"snapshot format version {version!r}; this gossip reads versions "
                            f"{sorted(DIGEST_VERSIONS)}")
    return version


def parse(manifest: Any) -> tuple[list[ArraySpec], list[str], dict]:
    """The specs, digests and parts of a manifest, checked (it may come from another peer or
    a damaged file): SnapshotError naming what is wrong."""
    version_of(manifest)
    entries, parts = manifest.get("arrays"), manifest.get("parts")
    if not isinstance(entries, list) or not isinstance(parts, dict) or not set(parts) <= set(
            PARTS) or set(manifest) != {"format", "version", "arrays", "parts"}:
        raise SnapshotError("malformed manifest: expected format, version, arrays and parts "
                            f"(parts among {PARTS})")
    specs, digests = [], []
    for entry in entries:
        spec, d = ArraySpec.from_manifest(entry)
        specs.append(spec)
        digests.append(d)
    if len({s.name for s in specs}) != len(specs):
        raise SnapshotError("malformed manifest: two arrays of the same name")
    return specs, digests, parts


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes, where: str) -> Any:
    """Plain msgpack values (no extension types, nothing unpickled); SnapshotError naming
    ``where`` for bytes that are not (a reader of a file turns it into SnapshotCorrupt)."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True,
                               max_bin_len=_MAX_MANIFEST_BYTES,
                               max_str_len=_MAX_MANIFEST_BYTES)
    except (ValueError, msgpack.UnpackException, TypeError) as exc:
        raise SnapshotError(f"{where} is not a readable manifest ({exc})") from exc


def digest(manifest: dict) -> str:
    """The snapshot's digest: blake2b of the packed manifest, which holds every array's
    digest, so two snapshots share it exactly when their descriptions and bytes agree."""
    return hashlib.blake2b(pack(manifest), digest_size=DIGEST_BYTES).hexdigest()


def compare(mine: Sequence[ArraySpec], theirs: Sequence[ArraySpec], here: str, there: str,
            prefixes: Sequence[str] | None = None) -> None:
    """SnapshotMismatch naming the first tensor (in ``mine``'s order, then ``theirs``') whose
    name is on one side only or whose kind, dtype or shape differ; ``prefixes`` limits the
    comparison to names under those parts ("model", "optimizer", ...)."""
    def wanted(spec: ArraySpec) -> bool:
        return prefixes is None or spec.name.split("/", 1)[0] in prefixes

    by_name = {s.name: s for s in theirs if wanted(s)}
    for spec in filter(wanted, mine):
        other = by_name.pop(spec.name, None)
        if other is None:
            raise SnapshotMismatch(f"first mismatched tensor {spec.name!r}: "
                                   f"{spec.describe()} in {here}, absent from {there}",
                                   tensor=spec.name)
        if not spec.same_as(other):
            raise SnapshotMismatch(f"first mismatched tensor {spec.name!r}: "
                                   f"{spec.describe()} in {here}, {other.describe()} in "
                                   f"{there}", tensor=spec.name)
    if by_name:
        name, other = next(iter(by_name.items()))
        raise SnapshotMismatch(f"first mismatched tensor {name!r}: absent from {here}, "
                               f"{other.describe()} in {there}", tensor=name)
