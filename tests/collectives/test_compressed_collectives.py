"""Compressed collectives among real peers over real sockets: allreduce and the neighbour
exchange with each codec stay within the documented error bound and give every peer the same
bytes; peers that pass different codecs get a ProtocolError on every rank; a peer sending
malformed compressed payloads (unknown codec, sizes its header contradicts, top-k indices out
of range) is dropped and counted, and the receiver goes on serving."""
from __future__ import annotations

import numpy as np
import pytest

import gossip
from collectives import COLLECTIVE_CHANNEL
from collectives.algorithms.compressed import padded_count
from collectives.communicator import DEFAULT_SMALL_BYTES
from collectives.codecs import TopK, parse, wire_dtype
from collectives.transport.wire import DATA, Header, encode_header
from gossip.testing import spawn

SPECS = ["fp16", "bf16", "int8", "topk:0.1"]
COUNT = 20_000


def local_input(rank: int, count: int = COUNT) -> np.ndarray:
    rng = np.random.default_rng(rank)
    return (rng.standard_normal(count) * np.exp(rng.uniform(-4, 4, count))).astype(np.float32)


def allreduce_each_codec(peer, count):
    out = {}
    for spec in SPECS:
        x = local_input(peer.rank, count)
        peer.allreduce(x, op="mean", compression=spec)
        y = local_input(peer.rank, count).astype(np.float64)
        h = peer.allreduce(y, op="sum", compression=spec, wait=False)   # the twin
        h.wait(30)
        out[spec] = (x, y)
    return out


# 80 KB, at most DEFAULT_SMALL_BYTES: every encoding straight from its owner; 400 KB: the ring
# on encodings (dense codecs) or the ring's allgather (top-k)
@pytest.mark.parametrize("count", [COUNT, 100_000])
def test_compressed_allreduce_is_within_its_bound_and_identical_everywhere(count):
    n = 4
    results = spawn(allreduce_each_codec, n=n, timeout=120, args=(count,))
    inputs = [local_input(r, count) for r in range(n)]
    exact = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    magnitude = np.sum(np.abs(inputs), axis=0, dtype=np.float32)
    for spec in SPECS:
        codec = parse(spec)
        if codec.dense and count * 4 > DEFAULT_SMALL_BYTES:   # the ring: one encoding per
            # hop of a partial sum of a segment (int8's blocks start at each segment's start)
            seg = padded_count(count, n)
            per_segment = np.concatenate([codec.error_bound(magnitude[lo:lo + seg])
                                          for lo in range(0, count, seg)])
            bound = n * per_segment.astype(np.float64) * (1 + n * 2.0 ** -8)
        else:             # gathered (top-k, small arrays): one encoding per input
            bound = np.sum([codec.error_bound(x) for x in inputs], axis=0).astype(np.float64)
        bound += 1e-6 * magnitude   # float32's rounding of the sum
        mean, total = results[0][spec]
        assert np.all(np.abs(total - exact) <= bound), spec
        assert np.all(np.abs(mean - exact / n) <= bound / n), spec
        for r in range(1, n):
            assert np.array_equal(results[r][spec][0], mean), (spec, r)
            assert np.array_equal(results[r][spec][1], total), (spec, r)


def exchange_on_a_ring(peer, spec):
    n, r = peer.world_size, peer.rank
    x = local_input(r, 1000)
    peer.neighbor_average(x, compression=spec)
    y = local_input(r, 1000)
    out = np.empty_like(y)
    peer.neighbor_allreduce(y, 0.5, {(r - 1) % n: 0.5}, [(r + 1) % n], out=out,
                            compression=spec)
    return x, y, out


@pytest.mark.parametrize("spec", ["bf16", "int8"])
def test_compressed_neighbour_exchange_combines_the_decoded_encodings(spec):
    n = 4
    results = spawn(exchange_on_a_ring, n=n, timeout=90, args=(spec,))
    codec = parse(spec)

    def decoded(r):
        x = local_input(r, 1000)
        enc = np.empty(codec.encoded_nbytes(x.size), dtype=np.uint8)
        codec.encode(x, enc)
        codec.decode(enc, x)
        return x

    for r, (x, y, out) in enumerate(results):
        # Ring of 4, Metropolis weights: 1/3 each for self and both neighbours.
        expected = (decoded(r) + decoded((r - 1) % n) + decoded((r + 1) % n)) / 3
        np.testing.assert_allclose(x, expected, rtol=1e-6, atol=1e-6)
        assert np.array_equal(y, decoded(r))   # with out=, x holds what was sent of it
        np.testing.assert_allclose(out, 0.5 * decoded(r) + 0.5 * decoded((r - 1) % n),
                                   rtol=1e-6, atol=1e-6)


