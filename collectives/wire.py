"""The wire format: a ZeroMQ multipart of one msgpack header and zero or one raw payload frame.

Header (a msgpack array, in this order; arrays pack smaller and parse faster than maps):

    [version, kind, src, channel, seq, op, dtype, shape, nbytes, offset]

- ``kind``: DATA (a chunk of an array), HELLO (a peer introduces itself after connecting),
  BYE (a peer is closing), ABORT (a peer abandons operation ``(channel, seq)``; ``op`` holds
  the reason).
- ``channel``/``seq``: which operation the message belongs to; concurrent operations use
  different (channel, seq) slots and never mix.
- ``op``: the signature of the call that sent it ("allreduce(sum)"), to detect mismatched calls.
- ``dtype``/``shape``/``nbytes``: the whole logical array the chunk belongs to.
- ``offset``: the byte offset of this chunk in that array; the payload frame's length is the
  chunk's length.

Nothing is ever unpickled: the header is msgpack of plain ints, strings and a list of ints, and
the payload is raw bytes interpreted only through an allow-listed dtype after every length has
been checked.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import msgpack

__all__ = [
    "PROTOCOL_VERSION",
    "DATA",
    "HELLO",
    "BYE",
    "ABORT",
    "KIND_NAMES",
    "ALLOWED_DTYPES",
    "MAX_HEADER_BYTES",
    "Header",
    "WireError",
    "encode_header",
    "decode_header",
    "dtype_itemsize",
]

PROTOCOL_VERSION = 1

DATA, HELLO, BYE, ABORT = 1, 2, 3, 4
KIND_NAMES = {DATA: "data", HELLO: "hello", BYE: "bye", ABORT: "abort"}

# dtype name -> itemsize. Names are numpy's, plus torch's bfloat16 (numpy has none).
ALLOWED_DTYPES: dict[str, int] = {
    "bool": 1,
    "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "complex64": 8, "complex128": 16,
}

MAX_HEADER_BYTES = 512
_MAX_NDIM = 32
_MAX_STR = 256
_FIELDS = 10


class WireError(ValueError):
    """A message that fails validation; the transport drops and counts it."""


@dataclass(frozen=True, slots=True)
class Header:
    kind: int
    src: int
    channel: int
    seq: int
    op: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    offset: int


def dtype_itemsize(name: str) -> int:
    try:
        return ALLOWED_DTYPES[name]
    except KeyError:
        raise WireError(f"dtype {name!r} is not on the wire's allow-list") from None


def encode_header(kind: int, src: int, channel: int, seq: int, op: str = "", dtype: str = "uint8",
                  shape: tuple[int, ...] = (0,), nbytes: int = 0, offset: int = 0) -> bytes:
    return msgpack.packb([PROTOCOL_VERSION, kind, src, channel, seq, op, dtype, list(shape),
                          nbytes, offset], use_bin_type=True)


def _int(value, name: str, lo: int = 0, hi: int = 2**63 - 1) -> int:
    # bool is an int subclass in Python but never a valid field here.
    if type(value) is not int or not lo <= value <= hi:
        raise WireError(f"header field {name}={value!r} is not an integer in [{lo}, {hi}]")
    return value


def _str(value, name: str) -> str:
    if type(value) is not str or len(value) > _MAX_STR:
        raise WireError(f"header field {name} is not a string of at most {_MAX_STR} chars")
    return value


def decode_header(raw: bytes | memoryview, *, world_size: int, max_bytes: int,
                  payload_len: int) -> Header:
    """Parse and validate one header against the payload frame that came with it.

    Every check happens before the payload is touched: a header that announces 1 TB is refused
    here, so no allocation ever follows from a hostile byte count.
    """
    if len(raw) > MAX_HEADER_BYTES:
        raise WireError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        fields = msgpack.unpackb(raw, raw=False, use_list=True, strict_map_key=True,
                                 max_bin_len=0, max_ext_len=0, max_map_len=0,
                                 max_str_len=_MAX_STR, max_array_len=_MAX_NDIM)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise WireError(f"header is not valid msgpack ({type(exc).__name__})") from None
    if type(fields) is not list or len(fields) != _FIELDS:
        raise WireError("header is not an array of 10 fields")
    version, kind, src, channel, seq, op, dtype, shape, nbytes, offset = fields
    if version != PROTOCOL_VERSION or type(version) is not int:
        raise WireError(f"protocol version {version!r} is not {PROTOCOL_VERSION}")
    kind = _int(kind, "kind", DATA, ABORT)
    src = _int(src, "src", 0, world_size - 1)
    channel = _int(channel, "channel", 0, 2**32)
    seq = _int(seq, "seq")
    op = _str(op, "op")
    dtype = _str(dtype, "dtype")
    itemsize = dtype_itemsize(dtype)
    if type(shape) is not list or len(shape) > _MAX_NDIM:
        raise WireError("header field shape is not a list of at most 32 dimensions")
    shape = tuple(_int(d, "shape", 0, 2**62) for d in shape)
    nbytes = _int(nbytes, "nbytes", 0, max_bytes)
    offset = _int(offset, "offset", 0, max_bytes)
    if math.prod(shape) * itemsize != nbytes:
        raise WireError(f"shape {shape} x itemsize {itemsize} != nbytes {nbytes}")
    if kind == DATA:
        if offset % itemsize or payload_len % itemsize:
            raise WireError(f"chunk at offset {offset} of {payload_len} bytes splits a "
                            f"{dtype} element")
        if offset + payload_len > nbytes:
            raise WireError(f"chunk [{offset}, {offset + payload_len}) overruns the "
                            f"{nbytes}-byte array")
    elif payload_len:
        raise WireError(f"a {KIND_NAMES[kind]} message carries no payload")
    return Header(kind, src, channel, seq, op, dtype, shape, nbytes, offset)
