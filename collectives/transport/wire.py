"""The wire format: a ZeroMQ multipart of one msgpack header and zero or one raw payload frame.

Header (a msgpack array, in this order; arrays pack smaller and parse faster than maps):

    [version, kind, src, channel, seq, op, dtype, shape, nbytes, offset, length, slot, number]

- ``kind``: DATA (a chunk of an array in the payload frame), SHM (a chunk of an array left in
  slot ``slot`` of the sender's shared-memory ring to this peer; no payload frame), SHM_OPEN
  (the sender's ring is ready: ``op`` tells where), CREDIT (the receiver freed a slot the
  sender was waiting for), SHM_MAPPED (the receiver mapped the sender's ring, so the sender
  may exit without taking queued chunks with it), STARVED (the sender has no free slot: the
  receiver copies out chunks of operations it has not started yet), BYE (a peer is closing),
  ABORT (a peer abandons operation ``(channel, seq)``; ``op`` holds the
  reason), PLAN (a neighbour exchange's pattern, before its data: ``slot`` holds PLAN_SENDS,
  PLAN_RECEIVES and PLAN_ANSWER bits; ``op``/``dtype``/``shape`` are the call's), STATUS (a
  question about operation ``(channel, seq)``, ``slot`` 0, or its answer: ``slot`` the state,
  ``offset`` 1 + the sequence the answer names, ``length`` 1 + the rank it waits on, 0 for
  none; ``op`` that operation's signature), HOLD (flow control: the receiver holds too much
  for operations it has not started; ``op`` "pause" or "resume", ``seq`` a generation), ACK
  (the send window: the receiver read every message of this connection up to number ``seq``,
  see flow_control.py). Any other kind is malformed.
- ``channel``/``seq``: which operation the message belongs to; concurrent operations use
  different (channel, seq) mailboxes and never mix (channel numbers: ``Channel`` below).
- ``op``: the signature of the call that sent it ("allreduce(sum)"), to detect mismatched calls.
- ``dtype``/``shape``/``nbytes``: the whole logical array the chunk belongs to. A compressed
  payload names its codec here ("codec:int8", "codec:topk:0.01", codecs/catalog.py): then
  ``shape`` is (parts..., count), each part the encoding of ``count`` elements, ``nbytes``
  must be parts x the codec's encoded size of ``count``, and offsets count bytes. An unknown
  codec, or a byte count its codec does not give, is malformed.
- ``offset``/``length``: the byte range of this chunk in that array (for DATA, ``length`` must
  equal the payload frame's length).
- ``slot``: SHM's slot; PLAN's bits; a DATA chunk's PLAN bits (a neighbour exchange's plan,
  carried by its first chunk; 0 otherwise).
- ``number``: the message's place on its connection (1, 2, 3, ... in the order the sender's
  socket took them; stamped by the link at send time, see ``stamp_number``). A ZeroMQ pipe never
  reorders or duplicates, so a number that does not exceed the last one heard from that source is
  a replay or a duplicate and is dropped: a chunk is never reduced twice. It is the last field and
  always a fixed-width uint64, so stamping is a byte splice, not a re-encode. Decoding also takes
  12-field headers (number 0), which the transport refuses as unnumbered.

Nothing is ever unpickled: the header is msgpack of plain ints, strings and a list of ints, and
the payload is raw bytes interpreted only through an allow-listed dtype after every length has
been checked.
"""
from __future__ import annotations

import enum
import math
import threading
from typing import NamedTuple

import msgpack

from collectives.codecs.catalog import from_wire

__all__ = [
    "PROTOCOL_VERSION",
    "Kind",
    "Channel",
    "channel_pair",
    "send_signature",
    "send_tag",
    "DATA",
    "BYE",
    "ABORT",
    "SHM",
    "SHM_OPEN",
    "CREDIT",
    "SHM_MAPPED",
    "STARVED",
    "HOLD",
    "ACK",
    "PLAN",
    "STATUS",
    "PLAN_SENDS",
    "PLAN_RECEIVES",
    "PLAN_ANSWER",
    "KIND_NAMES",
    "ALLOWED_DTYPES",
    "MAX_HEADER_BYTES",
    "Header",
    "WireError",
    "encode_header",
    "decode_header",
    "stamp_number",
    "dtype_itemsize",
    "payload_layout",
]

