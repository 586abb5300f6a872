"""The wire format: headers round-trip, and every validation rule refuses bad input before any
payload is touched."""
import msgpack
import pytest

from collectives.transport.wire import (ABORT, BYE, DATA, PROTOCOL_VERSION, SHM, Header,
                                        WireError, decode_header, encode_header)

GiB = 1 << 30


def decode(raw, payload_len=0, world_size=4, max_bytes=GiB):
    return decode_header(raw, world_size=world_size, max_bytes=max_bytes, payload_len=payload_len)


def raw(fields):
    return msgpack.packb(fields, use_bin_type=True)


def valid(**changes):
    fields = dict(v=PROTOCOL_VERSION, kind=DATA, src=1, channel=0, seq=7, op="allreduce(sum)",
                  dtype="float32", shape=[4, 5], nbytes=80, offset=0, length=80, slot=0)
    fields.update(changes)
    return list(fields.values())


def test_round_trip():
    h = decode(encode_header(Header(DATA, 2, 3, 9, "broadcast(root=1)", "float64", (3, 2), 48,
                                    16, 16)),
               payload_len=16)
    assert (h.kind, h.src, h.channel, h.seq, h.op, h.dtype, h.shape, h.nbytes, h.offset) == \
        (DATA, 2, 3, 9, "broadcast(root=1)", "float64", (3, 2), 48, 16)


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint64", "float16", "bfloat16", "complex128"])
def test_allowed_dtypes(dtype):
    itemsize = {"bool": 1, "int8": 1, "uint64": 8, "float16": 2, "bfloat16": 2,
                "complex128": 16}[dtype]
    assert decode(raw(valid(dtype=dtype, shape=[3], nbytes=3 * itemsize, length=itemsize)),
                  payload_len=itemsize).dtype == dtype


@pytest.mark.parametrize("fields, payload_len, match", [
    (valid(v=99), 80, "protocol version"),
    (valid(kind=17), 80, "kind"),
    (valid(kind=2), 0, "kind"),  # the retired greeting's number: unused, so refused
    (valid(src=4), 80, "src"),
    (valid(src=-1), 80, "src"),
    (valid(src=True), 80, "src"),
    (valid(seq=-5), 80, "seq"),
    (valid(dtype="object"), 80, "allow-list"),
    (valid(dtype="O"), 80, "allow-list"),
    (valid(shape=[4, 6]), 80, "shape"),
    (valid(shape="45"), 80, "shape"),
    (valid(shape=[-1, 5]), 80, "shape"),
    (valid(nbytes=2 * GiB, shape=[GiB // 2]), 80, "nbytes"),  # announces more than allowed
    (valid(offset=76, length=8), 8, "overruns"),
    (valid(offset=2, length=8), 8, "splits"),
    (valid(length=81, nbytes=84, shape=[21]), 81, "splits"),
    (valid(), 40, "payload frame has 40"),
    (valid(kind=BYE), 4, "no payload"),
    (valid(kind=SHM, offset=76, length=8), 0, "overruns"),
    (valid(kind=SHM), 80, "no payload"),
    (valid(slot=1 << 20), 80, "slot"),
    (valid()[:9], 80, "12 fields"),
    ({"v": 1}, 80, "msgpack"),  # maps are refused by the parser itself
])
def test_rejects_bad_headers(fields, payload_len, match):
    with pytest.raises(WireError, match=match):
        decode(raw(fields), payload_len=payload_len)


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\xff" * 10, b"\x92\x01", b"x" * 600,
                                  raw([b"bin" * 10])])
def test_rejects_garbage(data):
    with pytest.raises(WireError):
        decode(data, payload_len=0)


def test_huge_announcement_refused_without_allocation():
    # 2**62 elements of float64: refused by the size cap before anything is allocated.
    with pytest.raises(WireError):
        decode(raw(valid(shape=[2**59], nbytes=2**62, length=8)), payload_len=8)


def test_abort_carries_reason():
    h = decode(encode_header(Header(ABORT, 3, 0, 4, "lost:2|rank 2 died")))
    assert h.kind == ABORT and h.op == "lost:2|rank 2 died"
