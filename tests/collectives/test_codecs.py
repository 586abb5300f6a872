"""Codecs alone (no peers): round trips within each codec's documented error bound for
float32, float64 and bfloat16/float16 inputs, bf16 bit-exact against torch's conversion,
the wire's checks of codec payload headers, and top-k's error feedback on a quadratic."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from collectives.codecs import (BLOCK, BFloat16, CodecError, Int8Block, TopK, as_float32,
                                from_wire, parse, wire_dtype, write_back)
from collectives.arrays import adapter_for
from collectives.transport.wire import DATA, Header, WireError, decode_header, encode_header

SPECS = ["fp16", "bf16", "int8", "topk:0.01", "topk:0.3", "topk:1.0"]
SIZES = [0, 1, 7, BLOCK - 1, BLOCK, BLOCK + 1, 70_001]


def round_trip(codec, x32: np.ndarray) -> np.ndarray:
    enc = np.empty(codec.encoded_nbytes(x32.size), dtype=np.uint8)
    codec.encode(x32, enc)
    out = np.empty_like(x32)
    codec.decode(enc, out)
    return out


def inputs(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Magnitudes spread over many binades, so blocks and relative errors both matter.
    return (rng.standard_normal(n) * np.exp(rng.uniform(-8, 8, n))).astype(np.float32)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("n", SIZES)
def test_round_trip_is_within_the_documented_bound_float32(spec, n):
    codec = parse(spec)
    x = inputs(n, n)
    y = round_trip(codec, x)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert np.all(np.abs(y - x) <= codec.error_bound(x)), spec


@pytest.mark.parametrize("spec", SPECS)
def test_round_trip_of_float64_and_torch_bfloat16_parameters(spec):
    torch = pytest.importorskip("torch")
    codec = parse(spec)
    for x in (inputs(5000, 1).astype(np.float64), torch.from_numpy(inputs(5000, 2)).bfloat16(),
              torch.from_numpy(inputs(5000, 3)).half(), torch.from_numpy(inputs(5000, 4))):
        adapter = adapter_for(x)
        flat = adapter.flat(x)
        x32 = as_float32(adapter, flat, adapter.dtype_name(flat))
        assert x32.dtype == np.float32
        y = round_trip(codec, x32)
        assert np.all(np.abs(y - x32) <= codec.error_bound(x32))
        # Written back into the parameters' own dtype: within the bound plus that dtype's
        # own rounding (bf16: 2^-8 relative, fp16: 2^-11).
        before = x32.copy()
        write_back(adapter, flat, y)
        back = as_float32(adapter, flat, adapter.dtype_name(flat))
        slack = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}.get(adapter.dtype_name(flat), 0)
        assert np.all(np.abs(back - before) <= codec.error_bound(before) + slack * np.abs(y)
                      + 2.0 ** -24)


def test_bf16_rounds_to_nearest_even_exactly_as_torch():
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(inputs(100_000, 5))
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.4e38, -0.0, 1e-40,
                            1.00390625, 1.01171875])   # the last two: ties, to even
    for t in (x, special):
        y = round_trip(BFloat16(), t.numpy().copy())
        assert torch.equal(torch.from_numpy(y), t.bfloat16().float()) or \
            torch.allclose(torch.from_numpy(y), t.bfloat16().float(), equal_nan=True, rtol=0,
                           atol=0)


def test_int8_scales_per_block_and_a_large_value_costs_only_its_block():
    x = np.full(3 * BLOCK, 1e-3, dtype=np.float32)
    x[BLOCK + 5] = 1e3   # the second block's absmax
    y = round_trip(Int8Block(), x)
    np.testing.assert_allclose(y[:BLOCK], x[:BLOCK], rtol=1 / 254)
    np.testing.assert_allclose(y[2 * BLOCK:], x[2 * BLOCK:], rtol=1 / 254)
    assert np.all(np.abs(y[BLOCK:2 * BLOCK] - x[BLOCK:2 * BLOCK]) <= 1e3 / 254)


def test_top_k_keeps_the_largest_and_is_a_contraction():
    x = inputs(10_000, 6)
    codec = TopK(0.05)
    y = round_trip(codec, x)
    k = codec.k(x.size)
    kept = np.flatnonzero(y)
    assert len(kept) == k
    assert np.abs(x[kept]).min() >= np.sort(np.abs(x))[-k]
    assert np.sum((y - x) ** 2) <= (1 - k / x.size) * np.sum(x ** 2)


def test_top_k_refuses_indices_out_of_range_or_repeated():
    codec = TopK(0.5)
    good = np.empty(codec.encoded_nbytes(4), dtype=np.uint8)
    codec.encode(np.array([1, -5, 3, 0.5], dtype=np.float32), good)
    out = np.empty(4, dtype=np.float32)
    for indices in ([1, 4], [2, 2], [3, 1]):
        bad = good.copy()
        bad[:8].view(np.uint32)[:] = indices
        with pytest.raises(CodecError):
            codec.decode(bad, out)


def test_parse_names_and_refuses_unknown_specs():
    assert parse(None) is None and parse("none") is None
    assert parse("FP16").name == "fp16" and parse("topk").name == "topk:0.01"
    assert parse(parse("int8")) == parse("int8")
    for bad in ("fp8", "topk:0", "topk:1.5", "topk:nan", "topk:x", "int8:64"):
        with pytest.raises(ValueError):
            parse(bad)
    with pytest.raises(TypeError):
        parse(3)
    # The wire takes canonical names only, and never raises.
    assert from_wire("codec:topk:0.01") == TopK(0.01)
    for name in ("codec:topk:.01", "codec:fp8", "codec:", "fp16", "codec:topk:inf"):
        assert from_wire(name) is None


def header(dtype, shape, nbytes, length):
    return encode_header(Header(DATA, 1, 0, 5, "allreduce(sum,int8)", dtype, shape, nbytes, 0,
                                length, number=1))


def test_wire_checks_a_codec_payload_against_its_header():
    codec = parse("int8")
    size = codec.encoded_nbytes(1000)
    ok = decode_header(header(wire_dtype(codec), (4, 1000), 4 * size, size), world_size=4,
                       max_bytes=1 << 30, payload_len=size)
    assert ok.dtype == "codec:int8" and ok.shape == (4, 1000)
    cases = [(wire_dtype(codec), (4, 1000), 4 * size + 1, size),   # nbytes not the codec's
             (wire_dtype(codec), (4, 999), 4 * size, size),        # shape not the codec's
             ("codec:int9", (4, 1000), 4 * size, size),            # unknown codec
             (wire_dtype(codec), (), 4 * size, size),              # no count
             ("codec:topk:0.01", (2 ** 33,), 8 * 2 ** 33 // 100, 8)]  # past uint32 indices
    for dtype, shape, nbytes, length in cases:
        with pytest.raises(WireError):
            decode_header(header(dtype, shape, nbytes, length), world_size=4,
                          max_bytes=1 << 40, payload_len=length)


def quadratic_sgd(codec, feedback: bool, *, workers: int = 4, n: int = 100,
                  lr: float = 0.002, steps: int = 5000) -> float:
    """Relative distance to the optimum after SGD on f(x) = sum_i ||x - c_i||^2 / 2 over
    ``workers`` workers, each sending its gradient through ``codec`` (with or without error
    feedback), the update their mean: what data-parallel SGD with a compressed allreduce
    does, in one process. The optimum is mean(c_i), where no worker's gradient is zero."""
    rng = np.random.default_rng(0)
    c = rng.standard_normal((workers, n)).astype(np.float32)
    optimum = c.mean(axis=0)
    x = np.zeros(n, dtype=np.float32)
    residual = np.zeros((workers, n), dtype=np.float32)
    enc = np.empty(codec.encoded_nbytes(n), dtype=np.uint8)
    sent = np.empty(n, dtype=np.float32)
    for _ in range(steps):
        update = np.zeros(n, dtype=np.float32)
        for i in range(workers):
            g = lr * (x - c[i])
            if feedback:
                residual[i] += g
                codec.encode(residual[i], enc)
                codec.decode(enc, sent)
                residual[i] -= sent
            else:
                codec.encode(g, enc)
                codec.decode(enc, sent)
            update += sent / workers
        x -= update
    return float(np.linalg.norm(x - optimum) / np.linalg.norm(optimum))


