"""The array adapters' element-wise operations (what the policies build their averaging from),
against a float64 reference, on every kind of array this machine has: numpy, torch CPU tensors,
and, on a GPU machine, cupy arrays and torch CUDA tensors. Sizes straddle the numpy adapters'
cache-sized blocks (_BLOCK elements) so the blockwise loops' edges are covered."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from collectives.arrays.adapter import adapter_for
from collectives.arrays.numpy_arrays import BLOCK as _BLOCK

SIZES = [1, 7, _BLOCK - 1, _BLOCK, 2 * _BLOCK + 3]


def _gpu() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def make(kind: str, host: np.ndarray):
    """host (float64) as an array of ``kind``."""
    if kind == "numpy-float32":
        return host.astype(np.float32)
    if kind == "numpy-float64":
        return host.copy()
    if kind == "torch-float32":
        return torch.from_numpy(host.astype(np.float32))
    if kind == "torch-bfloat16":
        return torch.from_numpy(host).to(torch.bfloat16)
    if kind == "cupy-float32":
        import cupy
        return cupy.asarray(host.astype(np.float32))
    if kind == "torch-cuda-float32":
        return torch.from_numpy(host.astype(np.float32)).cuda()
    raise ValueError(kind)


def to_host(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    import cupy
    return cupy.asnumpy(x).astype(np.float64)


CPU_KINDS = ["numpy-float32", "numpy-float64", "torch-float32", "torch-bfloat16"]
GPU_KINDS = [pytest.param(k, marks=[pytest.mark.gpu, pytest.mark.skipif(
    not _gpu(), reason="needs cupy and a CUDA device")])
    for k in ("cupy-float32", "torch-cuda-float32")]

# name: (call on (adapter, dst, src, weight), reference on float64 (dst, src, weight))
OPERATIONS = {
    "axpy": (lambda a, d, s, w: a.axpy(d, w, s), lambda d, s, w: d + w * s),
    "axpy-one": (lambda a, d, s, w: a.axpy(d, 1.0, s), lambda d, s, w: d + s),
    "scaled_copy": (lambda a, d, s, w: a.scaled_copy(d, w, s), lambda d, s, w: w * s),
    "scale_add": (lambda a, d, s, w: a.scale_add(d, w, s), lambda d, s, w: w * d + s),
    "lerp": (lambda a, d, s, w: a.lerp(d, s, w), lambda d, s, w: d + w * (s - d)),
    "copy": (lambda a, d, s, w: a.copy(d, s), lambda d, s, w: s),
    "scale": (lambda a, d, s, w: a.scale(d, w), lambda d, s, w: w * d),
    "divide_into": (lambda a, d, s, w: a.divide_into(d, s, w), lambda d, s, w: s / w),
}


@pytest.mark.parametrize("kind", CPU_KINDS + GPU_KINDS)
@pytest.mark.parametrize("operation", sorted(OPERATIONS))
@pytest.mark.parametrize("size", SIZES)
def test_elementwise_operation_matches_float64_reference(kind, operation, size):
    rng = np.random.default_rng(size)
    d64, s64 = rng.standard_normal(size), rng.standard_normal(size)
    weight = 0.3125 if operation != "lerp" else 0.375
    dst, src = make(kind, d64), make(kind, s64)
    # The reference starts from what the array holds (bfloat16 rounds its inputs).
    want = OPERATIONS[operation][1](to_host(dst), to_host(src), weight)
    before_src = to_host(src)
    OPERATIONS[operation][0](adapter_for(dst), dst, src, weight)
    tol = 2e-2 if "bfloat16" in kind else 1e-6 if "32" in kind else 1e-14
    np.testing.assert_allclose(to_host(dst), want, rtol=tol, atol=tol)
    assert np.array_equal(to_host(src), before_src), "the source was modified"


@pytest.mark.parametrize("kind", ["numpy-float32", "torch-float32"])
def test_operations_work_in_place_on_views(kind):
    # The policies pass slices of their buffers (a message without its weight element).
    host = np.arange(2 * _BLOCK + 10, dtype=np.float64)
    dst, src = make(kind, host), make(kind, 2 * host)
    adapter = adapter_for(dst)
    adapter.lerp(dst[:-1], src[:-1], 0.5)
    out = to_host(dst)
    np.testing.assert_allclose(out[:-1], 1.5 * host[:-1])
    assert out[-1] == host[-1]


@pytest.mark.parametrize("kind", CPU_KINDS + GPU_KINDS)
@pytest.mark.parametrize("size", SIZES)
def test_allocation_and_finiteness_match_the_array(kind, size):
    host = np.random.default_rng(size).standard_normal(size)
    x = make(kind, host)
    adapter = adapter_for(x)
    copy = adapter.clone(x)
    assert type(copy) is type(x) and copy.dtype == x.dtype
    assert np.array_equal(to_host(copy), to_host(x))
    adapter.scale(copy, 2.0)
    assert np.array_equal(to_host(x), to_host(make(kind, host))), "clone shares memory"
    zeros = adapter.zeros(size + 1, x)
    assert type(zeros) is type(x) and zeros.dtype == x.dtype
    assert np.array_equal(to_host(zeros), np.zeros(size + 1))
    assert adapter.all_finite(x)
    for bad in (np.nan, np.inf, -np.inf):
        spoilt = host.copy()
        spoilt[size // 2] = bad
        assert not adapter.all_finite(make(kind, spoilt))


def test_an_adapter_missing_an_operation_fails_at_construction():
    from collectives.arrays.interface import ArrayAdapter
    from collectives.arrays.numpy_arrays import NumpyAdapter

    namespace = {name: getattr(NumpyAdapter, name) for name in ArrayAdapter.__abstractmethods__
                 if name != "lerp"}
    incomplete = type("Incomplete", (ArrayAdapter,), namespace)
    with pytest.raises(TypeError, match="lerp"):
        incomplete()


# (the bitwise ops take integers and bools only)
_REDUCE_CASES = [(dtype, op) for dtype in ("float32", "float64", "int32", "uint32", "bool")
                 for op in ("sum", "mean", "prod", "max", "min", "band", "bor", "bxor")
                 if not (dtype.startswith("float") and op in ("band", "bor", "bxor"))]


@pytest.mark.parametrize("family", ["numpy", "torch"])
@pytest.mark.parametrize("dtype, op", _REDUCE_CASES)
def test_reduce_into_gives_the_bytes_of_reduce_on_a_copy(family, dtype, op):
    """reduce_into(dst, a, b) (the aside reductions' one pass) against reduce on a copy of a:
    the same bytes, for every op the dtype takes, into a third array and into a or b."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal(_BLOCK + 5) * 100
    b = rng.standard_normal(_BLOCK + 5) * 100
    host_a, host_b = (v.astype(dtype) if dtype != "uint32" else np.abs(v).astype(dtype)
                      for v in (a, b))
    wrap = (lambda v: torch.from_numpy(v.copy())) if family == "torch" else np.copy
    adapter = adapter_for(wrap(host_a))
    expected = wrap(host_a)
    adapter.reduce(op, expected, wrap(host_b))
    for into in ("third", "a", "b"):
        x, y = wrap(host_a), wrap(host_b)
        dst = {"third": adapter.empty(x.shape[0], adapter.dtype_name(x), x), "a": x,
               "b": y}[into]
        adapter.reduce_into(op, dst, x, y)
        assert np.asarray(dst).tobytes() == np.asarray(expected).tobytes(), (into, dtype, op)