def error_feedback_rounds(peer):
    residual = np.zeros(1000, dtype=np.float32)
    sent = np.zeros(1000, dtype=np.float64)
    for _ in range(30):
        x = local_input(peer.rank, 1000)
        peer.allreduce(x, op="sum", compression="topk:0.05", residual=residual)
        sent += x
    return sent, residual


def test_error_feedback_sends_what_top_k_left_out_later():
    n = 2
    results = spawn(error_feedback_rounds, n=n, timeout=90)
    # After T rounds: sum of what arrived + every residual = T * the exact sum.
    exact = 30 * np.sum([local_input(r, 1000).astype(np.float64) for r in range(n)], axis=0)
    sent, _ = results[0]
    residuals = np.sum([res for _, res in results], axis=0)
    np.testing.assert_allclose(sent + residuals, exact, rtol=1e-4, atol=1e-3)
    assert np.array_equal(results[1][0], sent)


def different_codecs(peer):
    x = np.ones(1000, dtype=np.float32)
    spec = "int8" if peer.rank == 2 else "fp16"
    try:
        peer.allreduce(x, op="mean", compression=spec, timeout=15)
    except gossip.ProtocolError as exc:
        first = ("ProtocolError", str(exc))
    else:
        first = ("ok", "")
    try:
        peer.allreduce(np.ones(10, np.float32), compression=None if peer.rank else "bf16",
                       timeout=15)
    except gossip.ProtocolError as exc:
        second = ("ProtocolError", str(exc))
    else:
        second = ("ok", "")
    return first, second


def test_ranks_with_different_codecs_get_a_protocol_error_on_every_rank():
    for first, second in spawn(different_codecs, n=4, timeout=120, peer_timeout=20):
        assert first[0] == "ProtocolError", first
        assert second[0] == "ProtocolError", second


# ------------------------------------------------------------------ malformed payloads
class LyingCodec(TopK):
    """A faulty top-k (fault injection lives in tests): its indices run past the array."""

    def encode(self, x, out):
        super().encode(x, out)
        out[:4 * self.k(x.size)].view(np.uint32)[:] = x.size + 7


def malformed_sender(peer):
    n, r = peer.world_size, peer.rank
    count = 1000
    codec = TopK(0.1)
    if r == 1:
        # Headers that lie, straight to rank 0's transport, before rank 0 begins: an unknown
        # codec, a byte count its codec does not give, a shape that does not fit.
        size = codec.encoded_nbytes(count)
        t = peer.transport
        lies = [("codec:topk:0.7x", (n, count), n * size),
                (wire_dtype(codec), (n, count), n * size + 8),
                (wire_dtype(codec), (n, count + 1), n * size),
                ("codec:", (count,), size)]
        for dtype, shape, nbytes in lies:
            t.send(0, encode_header(Header(DATA, r, int(COLLECTIVE_CHANNEL), 10_000,
                                           "allreduce(sum,topk:0.1)", dtype, shape, nbytes, 0,
                                           size)),
                   bytes(size))
    peer.allreduce(np.zeros(1), timeout=30)   # after it, rank 0 has read (and counted) them
    # A payload whose header is right but whose bytes are not: rank 1's top-k lies.
    x = np.ones(count, dtype=np.float32)
    spec = LyingCodec(0.1) if r == 1 else codec
    try:
        peer.allreduce(x, op="sum", compression=spec, timeout=20)
        outcome = "ok"
    except gossip.ProtocolError as exc:
        outcome = str(exc)
    # Every peer still serves: an honest compressed allreduce completes.
    y = np.full(count, r + 1.0, dtype=np.float32)
    peer.allreduce(y, op="sum", compression="fp16", timeout=20)
    stats = peer.stats()
    return outcome, y[:3].tolist(), stats["dropped_by_reason"], stats["codec"]["rejected"]


def test_malformed_compressed_payloads_are_dropped_and_counted_and_never_crash():
    results = spawn(malformed_sender, n=3, timeout=120, peer_timeout=30)
    for r, (outcome, y, dropped, rejected) in enumerate(results):
        assert y == [6.0, 6.0, 6.0], (r, y)
    outcome0, _, dropped0, rejected0 = results[0]
    assert dropped0.get("malformed", 0) >= 4, dropped0
    # Rank 2 decodes rank 1's lying payload (rank 0 too): refused, counted, named.
    assert rejected0 >= 1 and "rank 1" in outcome0 and "does not decode" in outcome0, outcome0
    assert results[2][3] >= 1 and "rank 1" in results[2][0], results[2]
