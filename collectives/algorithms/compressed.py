"""Collectives on compressed payloads: allreduce and the neighbour exchange, with a codec.
Every peer ends with bitwise identical results: they all decode the same bytes, in the same
order, and sum in float32.

Allreduce, dense codecs (fp16, bf16, int8: ``ring_allreduce_compressed``): the ring of
algorithms/ring.py on encodings. Reduce-scatter: at each of n - 1 hops a peer encodes its
partial sum of a segment, sends it on, and adds the decoded partial sum it receives to its
own, in float32; allgather: the owner of each finished segment encodes it once, the
encodings travel the ring unchanged, and every peer (the owner too) decodes them. The
segments are padded to one length so every encoding has one size. Cost 2 (n-1)/n E bytes
sent per peer for encodings of E bytes (the uncompressed ring's, times E / M). Error: one
encoding per hop of a partial sum P_h of the segment, n in all, each within the codec's
bound of |P_h| <= sum_i |x_i| (fp16/bf16: relative to the element; int8: to the block's
largest), so elementwise

    |y - sum_i x_i| <= n * bound(sum_i |x_i|) * (1 + n * 2^-8)

(the last factor: the partial sums as computed carry the earlier hops' errors; divided by n
for a mean).

Allreduce, top-k, and every codec on small arrays (``gather_allreduce``): partial sums of
sparse vectors are not sparse, so each peer encodes its array once, the encodings are
allgathered, and every peer decodes all n and sums them in rank order. Each input is encoded
once: ``|y - sum_i x_i| <= sum_i bound(x_i)`` (top-k: the elements it dropped, which error
feedback sends later). Cost (n - 1) E bytes per peer, less than the uncompressed ring's
2 (n-1)/n M while E < 2 M / n (top-k 1%: 8 bytes per 100 elements, up to ~100 peers). The
allgather goes around the ring (forwarded as received: n - 1 latencies), or for arrays of at
most the communicator's small-array size (the one below which the uncompressed allreduce
takes recursive doubling) straight from each owner (``direct=True``: one latency). A small
array's cost is its latencies, not its bytes: the ring on encodings takes 2 (n - 1) of them,
and over an emulated 100 Mbit/s, 5 ms link it made an int8 allreduce of the demo's 73 KB
model twice as slow as the uncompressed one (recursive doubling: log2 n latencies).

Neighbour exchange (``compressed_exchange``): each peer sends one encoding of x to its
out-neighbours and combines the decoded encodings of its in-neighbours with its own decoded
encoding, ``y = w_self D(E(x)) + sum_j w_j D(E(x_j))``: every term is a value its
neighbours see too, so a doubly stochastic W keeps the mean of the decoded values.

Error feedback (top-k): with ``residual`` (a float32 buffer per array, the caller's state),
the encoded value is v = x + residual and the residual becomes v - D(E(v)): what was not
sent is sent later (Seide et al. 2014; Stich et al. 2018).

A payload whose bytes contradict themselves (codecs.CodecError, top-k's indices) is counted
(``CodecStats.rejected``) and fails the operation with that ProtocolError, naming the sender,
on this peer; the others are told (ABORT), and the receiver keeps serving.
"""
from __future__ import annotations

import threading
from typing import Any

from collectives.algorithms.allgather import direct_allgather
from collectives.algorithms.p2p import Call, post_range, recv_range, wait_reached, wait_sent
from collectives.algorithms.pattern import announce, check_pairing, plan_bits
from collectives.algorithms.neighbor import refuse
from collectives.algorithms.ring import ring_allgather
from collectives.arrays.adapter import adapter_for
from collectives.codecs.codec import Codec, CodecError, array_module
from collectives.neighbor_plan import NeighborPlan

__all__ = ["CodecStats", "encode_with_feedback", "gather_allreduce",
           "ring_allreduce_compressed", "padded_count", "compressed_exchange"]