PROTOCOL_VERSION = 2  # 2: the trailing message number


class Kind(enum.IntEnum):
    """The message kinds (the header's second field), the registry of the protocol."""
    DATA = 1
    # 2 was a greeting that no peer has sent for several versions: left unused, so a stray
    # one is refused rather than read as something else.
    BYE = 3
    ABORT = 4
    SHM = 5
    SHM_OPEN = 6
    CREDIT = 7
    SHM_MAPPED = 8
    STARVED = 9
    # 10 and 11 are left unused (tests/test_hostile.py sends them as unknown kinds).
    PLAN = 12
    STATUS = 13
    # Flow control of what a receiver holds for operations not started (flow_control.py): op is
    # "pause" or "resume", seq a generation (the newest wins).
    HOLD = 14
    # The send window (flow_control.py): seq is the number of the last message read from the
    # receiving peer's connection.
    ACK = 15


class Channel(enum.IntEnum):
    """The channel registry: which channel numbers mean what on the wire.

    A message names its operation by ``(channel, seq)``; concurrent streams of operations use
    different channels so their sequence numbers never meet in one mailbox. A communicator
    takes a pair: an even channel for its collectives and the next odd one for its
    point-to-point messages. The peer's own communicator has the first pair; independent ones
    (a policy's background thread, numbered 1, 2, ... through ``peer.channel(number)``) take
    the pair of their number (``channel_pair``)."""

    # The peer's main communicator: its collectives...
    COLLECTIVE = 0
    # ...and its point-to-point send/recv.
    P2P = 1
    # Link-level control messages (SHM_OPEN, SHM_MAPPED, STARVED, CREDIT, BYE) concern a
    # connection, not an operation: their kind says everything and they never reach a mailbox,
    # so they carry the first channel (an alias of COLLECTIVE, seq 0).
    LINK = 0


def channel_pair(number: int) -> tuple[int, int]:
    """The (collective, point-to-point) channels of communicator ``number`` (0: the peer's
    own, COLLECTIVE and P2P)."""
    return Channel.COLLECTIVE + 2 * number, Channel.P2P + 2 * number


def send_signature(tag: int) -> str:
    """A point-to-point message's signature (its header's ``op``) for ``tag``: "send" for tag 0
    (what every untagged send sends), "send#<tag>" for the others."""
    return "send" if tag == 0 else f"send#{tag}"


def send_tag(signature: str) -> int | None:
    """The tag of a point-to-point message's signature; None for any other signature (a
    collective's, or one no send makes)."""
    if signature == "send":
        return 0
    if signature.startswith("send#") and signature[5:].isdigit():
        return int(signature[5:])
    return None


# Plain ints for the per-message comparisons and table lookups: against an int read from a
# header, an enum member is slower to compare (1.2x) and to look up in a dict (1.6x), measured.
(DATA, BYE, ABORT, SHM, SHM_OPEN, CREDIT, SHM_MAPPED, STARVED, PLAN, STATUS,
 HOLD, ACK) = (int(k) for k in Kind)
KIND_NAMES = {int(k): k.name.lower().replace("_", "-") for k in Kind}

# dtype name -> itemsize. Names are numpy's, plus torch's bfloat16 (numpy has none).
ALLOWED_DTYPES: dict[str, int] = {
    "bool": 1,
    "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "complex64": 8, "complex128": 16,
}

# A PLAN's bits: the sender sends data to the receiver in this call; it expects data from the
# receiver; it is an answer from a peer whose call at this sequence does not involve the
# receiver at all (then the other two are 0).
PLAN_SENDS, PLAN_RECEIVES, PLAN_ANSWER = 1, 2, 4
_STATUS_STATES = 4  # activity.py's IDLE .. BUSY

MAX_HEADER_BYTES = 512
_MAX_NDIM = 32
_MAX_STR = 256
_FIELDS = 12
_MAX_SLOTS = 1 << 16


class WireError(ValueError):
    """A message that fails validation; the transport drops and counts it."""


