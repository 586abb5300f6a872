"""Allreduce of GPU arrays (cupy, and torch CUDA tensors) between peers that share one GPU,
against the same allreduce of host (numpy) arrays and the GPU's own host<->device copies, in
one run. Needs cupy and a CUDA device (scripts/gpu-check.sh runs it after the GPU tests).

    python benchmarks/gpu_allreduce.py [--nprocs 2,4] [--sizes 4M,64M] [--iters 10]

Peers of one GPU take the staged ring (NCCL refuses a GPU shared by several processes): each
call copies the array to pinned host memory, runs the host allreduce, and copies back. So the
bound is the host allreduce plus two copies; the table prints each time, and bound / GPU time
(1.00: nothing lost beyond the copies; above 1, the copies overlap the host work).
Per size: barrier, then the call, the slowest rank's time, the median over the iterations
after 3 warm-ups (benchmarks/README.md's method)."""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from gossip.testing import spawn

__all__ = ["main"]


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def _timed(peer, kind: str, nbytes: int, iters: int) -> list[float]:
    """This rank's times of ``iters`` allreduces of a float32 array of ``nbytes``."""
    count = nbytes // 4
    if kind == "numpy":
        x = np.ones(count, dtype=np.float32)
        sync = lambda: None  # noqa: E731
    elif kind == "cupy":
        import cupy
        x = cupy.ones(count, dtype=cupy.float32)
        sync = cupy.cuda.Device().synchronize
    else:
        import torch
        x = torch.ones(count, dtype=torch.float32, device="cuda")
        sync = torch.cuda.synchronize
    times = []
    for i in range(iters + 3):
        peer.barrier()
        sync()
        t0 = time.perf_counter()
        peer.allreduce(x)
        sync()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return times


def _copies(nbytes: int, iters: int) -> tuple[float, float]:
    """Median seconds of one host->device and one device->host copy of ``nbytes`` (pinned)."""
    import cupy
    count = nbytes // 4
    device = cupy.ones(count, dtype=cupy.float32)
    pinned = cupy.cuda.alloc_pinned_memory(nbytes)
    host = np.frombuffer(pinned, dtype=np.float32, count=count)
    up, down = [], []
    for _ in range(iters + 3):
        t0 = time.perf_counter()
        device.set(host)
        cupy.cuda.Device().synchronize()
        t1 = time.perf_counter()
        device.get(out=host)
        cupy.cuda.Device().synchronize()
        up.append(t1 - t0)
        down.append(time.perf_counter() - t1)
    return statistics.median(up[3:]), statistics.median(down[3:])


def _run(peer, kinds: list[str], sizes: list[int], iters: int) -> dict:
    return {(kind, size): _timed(peer, kind, size, iters) for kind in kinds for size in sizes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nprocs", default="2,4")
    parser.add_argument("--sizes", default="4M,64M")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args(argv)
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as exc:   # (ImportError, or cupy's CUDA errors)
        print(f"gpu_allreduce: needs cupy and a CUDA device ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        return 2
    kinds = ["numpy", "cupy"]
    try:
        import torch
        if torch.cuda.is_available():
            kinds.append("torch")
    except ImportError:
        pass
    sizes = [_size(s) for s in args.sizes.split(",")]
    print(f"# {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, cupy "
          f"{cupy.__version__}; median of {args.iters} after 3 warm-ups, slowest rank")
    print("| n | size | numpy (host) ms | copies up+down ms | bound ms | cupy ms | bound/cupy "
          "| torch ms | bound/torch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in (int(v) for v in args.nprocs.split(",")):
        results = spawn(_run, n=n, timeout=600, args=(kinds, sizes, args.iters),
                        env={"GOSSIP_NCCL": "0"})
        for size in sizes:
            def median(kind: str) -> float:
                slowest = [max(r[(kind, size)][i] for r in results) for i in range(args.iters)]
                return statistics.median(slowest) * 1e3
            up, down = _copies(size, args.iters)
            host = median("numpy")
            bound = host + (up + down) * 1e3
            cells = [str(n), f"{size >> 20} MiB", f"{host:.2f}", f"{(up + down) * 1e3:.2f}",
                     f"{bound:.2f}", f"{median('cupy'):.2f}", f"{bound / median('cupy'):.2f}"]
            if "torch" in kinds:
                cells += [f"{median('torch'):.2f}", f"{bound / median('torch'):.2f}"]
            else:
                cells += ["-", "-"]
            print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