def test_error_feedback_makes_top_k_sgd_converge_where_plain_top_k_does_not():
    # Without feedback the mean of the workers' top-k vanishes away from the optimum (each
    # sends only its own largest coordinates, which need not cancel), so SGD stalls there
    # whatever the step size; with feedback what was not sent is sent later, and the
    # iterate reaches a neighbourhood of the optimum whose size shrinks with lr.
    codec = TopK(0.05)   # 5 of 100 coordinates
    with_feedback = quadratic_sgd(codec, True)
    without = quadratic_sgd(codec, False)
    assert with_feedback < 0.02, with_feedback
    assert without > 0.5, without


# --- numpy's own path (no torch): the same bytes as numpy's casts and as the general code ---

@pytest.fixture
def numpy_only(monkeypatch):
    """The codecs' numpy path even when another test imported torch (fast.py looks for
    torch in sys.modules; None there reads as not imported)."""
    monkeypatch.setitem(sys.modules, "torch", None)


def half_edges() -> np.ndarray:
    """float32 values where a half's rounding can go wrong: subnormal halves and their
    boundary with normals, ties to even (both parities), the largest half and the overflow
    threshold 65520, float32 subnormals, signed zeros, inf, NaN with payloads in the high
    and in the low bits, and a spread of random bit patterns (every exponent)."""
    rng = np.random.default_rng(7)
    ranges = [np.arange(a - 3000, a + 3000, dtype=np.int64) for a in
              (0x33000000, 0x33800000, 0x38000000, 0x38800000, 0x477FE000, 0x477FF000,
               0x47800000, 0x3F800000, 0x3F801000, 0x3F803000)]
    ties = (np.arange(0x30000000, 0x48000000, 1 << 13, dtype=np.int64) | 0x1000)   # halfway
    bits = np.concatenate(ranges + [ties, ties + 1, ties - 1, np.arange(0, 5000),
                                    rng.integers(0, 1 << 31, 300_000),
                                    [0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF,
                                     0x7F801FFF, 0x7FBFE000, 0x7F802000]])
    bits = np.concatenate([bits, bits | 0x80000000]).astype(np.uint32)
    return bits.view(np.float32)