class CodecStats:
    """What one communicator's compressed operations did (thread-safe: operations run in the
    caller's thread and on the worker)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.raw_bytes = 0        # float32 bytes of the arrays encoded (4 per element)
        self.encoded_bytes = 0    # bytes of their encodings
        self.rejected = 0         # received payloads that did not decode (CodecError)

    def encoded(self, count: int, nbytes: int) -> None:
        with self._lock:
            self.raw_bytes += 4 * count
            self.encoded_bytes += nbytes

    def reject(self) -> None:
        with self._lock:
            self.rejected += 1

    def snapshot(self) -> dict:
        with self._lock:
            return {"raw_bytes": self.raw_bytes, "encoded_bytes": self.encoded_bytes,
                    "rejected": self.rejected}


def encode_with_feedback(codec: Codec, x: Any, out: Any, residual: Any = None,
                         decoded: Any = None) -> None:
    """Encode float32 ``x`` into ``out``; with ``residual``, encode x + residual and leave
    there what the encoding missed. ``decoded`` (float32 like x) receives D(out) if given
    (it may be x itself once x is no longer needed)."""
    if residual is None:
        codec.encode(x, out)
        if decoded is not None:
            codec.decode(out, decoded)
        return
    residual += x
    codec.encode(residual, out)
    xp = array_module(x)
    back = decoded if decoded is not None else xp.empty_like(residual)
    codec.decode(out, back)
    residual -= back


def _decode_from(call: Call, codec: Codec, src: int, data: Any, out: Any,
                 stats: CodecStats) -> None:
    try:
        codec.decode(data, out)
    except CodecError as exc:
        stats.reject()
        raise CodecError(f"rank {call.transport.rank}: {call.describe()}: rank {src} sent a "
                         f"{codec.name} payload that does not decode: {exc}") from None


def gather_allreduce(call: Call, codec: Codec, x: Any, op: str, stats: CodecStats,
                     residual: Any = None, direct: bool = False) -> Any:
    """Sum (or mean) float32 ``x`` over every peer by the scheme of the module docstring
    (``direct``: each encoding straight from its owner, else around the ring); the result
    overwrites ``x`` and is returned. ``call`` describes the gathered encodings (dtype
    wire_dtype(codec), shape (n, count))."""
    t = call.transport
    n, r = t.world_size, t.rank
    xp = array_module(x)
    count = x.size
    size = codec.encoded_nbytes(count)
    gathered = xp.empty(n * size, dtype=xp.uint8)
    encode_with_feedback(codec, x, gathered[r * size:(r + 1) * size], residual)
    stats.encoded(count, size)
    if n > 1:
        segs = [(i * size, (i + 1) * size) for i in range(n)]
        if direct:
            direct_allgather(call, adapter_for(gathered), gathered, segs)
        else:
            wait_sent(call, ring_allgather(call, adapter_for(gathered), gathered, segs=segs,
                                           owned_shift=0))
    # Summed apart from x: a payload that does not decode leaves x as it was.
    acc = xp.empty_like(x)
    part = xp.empty_like(x) if n > 1 else None
    for i in range(n):   # rank order on every peer: the same float32 sum everywhere
        target = acc if i == 0 else part
        _decode_from(call, codec, i, gathered[i * size:(i + 1) * size], target, stats)
        if i:
            acc += part
    if op == "mean" and n > 1:
        acc /= n
    x[...] = acc
    return x


def padded_count(count: int, n: int) -> int:
    """Elements per segment of the compressed ring (the count's segments padded to one
    length, so every encoding has one size)."""
    return -(-count // n) if count else 0


def _recv_encoding(call: Call, src: int, adapter: Any, into: Any, lo: int) -> None:
    """Bytes [lo, lo + into.size) of the call's array from ``src``, copied into ``into``."""
    for a, b, chunk in recv_range(call, src, adapter, lo, lo + into.size):
        into[a - lo:b - lo] = chunk