class Header(NamedTuple):
    """One message's header, the wire's one value for it: what encode_header packs and
    decode_header returns, decoded and validated (a named tuple: built for every message, and
    a tuple is made several times faster than a frozen dataclass). The defaults are those of
    a control message, which names no array."""

    kind: int
    src: int
    channel: int
    seq: int
    op: str = ""
    dtype: str = "uint8"
    shape: tuple[int, ...] = (0,)
    nbytes: int = 0
    offset: int = 0
    length: int = 0
    slot: int = 0
    number: int = 0


def dtype_itemsize(name: str) -> int:
    """Bytes per element of the wire dtype ``name``; WireError if it is not on ALLOWED_DTYPES."""
    try:
        return ALLOWED_DTYPES[name]
    except KeyError:
        raise WireError(f"dtype {name!r} is not on the wire's allow-list") from None


def payload_layout(dtype: str, shape: tuple[int, ...]) -> tuple[int, int, str]:
    """(bytes per element, bytes of the whole array, the dtype its frames are read as) of a
    header's dtype and shape: a plain dtype's, or a codec payload's (module docstring: bytes,
    parts x encoded size of the last dimension). WireError if the dtype is neither."""
    itemsize = ALLOWED_DTYPES.get(dtype)
    if itemsize is not None:
        return itemsize, math.prod(shape) * itemsize, dtype
    codec = from_wire(dtype)
    if codec is None:
        raise WireError(f"dtype {dtype!r} is not on the wire's allow-list, nor a known codec")
    if not shape:
        raise WireError(f"a {dtype} payload needs a shape (parts..., count)")
    try:
        part = codec.encoded_nbytes(shape[-1])
    except ValueError as exc:
        raise WireError(f"a {dtype} payload of {shape[-1]} elements: {exc}") from None
    return 1, math.prod(shape[:-1]) * part, "uint8"


_UINT64 = b"\xcf"  # msgpack's fixed-width uint64 marker


# One msgpack Packer per thread, made on its first header: a Packer made per message (what
# msgpack.packb does) was a third of the cost of packing a header. Per thread, since a Packer
# keeps its buffer between calls (atomic under the GIL in msgpack's C extension, but not in
# its pure-Python fallback).
_packers = threading.local()


def encode_header(header: Header) -> bytes:
    """Pack ``header`` (fields in the order of the module docstring); the link stamps its
    ``number`` in place when the socket takes the message, so senders leave it 0."""
    try:
        pack = _packers.pack
    except AttributeError:
        pack = _packers.pack = msgpack.Packer(use_bin_type=True).pack
    # The 12 fields but the number (a tuple packs as an array, the shape too) pack as a
    # fixarray (0x9c); make it 13 and append the number as a fixed-width uint64, so the link
    # can stamp it in place when the socket takes the message.
    packed = pack((PROTOCOL_VERSION,) + header[:11])
    return b"\x9d" + packed[1:] + _UINT64 + header[11].to_bytes(8, "big")


def stamp_number(header: bytes, number: int) -> bytes:
    """``header`` (made by encode_header) with its message number set to ``number``."""
    return header[:-8] + number.to_bytes(8, "big")


def _int(value, name: str, lo: int = 0, hi: int = 2**63 - 1) -> int:
    # bool is an int subclass in Python but never a valid field here.
    if type(value) is not int or not lo <= value <= hi:
        raise WireError(f"header field {name}={value!r} is not an integer in [{lo}, {hi}]")
    return value


def _str(value, name: str) -> str:
    if type(value) is not str or len(value) > _MAX_STR:
        raise WireError(f"header field {name} is not a string of at most {_MAX_STR} chars")
    return value


