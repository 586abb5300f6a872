"""What each directed link between the peers carries, measured by the peers themselves
(``Communicator.measure_links``, issue #37), and the ring order it suggests
(algorithms/ring_order.py).

The call is collective. Its pairs meet in rounds (the circle method of a round-robin
tournament: n - 1 rounds for n peers, n for odd n, each peer in at most one pair a round), so
no two measurements of one round share a peer. In each pair the lower rank measures first:
a one-byte ping and its echo (the round trip), then ``nbytes`` and a one-byte answer sent once
all of them arrived, ``repeats`` times; the rate of the link is ``nbytes / (time - round
trip)``, the best of the repeats (a measurement is slower than the link, never faster). Then
the higher rank measures the other direction the same way. Each peer ends with its own row
(the links it sends on); the rows are then allgathered, so every peer holds the same matrix,
bit for bit, and orders the same ring from it. With ``among``, only the pairs of those ranks
meet (one peer a host, for the order of the hosts); the others enter the call and leave it.

What it measures is what the transport carries between the two peers: tcp between hosts
(including the kernel's send buffers and TCP's slow start, so a small ``nbytes`` on a long fat
link under-reads it: measure with about what the allreduce sends a link, or compare links by
the same ``nbytes``), shared memory on one host. Two pairs of one round may cross the same
host's uplink (two peers of one host meeting peers of another at once) and then each reads
its share of it. ``timeout`` (default the peer's) bounds the whole measurement.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from collectives.algorithms.p2p import Call, post_range, recv_range, wait_sent
from collectives.algorithms.ring import counts_digest
from collectives.algorithms.ring_order import DEFAULT_MARGIN, best_ring, ring_bottleneck
from collectives.arrays.adapter import adapter_for

if TYPE_CHECKING:
    from collectives.engine import Engine

__all__ = ["LinkRates", "measure_links", "pairing_rounds", "MIN_SECONDS"]

#: The shortest transfer a rate is computed from (seconds beyond the round trip): a faster one
#: (shared memory, a probe too small for the link) reads as nbytes / MIN_SECONDS.
MIN_SECONDS = 1e-6


@dataclass(frozen=True)
class LinkRates:
    """A measured rate matrix: ``rates[i][j]`` bytes/s from rank i to rank j, measured with
    ``nbytes`` a transfer, the best of ``repeats``, between the peers of ``ranks`` (every rank,
    or those the measurement was asked for: ``among``); 0.0 on the diagonal and for every
    link not measured."""
    rates: tuple[tuple[float, ...], ...]
    nbytes: int
    repeats: int
    ranks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.ranks:
            object.__setattr__(self, "ranks", tuple(range(len(self.rates))))

    @property
    def world_size(self) -> int:
        return len(self.rates)

    def rate(self, src: int, dst: int) -> float:
        """Bytes/s from ``src`` to ``dst``."""
        return self.rates[src][dst]

    def ring(self, margin: float = DEFAULT_MARGIN) -> list[int]:
        """The ring order of ``ranks`` these rates suggest (algorithms/ring_order.best_ring):
        their order unless a ring whose slowest link is more than ``margin`` faster exists."""
        ranks = self.ranks
        sub = [[self.rates[a][b] for b in ranks] for a in ranks]
        return [ranks[k] for k in best_ring(sub, margin)]

    def slowest(self, ring: list[int] | None = None) -> tuple[int, int, float]:
        """``(src, dst, bytes/s)`` of the slowest link of ``ring`` (default: ``ranks`` in
        their order)."""
        order = list(self.ranks) if ring is None else list(ring)
        n = len(order)
        if n < 2:
            return (order[0] if order else 0, order[0] if order else 0, math.inf)
        rate = ring_bottleneck(self.rates, order)
        k = next(k for k in range(n) if self.rates[order[k]][order[(k + 1) % n]] == rate)
        return (order[k], order[(k + 1) % n], rate)

    def describe(self, ring: list[int] | None = None) -> str:
        """A line for the log: the ring and its slowest link, against the rank order's."""
        order = list(self.ranks) if ring is None else list(ring)
        src, dst, rate = self.slowest(order)
        line = f"ring {order}: slowest link {src}->{dst} at {_rate(rate)}"
        if order != list(self.ranks):
            src0, dst0, rate0 = self.slowest(None)
            line += f" (the rank order's: {src0}->{dst0} at {_rate(rate0)})"
        return line


