"""Benchmarks of the collectives, reported like nccl-tests, with Gloo and plain pyzmq measured
in the same run for comparison. ``gossip bench`` is the command line; everything here is usable
from Python:

    from gossip.bench import run_bench, format_table
    rows = run_bench("allreduce", 4, ["4K", "64M"], vs_gloo=True)
    print(format_table(rows))

Method (as the baseline scripts in shared/bench/, and nccl-tests):

* every peer is a real process on this host (gossip.testing.spawn, loopback);
* each iteration is ``barrier(); t0; op; t1``; the iteration's time is the slowest rank's
  (``p2p``: the receiver's, timed from the barrier); the figure reported is the median of the
  timed iterations (min and max are kept too), after ``warmup`` untimed iterations;
* ``algbw = bytes / time`` (GB = 1e9 bytes), and ``busbw`` by the nccl-tests conventions:
  allreduce ``algbw * 2(n-1)/n``; allgather: ``bytes`` is each peer's *input*, algbw is
  computed on the gathered output (``n * bytes / time``, nccl-tests' size) and
  ``busbw = algbw * (n-1)/n``, i.e. what each peer receives per second; broadcast, neighbor
  and p2p ``busbw = algbw``;
* ``neighbor`` is one ``peer.neighbor_allreduce`` round on a ring (self 1/3, each of the two
  ring neighbours 1/3: the D-PSGD step); with n = 2 both neighbours are the same peer, which
  then weighs 2/3 and is sent to once.

torch is imported only by the Gloo comparison (in its own processes), never by ``gossip``.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import re
import statistics
import tempfile
import time
import traceback
from multiprocessing.connection import wait as wait_any
from typing import Any, Callable, Iterable, Sequence

__all__ = ["OPS", "REDUCE_OPS", "ALGORITHMS", "DEFAULT_SIZES", "BenchError",
           "parse_size", "parse_sizes", "supported_transports", "format_size", "default_iters",
           "busbw_factor", "check_args", "run_bench", "format_table", "header_line", "run_p2p",
           "run_pyzmq_p2p", "summarize", "stream_count"]

OPS = ("allreduce", "allgather", "broadcast", "neighbor", "p2p")
REDUCE_OPS = ("sum", "mean", "max", "min", "prod")
ALGORITHMS = ("auto", "ring", "recursive-doubling")
BASELINES = ("gloo",)
DEFAULT_SIZES = ("4K", "256K", "4M", "64M")
ITEMSIZE = 4  # float32

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


class BenchError(RuntimeError):
    """A benchmark run failed (a process died, timed out or computed a wrong result)."""


# ---------------------------------------------------------------------------- arguments
def parse_size(text: str | int) -> int:
    """'4K' -> 4096, '64M' -> 67108864, '1000' -> 1000 (K/M/G are powers of 1024), rounded
    down to a whole number of float32 elements."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _SIZE_RE.match(str(text))
        unit = m.group(2).upper() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(f"bad size {str(text)!r}: give bytes or a K/M/G suffix (powers of "
                             "1024), e.g. 4K,256K,4M,64M")
        value = int(float(m.group(1)) * _UNITS[unit])
    value -= value % ITEMSIZE
    if value < ITEMSIZE:
        raise ValueError(f"bad size {str(text)!r}: must be at least {ITEMSIZE} bytes "
                         "(one float32)")
    return value


def parse_sizes(spec: str | int | Iterable[str | int]) -> list[int]:
    """'4K,256K' (commas or spaces) or a list of sizes -> bytes."""
    if isinstance(spec, (str, int)):
        items = [s for s in re.split(r"[,\s]+", str(spec)) if s]
    else:
        items = list(spec)
    if not items:
        raise ValueError("no sizes given (e.g. --sizes 4K,256K,4M,64M)")
    return [parse_size(s) for s in items]


