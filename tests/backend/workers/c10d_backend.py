"""Run under torchrun: the "gossip" torch.distributed backend's collectives, checked against
what c10d documents, then DDP against the same training done by hand. Prints "OK <what>" per
check; any mismatch raises (non-zero exit)."""
import copy
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import gossip  # noqa: F401  (torch imported first: gossip registers its backend)


def say(*parts) -> None:
    """One write per line: the ranks share torchrun's stdout, and print() writes the text
    and its newline apart, so lines of two ranks could run into each other."""
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


def main() -> None:
    dist.init_process_group("gossip")
    r, n = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "gossip", dist.get_backend()
    say("OK init", n)

    t = torch.full((5,), float(r + 1))
    dist.all_reduce(t)
    assert t.tolist() == [n * (n + 1) / 2] * 5, t
    for op, want in ((dist.ReduceOp.MAX, n), (dist.ReduceOp.MIN, 1),
                     (dist.ReduceOp.PRODUCT, float(torch.arange(1, n + 1).prod())),
                     (dist.ReduceOp.AVG, (n + 1) / 2)):
        t = torch.full((3,), float(r + 1))
        dist.all_reduce(t, op=op)
        assert t.tolist() == [want] * 3, (op, t)
    x = torch.arange(12.0).reshape(3, 4).t() * (r + 1)   # not contiguous: copied and back
    dist.all_reduce(x)
    assert torch.equal(x, torch.arange(12.0).reshape(3, 4).t() * n * (n + 1) / 2), x
    say("OK all_reduce")

    t = torch.full((3,), float(r))
    dist.broadcast(t, src=n - 1)
    assert t.tolist() == [n - 1.0] * 3, t
    say("OK broadcast")

    outs = [torch.empty(2, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(outs, torch.full((2,), r, dtype=torch.int64))
    assert [o.tolist() for o in outs] == [[k, k] for k in range(n)], outs
    flat = torch.empty(2 * n)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(r)))
    assert flat.tolist() == [float(k) for k in range(n) for _ in range(2)], flat
    # Uneven sizes, as torch's all_gather takes them: rank k sends k + 1 values in a (k+1, 1).
    uneven = [torch.empty(k + 1, 1) for k in range(n)]
    dist.all_gather(uneven, torch.full((r + 1, 1), float(r)))
    assert [o.reshape(-1).tolist() for o in uneven] == [[float(k)] * (k + 1)
                                                        for k in range(n)], uneven
    objects = [None] * n
    dist.all_gather_object(objects, {"rank": r, "text": "x" * r})
    assert objects == [{"rank": k, "text": "x" * k} for k in range(n)], objects
    say("OK all_gather")

    out = torch.empty(2)
    dist.reduce_scatter(out, [torch.full((2,), float(r * 10 + i)) for i in range(n)])
    assert out.tolist() == [float(sum(k * 10 + r for k in range(n)))] * 2, out
    inp = torch.arange(2.0 * n) + r
    keep = inp.clone()
    dist.reduce_scatter_tensor(out, inp)
    assert torch.equal(inp, keep), "reduce_scatter_tensor changed its input"
    want = sum(torch.arange(2.0 * n) + k for k in range(n))[2 * r:2 * r + 2]
    assert torch.equal(out, want), (out, want)
    say("OK reduce_scatter")

    for root in range(n):
        t = torch.arange(4.0) * (r + 1)
        dist.reduce(t, dst=root)
        if r == root:
            assert torch.equal(t, torch.arange(4.0) * n * (n + 1) / 2), t
        got = [torch.empty(2) for _ in range(n)] if r == root else None
        dist.gather(torch.full((2,), float(r)), got, dst=root)
        if r == root:
            assert [g.tolist() for g in got] == [[float(k)] * 2 for k in range(n)], got
        part = torch.empty(3)
        dist.scatter(part, [torch.full((3,), float(k)) for k in range(n)] if r == root
                     else None, src=root)
        assert part.tolist() == [float(r)] * 3, part
    say("OK reduce_gather_scatter")

    outs = [torch.empty(2) for _ in range(n)]
    dist.all_to_all(outs, [torch.full((2,), float(10 * r + j)) for j in range(n)])
    assert [o.tolist() for o in outs] == [[float(10 * k + r)] * 2 for k in range(n)], outs
    single = torch.empty(2 * n)
    dist.all_to_all_single(single, torch.arange(2.0 * n) + 100 * r)
    want = torch.cat([torch.arange(2.0 * r, 2.0 * r + 2) + 100 * k for k in range(n)])
    assert torch.equal(single, want), (single, want)
    # Uneven splits (torch's documented example's shape): rank r sends (2r + j) % 3 + 1 rows
    # of 2 to rank j; rows hold 100 * sender + 10 * receiver + their index.
    def rows(src: int, dst: int) -> torch.Tensor:
        k = (2 * src + dst) % 3 + 1
        return (100.0 * src + 10.0 * dst + torch.arange(k, dtype=torch.float32))[:, None] \
            .expand(k, 2)
    in_splits = [(2 * r + j) % 3 + 1 for j in range(n)]
    out_splits = [(2 * j + r) % 3 + 1 for j in range(n)]
    x = torch.cat([rows(r, j) for j in range(n)])
    single = torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(single, x, output_split_sizes=out_splits,
                           input_split_sizes=in_splits)
    assert torch.equal(single, torch.cat([rows(j, r) for j in range(n)])), single
    outs = [torch.empty(r + 1) for _ in range(n)]             # rank j sends rank r r + 1
    dist.all_to_all(outs, [torch.full((j + 1,), float(10 * r + j)) for j in range(n)])
    assert [o.tolist() for o in outs] == [[float(10 * k + r)] * (r + 1) for k in range(n)]
    say("OK all_to_all")

    out = torch.empty(r + 1)                                   # reduce_scatter_v
    dist.reduce_scatter(out, [torch.full((j + 1,), float(r * 10 + j)) for j in range(n)])
    assert out.tolist() == [float(sum(k * 10 + r for k in range(n)))] * (r + 1), out
    say("OK reduce_scatter_v")

    works = [dist.all_reduce(torch.full((4,), float(i)), async_op=True) for i in range(3)]
    for i, w in enumerate(works):
        assert w.wait()
        assert w.is_completed()
        assert w.get_future().value()[0].tolist() == [float(i * n)] * 4
    work = dist.all_reduce(torch.ones(2), async_op=True)
    work.wait()
    assert [t.tolist() for t in work.result()] == [[float(n)] * 2], work.result()
    # An async barrier returns at once (MPI's Ibarrier): rank 0 sends while it is pending.
    if r == 0:
        pending = dist.barrier(async_op=True)
        dist.send(torch.ones(2), 1)
        pending.wait()
    else:
        if r == 1:
            dist.recv(torch.empty(2), 0)
        dist.barrier()
    say("OK async")

    if r == 0:
        dist.send(torch.tensor([42.0, float(r)]), 1)
        back = torch.empty(2)
        dist.recv(back, 1)
        assert back.tolist() == [43.0, 1.0], back
    elif r == 1:
        got = torch.empty(2)
        dist.recv(got, 0)
        assert got.tolist() == [42.0, 0.0], got
        dist.send(got + torch.tensor([1.0, 1.0]), 0)
    dist.barrier()
    say("OK send_recv")

    # torch's test_send_recv_with_tag: every rank sends every other with its rank as the tag,
    # and receives from each in rank order, by tag.
    for dst in range(n):
        if dst == r:
            for src in range(n):
                if src != r:
                    got = torch.full((10,), -1.0)
                    dist.recv(got, src, tag=src)
                    assert got.eq(src).all(), (src, got)
        else:
            dist.send(torch.full((10,), float(r)), dst, tag=r)
    # Tags out of order (Gloo's and MPI's matching): rank 0 sends tag 5 then tag 7; rank 1
    # receives tag 7 first. Then torch's test_send_recv_any_source: each rank receives from
    # any source, n - 1 times, and learns who sent.
    if r == 0:
        first = dist.isend(torch.full((2,), 5.0), 1, tag=5)
        second = dist.isend(torch.full((2,), 7.0), 1, tag=7)
        first.wait()
        second.wait()
    elif r == 1:
        late, early = torch.empty(2), torch.empty(2)
        dist.recv(late, 0, tag=7)
        dist.recv(early, 0, tag=5)
        assert late.tolist() == [7.0, 7.0] and early.tolist() == [5.0, 5.0], (late, early)
    for dst in range(n):
        if dst != r:
            dist.send(torch.tensor([float(r)]), dst, tag=3)
    senders = set()
    for _ in range(n - 1):
        got = torch.empty(1)
        sender = dist.recv(got, tag=3)
        assert got.item() == float(sender), (got, sender)
        senders.add(sender)
    assert senders == set(range(n)) - {r}, senders
    dist.barrier()
    say("OK tags")

    bits = torch.tensor([1 << r, 0b111, 1 << r], dtype=torch.int64)
    for op, want in ((dist.ReduceOp.BOR, [(1 << n) - 1, 7, (1 << n) - 1]),
                     (dist.ReduceOp.BAND, [0 if n > 1 else 1, 7, 0 if n > 1 else 1]),
                     (dist.ReduceOp.BXOR, [(1 << n) - 1, 7 if n % 2 else 0, (1 << n) - 1])):
        t = bits.clone()
        dist.all_reduce(t, op=op)
        assert t.tolist() == want, (op, t, want)
    try:
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)
    except TypeError as exc:
        assert "bitwise" in str(exc), exc
    else:
        raise AssertionError("BAND of floats was not refused")
    try:
        dist.all_reduce(torch.ones(2).to_sparse())
    except ValueError as exc:
        assert "dense tensors" in str(exc), exc
    else:
        raise AssertionError("a sparse tensor was not refused")
    # Unsigned types wider than 8 bits: torch cannot add them; reduced through numpy.
    wide = torch.from_numpy(np.array([r + 1, 65535 - n], dtype=np.uint16))
    dist.all_reduce(wide)
    assert wide.numpy().tolist() == [n * (n + 1) // 2, (n * (65535 - n)) % 65536], wide
    # A check of one rank's own tensors fails the call on every rank, and they stay in step.
    try:
        dist.all_gather([torch.empty(2) for _ in range(n)], torch.ones(2 + (r == 0)))
    except Exception as exc:
        assert "rank 0" in str(exc), exc
        # The other ranks' ProtocolError is a RuntimeError too (torch's callers catch those).
        assert r == 0 or isinstance(exc, RuntimeError), type(exc).__mro__
    else:
        raise AssertionError("a mismatched all_gather did not fail")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == n
    say("OK refused")

    group = dist.new_group(list(range(n)))
    t = torch.ones(2)
    dist.all_reduce(t, group=group)
    assert t.tolist() == [float(n)] * 2
    # torch names groups (destroy_process_group, functional collectives look them up).
    assert dist.group.WORLD.group_name and group.group_name != dist.group.WORLD.group_name
    import torch.distributed._functional_collectives as funcol
    summed = funcol.all_reduce(torch.ones(2) * (r + 1), "sum", dist.group.WORLD)
    assert summed.tolist() == [n * (n + 1) / 2] * 2, summed
    pair = dist.new_group([0, 1])
    if r in (0, 1):
        t = torch.ones(1)
        dist.all_reduce(t, group=pair)
        assert t.item() == 2
        dist.destroy_process_group(pair)
    say("OK new_group")

    # A future's callback that starts a collective and waits for it (PowerSGD's hook does):
    # futures complete off the thread that runs the collectives, or this waits forever.
    y = torch.ones(2)
    chained = dist.all_reduce(torch.ones(2), async_op=True).get_future().then(
        lambda _: dist.all_reduce(y, async_op=True).get_future().wait()[0])
    assert chained.wait().tolist() == [float(n)] * 2
    say("OK then_collective")

    # DDP: every rank trains on its own batches; the replicas must equal the same steps
    # taken by hand with the ranks' mean gradient (every rank's data is known from its seed).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    reference = copy.deepcopy(model)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    batches = {k: [torch.randn(16, 6, generator=torch.Generator().manual_seed(100 * k + s))
                   for s in range(4)] for k in range(n)}
    for s in range(4):
        opt.zero_grad()
        ddp(batches[r][s]).pow(2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        (sum(reference(batches[k][s]).pow(2).mean() for k in range(n)) / n).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-6), (p - q).abs().max()
    say("OK ddp")

    if os.environ.get("C10D_VICTIM") == str(r):
        os._exit(0)   # gone without a word: the others' next collective names it
    if "C10D_VICTIM" in os.environ:
        try:
            dist.all_reduce(torch.ones(1 << 16))
        except gossip.PeerLost as exc:
            # ...and a DistBackendError (a RuntimeError), as torch's backends raise theirs.
            assert isinstance(exc, dist.DistBackendError), type(exc).__mro__
            say("OK peer_lost", type(exc).__name__, exc)
        else:
            raise AssertionError("the lost rank went unnoticed")
    dist.destroy_process_group()
    say("OK destroyed")


if __name__ == "__main__":
    main()
