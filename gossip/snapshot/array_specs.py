"""The arrays of a snapshot: what describes one (ArraySpec), its bytes as a flat view, a fresh
array to receive it, and its digest.

Two kinds of array: numpy arrays (dtype by numpy's string, '<f4') and torch CPU tensors (dtype
by torch's name, 'bfloat16', which numpy lacks). torch is imported only for specs of kind
"torch", so numpy-only snapshots never load it.
"""
from __future__ import annotations

import hashlib
import math
import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import xxhash

from gossip.errors import SnapshotCorrupt, SnapshotError
from gossip.policies.base.buckets import is_torch_tensor
from gossip.snapshot.crc import checksum, xxh3

__all__ = ["ArraySpec", "spec_of", "prepare", "byte_view", "allocate", "digest_of",
           "digests_of", "sums_of", "piece_sums", "piece_sum", "digest_of_pieces", "verify",
           "is_array", "DIGEST_BYTES", "PIECE_BYTES", "DIGEST_VERSIONS"]

#: The digest's size: 32 bytes of blake2b (hex in a manifest).
DIGEST_BYTES = 32
#: An array's digest is taken over a checksum of each of its PIECE_BYTES pieces (from its
#: first byte; the last one shorter), then blake2b over its spec and those checksums. The
#: checksum is the manifest's version's (DIGEST_VERSIONS): XXH3-64 (xxhash) since version 3,
#: zlib's CRC-32 in version 2, whose snapshots and checkpoints still load and verify. XXH3
#: runs at ~17 GB/s on one core of this project's 2-core machine, CRC-32C (crc32c) at ~9 and
#: zlib's CRC-32 at ~2 (blake2b: 1.4): a 4 MiB piece is checked in a quarter of a
#: millisecond on one thread, no longer the bound of a state transfer. Pieces can be checked
#: in any order, each as soon as it lands (a chunk of a transfer is one piece), by any thread
#: (both hashes release the GIL). Either catches any accidental damage of a piece but with a
#: chance of 2**-64 (2**-32 for CRC-32): this is a check against corruption (a torn file, a
#: wrong offset, a bad copy), not against an attacker, whom CURVE keeps off the wire and file
#: permissions off the disk.
PIECE_BYTES = 4 << 20
#: The manifest versions whose digests this module computes: version -> (the piece checksum,
#: the bytes each adds to the digest's input).
DIGEST_VERSIONS = {2: (zlib.crc32, 4), 3: (xxhash.xxh3_64_intdigest, 8)}
# numpy kinds a snapshot may hold: bool, ints, floats, complex. Never objects or records
# (a manifest from a donor must not make us build an object array).
_NUMPY_KINDS = frozenset("biufc")
# Sum in threads only when there is enough to share out (a part's hand-off costs ~20 us).
_PARALLEL_BYTES = 2 << 20
_MAX_DIMS = 64


