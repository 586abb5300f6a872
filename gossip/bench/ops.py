"""What each ``gossip bench`` operation means: the operations, what a size is for each (as
nccl-tests), the bytes its algbw is computed on, its busbw factor, the note under its table,
and the memory a run of it needs (checked before any process starts).

    layout("gather", 3, 4096)       # (4092, 341): 3 parts of 341 float32s, 4092 bytes in all
    busbw_factor("alltoall", 4)     # 0.75
    check_memory("gather", 4, [100 << 30])   # ValueError: needs about ... GiB
"""
from __future__ import annotations

from typing import Sequence

from gossip.bench.sizes import BUFFERS_PER_PEER, ITEMSIZE, available_memory, format_size

__all__ = ["OPS", "REDUCING", "SPLIT", "ROOTED", "layout", "busbw_factor", "algbw_bytes",
           "memory_need", "check_memory", "NOTES", "ring_in_degree", "alltoallv_counts",
           "allgatherv_counts"]

OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter",
       "alltoall", "alltoallv", "allgatherv", "neighbor", "neighbor_allgather", "p2p")
#: The operations that reduce (``--op`` applies to them; the table's redop column).
REDUCING = ("allreduce", "reduce_scatter", "reduce")
#: nccl-tests' size is their whole buffer, cut in n equal parts of whole float32s: the buffer
#: reduce_scatter reduces, the root's buffer of gather and scatter, each peer's alltoall input.
SPLIT = ("reduce_scatter", "gather", "scatter", "alltoall")
#: Rooted at rank 0.
ROOTED = ("broadcast", "reduce", "gather", "scatter")


def layout(op: str, n: int, nbytes: int) -> tuple[int, int]:
    """(the row's size in bytes, its count) for a requested size, as nccl-tests prints them:
    for the SPLIT ops the size is rounded down to n equal parts of whole float32s and the count
    is one part's elements (the count ncclReduceScatter, ncclGather, ncclScatter and
    ncclAlltoAll take); for the others the size is the array and the count its elements
    (allgather: each peer's input, see NOTES). ValueError when a part would be empty."""
    count = nbytes // ITEMSIZE
    if op in ("alltoallv", "allgatherv"):
        shares = _shares(n)
        unit = count // shares
        if unit == 0:
            raise ValueError(f"size {nbytes} B is too small for {op} over {n} peers: give "
                             f"at least {shares * ITEMSIZE} bytes (one float32 per share)")
        return unit * shares * ITEMSIZE, unit
    if op not in SPLIT:
        return count * ITEMSIZE, count
    part = count // n
    if part == 0:
        raise ValueError(f"size {nbytes} B is too small for {op} over {n} peers: give at least "
                         f"{n * ITEMSIZE} bytes (one float32 per peer)")
    return part * n * ITEMSIZE, part


def busbw_factor(op: str, n: int) -> float:
    """busbw = algbw * factor (nccl-tests): allreduce 2(n-1)/n; allgather, reduce_scatter,
    gather, scatter, alltoall (n-1)/n; broadcast, reduce, neighbor, p2p 1."""
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("allgather", "allgatherv") or op in SPLIT:
        return (n - 1) / n
    if op == "alltoallv":   # each peer keeps one share of its n(n+1)/2 and sends the rest
        return (_shares(n) - 1) / _shares(n)
    return 1.0


def _shares(n: int) -> int:
    return n * (n + 1) // 2


def alltoallv_counts(n: int, rank: int, total: int) -> tuple[list[int], list[int]]:
    """The unequal blocks of the alltoallv rows: (what ``rank`` sends each peer, what it
    receives from each), in elements, for an input of ``total`` elements a peer: n(n+1)/2
    shares of ``total`` // n(n+1)/2 elements (the row's count); rank r sends peer j
    ``(j - r) % n + 1`` shares, so every peer sends blocks of 1 to n shares, keeps one share,
    and receives as much as it sends."""
    unit = total // _shares(n)
    sends = [((j - rank) % n + 1) * unit for j in range(n)]
    recvs = [((rank - j) % n + 1) * unit for j in range(n)]
    return sends, recvs


def allgatherv_counts(n: int, total: int) -> list[int]:
    """The unequal parts of the allgatherv rows, in elements, for a gathered output of
    ``total`` elements: n(n+1)/2 shares of ``total`` // n(n+1)/2 elements (the row's count),
    rank j's part ``j + 1`` shares."""
    unit = total // _shares(n)
    return [(j + 1) * unit for j in range(n)]


def algbw_bytes(op: str, n: int, nbytes: int) -> int:
    """The bytes algbw divides by the time: the row's size, except allgather's, whose size is
    each peer's input and whose algbw is on the gathered output (nccl-tests' size there), and
    neighbor_allgather's, on what each peer receives (its ring neighbours' arrays)."""
    if op == "allgather":
        return n * nbytes
    if op == "neighbor_allgather":
        return ring_in_degree(n) * nbytes
    return nbytes


