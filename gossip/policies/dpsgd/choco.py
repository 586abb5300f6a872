"""CHOCO-SGD: gossip on compressed differences to public copies (Koloskova, Stich, Jaggi,
"Decentralized Stochastic Optimization and Gossip Algorithms with Compressed Communication",
ICML 2019, Algorithm 2)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from collectives.arrays import adapter_for
from collectives.codecs import as_float32, write_back
from collectives.codecs import CodecSpec
from gossip.errors import TopologyError
from gossip.policies.base import DEFAULT_BUCKET_BYTES, Policy, check_int, check_number
from gossip.policies.neighborhood import PEER_TOPOLOGY, mixing_round

if TYPE_CHECKING:
    from topologies import Topology

__all__ = ["Choco"]

_STOCHASTIC_TOL = 1e-9


class Choco(Policy):
    """CHOCO-SGD. Every peer i keeps a public copy x^_i of its parameters, which its
    neighbours know exactly, and s_i = sum_j W_ij x^_j (itself included). After each local
    step it sends only the compressed difference q_i = C(x_i - x^_i) to its neighbours; every
    peer adds the q's it hears of to its public copies, and moves towards them by the
    consensus step gamma:

        q_i = C(x_i - x^_i);  x^_i += q_i;  s_i += sum_j W_ij q_j;  x_i += gamma (s_i - x^_i)

    Because x^ tracks x, the differences shrink as the peers agree, and so does what the codec
    loses: for a contractive codec (top-k, int8, bf16; not fp16, which underflows) and a
    small enough gamma the peers reach their exact average without training (lr = 0), where
    Gossip(compression=...) would stall at the codec's error. A doubly stochastic W keeps the
    mean exactly: sum_i (s_i - x^_i) = 0.

    ``consensus_step`` gamma in (0, 1]; default 1 with a fine codec (bf16, int8) and 0.05 with
    top-k, which needs less (measured on a ring of 4, lr 0: top-k 10% converges with 0.1 and
    stalls with 0.3, top-k 25% converges with 0.5; training the demo's CNN for 100 epochs,
    top-k 1% with 0.1 drifts apart after epoch 40, 98.7% down to 90.7% and a consensus
    distance of 23, while 0.05 holds 98.6%; the paper tunes gamma per codec and graph, and
    its theory asks for gamma about the codec's ratio). ``compression``: any codec (default
    top-k 1%); a codec that is no contraction is refused.

    Static graphs only (the s_i sum follows one W); the public copies and s are policy state
    (state_dict()). Views: every copy of x^_j must be the same on all of j's neighbours, and
    a partial round (a neighbour lost half-way) or a new graph (a joiner, a restart, a leave)
    breaks that. So every change of the group is a view change, agreed at one step boundary:
    a lost peer makes the survivors re-form the group as Synchronous(elastic=True) does (a
    round cut by the death is not redone: each survivor keeps its own parameters), a joiner
    takes a member's parameters, and at the switch every member restarts its public copies
    and s at zero over the graph recomputed for the new view, as at attach. The peers' mean
    is kept exactly from the switch on; the copies catch up in the rounds after it (as many
    as from the start). Below ``min_peers`` members a death raises PeerLost. Cost per step:
    one encoding of the parameters to each out-neighbour (top-k 1%: 8 bytes per 100
    elements); memory: two more copies of the parameters (float32, float64 for float64
    parameters).
    """

    name = "choco"
    default_topology = PEER_TOPOLOGY

    def __init__(self, *, consensus_step: float | None = None,
                 compression: CodecSpec = "topk:0.01", topology: Topology | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 timeout: float | None = None, nan_guard: bool = False,
                 min_peers: int = 1) -> None:
        if compression is None:
            raise ValueError("Choco exchanges compressed differences: give it a codec "
                             "(Gossip is the uncompressed D-PSGD)")
        super().__init__(bucket_bytes=bucket_bytes, timeout=timeout, nan_guard=nan_guard,
                         compression=compression)
        codec = self.compression
        if codec is None:   # compression="none"
            raise ValueError("Choco exchanges compressed differences: give it a codec "
                             "(Gossip is the uncompressed D-PSGD)")
        if not codec.contractive:
            raise ValueError(f"Choco needs a contractive codec; {codec.name} is "
                             "not one (it loses small differences entirely); use bf16")
        if consensus_step is None:
            consensus_step = 0.05 if codec.family == "topk" else 1.0
        self.consensus_step = check_number("consensus_step", consensus_step,
                                           lambda g: 0 < g <= 1, "in (0, 1]")
        self._topology_arg = topology
        # A death is a view change (the class docstring): the survivors' copies of one
        # another must restart together, which only an agreed boundary gives.
        self.elastic = True
        self.min_peers = check_int("min_peers", min_peers, 1)

    def _setup(self) -> None:
        self._plan_graph()
        work = [self._work(b) for b in self._packed()]
        self._public = [np.zeros_like(x) for x in work]     # x^_i
        self._mixed = [np.zeros_like(x) for x in work]      # s_i
        self._diff = [np.zeros_like(x) for x in work]       # q_i, then D(E(q_i))
        self._heard = [np.zeros_like(x) for x in work]      # sum_j W_ij D(E(q_j))

    def _plan_graph(self) -> None:
        """This peer's row of the graph's mixing matrix (checked: static, doubly
        stochastic)."""
        topo = self._graph()
        if getattr(topo, "is_time_varying", False):
            raise TopologyError(f"Choco runs on a static graph, not on {topo!r}")
        w = topo.sparse_mixing_matrix(0)
        if np.abs(w.row_sums() - 1).max() > _STOCHASTIC_TOL or \
                np.abs(w.column_sums() - 1).max() > _STOCHASTIC_TOL:
            raise TopologyError(f"Choco needs a doubly stochastic mixing matrix; {topo!r}'s "
                                "is not (use weights='metropolis')")
        self._plan = mixing_round(topo, self._host().rank, 0).plan(compression=self.compression)

    def _restart_copies(self) -> None:
        """Public copies and their sums back to zero, as at attach: the same on every member
        of the new view, whatever each held of the old graph."""
        for public, mixed in zip(self._public, self._mixed):
            public.fill(0)
            mixed.fill(0)

    def view_changed(self) -> None:
        super().view_changed()   # the graph over the new view's size
        self._plan_graph()
        self._restart_copies()

    def took_state(self, step: int) -> None:
        # A joiner took a member's parameters (and that member's copies, of the old graph).
        super().took_state(step)
        self._restart_copies()

    @staticmethod
    def _work(b: Any) -> Any:
        """The bucket as the float array Choco updates (numpy float64 stays float64)."""
        adapter = adapter_for(b.flat)
        dtype = adapter.dtype_name(b.flat)
        if dtype == "float64" and adapter.kind == "numpy":
            return b.flat
        return as_float32(adapter, b.flat, dtype)

    def _after_step(self, step: int) -> None:
        buckets = self._packed()
        buckets.copy_in()
        plan, gamma = self._plan, self.consensus_step
        for b, public, mixed, diff, heard in zip(buckets, self._public, self._mixed,
                                                 self._diff, self._heard):
            x = self._work(b)
            np.subtract(x, public, out=diff)
            # diff becomes D(E(diff)), heard its W-weighted sum with the neighbours'.
            self._host().neighbor_exchange(diff, plan, out=heard, timeout=self.timeout)
            public += diff
            mixed += heard
            np.subtract(mixed, public, out=heard)
            heard *= gamma
            x += heard
            write_back(adapter_for(b.flat), b.flat, x)
        buckets.copy_out()

    def _extra_state(self) -> dict:
        return {"public": [p.copy() for p in self._public],
                "mixed": [m.copy() for m in self._mixed],
                "consensus_step": self.consensus_step}

    def _load_extra_state(self, state: dict) -> None:
        for key, mine in (("public", self._public), ("mixed", self._mixed)):
            theirs = state.get(key)
            if not isinstance(theirs, (list, tuple)) or len(theirs) != len(mine) or any(
                    tuple(t.shape) != tuple(m.shape) for t, m in zip(theirs, mine)):
                raise ValueError(f"Choco state needs {len(mine)} {key} buffers of the "
                                 "buckets' sizes")
        for key, mine in (("public", self._public), ("mixed", self._mixed)):
            for m, t in zip(mine, state[key]):
                np.copyto(m, t)

    def _extra_stats(self) -> dict:
        return {"consensus_step": self.consensus_step, "topology": repr(self.topology)}
