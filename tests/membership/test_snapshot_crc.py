"""snapshot.crc: the parallel CRC-32 and its combination equal zlib's CRC of the whole
buffer, for every cut (the digests of a snapshot, a file and a transfer depend on it)."""
import os
import zlib

import numpy as np
import pytest

from gossip.snapshot import crc


@pytest.mark.parametrize("n", [0, 1, 7, crc.SPLIT_BYTES - 1, crc.SPLIT_BYTES,
                               crc.SPLIT_BYTES + 1, 3 * crc.SPLIT_BYTES + 5])
def test_checksum_equals_zlib(n):
    data = os.urandom(n)
    assert crc.checksum(data).result() == zlib.crc32(data)
    assert crc.checksum(data, 0xDEADBEEF).result() == zlib.crc32(data, 0xDEADBEEF)
    before = crc.checksum(b"prefix")
    assert crc.checksum(data, before).result() == zlib.crc32(b"prefix" + data)


def test_combine_equals_zlib_at_every_kind_of_cut():
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 50_000, dtype=np.uint8).tobytes()
    for cut in [0, 1, 2, 31, 32, 33, 4096, 25_000, 49_999, 50_000]:
        a, b = data[:cut], data[cut:]
        assert crc.combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(data), cut


def test_a_changed_byte_in_any_part_changes_the_checksum():
    data = bytearray(os.urandom(2 * crc.SPLIT_BYTES + 100))
    want = crc.checksum(data).result()
    for at in [0, crc.SPLIT_BYTES - 1, crc.SPLIT_BYTES, len(data) - 1]:
        data[at] ^= 0x01
        assert crc.checksum(data).result() != want
        data[at] ^= 0x01
    assert crc.checksum(data).result() == want


def test_pending_checksums_in_a_chain_of_parts_equal_one_of_the_whole():
    """A piece written in parts in order (the receiver's case): each part summed on top of
    the pending CRC of the ones before."""
    data = memoryview(os.urandom(3 * crc.SPLIT_BYTES + 12345))
    pending = None
    for lo in range(0, len(data), 700_001):
        pending = crc.checksum(data[lo:lo + 700_001], pending)
    assert pending.result() == zlib.crc32(data)
    assert pending.done()