@pytest.mark.parametrize("n", [None, 1, 7, 65_536, 65_537, 200_003])
def test_fp16_numpy_path_is_numpys_cast_bit_for_bit(numpy_only, n):
    from collectives.codecs import Float16
    x = half_edges()
    if n is not None:   # sizes around the blocks of halves.py (HALF_WORK = 64 Ki)
        x = np.resize(np.random.default_rng(n).permutation(x), n)
    enc = np.empty(2 * x.size, dtype=np.uint8)
    Float16().encode(x, enc)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).view(np.uint16)
    assert np.array_equal(enc.view(np.uint16), expected)
    # Decoding: every half there is (NaN payloads, subnormals, inf), and the encodings.
    for halves in (np.arange(1 << 16, dtype=np.uint32).astype(np.uint16), enc.view(np.uint16)):
        out = np.empty(halves.size, dtype=np.float32)
        Float16().decode(halves.view(np.uint8), out)
        assert np.array_equal(out.view(np.uint32),
                              halves.view(np.float16).astype(np.float32).view(np.uint32))


def test_fp16_numpy_path_agrees_with_torch_but_for_nan_payloads():
    from collectives.codecs.halves import encode_fp16
    torch = pytest.importorskip("torch")
    x = half_edges()
    ours = np.empty(x.size, dtype=np.uint16)
    encode_fp16(x, ours)   # numpy's path whether torch is imported or not
    theirs = torch.from_numpy(x).half().view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(ours[~nan], theirs[~nan])
    assert np.all(np.isnan(ours.view(np.float16)[nan]))