def format_size(nbytes: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= f and nbytes % f == 0:
            return f"{nbytes // f} {unit}"
    return f"{nbytes} B"


def default_iters(nbytes: int) -> int:
    """Timed iterations per size, as the baseline: 50 up to 256 KiB, 20 up to 4 MiB, then 10."""
    if nbytes <= 256 * 1024:
        return 50
    if nbytes <= 4 * 1024 * 1024:
        return 20
    return 10


def busbw_factor(op: str, n: int) -> float:
    """busbw = algbw * factor (nccl-tests); allgather's algbw is on the gathered output."""
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op == "allgather":
        return (n - 1) / n
    return 1.0


def _algbw_bytes(op: str, n: int, nbytes: int) -> int:
    return n * nbytes if op == "allgather" else nbytes


def check_args(op: str, n: int, transport: str = "auto", vs: Sequence[str] = (),
               reduce_op: str = "sum", algorithm: str = "auto", iters: int | None = None,
               warmup: int = 3) -> None:
    """Raise ValueError (one line) for arguments run_bench would refuse."""
    if op not in OPS:
        raise ValueError(f"unknown operation {op!r}; choose one of {', '.join(OPS)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of peers must be at least 1, got {n!r}")
    if op == "p2p" and n != 2:
        raise ValueError(f"p2p measures rank 0 -> rank 1 and needs exactly 2 peers (-n 2), "
                         f"got {n}")
    if transport not in supported_transports():
        raise ValueError(f"unknown transport {transport!r}; choose one of "
                         f"{', '.join(supported_transports())}")
    for v in vs:
        if v not in BASELINES:
            raise ValueError(f"unknown comparison {v!r}; choose one of {', '.join(BASELINES)}")
    if reduce_op not in REDUCE_OPS:
        raise ValueError(f"unknown reduce op {reduce_op!r}; choose one of {', '.join(REDUCE_OPS)}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of "
                         f"{', '.join(ALGORITHMS)}")
    if iters is not None and iters < 1:
        raise ValueError(f"iters must be at least 1, got {iters}")
    if warmup < 0:
        raise ValueError(f"warmup must be at least 0, got {warmup}")


def supported_transports() -> tuple[str, ...]:
    """The transports this build of collectives accepts (auto, tcp, ipc, and shm where the
    shared-memory transport exists)."""
    from collectives.config import TransportConfig

    found = []
    for name in ("auto", "tcp", "ipc", "shm"):
        try:
            TransportConfig(transport=name)
        except ValueError:
            continue
        found.append(name)
    return tuple(found)


def _plan(sizes: Sequence[int], iters: int | None, warmup: int) -> list[tuple[int, int, int]]:
    return [(nbytes, warmup, iters if iters else default_iters(nbytes)) for nbytes in sizes]


def stream_count(stream, nbytes: int) -> int:
    """Messages per iteration: ``stream`` is an int, a dict {nbytes: k}, or a callable."""
    if callable(stream):
        return int(stream(nbytes))
    if isinstance(stream, dict):
        return int(stream.get(nbytes, 1))
    return int(stream)


def _deadline_for(plan, n: int, streamed=1) -> float:
    """A generous wall limit for one spawn: start-up plus a 50 MB/s floor on every iteration."""
    total = 60.0
    for nbytes, warmup, iters in plan:
        per_iter = 0.05 + nbytes * max(n, 2) / 5e7
        total += (warmup + iters) * stream_count(streamed, nbytes) * per_iter
    return total


# ---------------------------------------------------------------------------- statistics
def summarize(times: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(times), min(times), max(times)


def _slowest(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Iteration i's time is the slowest rank's."""
    return [max(vals) for vals in zip(*per_rank)]


def _figures(op: str, n: int, nbytes: int, times: Sequence[float]) -> dict:
    med, lo, hi = summarize(times)
    algbw = _algbw_bytes(op, n, nbytes) / med / 1e9 if med > 0 else float("inf")
    return {"seconds_median": med, "seconds_min": lo, "seconds_max": hi,
            "algbw_GBps": algbw, "busbw_GBps": algbw * busbw_factor(op, n)}


# ---------------------------------------------------------------------------- gossip peers
def _expected_allreduce(reduce_op: str, n: int) -> float:
    # Rank r contributes r + 1.
    return {"sum": n * (n + 1) / 2, "mean": (n + 1) / 2, "max": float(n), "min": 1.0,
            "prod": float(math.factorial(n))}[reduce_op]


def _ring_weights(rank: int, n: int) -> tuple[float, dict[int, float], list[int]]:
    """Self 1/3 and 1/3 for each ring neighbour (n = 2: one neighbour at 2/3; n = 1: alone)."""
    if n == 1:
        return 1.0, {}, []
    left, right = (rank - 1) % n, (rank + 1) % n
    src: dict[int, float] = {}
    for j in (left, right):
        src[j] = src.get(j, 0.0) + 1.0 / 3.0
    return 1.0 / 3.0, src, sorted(src)


def _gossip_step(peer, op: str, count: int, reduce_op: str, algorithm: str,
                 stream: int) -> Callable[[], Any]:
    """Set up one size: check the result once, then return the callable that is timed."""
    import numpy as np

    n, r = peer.world_size, peer.rank
    if op == "allreduce":
        x = np.full(count, r + 1, dtype=np.float32)
        peer.allreduce(x, reduce_op, algorithm=algorithm)
        want = _expected_allreduce(reduce_op, n)
        if not (np.allclose(x[[0, -1]], want) and np.allclose(x[count // 2], want)):
            raise AssertionError(f"rank {r}: allreduce({reduce_op}) gave {x[0]}, expected {want}")
        x[:] = 1.0 if reduce_op == "prod" else 0.0  # values stay finite over the iterations
        return lambda: peer.allreduce(x, reduce_op, algorithm=algorithm)
    if op == "allgather":
        x = np.full(count, r, dtype=np.float32)
        out = np.empty((n, count), dtype=np.float32)
        peer.allgather(x, out=out)
        if not np.array_equal(out[:, -1], np.arange(n, dtype=np.float32)):
            raise AssertionError(f"rank {r}: allgather gave {out[:, -1]}")
        return lambda: peer.allgather(x, out=out)
    if op == "broadcast":
        x = np.full(count, r + 1, dtype=np.float32)
        peer.broadcast(x, 0)
        if not (x[0] == 1 and x[-1] == 1):
            raise AssertionError(f"rank {r}: broadcast gave {x[0]}, expected 1")
        return lambda: peer.broadcast(x, 0)
    if op == "neighbor":
        self_w, src_w, dst = _ring_weights(r, n)
        x = np.full(count, r, dtype=np.float32)
        scratch = np.empty_like(x)
        peer.neighbor_allreduce(x, self_w, src_w, dst, scratch=scratch)
        want = self_w * r + sum(w * j for j, w in src_w.items())
        if not np.allclose(x[[0, -1]], want, rtol=1e-5, atol=1e-5):
            raise AssertionError(f"rank {r}: neighbor_allreduce gave {x[0]}, expected {want}")
        x[:] = np.random.default_rng(r).random(count, dtype=np.float32)
        return lambda: peer.neighbor_allreduce(x, self_w, src_w, dst, scratch=scratch)
    if op == "p2p":
        x = np.arange(count, dtype=np.float32)
        if r == 0:
            peer.send(1, x)

            def send() -> None:
                for _ in range(stream):
                    peer.send(1, x)
            return send
        y = peer.recv(0)
        if y.shape != x.shape or y[-1] != x[-1]:
            raise AssertionError(f"rank 1: recv gave {y.shape} ending {y[-1]}")

        # As the API intends: an array that travels whole (up to whole_message_bytes) comes
        # back without a copy; a larger one is received chunk by chunk into the same array
        # every time, as a training loop receives parameters, so no fresh buffer is faulted in.
        whole = x.nbytes <= peer.transport.config.whole_message_bytes
        reuse = None if whole else y

        def recv() -> None:
            for _ in range(stream):
                peer.recv(0, out=reuse)
        return recv
    raise ValueError(f"unknown operation {op!r}")


def _gossip_worker(peer, op: str, plan, reduce_op: str, algorithm: str,
                   stream=1) -> dict:
    """Runs in every peer: the per-iteration durations of each size, on this rank."""
    out = {}
    for nbytes, warmup, iters in plan:
        k = stream_count(stream, nbytes)
        step = _gossip_step(peer, op, nbytes // ITEMSIZE, reduce_op, algorithm, k)
        times = []
        for i in range(warmup + iters):
            peer.barrier()
            t0 = time.perf_counter()
            step()
            dt = time.perf_counter() - t0
            if i >= warmup:
                times.append(dt / k)
        out[nbytes] = times
    peer.barrier()
    addresses = {j: peer.transport.address(j) for j in range(peer.world_size) if j != peer.rank}
    shm = bool(peer.stats().get("endpoints", {}).get("shm"))
    return {"times": out, "addresses": addresses, "shm": shm}


def _scheme(result: dict, transport: str) -> str:
    """What the peers used: tcp / ipc, or shm when payloads go through shared memory (the
    ZeroMQ connection, then ipc, carries only control messages)."""
    kinds = sorted({str(a).split("://", 1)[0] for a in result["addresses"].values()})
    if result.get("shm") and transport in ("auto", "shm"):
        kinds = ["shm" if k == "ipc" else k for k in kinds]
    return "+".join(kinds) if kinds else "none"


def _run_gossip(op: str, n: int, plan, *, transport: str, key: str | None, reduce_op: str,
                algorithm: str, timeout: float | None, stream=1) -> tuple[dict, str]:
    """Spawn n peers; returns ({nbytes: per-iteration times}, the transport the peers used)."""
    from gossip.testing import spawn

    limit = timeout if timeout else _deadline_for(plan, n, stream)
    init = {"transport": transport}
    if key:
        init["key"] = key
    results = spawn(_gossip_worker, n, timeout=limit,
                    args=(op, plan, reduce_op, algorithm, stream), **init)
    used = _scheme(results[0], transport) if n > 1 else "none"
    times = {}
    for nbytes, _, _ in plan:
        if op == "p2p":
            times[nbytes] = results[1]["times"][nbytes]  # the receiver's clock
        else:
            times[nbytes] = _slowest([res["times"][nbytes] for res in results])
    return times, used


# ---------------------------------------------------------------------------- helper processes
def _child_main(target, rank: int, args: tuple, conn) -> None:
    try:
        result = target(rank, *args)
        conn.send(("ok", result))
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except Exception:
            pass
    finally:
        conn.close()


def _run_processes(name: str, target, n: int, args: tuple, timeout: float) -> list[Any]:
    """Run target(rank, *args) in n fresh (spawned) processes with a deadline; kill stragglers.
    Returns each rank's result or raises BenchError with the failing rank's traceback."""
    ctx = mp.get_context("spawn")
    procs, conns = [], {}
    results: list[Any] = [None] * n
    done: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        for rank in range(n):
            recv_end, send_end = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child_main, args=(target, rank, args, send_end),
                            name=f"bench-{name}-{rank}", daemon=True)
            p.start()
            send_end.close()
            procs.append(p)
            conns[recv_end] = rank
        while len(done) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"{name}: ranks {sorted(set(range(n)) - done)} did not finish "
                                 f"within {timeout:.0f}s")
            ready = wait_any(list(conns) + [p.sentinel for i, p in enumerate(procs)
                                            if i not in done], timeout=left)
            for obj in ready:
                if obj in conns:
                    rank = conns.pop(obj)
                    try:
                        kind, value = obj.recv()
                    except (EOFError, OSError):
                        kind, value = "error", "exited without a result"
                    if kind != "ok":
                        raise BenchError(f"{name}: rank {rank} failed:\n{value}")
                    results[rank] = value
                    done.add(rank)
                else:
                    rank = next(i for i, p in enumerate(procs) if p.sentinel == obj)
                    conn = next((c for c, rr in conns.items() if rr == rank), None)
                    if conn is not None and conn.poll(0.5):
                        continue  # its result is in the pipe; read it on the next pass
                    if rank not in done:
                        raise BenchError(f"{name}: rank {rank} died (exit code "
                                         f"{procs[rank].exitcode})")
        return results
    finally:
        for p in procs:  # stragglers, by PID
            p.join(2.0 if p.is_alive() and len(done) == n else 0)
            if p.is_alive():
                p.kill()
                p.join(5)
        for c in conns:
            c.close()


# ---------------------------------------------------------------------------- Gloo
def _gloo_worker(rank: int, n: int, port: int, op: str, plan, reduce_op: str, threads: int,
                 timeout: float) -> dict:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n, timeout=timedelta(seconds=timeout))
    red = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
           "min": dist.ReduceOp.MIN, "prod": dist.ReduceOp.PRODUCT}[reduce_op]
    out: dict[int, list[float]] = {}
    try:
        for nbytes, warmup, iters in plan:
            count = nbytes // ITEMSIZE
            if op == "allreduce":
                x = torch.full((count,), float(rank + 1))

                def step() -> None:
                    dist.all_reduce(x, op=red)
                    if reduce_op == "mean":
                        x.div_(n)
                step()
                want = _expected_allreduce(reduce_op, n)
                assert abs(float(x[-1]) - want) <= 1e-5 * abs(want), (float(x[-1]), want)
                x.fill_(1.0 if reduce_op == "prod" else 0.0)
            elif op == "allgather":
                x = torch.full((count,), float(rank))
                gathered = torch.empty(n * count)
                gather_one = (getattr(dist, "all_gather_single", None)  # torch >= 2.13
                              or getattr(dist, "all_gather_into_tensor", None))
                if gather_one is not None:
                    def step() -> None:
                        gather_one(gathered, x)
                else:  # pragma: no cover - old torch
                    parts = list(gathered.view(n, count))

                    def step() -> None:
                        dist.all_gather(parts, x)
                step()
                assert float(gathered[-1]) == n - 1
            elif op == "broadcast":
                x = torch.full((count,), float(rank + 1))

                def step() -> None:
                    dist.broadcast(x, 0)
                step()
                assert float(x[-1]) == 1.0
            elif op == "neighbor":
                # What a user writes with torch.distributed (bench_gossip_torch.py): isend to
                # both ring neighbours, irecv from both, wait, average. n = 2 sends twice.
                left, right = (rank - 1) % n, (rank + 1) % n
                state = {"x": torch.full((count,), float(rank))}
                xl, xr = torch.empty(count), torch.empty(count)

                def step() -> None:
                    x = state["x"]
                    if n == 1:
                        return
                    reqs = [dist.isend(x, left, tag=0), dist.isend(x, right, tag=1),
                            dist.irecv(xr, right, tag=0), dist.irecv(xl, left, tag=1)]
                    for q in reqs:
                        q.wait()
                    state["x"] = (xl + x + xr) / 3
                step()
                want = (left + rank + right) / 3 if n > 1 else rank
                assert abs(float(state["x"][-1]) - want) < 1e-5, (float(state["x"][-1]), want)
                state["x"] = torch.rand(count)
            elif op == "p2p":
                x = torch.arange(count, dtype=torch.float32)
                y = torch.empty(count)

                def step() -> None:
                    if rank == 0:
                        dist.send(x, 1)
                    else:
                        dist.recv(y, 0)
                step()
                assert rank == 0 or float(y[-1]) == count - 1
            else:
                raise ValueError(op)
            times = []
            for i in range(warmup + iters):
                dist.barrier()
                t0 = time.perf_counter()
                step()
                dt = time.perf_counter() - t0
                if i >= warmup:
                    times.append(dt)
            out[nbytes] = times
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return {"times": out, "torch": torch.__version__}


def _run_gloo(op: str, n: int, plan, *, reduce_op: str, threads: int,
              timeout: float | None) -> dict[int, list[float]]:
    from gossip.testing import free_port

    limit = timeout if timeout else _deadline_for(plan, n)
    results = _run_processes("gloo", _gloo_worker, n,
                             (n, free_port(), op, plan, reduce_op, threads, limit), limit)
    times = {}
    for nbytes, _, _ in plan:
        if op == "p2p":
            times[nbytes] = results[1]["times"][nbytes]
        else:
            times[nbytes] = _slowest([res["times"][nbytes] for res in results])
    return times


# ---------------------------------------------------------------------------- plain pyzmq
def _pyzmq_endpoint(transport: str) -> str:
    if transport == "ipc":
        name = f"gossip-bench-{os.getpid()}-{time.monotonic_ns()}.sock"
        return f"ipc://{os.path.join(tempfile.gettempdir(), name)}"
    from gossip.testing import free_port
    return f"tcp://127.0.0.1:{free_port()}"


def _pyzmq_worker(rank: int, endpoint: str, plan, stream: int, curve) -> dict:
    """Rank 1 binds a PAIR socket and receives; rank 0 connects and sends. Before every
    iteration both exchange one empty message (the two-peer barrier); the receiver times from
    there to its last recv(copy=False) -> np.frombuffer."""
    import numpy as np
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.PAIR)
    s.linger = 0
    if curve is not None:
        public, secret = curve
        if rank == 1:
            s.curve_secretkey, s.curve_publickey, s.curve_server = secret, public, True
        else:
            s.curve_serverkey, s.curve_publickey, s.curve_secretkey = public, public, secret
    out: dict[int, list[float]] = {}
    try:
        if rank == 1:
            s.bind(endpoint)
        else:
            s.connect(endpoint)

        def barrier() -> None:
            s.send(b"")
            if not s.poll(60_000):
                raise TimeoutError("pyzmq peer did not answer within 60 s")
            s.recv()
        for nbytes, warmup, iters in plan:
            x = np.arange(nbytes // ITEMSIZE, dtype=np.float32)
            k = stream_count(stream, nbytes)
            times = []
            for i in range(warmup + iters):
                barrier()
                if rank == 0:
                    for _ in range(k):
                        s.send(x, copy=False)
                    continue
                t0 = time.perf_counter()
                for _ in range(k):
                    frame = s.recv(copy=False)
                    y = np.frombuffer(frame.buffer, dtype=np.float32)
                dt = time.perf_counter() - t0
                if y.nbytes != nbytes:
                    raise AssertionError(f"received {y.nbytes} bytes, expected {nbytes}")
                if i >= warmup:
                    times.append(dt / k)
            out[nbytes] = times
        barrier()
    finally:
        s.close(linger=0)
        ctx.term()
        if rank == 1 and endpoint.startswith("ipc://"):
            try:
                os.unlink(endpoint[len("ipc://"):])
            except OSError:
                pass
    return {"times": out}


def run_pyzmq_p2p(sizes: Sequence[int], *, transport: str = "tcp", key: str | None = None,
                  iters: int | None = None, warmup: int = 3, stream=1,
                  timeout: float | None = None) -> dict[int, list[float]]:
    """Plain pyzmq rank 0 -> rank 1 (PAIR, send(copy=False) / recv(copy=False)), receiver's
    per-iteration seconds per message, for each size. ``key``: a cluster key file (CURVE)."""
    plan = _plan(sizes, iters, warmup)
    curve = None
    if key:
        from collectives.security import load_cluster_key
        k = load_cluster_key(key)
        curve = (k.public, k.secret)
    limit = timeout if timeout else _deadline_for(plan, 2, stream)
    tr = "ipc" if transport == "ipc" else "tcp"
    results = _run_processes(f"pyzmq-{tr}", _pyzmq_worker, 2,
                             (_pyzmq_endpoint(tr), plan, stream, curve), limit)
    return {nbytes: results[1]["times"][nbytes] for nbytes, _, _ in plan}


def run_p2p(sizes: Sequence[int], *, transport: str = "tcp", key: str | None = None,
            iters: int | None = None, warmup: int = 3, stream=1,
            timeout: float | None = None) -> tuple[dict[int, list[float]], str]:
    """gossip peer.send / peer.recv rank 0 -> rank 1, receiver's per-iteration seconds per
    array, for each size; and the transport the peers used."""
    plan = _plan(sizes, iters, warmup)
    return _run_gossip("p2p", 2, plan, transport=transport, key=key, reduce_op="sum",
                       algorithm="auto", timeout=timeout, stream=stream)


# ---------------------------------------------------------------------------- the benchmark
def run_bench(op: str, n: int, sizes: str | Iterable[str | int] = DEFAULT_SIZES, *,
              transport: str = "auto", vs_gloo: bool = False, iters: int | None = None,
              warmup: int = 3, reduce_op: str = "sum", key: str | None = None,
              algorithm: str = "auto", timeout: float | None = None, gloo_threads: int = 1,
              progress: Callable[[str], None] | None = None) -> list[dict]:
    """Measure ``op`` over ``n`` peers on float32 arrays of each size (bytes); one row (dict)
    per size. ``vs_gloo``: also torch.distributed Gloo, same sizes and process count, giving
    ``gloo_*`` fields and ``ratio = gloo time / our time``. ``p2p`` (n = 2) always measures
    plain pyzmq too (``pyzmq_*`` fields; its ``ratio`` is pyzmq time / our time)."""
    vs = ("gloo",) if vs_gloo is True else tuple(vs_gloo or ())
    check_args(op, n, transport, vs, reduce_op, algorithm, iters, warmup)
    sizes = parse_sizes(sizes)
    plan = _plan(sizes, iters, warmup)
    say = progress or (lambda msg: None)

    say(f"gossip {op}: {n} peers, sizes {', '.join(format_size(s) for s in sizes)}")
    t0 = time.perf_counter()
    ours, used = _run_gossip(op, n, plan, transport=transport, key=key, reduce_op=reduce_op,
                             algorithm=algorithm, timeout=timeout)
    wall = time.perf_counter() - t0
    baselines: dict[str, dict[int, list[float]]] = {}
    if op == "p2p":
        say("plain pyzmq PAIR p2p, same sizes")
        baselines["pyzmq"] = run_pyzmq_p2p(sizes, transport="tcp" if used == "tcp" else "ipc",
                                           key=key, iters=iters,
                                           warmup=warmup, timeout=timeout)
    if "gloo" in vs:
        say(f"torch.distributed Gloo {op}: {n} processes, same sizes")
        baselines["gloo"] = _run_gloo(op, n, plan, reduce_op=reduce_op, threads=gloo_threads,
                                      timeout=timeout)

    rows = []
    for nbytes, w, it in plan:
        row = {"impl": "gossip", "op": op, "nprocs": n, "bytes": nbytes,
               "count": nbytes // ITEMSIZE, "type": "float32",
               "redop": reduce_op if op == "allreduce" else None,
               "transport": transport, "transport_used": used}
        if op == "allreduce":
            row["algorithm"] = algorithm
        if key:
            row["curve"] = True
        row.update(_figures(op, n, nbytes, ours[nbytes]))
        row.update({"iters": it, "warmup": w, "ncpu": os.cpu_count(), "wall_seconds": wall})
        for name in ("pyzmq", "gloo"):
            if name not in baselines:
                continue
            fig = _figures(op, n, nbytes, baselines[name][nbytes])
            row.update({f"{name}_{k}": v for k, v in fig.items()})
            row[f"{name}_ratio"] = (fig["seconds_median"] / row["seconds_median"]
                                    if row["seconds_median"] > 0 else float("inf"))
        primary = "pyzmq" if op == "p2p" else "gloo"
        if f"{primary}_ratio" in row:
            row["ratio"] = row[f"{primary}_ratio"]
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------- output
def header_line(op: str, n: int, transport: str = "auto", *, vs_gloo: bool = False,
                key: str | None = None, algorithm: str = "auto") -> str:
    ncpu = os.cpu_count() or 1
    share = f"the {n} peers share these CPUs"
    if n > ncpu:
        share += f": {n} peers on {ncpu} CPUs contend"
    if vs_gloo:
        share += "; Gloo runs after ours, in its own processes"
    extra = f", algorithm={algorithm}" if op == "allreduce" else ""
    extra += ", CURVE on" if key else ""
    timing = ("the receiver's time from a barrier" if op == "p2p"
              else "the slowest rank's time")
    return (f"# gossip bench {op}: n={n} peers, transport={transport}{extra}, host CPUs: "
            f"{ncpu} ({share}); time = median over iterations of {timing}")


_NOTES = {
    "allreduce": "busbw = algbw * 2(n-1)/n (nccl-tests)",
    "allgather": "size = each peer's input; algbw = n*size/time (the gathered output, as "
                 "nccl-tests); busbw = algbw * (n-1)/n",
    "broadcast": "root 0; busbw = algbw",
    "neighbor": "one neighbor_allreduce ring round (self 1/3, each neighbour 1/3); Gloo: "
                "isend/irecv to both neighbours + average; busbw = algbw",
    "p2p": "rank 0 -> rank 1, one array, timed at the receiver from a barrier; busbw = algbw; "
           "pyzmq: a PAIR socket over tcp when the peers used tcp, else ipc",
}


def _fmt_us(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:.1f}" if us < 1e4 else f"{us:.0f}"


def format_table(rows: Sequence[dict]) -> str:
    """An nccl-tests style table of run_bench rows (one line per size)."""
    if not rows:
        return "# (no rows)"
    first = rows[0]
    op = first["op"]
    extras = [name for name in ("pyzmq", "gloo") if f"{name}_seconds_median" in first]
    head1 = f"#{'size':>11} {'count':>11} {'type':>7} {'redop':>6} {'time':>10} " \
            f"{'algbw':>7} {'busbw':>7}"
    head2 = f"#{'(B)':>11} {'(elements)':>11} {'':>7} {'':>6} {'(us)':>10} " \
            f"{'(GB/s)':>7} {'(GB/s)':>7}"
    for name in extras:
        head1 += f" | {name + ' time':>11} {name + ' busbw':>12} {'ratio':>6}"
        head2 += f" | {'(us)':>11} {'(GB/s)':>12} {'':>6}"
    lines = [head1, head2]
    for row in rows:
        line = (f" {row['bytes']:>11} {row['count']:>11} {row['type']:>7} "
                f"{row.get('redop') or 'none':>6} {_fmt_us(row['seconds_median']):>10} "
                f"{row['algbw_GBps']:>7.3f} {row['busbw_GBps']:>7.3f}")
        for name in extras:
            line += (f" | {_fmt_us(row[name + '_seconds_median']):>11} "
                     f"{row[name + '_busbw_GBps']:>12.3f} {row[name + '_ratio']:>6.2f}")
        lines.append(line)
    lines.append(f"# {_NOTES[op]}")
    if extras:
        lines.append("# ratio = baseline time / gossip time (> 1: gossip is faster)")
    if first.get("transport_used"):
        lines.append(f"# peers connected over: {first['transport_used']}")
    return "\n".join(lines)
