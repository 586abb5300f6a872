"""Collectives on compressed payloads: allreduce and the neighbour exchange, with a codec.

Allreduce (``gather_allreduce``): each peer encodes its array once, the encodings are
allgathered around the ring (forwarded as received, never re-encoded), and every peer decodes
all n of them and sums them in float32, in rank order. So each input is quantised exactly
once, every peer computes the same sum of the same bytes in the same order (the results are
bitwise identical on every peer), and the error is that of one encoding per input:

    |y - sum_i x_i| <= sum_i bound_i   elementwise, bound_i = codec.error_bound(x_i)

(plus float32's rounding of the sum; divided by n for a mean). Cost: n - 1 encodings sent
and received per peer, (n - 1) E bytes for an encoding of E bytes, against 2 (n-1)/n M for
the uncompressed ring of M bytes: less traffic while E < 2M / n (fp16/bf16 on up to 3 peers,
equal at 4; int8 on up to 7; top-k 1% on up to ~100). A ring that re-quantises partial sums
at each hop would send 2 (n-1)/n E but add an error per hop; it is not implemented.

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

from collectives.algorithms.p2p import Call, post_range, recv_range, wait_reached, wait_sent
from collectives.algorithms.pattern import announce, check_pairing, plan_bits
from collectives.algorithms.neighbor import UNCHECKED, refuse
from collectives.algorithms.ring import ring_allgather
from collectives.arrays.adapter import adapter_for
from collectives.codecs.base import Codec, CodecError, array_module

__all__ = ["CodecStats", "encode_with_feedback", "gather_allreduce", "compressed_exchange"]


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
                     residual: Any = None) -> Any:
    """Sum (or mean) float32 ``x`` over every peer by the scheme of the module docstring;
    the result overwrites ``x`` and is returned. ``call`` describes the gathered encodings
    (dtype wire_dtype(codec), shape (n, count))."""
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
        wait_sent(call, ring_allgather(call, adapter_for(gathered), gathered, segs=segs,
                                       owned_shift=0))
    part = xp.empty_like(x) if n > 1 else None
    for i in range(n):   # rank order on every peer: the same float32 sum everywhere
        target = x if i == 0 else part
        _decode_from(call, codec, i, gathered[i * size:(i + 1) * size], target, stats)
        if i:
            x += part
    if op == "mean" and n > 1:
        x /= n
    return x


def compressed_exchange(call: Call, codec: Codec, x: Any, self_weight: float,
                        src_weights: dict[int, float], dst_ranks: list[int],
                        stats: CodecStats, accumulate: str = "float32") -> Any:
    """The neighbour exchange of the module docstring on float32 ``x``. Afterwards ``x``
    holds its own decoded encoding D(E(x)); returns the combination, a new array of dtype
    ``accumulate`` (float32, or float64 for float64 parameters: CHOCO's public copies sum
    many small decoded differences, which float32 would round). ``call`` describes one
    encoding (dtype wire_dtype(codec), shape (count,))."""
    xp = array_module(x)
    count = x.size
    size = codec.encoded_nbytes(count)
    peers = sorted(set(src_weights) | set(dst_ranks))
    checked = not call.signature.endswith(UNCHECKED)
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
    codec.decode(enc, x)
    acc = x.astype(accumulate)
    acc *= self_weight
    got = xp.empty(size, dtype=xp.uint8)
    part = xp.empty_like(x)
    for src in sorted(src_weights):
        for a, b, chunk in recv_range(call, src, byte_adapter, 0, size):
            got[a:b] = chunk
        _decode_from(call, codec, src, got, part, stats)
        acc += src_weights[src] * part.astype(accumulate, copy=False)
    for dst, ticket in zip(dst_ranks, tickets):
        wait_sent(call, ticket)
        if dst not in src_weights:
            wait_reached(call, dst)
    return acc