@pytest.mark.slow
@pytest.mark.timeout(1200)   # 3 minutes quiet, 10 on a loaded 2-core machine
def test_fp16_numpy_path_on_every_float32(numpy_only):
    from collectives.codecs.halves import encode_fp16
    step = 1 << 26
    out = np.empty(step, dtype=np.uint16)
    for start in range(0, 1 << 32, step):
        x = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32).view(np.float32)
        encode_fp16(x, out)
        with np.errstate(over="ignore"):
            assert np.array_equal(out, x.astype(np.float16).view(np.uint16)), hex(start)


def bf16_reference(x: np.ndarray) -> np.ndarray:
    """Round to nearest even on the upper 16 bits, in uint64 (no overflow), NaN -> 0x7FC0."""
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[np.isnan(x)] = 0x7FC0
    return r


def test_bf16_numpy_path_rounds_to_nearest_even_bit_for_bit(numpy_only):
    x = np.concatenate([half_edges(), np.random.default_rng(3).standard_normal(70_001)
                        .astype(np.float32)])
    enc = np.empty(2 * x.size, dtype=np.uint8)
    BFloat16().encode(x, enc)
    assert np.array_equal(enc.view(np.uint16), bf16_reference(x))


@pytest.mark.parametrize("n", [1, BLOCK - 1, BLOCK + 1, 200_003])
def test_int8_numpy_path_is_the_general_spelling_bit_for_bit(numpy_only, n):
    # Blocks that take reduceat's shortcut and blocks that do not (all zero, a tiny scale
    # that underflows, inf, NaN with distinct payloads): the bytes of the general code.
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-40, 40, n))).astype(np.float32)
    if n > 5 * BLOCK:
        x[:BLOCK] = 0
        x[BLOCK:2 * BLOCK] = np.float32(1e-45)
        x[2 * BLOCK + 3] = np.inf
        x.view(np.uint32)[3 * BLOCK + 1:3 * BLOCK + 3] = [0x7FC00001, 0xFFC12345]
        x[4 * BLOCK + 9] = -np.inf
    codec = Int8Block()
    ours = np.empty(codec.encoded_nbytes(n), dtype=np.uint8)
    codec.encode(x, ours)
    general = np.empty_like(ours)
    scales, q = codec._split(general, n)
    full = n // BLOCK * BLOCK
    with np.errstate(invalid="ignore", divide="ignore"):
        Int8Block._encode_blocks(np, x[:full], BLOCK, scales[:full // BLOCK], q[:full],
                                 np.empty(full, dtype=np.float32))
        if full < n:
            Int8Block._encode_blocks(np, x[full:], n - full, scales[-1:], q[full:],
                                     np.empty(n - full, dtype=np.float32))
    if not np.isfinite(scales).all():   # blocks with a NaN or inf: mended the same way
        Int8Block._confine(np, x, scales, q)
    assert np.array_equal(ours, general)


@pytest.mark.parametrize("n", [5, BLOCK, BLOCK + 44, 4 * BLOCK + 7])
def test_int8_keeps_nan_and_inf_to_their_own_elements(n):
    """One NaN or inf used to make its whole block of 256 NaN (and an inf came back NaN):
    now each decodes as itself, and its block's finite elements within half a step of
    their finite maximum / 126."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    x[min(3, n - 1)] = np.nan
    if n > BLOCK:
        x[BLOCK + 1], x[n - 1] = np.inf, -np.inf
        x[2 * BLOCK:3 * BLOCK] = np.nan      # a block of nothing else (where n reaches it)
    codec = Int8Block()
    enc = np.empty(codec.encoded_nbytes(n), dtype=np.uint8)
    codec.encode(x, enc)
    y = np.empty(n, dtype=np.float32)
    codec.decode(enc, y)
    finite = np.isfinite(x)
    assert np.array_equal(np.isnan(y), np.isnan(x))
    assert np.array_equal(y[np.isinf(x)], x[np.isinf(x)])
    for lo in range(0, n, BLOCK):
        block = slice(lo, min(lo + BLOCK, n))
        ok = finite[block]
        if ok.any():
            step = np.abs(x[block][ok]).max() / 126
            assert np.abs(y[block][ok] - x[block][ok]).max() <= step / 2 * (1 + 1e-5)