@dataclass(frozen=True)
class ArraySpec:
    """What a snapshot says of one array: its ``name`` ("model/0.weight"), ``kind`` ("numpy"
    or "torch"), ``dtype`` (numpy's dtype string or torch's dtype name), ``shape`` and the
    size of one element."""

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    itemsize: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    def describe(self) -> str:
        """'torch float32 [32, 20]', 'numpy float32 [3]': what error messages print (numpy
        dtypes by name, unless their byte order is not the machine's: '>f8')."""
        dtype = self.dtype
        if self.kind == "numpy" and np.dtype(dtype).str == np.dtype(np.dtype(dtype).name).str:
            dtype = np.dtype(dtype).name
        return f"{self.kind} {dtype} {list(self.shape)}"

    def same_as(self, other: "ArraySpec") -> bool:
        """Same kind, dtype and shape (the name is compared by the caller)."""
        return (self.kind, self.dtype, self.shape) == (other.kind, other.dtype, other.shape)

    def to_manifest(self, digest: str) -> dict:
        return {"name": self.name, "kind": self.kind, "dtype": self.dtype,
                "shape": list(self.shape), "digest": digest}

    @classmethod
    def from_manifest(cls, entry: Any) -> tuple["ArraySpec", str]:
        """Parse and check one manifest entry (it may come from another peer or a damaged
        file): SnapshotError naming what is wrong."""
        if not isinstance(entry, dict) or set(entry) != {"name", "kind", "dtype", "shape",
                                                          "digest"}:
            raise SnapshotError(f"malformed manifest entry {entry!r:.200}")
        name, kind, dtype, shape, digest = (entry[k] for k in ("name", "kind", "dtype",
                                                               "shape", "digest"))
        if not isinstance(name, str) or not name:
            raise SnapshotError(f"malformed array name {name!r:.200}")
        if (not isinstance(shape, list) or len(shape) > _MAX_DIMS
                or not all(type(d) is int and d >= 0 for d in shape)):
            raise SnapshotError(f"array {name!r}: malformed shape {shape!r:.200}")
        if not (isinstance(digest, str) and len(digest) == 2 * DIGEST_BYTES
                and all(c in "0123456789abcdef" for c in digest)):
            raise SnapshotError(f"array {name!r}: malformed digest {digest!r:.200}")
        return cls(name, kind, dtype, tuple(shape), _itemsize(name, kind, dtype)), digest


def _itemsize(name: str, kind: str, dtype: Any) -> int:
    if not isinstance(dtype, str):
        raise SnapshotError(f"array {name!r}: malformed dtype {dtype!r:.200}")
    if kind == "numpy":
        try:
            dt = np.dtype(dtype)
        except TypeError:
            dt = None
        if dt is None or dt.kind not in _NUMPY_KINDS or dt.fields is not None or dt.str != dtype:
            raise SnapshotError(f"array {name!r}: not a numeric numpy dtype: {dtype!r:.200}")
        return dt.itemsize
    if kind == "torch":
        import torch
        dt = getattr(torch, dtype, None) if dtype.isidentifier() else None
        # Canonical names only ("float32", not its alias "float"): the digest covers the name.
        if not isinstance(dt, torch.dtype) or str(dt) != f"torch.{dtype}":
            raise SnapshotError(f"array {name!r}: not a torch dtype: {dtype!r:.200}")
        return torch.empty(0, dtype=dt).element_size()
    raise SnapshotError(f"array {name!r}: unknown kind {kind!r:.200} (numpy or torch)")


def is_array(x: Any) -> bool:
    """A numpy array or a torch tensor: what a snapshot stores as bytes."""
    return isinstance(x, np.ndarray) or is_torch_tensor(x)


def prepare(x: Any, copy: bool) -> Any:
    """``x`` as a snapshot holds it: detached, on the CPU, contiguous, with plain (not
    conjugated, not negated) bits; the same memory when it already is and ``copy`` is false."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in _NUMPY_KINDS or x.dtype.fields is not None:
            raise TypeError(f"a snapshot holds numeric arrays, not dtype {x.dtype}")
        # (np.ascontiguousarray would turn a 0-d array into a 1-d one.)
        if copy or not x.flags.c_contiguous:
            return np.array(x, order="C", copy=True)
        return x
    if x.is_sparse or x.is_quantized or getattr(x, "is_nested", False):
        raise TypeError(f"a snapshot holds dense tensors, not a {x.layout} one")
    t = x.detach().cpu().resolve_conj().resolve_neg().contiguous()
    if copy and t.data_ptr() == x.data_ptr():
        t = t.clone()
    return t


def spec_of(name: str, x: Any) -> ArraySpec:
    """The spec of an array made by prepare()."""
    if isinstance(x, np.ndarray):
        return ArraySpec(name, "numpy", x.dtype.str, tuple(x.shape), x.dtype.itemsize)
    return ArraySpec(name, "torch", str(x.dtype).removeprefix("torch."), tuple(x.shape),
                     x.element_size())


def byte_view(x: Any) -> memoryview:
    """The bytes of a contiguous array as a flat memoryview, no copy (writable if ``x`` is)."""
    if isinstance(x, np.ndarray):
        return x.reshape(-1).view(np.uint8).data
    import torch
    return x.reshape(-1).view(torch.uint8).numpy().data


def allocate(spec: ArraySpec) -> Any:
    """A new, uninitialised array that fits ``spec``."""
    if spec.kind == "numpy":
        return np.empty(spec.shape, dtype=np.dtype(spec.dtype))
    import torch
    return torch.empty(spec.shape, dtype=getattr(torch, spec.dtype))


def _scheme(version: int) -> tuple[Any, int]:
    try:
        return DIGEST_VERSIONS[version]
    except KeyError:
        raise SnapshotError(f"snapshot digests of version {version!r}; this gossip computes "
                            f"versions {sorted(DIGEST_VERSIONS)}") from None


def piece_sum(data: memoryview, version: int) -> int:
    """The checksum of one piece (or any buffer) in ``version``'s scheme, on this thread."""
    return _scheme(version)[0](data)