def ring_in_degree(n: int) -> int:
    """In-neighbours of a ring of n: 2, or 1 when both are the same peer (n = 2)."""
    return min(n - 1, 2)


def memory_need(op: str, n: int, nbytes: int) -> int:
    """Bytes a run of ``op`` over ``n`` peers at a row size of ``nbytes`` holds at once, about:
    every rank's arrays for the operation (the root's larger ones too), plus
    BUFFERS_PER_PEER - 1 arrays of the size per peer for what is in flight (received chunks,
    send buffers). The measured implementation runs alone, so this is the run's need."""
    part = nbytes // max(n, 1)
    held = {
        "allreduce": n * nbytes, "broadcast": n * nbytes, "reduce_scatter": n * nbytes,
        "reduce": (2 * n - 1) * nbytes,          # a non-root reduces a copy of its array
        "neighbor": 2 * n * nbytes,              # the array and the received neighbours'
        "neighbor_allgather": 3 * n * nbytes,    # the array and the two received
        "p2p": 2 * nbytes,
        "allgather": n * (n + 1) * nbytes,       # each peer's input and the gathered output
        "gather": n * part + nbytes,             # the parts, and the root's gathered buffer
        "scatter": nbytes + n * part,            # the root's buffer, and every peer's part
        "alltoall": 2 * n * nbytes,              # each peer's input and output
        "alltoallv": 2 * n * nbytes,
        "allgatherv": 2 * n * nbytes,            # each peer's part and the gathered output
    }[op]
    return held + (BUFFERS_PER_PEER - 1) * n * nbytes


def check_memory(op: str, n: int, sizes: Sequence[int], available: int | None = None) -> None:
    """ValueError, before any process starts, when the largest size cannot fit in the memory
    available (MemAvailable; a run that does not fit dies in the kernel's OOM killer or in
    allocation failures deep in n processes). ``sizes`` are row sizes (``layout``)."""
    if not sizes:
        return
    if available is None:
        available = available_memory()
        if available is None:
            return   # (not Linux: nothing to check against)
    largest = max(sizes)
    need = memory_need(op, n, largest)
    if need > available:
        raise ValueError(f"{op} of {format_size(largest)} with {n} peers needs about "
                         f"{need / 2**30:.1f} GiB (the peers' arrays and "
                         f"{BUFFERS_PER_PEER - 1} more of that size per peer in flight); this "
                         f"machine has {available / 2**30:.1f} GiB available")


NOTES = {
    "allreduce": "busbw = algbw * 2(n-1)/n (nccl-tests)",
    "allgather": "size = each peer's input (not nccl-tests' gathered size); algbw = "
                 "n*size/time (the gathered output, as nccl-tests); busbw = algbw * (n-1)/n",
    "reduce_scatter": "size = the whole array each peer reduces (nccl-tests), count = one "
                      "peer's part (size/n); algbw = size/time; busbw = algbw * (n-1)/n",
    "broadcast": "root 0; busbw = algbw",
    "reduce": "root 0; size = each peer's array; busbw = algbw",
    "gather": "root 0; size = the root's gathered buffer (nccl-tests), count = one peer's "
              "part (size/n); busbw = algbw * (n-1)/n",
    "scatter": "root 0; size = the root's buffer (nccl-tests), count = one peer's part "
               "(size/n); busbw = algbw * (n-1)/n",
    "alltoall": "size = each peer's input (nccl-tests), n equal blocks, count = one block's "
                "elements; busbw = algbw * (n-1)/n",
    "alltoallv": "size = each peer's input, n(n+1)/2 shares: rank r sends rank j (j - r) % n + "
                 "1 of them (MPI's Alltoallv, torch's split sizes), count = one share's "
                 "elements; busbw = algbw * (shares - 1)/shares",
    "allgatherv": "size = the gathered output, n(n+1)/2 shares: rank j gives j + 1 of them "
                  "(MPI's Allgatherv; allgather(variable=True)), count = one share's "
                  "elements; algbw = size/time; busbw = algbw * (n-1)/n",
    "neighbor": "one neighbor_allreduce ring round (self 1/3, each neighbour 1/3); Gloo: "
                "isend/irecv to both neighbours + average; busbw = algbw",
    "neighbor_allgather": "each peer's array to its two ring neighbours, theirs concatenated "
                          "(BlueFog's neighbor_allgather); algbw = bytes received (2*size, "
                          "n = 2: size)/time; Gloo: isend/irecv to both; busbw = algbw",
    "p2p": "rank 0 -> rank 1, one array, timed at the receiver from a barrier; busbw = algbw; "
           "pyzmq: a PAIR socket over tcp when the peers used tcp, else ipc",
}
