"""The demo's data: scikit-learn's handwritten digits (shipped inside the package, never
downloaded), MNIST from its IDX files on disk, and equal shards for the peers.

    data = load_digits()                      # 1437 train / 360 test images of 8x8
    data = load_shifted_digits()              # the same, 4 (8) placements each on 12x12
    data = load_mnist("/data/mnist")          # the four IDX files, gzipped or not
    rows = shard(len(data.train_labels), rank=1, world_size=4, seed=0)

Images stay uint8 (``max_value`` says what full scale is) so a dataset travels cheaply to the
peer processes; each peer normalises its own copy. Everything read from disk is validated
(magic numbers, dimensions, lengths, label range): a hostile or truncated file is a
DataError (a ValueError) with one clear line, never a crash or a huge allocation.
"""
from __future__ import annotations

import gzip
import importlib.util
import os
import struct
import zlib
from dataclasses import dataclass

import numpy as np

__all__ = ["Dataset", "DataError", "load_digits", "load_shifted_digits", "load_mnist",
           "read_idx", "write_idx",
           "shard", "MNIST_FILES", "IDX_DTYPES"]


class DataError(ValueError):
    """A data set that is missing, malformed or unusable; the message is one line."""


@dataclass(frozen=True)
class Dataset:
    """Images and labels, split into train and test."""

    name: str                  # "digits" or "mnist"
    train_images: np.ndarray   # uint8, (N, H, W)
    train_labels: np.ndarray   # int64, (N,), values 0..classes-1
    test_images: np.ndarray    # uint8, (M, H, W)
    test_labels: np.ndarray    # int64, (M,)
    max_value: float           # pixel value of full ink (16 for digits, 255 for MNIST)
    classes: int = 10          # number of label values

    @property
    def image_shape(self) -> tuple[int, int]:
        """(height, width) of every image."""
        return tuple(self.train_images.shape[1:])

    def describe(self) -> str:
        """One line for the demo's output: name, train and test counts, image size."""
        h, w = self.image_shape
        return (f"{self.name}: {len(self.train_labels)} train / {len(self.test_labels)} test "
                f"images of {h}x{w}")


# ---------------------------------------------------------------------- digits

_DIGITS_TEST_FRACTION = 0.2
_DIGITS_SPLIT_SEED = 0  # a fixed split, so every run (and every peer) sees the same test set