def piece_sums(data: memoryview, version: int) -> list[int]:
    """The checksum of each PIECE_BYTES piece of an array's bytes (none for an empty array),
    in ``version``'s scheme (DIGEST_VERSIONS)."""
    fn = _scheme(version)[0]
    return [fn(data[at:at + PIECE_BYTES]) for at in range(0, len(data), PIECE_BYTES)]


def digest_of_pieces(spec: ArraySpec, sums: Sequence[int], version: int) -> str:
    """The array's digest from its pieces' checksums: blake2b over its kind, dtype and shape
    (the same bytes under another dtype or shape are another array), then the checksums in
    order (big-endian, as wide as ``version``'s checksum)."""
    width = _scheme(version)[1]
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    h.update(f"{spec.kind}:{spec.dtype}:{list(spec.shape)}\n".encode())
    h.update(b"".join(c.to_bytes(width, "big") for c in sums))
    return h.hexdigest()


def digest_of(spec: ArraySpec, data: memoryview, version: int) -> str:
    """The digest of one array's bytes (see PIECE_BYTES)."""
    return digest_of_pieces(spec, piece_sums(data, version), version)


def sums_of(views: Sequence[memoryview], version: int) -> list[list[int]]:
    """Every array's piece_sums(), on every core (snapshot.crc's threads) when there is
    enough to share out: a piece per task in version 3 (XXH3 cannot be split), parts of
    pieces combined in version 2 (crc.checksum)."""
    if sum(len(v) for v in views) < _PARALLEL_BYTES:
        return [piece_sums(v, version) for v in views]
    start = xxh3 if _scheme(version)[0] is xxhash.xxh3_64_intdigest else checksum
    pending = [[start(v[at:at + PIECE_BYTES]) for at in range(0, len(v), PIECE_BYTES)]
               for v in views]
    return [[p.result() for p in pieces] for pieces in pending]


def digests_of(specs: Sequence[ArraySpec], views: Sequence[memoryview],
               version: int) -> list[str]:
    """Every array's digest (its pieces summed as sums_of does)."""
    return [digest_of_pieces(s, c, version) for s, c in zip(specs, sums_of(views, version))]


def verify(specs: Sequence[ArraySpec], got: Sequence[str], want: Sequence[str],
           offsets: Sequence[int], where: str) -> None:
    """SnapshotCorrupt naming the first array (in snapshot order) whose digest ``got`` is not
    the one its manifest says (``want``); ``where`` says what was read ("file /x/a.bin",
    "the chunks received")."""
    for spec, g, w, offset in zip(specs, got, want, offsets):
        if g != w:
            raise SnapshotCorrupt(
                f"tensor {spec.name!r} ({spec.describe()}, bytes {offset}-"
                f"{offset + spec.nbytes} of the snapshot) does not match its digest in "
                f"{where}: corrupted or torn", tensor=spec.name, offset=offset,
                nbytes=spec.nbytes)