def ring_allreduce_compressed(call: Call, codec: Codec, x: Any, op: str,
                              stats: CodecStats) -> Any:
    """Sum (or mean) float32 ``x`` over every peer by the ring of the module docstring; the
    result overwrites ``x``. ``call``: dtype wire_dtype(codec), shape (n, padded_count)."""
    t = call.transport
    n, r = t.world_size, t.rank
    right, left = (r + 1) % n, (r - 1) % n
    xp = array_module(x)
    count = x.size
    seg = padded_count(count, n)
    size = codec.encoded_nbytes(seg)
    acc = xp.zeros(n * seg, dtype=xp.float32)
    acc[:count] = x
    # Two send buffers: what the reduce-scatter sent may still be read by the network
    # (zero-copy) while the allgather's arrivals land.
    sent = xp.empty(n * size, dtype=xp.uint8)
    gathered = xp.empty(n * size, dtype=xp.uint8)
    got = xp.empty(size, dtype=xp.uint8)
    part = xp.empty(seg, dtype=xp.float32)
    adapter = adapter_for(sent)

    def piece(buf: Any, j: int) -> Any:
        return buf[j * size:(j + 1) * size]

    ticket = None
    for s in range(n - 1):
        j = (r - s) % n   # the segment summed so far (this peer's own at the first hop)
        codec.encode(acc[j * seg:(j + 1) * seg], piece(sent, j))
        stats.encoded(seg, size)
        ticket = post_range(call, right, adapter, sent, j * size, (j + 1) * size, track=True)
        k = (r - s - 1) % n
        _recv_encoding(call, left, adapter, got, k * size)
        _decode_from(call, codec, left, got, part, stats)
        acc[k * seg:(k + 1) * seg] += part
    owned = (r + 1) % n
    codec.encode(acc[owned * seg:(owned + 1) * seg], piece(gathered, owned))
    stats.encoded(seg, size)
    if n > 1:
        segs = [(j * size, (j + 1) * size) for j in range(n)]
        ticket = ring_allgather(call, adapter, gathered, segs=segs, owned_shift=1) or ticket
        wait_sent(call, ticket)
    for j in range(n):
        _decode_from(call, codec, (j - 1) % n, piece(gathered, j), part, stats)
        acc[j * seg:(j + 1) * seg] = part
    x[...] = acc[:count]
    if op == "mean" and n > 1:
        x /= n
    return x


def compressed_exchange(call: Call, x: Any, plan: NeighborPlan, stats: CodecStats,
                        accumulate: str = "float32") -> Any:
    """The neighbour exchange of the module docstring on float32 ``x``, in ``plan``'s codec.
    Afterwards ``x`` holds its own decoded encoding D(E(x)); returns the combination, a new
    array of dtype ``accumulate`` (float32, or float64 for float64 parameters: CHOCO's public
    copies sum many small decoded differences, which float32 would round). ``call``
    describes one encoding (dtype wire_dtype(codec), shape (count,))."""
    codec, src_weights, dst_ranks = plan.compression, plan.src_weights, plan.dst_ranks
    if codec is None:
        raise ValueError("compressed_exchange takes a plan with a codec (plan.compression)")
    xp = array_module(x)
    count = x.size
    size = codec.encoded_nbytes(count)
    peers = plan.peers
    checked = plan.check_pattern
    if checked:
        announce(call, peers, src_weights, dst_ranks)
    enc = xp.empty(size, dtype=xp.uint8)
    codec.encode(x, enc)
    stats.encoded(count, size)
    byte_adapter = adapter_for(enc)
    tickets = [post_range(call, dst, byte_adapter, enc, 0, size, track=True,
                          plan=plan_bits(dst, src_weights, dst_ranks) if checked else 0)
               for dst in dst_ranks]
    problems = check_pairing(call, peers, src_weights, dst_ranks) if checked else None
    if problems:
        refuse(call, peers, problems, tickets)
    # Decoded apart from x: a round that fails (a lost neighbour) leaves x as it was.
    own = xp.empty_like(x)
    codec.decode(enc, own)
    acc = own.astype(accumulate)
    acc *= plan.self_weight
    got = xp.empty(size, dtype=xp.uint8)
    part = xp.empty_like(x)
    for src in sorted(src_weights):
        _recv_encoding(call, src, byte_adapter, got, 0)
        _decode_from(call, codec, src, got, part, stats)
        acc += src_weights[src] * part.astype(accumulate, copy=False)
    for dst, ticket in zip(dst_ranks, tickets):
        wait_sent(call, ticket)
        if dst not in src_weights:
            wait_reached(call, dst)
    x[...] = own
    return acc
