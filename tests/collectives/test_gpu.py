"""GPU arrays: cupy arrays and torch CUDA tensors through the same ring algorithm (staged through
pinned host memory), and NCCL where each peer has its own GPU. Marked `gpu`: excluded from the
default run, and skipped (not passed) without cupy or a CUDA device. scripts/gpu-check.sh runs
them on a GPU machine."""
from __future__ import annotations

import numpy as np
import pytest

from gossip.testing import spawn

pytestmark = pytest.mark.gpu


def _gpu_count() -> int:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


needs_gpu = pytest.mark.skipif(_gpu_count() < 1, reason="needs cupy and a CUDA device")
needs_two_gpus = pytest.mark.skipif(_gpu_count() < 2, reason="NCCL needs a GPU per peer")


def cupy_collectives(peer, lengths):
    import cupy
    cupy.cuda.Device(peer.rank % cupy.cuda.runtime.getDeviceCount()).use()
    n, r = peer.world_size, peer.rank
    out = []
    for length in lengths:
        for op in ("sum", "mean", "max"):
            host = np.arange(length, dtype=np.float32) * (r + 1)
            x = cupy.asarray(host)
            assert peer.allreduce(x, op=op) is x
            ref = np.stack([np.arange(length, dtype=np.float32) * (k + 1) for k in range(n)])
            want = {"sum": ref.sum(0), "mean": ref.sum(0) / n, "max": ref.max(0)}[op]
            out.append(bool(np.allclose(cupy.asnumpy(x), want, rtol=1e-5)))
    b = cupy.full(100_003, float(r))
    peer.broadcast(b, root=n - 1)
    out.append(bool((b == n - 1).all()))
    g = peer.allgather(cupy.full(5, r, dtype=cupy.int64))
    out.append(cupy.asnumpy(g).tolist() == [[k] * 5 for k in range(n)])
    y = cupy.full(1000, float(r))
    peer.neighbor_allreduce(y, 0.5, {(r - 1) % n: 0.5}, [(r + 1) % n])
    out.append(float(y[0]) == (r + (r - 1) % n) / 2)
    return out


@needs_gpu
@pytest.mark.parametrize("n", [2, 3])
def test_cupy_staged_ring(n):
    # One GPU shared by every peer: the staged ring over ZeroMQ (NCCL refuses shared GPUs).
    results = spawn(cupy_collectives, n=n, timeout=240, args=([0, 1, 1000, 2**20 + 7],),
                    env={"GOSSIP_NCCL": "0"})
    assert all(all(r) for r in results), results


def torch_cuda(peer):
    import torch
    if not torch.cuda.is_available():
        import pytest as _pytest
        _pytest.skip("torch has no CUDA")
    device = torch.device("cuda", peer.rank % torch.cuda.device_count())
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.arange(1000, device=device, dtype=dtype) + peer.rank
        peer.allreduce(x)
        want = (torch.arange(1000, dtype=torch.float64) * peer.world_size
                + sum(range(peer.world_size)))
        out.append(bool(torch.allclose(x.double().cpu(), want, rtol=1e-2)))
    return out


@needs_gpu
def test_torch_cuda_tensors_staged():
    results = spawn(torch_cuda, n=2, timeout=240, env={"GOSSIP_NCCL": "0"})
    assert all(all(r) for r in results), results


@needs_two_gpus
def test_nccl_path():
    results = spawn(cupy_collectives, n=2, timeout=240, args=([1000, 2**20 + 7],))
    assert all(all(r) for r in results), results
