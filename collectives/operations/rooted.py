"""Rooted and personalised collectives of a Communicator, run through its Engine: reduce to a
root, gather to a root, scatter from a root, all-to-all (MPI's and torch.distributed's
semantics; alltoall's blocks equal or of any sizes).

- ``reduce``: Rabenseifner's scheme, a ring reduce-scatter then each peer's reduced segment
  sent to the root: every peer sends about 2 (n-1)/n of the array, as an allreduce's first
  half plus a gather, instead of the root receiving n - 1 whole arrays. The root's ``x``
  holds the result; the others' ``x`` is left as it was (they reduce a copy).
- ``gather`` / ``scatter``: each peer's part straight to / from the root (the root moves
  (n - 1) parts whatever the scheme, so one hop each is optimal), every part at once.
- ``alltoall``: block j of each peer's ``x`` goes to peer j, all sends posted first so every
  link is busy at once; peer r's ``out`` holds block r of every peer, in rank order.

Among peers on one host (choice.on_host_copies) each of them reads what it needs straight
from the others' arrays instead (algorithms/shm_copies.py): reduce's segments are reduced by
their peers out of every array and written into the root's ``x`` (each as soon as it is
reduced, all at once); gather's peers write their parts into the root's output, a scatter's
peers read their parts of the root's array, alltoall's their blocks of every peer's (with
unequal blocks, every peer's counts travel in its slot as it enters: once every peer
entered, each knows where its block starts in every sender's array; OnHostCopies.exchange).

Non-contiguous arrays go through contiguous stand-ins (staging.py). Every peer must make the
same call (root, op, dtype, sizes): each message's header is
checked against the receiver's call, so a mismatch is a ProtocolError naming both calls on
the peers it reaches and, through the abort, on the others. ``wait=False`` returns a Work.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from collectives.algorithms.allgather import direct_allgather
from collectives.algorithms.choice import COPIES_SIGNATURE, on_host_copies
from collectives.algorithms.p2p import Call, post_range, recv_range, wait_sent
from collectives.algorithms.ring import (counts_digest, ring_reduce_scatter, segments,
                                         segments_of_counts)
from collectives.algorithms.shm_copies import CallArrays, OnHostCopies, SlotArrays
from collectives.algorithms.shm_entry import ANNOUNCEMENT_BYTES
from collectives.arrays.adapter import adapter_for, check_reduce_op
from collectives.engine import Engine
from collectives.errors import ProtocolError
from collectives.staging import Staging
from collectives.transport.wire import dtype_itemsize

__all__ = ["reduce", "gather", "scatter", "alltoall"]


def reduce(engine: Engine, x: Any, root: int, op: str, wait: bool, timeout: float | None) -> Any:
    """Reduce every peer's ``x`` into the root's ``x`` (in place); returns ``x``."""
    _check_root(engine, root)
    stage = Staging()
    adapter, flat, dtype = stage.flat(x, written=engine.rank == root)
    check_reduce_op(op, dtype)
    n, r = engine.world_size, engine.rank
    count = adapter.size(flat)
    segs = segments(count, n)
    shifted = segs[-1:] + segs[:-1]   # the ring leaves peer r with segment r + 1: rotated
    copies = _copies(engine, adapter, dtype, count)
    seq = engine.next_seq("shm" if copies else "")
    signature = f"reduce({op},root={root})" + _suffix(copies)
    reduce_op = "sum" if op == "mean" else op
    lo, hi = segs[r]
    size = dtype_itemsize(dtype)
    # On one host every peer reduces its segment of the arrays, the root's in place, the
    # others' in a buffer each then writes into the root's x: only peer j reads segment j of
    # any array, so it writes the root's as soon as it is reduced, every peer at once, with no
    # barrier and no peer reading the others' results one after the other. Through the slots
    # (a small array) the root reduces the whole of every slot itself.
    def move(peers: CallArrays) -> None:
        others = [j for j in range(n) if j != r]
        if isinstance(peers, SlotArrays):   # small: the root reduces every slot (one wait)
            if r == root:
                peers.reduce(reduce_op, flat, 0, 0, count, others,
                             divide_by=n if op == "mean" else 0)
            return
        mine = None if r == root else peers.scratch("segment", hi - lo)
        into, at = (flat, lo) if mine is None else (mine, 0)
        if mine is not None:
            adapter.copy(mine, adapter.slice(flat, lo, hi))
        peers.reduce(reduce_op, into, at, lo, hi, others, divide_by=n if op == "mean" else 0)
        if mine is not None:
            peers.put(root, lo, mine, 0, hi - lo)

    def messages(call: Call) -> None:
        if n == 1:
            return
        buf = flat if r == root else adapter.empty(count, dtype, flat)
        if buf is not flat:
            adapter.copy(buf, flat)
        # (the root's partial sums aside: a call that fails leaves each element of its x as
        # it was or at its result; the others reduce a copy)
        wait_sent(call, ring_reduce_scatter(call, adapter, buf, "sum" if op == "mean" else op,
                                            segs=shifted, divide_by=n if op == "mean" else 0,
                                            aside=buf is flat))
        if r != root:
            wait_sent(call, post_range(call, root, adapter, buf, *segs[r], track=True))
            return
        for src in range(n):
            if src != root:
                for a, b, chunk in recv_range(call, src, adapter, *segs[src]):
                    adapter.copy(adapter.slice(flat, a, b), chunk)

    return _start(engine, seq, signature, dtype, (count,), timeout,
                  # (every peer reads a segment of every x; the others write into the root's)
                  _run(copies, adapter, flat, move, messages, slot_bytes=count * size,
                       target=flat if r == root else None),
                  result=x,
                  adapter=adapter, wait=wait, stage=stage)


def gather(engine: Engine, x: Any, root: int, out: Any, wait: bool,
           timeout: float | None, counts: Any = None) -> Any:
    """Every peer's ``x`` at the root, in rank order: an array of shape (n, *x.shape) (into
    ``out`` if given); None on the other peers. ``counts`` (MPI's Gatherv recvcounts, the
    same on every peer): peer j sends ``counts[j]`` elements (its flat ``x``), and the root
    gets one flat array of their sum, peer j's at the elements after the first j's."""
    _check_root(engine, root)
    stage = Staging()
    adapter, flat, dtype = stage.flat(x, written=False)
    n, r = engine.world_size, engine.rank
    count = adapter.size(flat)
    try:   # (this peer's own part: the others cannot see it)
        sizes, total, signature = _parts(count, counts, n, r, "gather", root)
    except ValueError as exc:
        engine.refuse(exc, f"gather(root={root})")
    at = _offsets(sizes)
    if r == root:
        if out is None:
            out = adapter.empty(total, dtype, flat)
            if counts is None:
                out = out.reshape((n,) + tuple(x.shape))
        out_flat = engine.out_like(adapter, dtype, total, out, "gather",
                                   f"{total} elements from {n} peers", stage)
    copies = _copies(engine, adapter, dtype, count if counts is None else total)
    seq = engine.next_seq("shm" if copies else "")

    def messages(call: Call) -> None:
        if r != root:
            wait_sent(call, post_range(_part(call, count), root, adapter, flat, 0, count,
                                       track=True))
            return
        adapter.copy(adapter.slice(out_flat, at[r], at[r] + count), flat)
        for src in range(n):
            if src != root:
                for a, b, chunk in recv_range(_part(call, sizes[src]), src, adapter, 0,
                                              sizes[src]):
                    adapter.copy(adapter.slice(out_flat, at[src] + a, at[src] + b), chunk)

    def move(peers: CallArrays) -> None:
        if isinstance(peers, SlotArrays):   # small: the root reads every slot
            if r == root:
                for src in range(n):
                    if src != root:
                        peers.copy(src, 0, out_flat, at[src], at[src] + sizes[src])
        elif r != root:   # each peer writes its part into the root's output, all at once
            peers.put(root, at[r], flat, 0, count)
        if r == root:
            adapter.copy(adapter.slice(out_flat, at[r], at[r] + count), flat)

    return _start(engine, seq, signature + _suffix(copies), dtype,
                  (count,) if counts is None else (total,),
                  timeout, _run(copies, adapter, flat, move, messages,
                                # (the others write into the root's output; nobody reads
                                # theirs but through the slots)
                                readers=None if r == root else (),
                                slot_bytes=max(sizes) * dtype_itemsize(dtype),
                                target=out_flat if r == root else None),
                  result=out if r == root else None, adapter=adapter, wait=wait, stage=stage)


def scatter(engine: Engine, x: Any, root: int, out: Any, wait: bool,
            timeout: float | None, counts: Any = None) -> Any:
    """Part r of the root's ``x`` (its first axis cut in n equal parts, or the flat array
    in n equal runs) into peer r's ``out``, returned; the others' ``x`` is not read (None
    will do). ``counts`` (MPI's Scatterv sendcounts, the same on every peer): part j is the
    ``counts[j]`` elements of the root's flat ``x`` after the first j parts, and peer j's
    ``out`` holds that many."""
    _check_root(engine, root)
    if out is None:
        engine.refuse(ValueError(f"rank {engine.rank}: scatter needs out= (this peer's "
                                 f"part)"), f"scatter(root={root})")
    stage = Staging()
    adapter, out_flat, dtype = stage.flat(out)
    n, r = engine.world_size, engine.rank
    count = adapter.size(out_flat)
    try:   # (this peer's out= against the counts, the root's x: the others cannot see them)
        sizes, total, signature = _parts(count, counts, n, r, "scatter", root)
        at = _offsets(sizes)
        if r == root:
            _, flat, x_dtype = stage.flat(x, written=False)
            if x_dtype != dtype or adapter.size(flat) != total:
                raise ValueError(f"rank {r}: scatter from {x_dtype} of {adapter.size(flat)} "
                                 f"elements into parts of {sizes} {dtype} elements (out)")
    except ValueError as exc:
        engine.refuse(exc, f"scatter(root={root})")
    copies = _copies(engine, adapter, dtype, count if counts is None else total)
    seq = engine.next_seq("shm" if copies else "")

    def messages(call: Call) -> None:
        if r != root:
            for a, b, chunk in recv_range(_part(call, count), root, adapter, 0, count):
                adapter.copy(adapter.slice(out_flat, a, b), chunk)
            return
        tickets = [post_range(_part(call, sizes[dst]), dst, adapter,
                              adapter.slice(flat, at[dst], at[dst] + sizes[dst]),
                              0, sizes[dst], track=True) for dst in range(n) if dst != root]
        adapter.copy(out_flat, adapter.slice(flat, at[r], at[r] + count))
        for ticket in tickets:
            wait_sent(call, ticket)

    def move(peers: CallArrays) -> None:
        # (each peer reads its part while the root copies its own: n copies at once, where a
        # broadcast's root has none of its own and writes a share of the others' instead)
        if r != root:
            peers.copy(root, at[r], out_flat, 0, count)
        else:
            adapter.copy(out_flat, adapter.slice(flat, at[r], at[r] + count))

    return _start(engine, seq, signature + _suffix(copies), dtype,
                  (count,) if counts is None else (total,),
                  timeout, _run(copies, adapter, flat if r == root else None, move, messages,
                                readers=None if r == root else (),
                                slot_bytes=total * dtype_itemsize(dtype)),
                  result=out, adapter=adapter, wait=wait, stage=stage)


def _parts(count: int, counts: Any, n: int, r: int, name: str,
           root: int) -> tuple[list[int], int, str]:
    """Every peer's part of a gather or scatter (``name``; this peer's is ``count``, n times
    without ``counts``), their sum, and the call's signature (naming the counts: peers that
    pass others raise a ProtocolError, every one of them); ValueError if ``counts`` is not n
    non-negative integers or does not give this peer ``count`` (the caller refuses the call
    with it: Engine.refuse)."""
    if counts is None:
        return [count] * n, n * count, f"{name}(root={root})"
    sizes = _sizes(segments_of_counts(counts, None, n, r, name))
    if sizes[r] != count:
        raise ValueError(f"rank {r}: {name} with counts {sizes}: this peer's part has {count} "
                         f"elements, not counts[{r}] = {sizes[r]}")
    return sizes, sum(sizes), f"{name}(root={root},counts={counts_digest(sizes)})"


def _part(call: Call, count: int) -> Call:
    """``call`` as one peer's part of it travels: ``count`` elements (the whole call's, where
    every part is the same size)."""
    if call.shape == (count,):
        return call
    return Call(call.transport, call.channel, call.seq, call.signature, call.dtype, (count,),
                call.deadline)


def alltoall(engine: Engine, x: Any, out: Any, wait: bool, timeout: float | None,
             send_counts: Any = None, recv_counts: Any = None) -> Any:
    """Block j of ``x`` (its flat elements cut in n equal blocks) to peer j; ``out`` (like
    x, allocated if None) gets block r of every peer's x, in rank order; returns it.

    ``send_counts`` (MPI's Alltoallv, torch's split sizes): block j is the next
    ``send_counts[j]`` elements of flat ``x``; ``out`` is flat, peer j's block at the next
    ``recv_counts[j]`` elements (without ``recv_counts``, what the peers send; ``out`` is
    then allocated). Every peer's counts reach every other (on one host with the entry, in
    its slot; else one tiny message per pair, at once) and each checks them all, so a pair
    that does not match is a ProtocolError on every peer, naming the pair, before any data
    moves."""
    if send_counts is None and recv_counts is None:
        return _alltoall_equal(engine, x, out, wait, timeout)
    stage = Staging()
    adapter, flat, dtype = stage.flat(x, written=False)
    n, r = engine.world_size, engine.rank
    try:   # (this peer's counts against its own x: the others cannot see them)
        sends = _sizes(segments_of_counts(send_counts, adapter.size(flat), n, r,
                                          "alltoall send"))
        recvs = None if recv_counts is None else \
            _sizes(segments_of_counts(recv_counts, None, n, r, "alltoall recv"))
        if recvs is not None and recvs[r] != sends[r]:
            raise ValueError(f"rank {r}: alltoall sends itself {sends[r]} elements but "
                             f"expects {recvs[r]} from itself (send_counts[{r}] != "
                             f"recv_counts[{r}])")
        if recvs is None and out is not None:
            raise ValueError(f"rank {r}: alltoall with out= needs recv_counts (out's size)")
    except ValueError as exc:
        engine.refuse(exc, "alltoallv")
    if recvs is not None:
        if out is None:
            out = adapter.empty(sum(recvs), dtype, flat)
        out_flat = engine.out_like(adapter, dtype, sum(recvs), out, "alltoall",
                                   f"the sum of recv_counts {recvs}", stage)
    # On one host the blocks are read straight out of the senders' arrays (or their slots),
    # as the equal alltoall's are. Whether the call can is decided before any count is known,
    # so the same on every peer whatever this peer's own counts: from the placement and the
    # dtype alone (an announcement's worth of bytes stands for the sizes).
    copies = on_host_copies(engine.on_host, engine.transport, adapter, dtype, ANNOUNCEMENT_BYTES)
    seq = engine.next_seq("shm" if copies else "")
    signature = "alltoallv" + _suffix(copies)
    # The call's own shape is only compared (its blocks travel as calls of their own): on
    # one host it must hold the arenas' announcement, which travels as its first elements.
    shape = (max(n, -(-ANNOUNCEMENT_BYTES // dtype_itemsize(dtype))) if copies else n,)
    result = [out]
    send_at = _offsets(sends)
    # This peer's row of the count table: what it sends each peer, what it expects of each
    # (-1: what it is sent).
    row = np.array(sends + ([-1] * n if recvs is None else recvs), dtype=np.int64)

    def messages(call: Call, counts: list[int], target: Any) -> None:
        recv_at = _offsets(counts)
        tickets = []
        for k in range(1, n):
            dst = (r + k) % n
            pair = Call(call.transport, call.channel, call.seq, signature, dtype,
                        (sends[dst],), call.deadline)
            tickets.append(post_range(pair, dst, adapter, adapter.slice(
                flat, send_at[dst], send_at[dst] + sends[dst]), 0, sends[dst], track=True))
        adapter.copy(adapter.slice(target, recv_at[r], recv_at[r] + counts[r]),
                     adapter.slice(flat, send_at[r], send_at[r] + sends[r]))
        for k in range(1, n):
            src = (r - k) % n
            pair = Call(call.transport, call.channel, call.seq, signature, dtype,
                        (counts[src],), call.deadline)
            for a, b, chunk in recv_range(pair, src, adapter, 0, counts[src]):
                adapter.copy(adapter.slice(target, recv_at[src] + a, recv_at[src] + b), chunk)
        for ticket in tickets:
            wait_sent(call, ticket)

    def plan(table: np.ndarray) -> tuple[list[int], Any]:
        """What each peer sends this one, and the array it goes into."""
        counts = [int(table[j, 0, r]) for j in range(n)]
        if recvs is None:
            result[0] = adapter.empty(sum(counts), dtype, flat)
        return counts, (out_flat if recvs is not None else result[0])

    def run(call: Call) -> None:
        if copies is None or n == 1:
            rows = _count_rows(call, row) if n > 1 else row.reshape(1, -1)
            messages(call, *plan(_checked_table(call, rows)))
            return

        def move(peers: CallArrays, rows: np.ndarray) -> None:
            table = _checked_table(call, rows)
            counts, target = plan(table)
            recv_at = _offsets(counts)
            for src in range(n):
                if src != r:
                    # This peer's block starts in the sender's array after the blocks it
                    # sends the ranks before this one.
                    peers.copy(src, int(table[src, 0, :r].sum()), target, recv_at[src],
                               recv_at[src] + counts[src])
            adapter.copy(adapter.slice(target, recv_at[r], recv_at[r] + counts[r]),
                         adapter.slice(flat, send_at[r], send_at[r] + sends[r]))
        # On one host the counts travel with the entry (each peer's row in its slot), and
        # the blocks through the slots where every peer's array fits in its slot too, else
        # read out of the senders' arrays.
        copies.exchange(call, adapter, flat, row, move,
                        lambda rows: messages(call, *plan(_checked_table(call, rows))))

    def body() -> Any:
        if n > 1:
            engine.execute(seq, signature, dtype, shape, timeout, engine.peers, run)
        else:
            run(engine.call(seq, signature, dtype, shape))
        adapter.synchronize()
        return result[0]
    return engine.launch(f"{signature} seq {seq}", body, wait, stage)


def _alltoall_equal(engine: Engine, x: Any, out: Any, wait: bool, timeout: float | None) -> Any:
    stage = Staging()
    adapter, flat, dtype = stage.flat(x, written=False)
    n, r = engine.world_size, engine.rank
    total = adapter.size(flat)
    if total % n:
        engine.refuse(ValueError(f"rank {r}: alltoall of {total} elements: not a multiple "
                                 f"of the {n} peers (pass send_counts for unequal blocks)"),
                      "alltoall")
    if out is None:
        out = adapter.empty(total, dtype, flat).reshape(tuple(x.shape))
    out_flat = engine.out_like(adapter, dtype, total, out, "alltoall", f"{total} elements",
                               stage)
    count = total // n
    copies = _copies(engine, adapter, dtype, count)
    seq = engine.next_seq("shm" if copies else "")

    def block(a: Any, j: int) -> Any:
        return adapter.slice(a, j * count, (j + 1) * count)

    def move(peers: CallArrays) -> None:
        for src in range(n):
            if src != r:
                peers.copy(src, r * count, out_flat, src * count, (src + 1) * count)
        adapter.copy(block(out_flat, r), block(flat, r))

    def messages(call: Call) -> None:
        tickets = [post_range(call, (r + k) % n, adapter, block(flat, (r + k) % n), 0, count,
                              track=True) for k in range(1, n)]
        adapter.copy(block(out_flat, r), block(flat, r))
        for k in range(1, n):
            src = (r - k) % n
            for a, b, chunk in recv_range(call, src, adapter, 0, count):
                adapter.copy(adapter.slice(out_flat, src * count + a, src * count + b), chunk)
        for ticket in tickets:
            wait_sent(call, ticket)

    return _start(engine, seq, "alltoall" + _suffix(copies), dtype, (count,), timeout,
                  _run(copies, adapter, flat, move, messages,
                       slot_bytes=total * dtype_itemsize(dtype)), result=out, adapter=adapter,
                  wait=wait, stage=stage)


def _sizes(segs: list[tuple[int, int]]) -> list[int]:
    return [b - a for a, b in segs]


def _offsets(counts: list[int]) -> list[int]:
    return [a for a, _ in segments_of_counts(counts, None, len(counts), 0, "alltoall")]


def _count_rows(call: Call, row: np.ndarray) -> np.ndarray:
    """Every peer's ``row`` of the count table (``2n`` int64: what it sends each peer, then
    what it expects of each, -1 for what it is sent), by rank: each travels to every other
    peer, one tiny message per pair, at once (the peers that cannot share them through the
    on-host entry)."""
    t = call.transport
    n, r = t.world_size, t.rank
    width = 2 * n
    rows = np.zeros(n * width, dtype=np.int64)
    rows[r * width:(r + 1) * width] = row
    counts_call = Call(t, call.channel, call.seq, call.signature + "[counts]", "int64",
                       (n * width,), call.deadline)
    direct_allgather(counts_call, adapter_for(rows), rows,
                     [(i * width, (i + 1) * width) for i in range(n)])
    return rows.reshape(n, width)


def _checked_table(call: Call, rows: np.ndarray) -> np.ndarray:
    """The count table of every peer's row, ``table[i, 0, j]`` elements rank i sends rank j,
    ``table[i, 1, j]`` what rank i expects from j (-1: what it is sent). Every peer checks the
    whole table, so counts that do not pair are the same ProtocolError on every peer, naming
    the pair, before any data moves."""
    n = rows.shape[0]
    table = rows.reshape(n, 2, n)
    bad = [f"rank {i} sends {table[i, 0, j]} elements to rank {j}, which expects "
           f"{table[j, 1, i]}" for i in range(n) for j in range(n)
           if 0 <= table[j, 1, i] != table[i, 0, j]]
    if bad:
        raise ProtocolError(f"rank {call.transport.rank}: {call.signature} at sequence "
                            f"{call.seq}: the peers' counts do not pair: {'; '.join(bad)}")
    return table


def _start(engine: Engine, seq: int, signature: str, dtype: str, shape: tuple,
           timeout: float | None, run: Any, *, result: Any, adapter: Any, wait: bool,
           stage: Staging) -> Any:
    """Run ``run`` as operation ``seq`` (alone when there is no other peer) and return
    ``result``, now or as a Work."""
    def body() -> Any:
        if engine.world_size > 1:
            engine.execute(seq, signature, dtype, shape, timeout, engine.peers, run)
        else:
            run(engine.call(seq, signature, dtype, shape))
        adapter.synchronize()
        return result
    return engine.launch(f"{signature} seq {seq}", body, wait, stage)


def _copies(engine: Engine, adapter: Any, dtype: str, count: int) -> OnHostCopies | None:
    """The on-host copies a call of ``count`` elements per peer runs as (choice.py), or None."""
    return on_host_copies(engine.on_host, engine.transport, adapter, dtype,
                          count * dtype_itemsize(dtype))


def _suffix(copies: OnHostCopies | None) -> str:
    return COPIES_SIGNATURE if copies is not None else ""


def _run(copies: OnHostCopies | None, adapter: Any, read: Any, move: Any, messages: Any,
         readers: Any = None, *, slot_bytes: int, target: Any = None) -> Any:
    """The call's body: ``move`` as on-host copies of ``read`` (with the peers that read or
    write this peer's arrays, ``readers``, and ``target``, the array the others write into;
    through the slots when the most any peer announces, ``slot_bytes``, fits:
    shm_copies.py), else (and where some peer cannot read the others) ``messages``, its
    ZeroMQ algorithm."""
    if copies is None:
        return messages

    def run(call: Call) -> None:
        copies(call, adapter, read, move, lambda: messages(call), readers,
               slot_bytes=slot_bytes, target=target)
    return run


def _check_root(engine: Engine, root: int) -> None:
    if not 0 <= root < engine.world_size:
        raise ValueError(f"rank {engine.rank}: root {root} is outside world size "
                         f"{engine.world_size}")
