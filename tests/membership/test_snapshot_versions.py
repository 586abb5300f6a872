"""Snapshot format versions: version 3 digests each 4 MiB piece with XXH3-64 (xxhash); a
version-2 snapshot (pieces' zlib CRC-32), such as a checkpoint saved before, still loads,
verifies, restores and travels to a receiver, keeping its digests.

data/snapshot-v2/ was written by gossip at commit c110537 (manifest version 2):

    gossip.Snapshot.of(params=[np.arange(12, dtype=np.float32).reshape(3, 4),
                               np.arange(10, dtype=np.int64)],
                       extra={"step": 7, "lr": 0.1, "mask": np.array([True, False, True])}
                       ).save("tests/membership/data/snapshot-v2")

and the same code gave the version-2 figures of BIG below.
"""
from __future__ import annotations

import shutil
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest
import xxhash

from gossip.errors import SnapshotCorrupt, SnapshotError
from gossip.snapshot import Snapshot, SnapshotReceiver, crc
from gossip.snapshot import manifest as mf
from gossip.snapshot.array_specs import PIECE_BYTES

V2_DIR = Path(__file__).parent / "data" / "snapshot-v2"
V2_DIGEST = "c75c63750b32aef20e1a7b4a58532beb67ec7cbe779896f3a55c6b2ad9943da6"
# np.arange((9 << 20) // 8, dtype=np.float64) as params: 3 pieces (4, 4 and 1 MiB)
BIG_V2 = {"array": "bca4eb7857dce0cb4ee6aebc94b8830a8adfc3ff68f58399dfab828e17275877",
          "snapshot": "7916691e0440b7e71e05a8e6a3b10f84b6b42118ef85879d7fd22035b8464eac",
          "pieces": [2244824762, 4271446377, 2321480230]}


def _big() -> np.ndarray:
    return np.arange((9 << 20) // 8, dtype=np.float64)


def _pieces(a: np.ndarray) -> list[bytes]:
    data = a.tobytes()
    return [data[at:at + PIECE_BYTES] for at in range(0, len(data), PIECE_BYTES)]


def test_new_snapshots_are_version_3_with_xxh3_pieces(tmp_path):
    big = _big()
    snap = Snapshot.of(params=[big], extra={"step": 3})
    assert mf.VERSION == 3 and snap.version == 3 and snap.manifest["version"] == 3
    assert snap.piece_crcs[0] == [xxhash.xxh3_64_intdigest(p) for p in _pieces(big)]
    # Not the version-2 digest of the same bytes.
    assert snap.digests[0] != BIG_V2["array"]
    snap.save(str(tmp_path))
    back = Snapshot.load(str(tmp_path))
    assert back.version == 3 and back.digest == snap.digest
    assert np.array_equal(back.arrays["params/0"], big)


def test_the_old_format_digests_are_kept_bit_for_bit():
    old = Snapshot.of(params=[_big()])
    old = Snapshot(list(old.arrays.items()), {"params": old.manifest["parts"]["params"]},
                   version=2)
    assert old.piece_crcs[0] == BIG_V2["pieces"] == [zlib.crc32(p) for p in _pieces(_big())]
    assert old.digests[0] == BIG_V2["array"] and old.digest == BIG_V2["snapshot"]
    assert old.manifest["version"] == 2


def test_a_version_2_checkpoint_loads_verifies_and_restores(tmp_path):
    snap = Snapshot.load(str(V2_DIR))
    assert snap.version == 2 and snap.manifest["version"] == 2
    assert snap.digest == V2_DIGEST                       # as the old code saved it
    params = [np.zeros((3, 4), dtype=np.float32), np.zeros(10, dtype=np.int64)]
    snap.restore_into(params=params)
    assert np.array_equal(params[0], np.arange(12, dtype=np.float32).reshape(3, 4))
    assert np.array_equal(params[1], np.arange(10))
    assert snap.extra["step"] == 7 and snap.extra["mask"].tolist() == [True, False, True]
    # Saved again, it stays what it was (version 2, the same digest).
    snap.save(str(tmp_path / "again"))
    assert Snapshot.load(str(tmp_path / "again")).digest == V2_DIGEST
    # Its digests are checked in its own scheme: a flipped byte is found and named.
    damaged = tmp_path / "damaged"
    shutil.copytree(V2_DIR, damaged)
    data = next(damaged.glob("snapshot-*.bin"))
    raw = bytearray(data.read_bytes())
    raw[50] ^= 0x01                                       # in params/1 (bytes 48-128)
    data.write_bytes(bytes(raw))
    with pytest.raises(SnapshotCorrupt) as info:
        Snapshot.load(str(damaged))
    assert info.value.tensor == "params/1"


def test_a_version_2_snapshot_is_received_and_checked_as_version_2():
    donor = Snapshot.load(str(V2_DIR))
    receiver = SnapshotReceiver(donor.manifest)
    for offset, length in receiver.layout.ranges(PIECE_BYTES):
        receiver.write(offset, donor.read(offset, length))
    copy = receiver.finish()
    assert copy.version == 2 and copy.digest == V2_DIGEST
    assert receiver.piece_crcs() == donor.piece_crcs
    # A bad byte in a version-2 transfer is named as in a version-3 one.
    receiver = SnapshotReceiver(donor.manifest)
    data = bytearray(donor.read(0, donor.nbytes))
    data[5] ^= 0x10
    receiver.write(0, bytes(data))
    with pytest.raises(SnapshotCorrupt) as info:
        receiver.finish()
    assert info.value.tensor == "params/0"


@pytest.mark.parametrize("version", [1, 4, "3", None])
def test_other_versions_are_refused_naming_the_ones_read(version):
    manifest = dict(Snapshot.of(params=[np.ones(3)]).manifest, version=version)
    with pytest.raises(SnapshotError, match=r"reads versions \[2, 3\]"):
        SnapshotReceiver(manifest)


def test_a_version_2_manifest_file_is_plain_msgpack_as_before():
    head = msgpack.unpackb((V2_DIR / "snapshot.msgpack").read_bytes(), raw=False)
    assert head["manifest"]["version"] == 2 and head["digest"] == V2_DIGEST


@pytest.mark.parametrize("n", [0, 1, 4095, PIECE_BYTES - 1, PIECE_BYTES])
def test_xxh3_in_the_pool_and_streamed_in_parts_equal_xxhash_of_the_whole(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    want = xxhash.xxh3_64_intdigest(data)
    assert crc.xxh3(data).result() == want
    stream = crc.Xxh3Stream()
    for lo in range(0, n, 700_001):
        stream.update(memoryview(data)[lo:lo + 700_001])
    assert stream.result() == want