def _digits_table() -> np.ndarray:
    """sklearn's digits as a (1797, 65) table: 64 pixels then the label. Read straight from the
    CSV that ships inside scikit-learn when it is where sklearn keeps it (importing
    sklearn.datasets costs seconds); otherwise through sklearn.datasets.load_digits."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None:
        raise DataError("the digits data set ships with scikit-learn, which is not installed; "
                        "pip install scikit-learn (or '.[demo]' in gossip's checkout)")
    for root in spec.submodule_search_locations or ():
        path = os.path.join(root, "datasets", "data", "digits.csv.gz")
        if os.path.isfile(path):
            table = np.loadtxt(path, delimiter=",")
            if table.ndim == 2 and table.shape[1] == 65:
                return table
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    return np.column_stack([bunch.data, bunch.target])


def load_digits(*, test_fraction: float = _DIGITS_TEST_FRACTION,
                seed: int = _DIGITS_SPLIT_SEED) -> Dataset:
    """scikit-learn's 1797 handwritten digits (8x8, values 0..16), split at random (fixed seed)
    into train and test."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    table = _digits_table()
    images = table[:, :64].reshape(-1, 8, 8).astype(np.uint8)
    labels = table[:, 64].astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = int(round(len(labels) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Dataset("digits", images[train], labels[train], images[test], labels[test],
                   max_value=16.0)


_SHIFT_SEED = 1  # placements are fixed too: every run trains and tests on the same images


def load_shifted_digits(*, canvas: int = 12, train_copies: int = 4, test_copies: int = 8,
                        seed: int = _SHIFT_SEED) -> Dataset:
    """The digits (same train/test split as load_digits), each image placed at random offsets
    on a blank ``canvas`` x ``canvas`` image: ``train_copies`` placements of every training
    image, ``test_copies`` of every test image (fixed by ``seed``).

    A harder task made only of the data scikit-learn ships: the model must learn the digits
    wherever they sit, so accuracy keeps rising for several epochs instead of passing 95% in
    the first one or two, and a policy that trains faster or mixes better is seen to be ahead.
    The test set's copies make it 8x larger (2872 images), so one image is 0.035% rather than
    0.28%. Training copies of one image may land on different peers (as augmented copies do)."""
    if canvas < 8:
        raise ValueError(f"canvas must be at least 8 (the digits are 8x8), got {canvas!r}")
    if train_copies < 1 or test_copies < 1:
        raise ValueError(f"copies must be at least 1, got {train_copies!r}, {test_copies!r}")
    digits = load_digits()
    rng = np.random.default_rng(seed)

    def place(images: np.ndarray, labels: np.ndarray, copies: int):
        n = len(images)
        out = np.zeros((copies * n, canvas, canvas), np.uint8)
        offsets = rng.integers(0, canvas - 8 + 1, size=(copies * n, 2))
        for i, (dy, dx) in enumerate(offsets):
            out[i, dy:dy + 8, dx:dx + 8] = images[i % n]
        return out, np.tile(labels, copies)

    train_images, train_labels = place(digits.train_images, digits.train_labels, train_copies)
    test_images, test_labels = place(digits.test_images, digits.test_labels, test_copies)
    return Dataset("shifted-digits", train_images, train_labels, test_images, test_labels,
                   max_value=digits.max_value)


# ---------------------------------------------------------------------- IDX (MNIST)

#: IDX type byte -> numpy dtype (big-endian, as the format stores it).
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
_IDX_MAX_DIMS = 8
_IDX_MAX_BYTES = 1 << 31  # refuse to allocate more than this for one file (MNIST: 47 MB)
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 22

#: The four files of MNIST, by role (each may also end in .gz).
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def _read_exact(f, n: int) -> bytes:
    """Up to n bytes (fewer only at the end of the stream), read in chunks so a gzip stream
    is never inflated past what was asked for."""
    parts, got = [], 0
    while got < n:
        part = f.read(min(_CHUNK, n - got))
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def read_idx(path: str | os.PathLike, *, max_bytes: int = _IDX_MAX_BYTES) -> np.ndarray:
    """The array stored in an IDX file (gzipped or not: told by its first bytes, not its name).

    Checked before any payload is read: the magic number (two zero bytes, a known type byte,
    1 to 8 dimensions), that the dimensions are all there and their product fits in
    ``max_bytes``; then that the payload is exactly that long (no missing, no trailing bytes).
    Any violation, or a corrupt gzip stream, is a DataError naming the file."""
    path = os.fspath(path)
    name = os.path.basename(path)
    try:
        with open(path, "rb") as raw:
            compressed = raw.read(2) == _GZIP_MAGIC
            raw.seek(0)
            f = gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw
            try:
                return _parse_idx(f, name, max_bytes)
            finally:
                if compressed:
                    f.close()
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise DataError(f"{name}: corrupt gzip stream ({exc or type(exc).__name__})") from None
    except IsADirectoryError:
        raise DataError(f"{path} is a directory, not an IDX file") from None
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _parse_idx(f, name: str, max_bytes: int) -> np.ndarray:
    magic = _read_exact(f, 4)
    if len(magic) < 4:
        raise DataError(f"{name}: not an IDX file ({len(magic)} bytes, shorter than the "
                        "4-byte magic number)")
    if magic[0] != 0 or magic[1] != 0:
        raise DataError(f"{name}: not an IDX file (magic number 0x{magic.hex()} does not start "
                        "with two zero bytes)")
    dtype = IDX_DTYPES.get(magic[2])
    if dtype is None:
        raise DataError(f"{name}: unknown IDX data type 0x{magic[2]:02x} (known: "
                        f"{', '.join(f'0x{k:02x}' for k in IDX_DTYPES)})")
    ndim = magic[3]
    if not 1 <= ndim <= _IDX_MAX_DIMS:
        raise DataError(f"{name}: IDX file with {ndim} dimensions (expected 1 to "
                        f"{_IDX_MAX_DIMS})")
    head = _read_exact(f, 4 * ndim)
    if len(head) < 4 * ndim:
        raise DataError(f"{name}: truncated IDX header ({ndim} dimensions announced, "
                        f"{len(head) // 4} present)")
    dims = struct.unpack(f">{ndim}I", head)
    count = 1
    for d in dims:
        count *= d  # Python ints: no overflow, whatever the header claims
    nbytes = count * dtype.itemsize
    if nbytes > max_bytes:
        raise DataError(f"{name}: IDX dimensions {'x'.join(map(str, dims))} would need "
                        f"{nbytes} bytes, more than the {max_bytes} allowed")
    payload = _read_exact(f, nbytes)
    if len(payload) < nbytes:
        raise DataError(f"{name}: truncated IDX data: dimensions {'x'.join(map(str, dims))} "
                        f"need {nbytes} bytes, the file holds {len(payload)}")
    if _read_exact(f, 1):
        raise DataError(f"{name}: trailing bytes after the {nbytes} bytes of data that "
                        f"dimensions {'x'.join(map(str, dims))} announce")
    return np.frombuffer(payload, dtype=dtype).reshape(dims).astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray, *, compress: bool = False) -> None:
    """Write ``array`` as an IDX file (gzipped if ``compress``): for tests and conversions."""
    array = np.asarray(array)
    codes = {dt.newbyteorder("=").str[1:]: code for code, dt in IDX_DTYPES.items()}
    code = codes.get(array.dtype.str[1:])
    if code is None:
        raise ValueError(f"IDX has no type for dtype {array.dtype}")
    if not 1 <= array.ndim <= _IDX_MAX_DIMS:
        raise ValueError(f"IDX holds 1 to {_IDX_MAX_DIMS} dimensions, got {array.ndim}")
    data = (bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
            + np.ascontiguousarray(array, dtype=IDX_DTYPES[code]).tobytes())
    opener = gzip.open if compress else open
    with opener(path, "wb") as f:
        f.write(data)


def _find_mnist_file(data_dir: str, stem: str) -> str | None:
    # The canonical names, and the "train-images.idx3-ubyte" spelling of some mirrors.
    dotted = stem.replace("-idx", ".idx")
    for base in (stem, dotted):
        for candidate in (base, base + ".gz"):
            path = os.path.join(data_dir, candidate)
            if os.path.isfile(path):
                return path
    return None


def load_mnist(data_dir: str | os.PathLike) -> Dataset:
    """MNIST from the four IDX files in ``data_dir`` (each gzipped or not). Missing files,
    malformed files and files that do not fit together are each a one-line DataError."""
    data_dir = os.fspath(data_dir)
    if not os.path.isdir(data_dir):
        raise DataError(f"data directory {data_dir} does not exist (or is not a directory)")
    found = {role: _find_mnist_file(data_dir, stem) for role, stem in MNIST_FILES.items()}
    missing = [MNIST_FILES[role] for role, path in found.items() if path is None]
    if missing:
        raise DataError(f"no MNIST in {data_dir}: missing {', '.join(missing)} (each may be "
                        "gzipped, .gz)")
    paths = {role: path for role, path in found.items() if path is not None}   # all of them
    arrays = {role: read_idx(path) for role, path in paths.items()}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        iname = os.path.basename(paths[f"{split}_images"])
        lname = os.path.basename(paths[f"{split}_labels"])
        if images.dtype != np.uint8 or images.ndim != 3:
            raise DataError(f"{iname}: expected unsigned bytes in 3 dimensions (images x rows "
                            f"x columns), got {images.dtype} in {images.ndim}")
        if labels.dtype != np.uint8 or labels.ndim != 1:
            raise DataError(f"{lname}: expected unsigned bytes in 1 dimension, got "
                            f"{labels.dtype} in {labels.ndim}")
        if len(images) != len(labels):
            raise DataError(f"{iname} holds {len(images)} images but {lname} {len(labels)} "
                            "labels")
        if len(images) == 0:
            raise DataError(f"{iname} holds no images")
        if labels.max() > 9:
            raise DataError(f"{lname}: label {int(labels.max())} outside 0..9")
        h, w = images.shape[1:]
        if not (4 <= h <= 1024 and 4 <= w <= 1024):
            raise DataError(f"{iname}: images of {h}x{w}; the demo's CNN needs 4 to 1024 "
                            "pixels a side")
    if arrays["train_images"].shape[1:] != arrays["test_images"].shape[1:]:
        raise DataError(f"train images are {arrays['train_images'].shape[1:]} but test images "
                        f"{arrays['test_images'].shape[1:]}")
    return Dataset("mnist", arrays["train_images"], arrays["train_labels"].astype(np.int64),
                   arrays["test_images"], arrays["test_labels"].astype(np.int64),
                   max_value=255.0)


# ---------------------------------------------------------------------- sharding


def shard(n_samples: int, rank: int, world_size: int, *, seed: int = 0,
          labels: np.ndarray | None = None, alpha: float | None = None) -> np.ndarray:
    """Row indices of ``rank``'s shard: a seeded permutation cut into ``world_size`` equal
    parts (the remainder is left out, so every peer takes the same number of steps).

    ``alpha`` (with ``labels``): non-iid shards of the same size, each peer's mix of classes
    drawn from a Dirichlet distribution of concentration ``alpha`` (Hsu et al. 2019): 0.1
    gives each peer mostly one or two classes, 100 nearly the iid mix. The peers draw their
    samples in turns, each a class by its own mix among the classes that have samples left,
    so the shards stay disjoint and equal; every peer computes every shard from the seed."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    size = n_samples // world_size
    if size == 0:
        raise DataError(f"{n_samples} training samples cannot be shared by {world_size} peers")
    rng = np.random.default_rng(seed)
    if alpha is None:
        order = rng.permutation(n_samples)
        return np.sort(order[rank * size:(rank + 1) * size])
    if not (alpha > 0 and np.isfinite(alpha)) or labels is None or len(labels) != n_samples:
        raise ValueError(f"non-iid shards need a positive alpha and one label per sample, got "
                         f"alpha {alpha!r}")
    classes = np.unique(labels)
    pools = [list(rng.permutation(np.flatnonzero(labels == c))) for c in classes]
    mixes = rng.dirichlet(np.full(len(classes), float(alpha)), size=world_size)
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for _ in range(size):
        for peer in range(world_size):
            left = np.array([len(p) > 0 for p in pools])
            weights = mixes[peer] * left
            total = weights.sum()
            weights = weights / total if total > 0 else left / left.sum()
            shards[peer].append(pools[rng.choice(len(classes), p=weights)].pop())
    return np.sort(np.array(shards[rank]))
