"""Large host arrays whose fresh memory faults in fast: anonymous mappings aligned to 2 MiB
and advised for transparent huge pages.

Why: a process that joins a running group writes hundreds of MiB into memory it has never
touched (the state it receives, the policy's buckets), and on the VMs here a fresh 4 KiB page
costs so much that a first write ran at 0.14-0.5 GB/s (256 MiB: 1.9 s; 4 MiB: 8 ms) against
3.7-12 GB/s for the same bytes in 2 MiB pages (73 ms; 0.33 ms). numpy advises huge pages
too, but its blocks come from malloc, not aligned to 2 MiB, and measured no faster. Where the
kernel has transparent huge pages off, this is an ordinary anonymous mapping.

The mapping lives as long as the array (it is the array's base); small arrays stay numpy's.
"""
from __future__ import annotations

import mmap

import numpy as np

__all__ = ["HUGE_PAGE", "empty_host", "empty_host_tensor"]

HUGE_PAGE = 2 << 20
# Below this, numpy's allocator (a reused block is warm already, and a mapping per array
# would cost a system call each).
_MAPPED_FROM = 2 * HUGE_PAGE


def empty_host(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous numpy array of ``shape`` and ``dtype``; from
    ``_MAPPED_FROM`` bytes up, in a 2 MiB-aligned anonymous mapping advised for huge pages."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64)) if np.ndim(shape) else int(shape)
    nbytes = count * dtype.itemsize
    if nbytes < _MAPPED_FROM or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.empty(shape, dtype=dtype)
    area = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(area, dtype=np.uint8)
    start = (-raw.ctypes.data) % HUGE_PAGE
    try:
        area.madvise(mmap.MADV_HUGEPAGE, start, nbytes - nbytes % HUGE_PAGE)
    except OSError:
        pass   # (a kernel without THP: an ordinary mapping)
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def empty_host_tensor(shape, dtype):
    """As empty_host, a CPU torch tensor of torch dtype ``dtype`` (bfloat16 too: the mapping
    is bytes, viewed)."""
    import torch
    shape = tuple(shape) if np.ndim(shape) else (int(shape),)
    count = int(np.prod(shape, dtype=np.int64))
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = empty_host(count * itemsize, np.uint8)
    return torch.from_numpy(raw).view(dtype).reshape(shape)