def _check_fields(fields: list, world_size: int, max_bytes: int) -> None:
    """Raise the WireError that names the first invalid field of a decoded header."""
    version, kind, src, channel, seq, op, dtype, shape, nbytes, offset, length, slot, number = \
        fields
    if version != PROTOCOL_VERSION or type(version) is not int:
        raise WireError(f"protocol version {version!r} is not {PROTOCOL_VERSION}")
    if type(kind) is not int or kind not in KIND_NAMES:
        raise WireError(f"header field kind={kind!r} is not a message kind "
                        f"({', '.join(f'{k} {name}' for k, name in KIND_NAMES.items())})")
    _int(src, "src", 0, world_size - 1)
    _int(channel, "channel", 0, 2**32)
    _int(seq, "seq")
    _str(op, "op")
    if from_wire(_str(dtype, "dtype")) is None:   # a codec's payload is also a dtype here
        dtype_itemsize(dtype)
    if type(shape) is not list or len(shape) > _MAX_NDIM:
        raise WireError("header field shape is not a list of at most 32 dimensions")
    for d in shape:
        _int(d, "shape", 0, 2**62)
    _int(nbytes, "nbytes", 0, max_bytes)
    _int(offset, "offset", 0, max_bytes)
    _int(length, "length", 0, max_bytes)
    _int(slot, "slot", 0, _MAX_SLOTS)
    _int(number, "number")
    raise WireError("header fields out of range")  # (the checks above name the field)


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
    if type(fields) is not list or len(fields) not in (_FIELDS, _FIELDS + 1):
        raise WireError(f"header is not an array of {_FIELDS} fields (or {_FIELDS + 1} with a "
                        "message number)")
    number = fields.pop() if len(fields) > _FIELDS else 0
    version, kind, src, channel, seq, op, dtype, shape, nbytes, offset, length, slot = fields
    itemsize = ALLOWED_DTYPES.get(dtype) if type(dtype) is str else None
    codec = None
    if itemsize is None and type(dtype) is str and dtype.startswith("codec:"):
        codec = from_wire(dtype)   # a compressed payload: offsets count bytes
        itemsize = 1 if codec is not None else None
    # One expression for the common, valid header (it runs for every message); the field by
    # field checks below run only when it fails, to name what is wrong.
    if not (type(version) is int and version == PROTOCOL_VERSION
            and type(kind) is int and kind in KIND_NAMES
            and type(src) is int and 0 <= src < world_size
            and type(channel) is int and 0 <= channel <= 2**32
            and type(seq) is int and 0 <= seq < 2**63
            and type(op) is str and len(op) <= _MAX_STR and itemsize is not None
            and type(shape) is list and len(shape) <= _MAX_NDIM
            and all(type(d) is int and 0 <= d <= 2**62 for d in shape)
            and type(nbytes) is int and 0 <= nbytes <= max_bytes
            and type(offset) is int and 0 <= offset <= max_bytes
            and type(length) is int and 0 <= length <= max_bytes
            and type(slot) is int and 0 <= slot <= _MAX_SLOTS
            and type(number) is int and 0 <= number < 2**63):
        _check_fields(fields + [number], world_size, max_bytes)
    shape = tuple(shape)
    if codec is not None:
        expected = payload_layout(dtype, shape)[1]
        if expected != nbytes:
            raise WireError(f"a {dtype} payload of shape {shape} has {expected} bytes, "
                            f"not nbytes {nbytes}")
    elif math.prod(shape) * itemsize != nbytes:
        raise WireError(f"shape {shape} x itemsize {itemsize} != nbytes {nbytes}")
    if kind in (DATA, SHM):
        if kind == DATA and length != payload_len:
            raise WireError(f"header says {length} bytes but the payload frame has {payload_len}")
        if offset % itemsize or length % itemsize:
            raise WireError(f"chunk at offset {offset} of {length} bytes splits a "
                            f"{dtype} element")
        if offset + length > nbytes:
            raise WireError(f"chunk [{offset}, {offset + length}) overruns the "
                            f"{nbytes}-byte array")
        if kind == DATA and slot > PLAN_SENDS | PLAN_RECEIVES:
            raise WireError(f"plan bits {slot} of a data chunk are not a plan")
    elif kind == PLAN:
        if slot > PLAN_SENDS | PLAN_RECEIVES | PLAN_ANSWER or \
                slot & PLAN_ANSWER and slot != PLAN_ANSWER:
            raise WireError(f"plan bits {slot} are not a plan")
    elif kind == STATUS:
        if slot > _STATUS_STATES or length > world_size or (slot == 0 and (offset or length)):
            raise WireError(f"status state {slot}, rank {length - 1} or sequence "
                            f"{offset - 1} out of range")
    if kind != DATA and payload_len:
        raise WireError(f"a {KIND_NAMES[kind]} message carries no payload frame")
    return Header(kind, src, channel, seq, op, dtype, shape, nbytes, offset, length, slot, number)
