"""The simulator's network: every directed link's rate and one-way latency.

Three ways to describe it:

- one link for every pair (``--link 1gbit,20ms``: ``Links.uniform``);
- regions (``--regions K --wan RATE,LATENCY``: ``Links.regions``): the peers in K blocks of
  consecutive ranks, as a launcher numbers the machines of K sites; ``--link`` within a block
  (free if not given), ``--wan`` between blocks;
- a file (``--links FILE``: ``Links.from_file``), JSON naming each peer's region and the link
  from every region to every other::

      {"regions": [0, 0, 0, 1, 1, 1],
       "links": [["10gbit,0.5ms", "100mbit,40ms"],
                 ["100mbit,40ms", "10gbit,0.5ms"]]}

  Row ``a``, column ``b`` is the link from region a to region b (they may differ: an
  asymmetric uplink); ``null`` is a free link. Without ``"regions"`` every peer is its own
  region and ``"links"`` is the full n x n matrix.

Links are stored per pair of regions (K x K arrays), so 1,024 peers in four regions cost 16
entries, and one region is the uniform network. A message between two peers is charged by
their regions' link (fabric.py). A collective is charged over the pairs its algorithm uses,
each step waiting for its slowest pair: the ring allreduce's 2(n - 1) steps of nbytes / n over
the links rank i -> i + 1, recursive doubling below DEFAULT_SMALL_BYTES (step k: i <-> i xor
2^k), the ring allgather's n - 1 steps of nbytes, the binomial broadcast from rank 0 (step k:
i -> i + 2^k for i < 2^k) and the dissemination barrier's latencies (step k: i -> i + 2^k mod
n). On one region these are ``collective_seconds``' formulas. The compressed allreduce's
schemes (collectives/algorithms/compressed.py) are charged on their encodings' bytes:
``ring_allreduce`` the ring whatever the size (nbytes: one peer's encodings of its n
segments), ``allgather`` the gather around the ring, ``direct_allgather`` every encoding
straight from its owner (one step in which every pair carries nbytes).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
import numpy as np

from collectives.communicator import DEFAULT_SMALL_BYTES
from collectives.transport.emulation import LinkSpec, parse_link

__all__ = ["Links"]


@dataclass(frozen=True, eq=False)
class Links:
    """Every directed link of ``size`` peers: peer ``i`` in region ``region[i]``; the link from
    region a to region b has ``rate[a, b]`` bytes/s (inf: free) and ``latency[a, b]`` s."""

    size: int
    region: np.ndarray
    rate: np.ndarray
    latency: np.ndarray
    text: str

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def uniform(cls, size: int, link: LinkSpec | None) -> "Links":
        """One link for every pair (None: free)."""
        rate, latency = _rate_latency(link)
        return cls(size, np.zeros(size, np.int64), np.full((1, 1), rate),
                   np.full((1, 1), latency), str(link) if link is not None else "free")

    @classmethod
    def regions(cls, size: int, count: int, local: LinkSpec | None,
                wan: LinkSpec) -> "Links":
        """``count`` blocks of consecutive ranks (sizes differing by at most one), ``local``
        within a block (None: free), ``wan`` between blocks."""
        if isinstance(count, bool) or not isinstance(count, int) or not 2 <= count <= size:
            raise ValueError(f"simulate: regions must be an int from 2 to the {size} peers, "
                             f"got {count!r}")
        region = (np.arange(size, dtype=np.int64) * count) // size
        local_rate, local_latency = _rate_latency(local)
        rate = np.full((count, count), wan.rate, dtype=float)
        latency = np.full((count, count), wan.latency, dtype=float)
        np.fill_diagonal(rate, local_rate)
        np.fill_diagonal(latency, local_latency)
        return cls(size, region, rate, latency,
                   f"{count} regions, {local or 'free'} within, {wan} between")

    @classmethod
    def from_file(cls, size: int, path: str) -> "Links":
        """The regions and links a JSON file names (the module docstring's format); a
        ValueError naming the file and what is wrong otherwise."""
        where = f"links file {path}"
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"simulate: cannot read the {where}: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("links"), list):
            raise ValueError(f"simulate: the {where} must be a JSON object with a \"links\" "
                             "matrix (and optionally \"regions\")")
        rows = data["links"]
        count = len(rows)
        regions = data.get("regions")
        if regions is None:
            if count != size:
                raise ValueError(f"simulate: the {where} has a {count}-row matrix and no "
                                 f"\"regions\": it needs one row per peer ({size})")
            region = np.arange(size, dtype=np.int64)
        else:
            if not isinstance(regions, list) or len(regions) != size or not all(
                    type(r) is int and 0 <= r < count for r in regions):
                raise ValueError(f"simulate: the {where}'s \"regions\" must list {size} "
                                 f"region numbers from 0 to {count - 1} (one per peer)")
            region = np.asarray(regions, dtype=np.int64)
        rate = np.empty((count, count))
        latency = np.empty((count, count))
        for a, row in enumerate(rows):
            if not isinstance(row, list) or len(row) != count:
                raise ValueError(f"simulate: the {where}'s \"links\" must be {count} x "
                                 f"{count}; row {a} is not")
            for b, text in enumerate(row):
                if text is not None and not isinstance(text, str):
                    raise ValueError(f"simulate: the {where}: links[{a}][{b}] must be a "
                                     f"link such as \"1gbit,20ms\" or null, got {text!r}")
                rate[a, b], latency[a, b] = _rate_latency(
                    parse_link(text or "", f"{where}: links[{a}][{b}]"))
        return cls(size, region, rate, latency, f"from {path} ({count} regions)")

    def subset(self, members: list[int]) -> "Links":
        """The links among ``members`` (peers of this network), renumbered 0 to
        len(members) - 1 in that order: a view without the dead (fabric.py)."""
        return Links(len(members), self.region[np.asarray(members, dtype=np.int64)],
                     self.rate, self.latency, self.text)

    # -- what a message and a collective cost ------------------------------------------------
    def link(self, src: int, dst: int) -> tuple[float, float]:
        """(rate in bytes/s, latency in s) of the link from ``src`` to ``dst``."""
        a, b = self.region[src], self.region[dst]
        return float(self.rate[a, b]), float(self.latency[a, b])

    def _slowest(self, src: np.ndarray, dst: np.ndarray, nbytes: float) -> float:
        """The slowest of the pairs ``src[i] -> dst[i]`` carrying ``nbytes`` each."""
        if len(src) == 0:
            return 0.0
        a, b = self.region[src], self.region[dst]
        return float(np.max(self.latency[a, b] + nbytes / self.rate[a, b]))

    def collective_seconds(self, op: str, nbytes: int) -> float:
        """Seconds of collective ``op`` over every peer, ``nbytes`` per peer (the module
        docstring's algorithms); 0 for one peer."""
        n = self.size
        if n <= 1:
            return 0.0
        ranks = np.arange(n)
        steps = math.ceil(math.log2(n))
        if op == "allreduce" and nbytes < DEFAULT_SMALL_BYTES:
            total = 0.0
            for k in range(steps):
                partner = ranks ^ (1 << k)
                keep = partner < n
                total += self._slowest(ranks[keep], partner[keep], nbytes)
            return total
        ring = (ranks + 1) % n
        if op in ("allreduce", "ring_allreduce"):
            return 2 * (n - 1) * self._slowest(ranks, ring, nbytes / n)
        if op == "direct_allgather":
            return max(self._slowest(ranks, (ranks + k) % n, nbytes) for k in range(1, n))
        if op == "allgather":
            return (n - 1) * self._slowest(ranks, ring, nbytes)
        if op == "broadcast":
            total = 0.0
            for k in range(steps):
                senders = ranks[:min(1 << k, n)]
                senders = senders[senders + (1 << k) < n]
                total += self._slowest(senders, senders + (1 << k), nbytes)
            return total
        return sum(self._slowest(ranks, (ranks + (1 << k)) % n, 0) for k in range(steps))


    def collective_sends(self, op: str, nbytes: int, rank: int) -> list[tuple[int, int]]:
        """(destination, bytes) of what ``rank`` sends in collective ``op`` of ``nbytes`` per
        peer, over the pairs collective_seconds charges: recursive doubling's partners below
        DEFAULT_SMALL_BYTES, the ring's next rank above (2(n - 1) chunks of nbytes / n), the
        ring allgather's (n - 1 chunks of nbytes), the direct allgather's (nbytes to every
        other peer), the binomial broadcast's children;
        nothing for a barrier (latencies only) or one peer."""
        n = self.size
        if n <= 1:
            return []
        steps = math.ceil(math.log2(n))
        if op == "allreduce" and nbytes < DEFAULT_SMALL_BYTES:
            return [(rank ^ (1 << k), nbytes) for k in range(steps) if rank ^ (1 << k) < n]
        if op in ("allreduce", "ring_allreduce"):
            return [((rank + 1) % n, 2 * (n - 1) * nbytes // n)]
        if op == "direct_allgather":
            return [((rank + k) % n, nbytes) for k in range(1, n)]
        if op == "allgather":
            return [((rank + 1) % n, (n - 1) * nbytes)]
        if op == "broadcast":
            return [(rank + (1 << k), nbytes) for k in range(steps)
                    if rank < (1 << k) and rank + (1 << k) < n]
        return []


def _rate_latency(link: LinkSpec | None) -> tuple[float, float]:
    return (math.inf, 0.0) if link is None else (float(link.rate), float(link.latency))