def _rate(bytes_per_second: float) -> str:
    if math.isinf(bytes_per_second):
        return "no link"
    return f"{bytes_per_second * 8 / 1e6:,.0f} Mbit/s"


def pairing_rounds(n: int) -> list[list[tuple[int, int]]]:
    """The rounds of a round-robin tournament of ``n`` peers (circle method): every pair
    ``(low, high)`` once, each peer in at most one pair a round."""
    order: list[int | None] = list(range(n))
    if n % 2:
        order.append(None)   # its partner sits the round out
    m = len(order)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = order[i], order[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        order = [order[0], order[-1], *order[1:-1]]
    return rounds


def measure_links(engine: "Engine", nbytes: int, repeats: int, timeout: float | None,
                  among: list[int] | None = None) -> list[float]:
    """This peer's row of the matrix (bytes/s to each rank; 0.0 to itself and to every rank
    not measured), measured with the others in one collective call (module docstring):
    between every pair of ``among`` (default: every rank; the others take part in the call
    and measure nothing)."""
    n, r = engine.world_size, engine.rank
    members = list(range(n)) if among is None else list(among)
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 1:
        raise ValueError(f"rank {r}: measure_links needs nbytes >= 1 (an int), got {nbytes!r}")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"rank {r}: measure_links needs repeats >= 1 (an int), got "
                         f"{repeats!r}")
    if sorted(set(members)) != sorted(members) or not all(0 <= j < n for j in members):
        raise ValueError(f"rank {r}: measure_links among {members!r}: ranks of the {n} peers, "
                         "each once")
    row = [0.0] * n
    if n == 1:
        return row
    seq = engine.next_seq()
    # (the members are part of the signature: peers that measure different sets disagree)
    signature = f"measure_links({nbytes},{repeats}" + (
        "" if among is None else f",among={counts_digest(members)}") + ")"

    def run(call: Call) -> None:
        if r not in members:
            return   # (enters and leaves the call: nothing to measure, nothing allocated)
        one = Call(call.transport, call.channel, call.seq, call.signature, "uint8",
                   (1,), call.deadline)
        probe, byte = np.zeros(nbytes, np.uint8), np.zeros(1, np.uint8)
        me = members.index(r)
        for pairs in pairing_rounds(len(members)):
            other = next((b if a == me else a for a, b in pairs if me in (a, b)), None)
            if other is None:
                continue
            partner = members[other]
            for measuring in ((True, False) if r < partner else (False, True)):
                if measuring:
                    row[partner] = _measure(call, one, partner, probe, byte, repeats)
                else:
                    _answer(call, one, partner, byte, repeats)

    engine.execute(seq, signature, "uint8", (nbytes,), timeout, engine.peers, run)
    return row


def _measure(call: Call, one: Call, partner: int, probe: np.ndarray, byte: np.ndarray,
             repeats: int) -> float:
    """This peer's side of one direction: the round trip, then ``repeats`` timed transfers."""
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        _send(one, partner, byte)
        _receive(one, partner)
        trip = time.perf_counter() - start
        start = time.perf_counter()
        _send(call, partner, probe)
        _receive(one, partner)
        took = time.perf_counter() - start
        best = max(best, probe.size / max(took - trip, MIN_SECONDS))
    return best


def _answer(call: Call, one: Call, partner: int, byte: np.ndarray, repeats: int) -> None:
    """The partner's side: echo each ping, answer each transfer once it all arrived."""
    for _ in range(repeats):
        _receive(one, partner)
        _send(one, partner, byte)
        _receive(call, partner)
        _send(one, partner, byte)


def _send(call: Call, dst: int, array: np.ndarray) -> None:
    adapter = adapter_for(array)
    wait_sent(call, post_range(call, dst, adapter, array, 0, array.size, track=True))


def _receive(call: Call, src: int) -> None:
    """Take the whole of ``src``'s message (its bytes are not kept)."""
    for _ in recv_range(call, src, adapter_for(np.zeros(0, np.uint8)), 0, call.shape[0]):
        pass
