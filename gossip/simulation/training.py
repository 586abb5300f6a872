"""Training many peers in one process on a virtual clock: each peer a thread running the real
policy class through gossip.DistributedOptimizer on a SimHost (sim_host.py), its compute and
its messages charged to its clock by the spec's models (fabric.py).

The task is the demo's: the 8x8 digits that ship inside scikit-learn, an MLP, each peer its
shard. ``train_peer`` is the one loop every peer runs, simulated or real (the fidelity test
runs it on real peer processes too)."""
from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from collectives.transport.emulation import parse_link
from gossip.simulation.churn import Churn
from gossip.simulation.fabric import Fabric, SimulatedDeath
from gossip.simulation.links import Links
from gossip.simulation.sim_host import SimHost
from gossip.simulation.trace import TrainingTrace

__all__ = ["TrainingSpec", "TrainingResult", "PeerResult", "simulate_training", "train_peer",
           "SIMULATED_POLICIES", "measure_step_seconds"]

_SEEDING = threading.Lock()

SIMULATED_POLICIES = ("synchronous", "local-sgd", "gossip", "push-sum", "asynchronous")
"""The policies the simulator runs: those whose rounds are collectives and exchanges the peers
make together (push-sum with ``overlap=True`` too: its exchange completes at the next step),
and the asynchronous policy, whose background threads run on the fabric's Scheduler.
``policy_options`` go to the policy's constructor: ``compression`` too (synchronous, local
SGD and gossip take a codec; sim_host.py runs it as the real collectives do)."""


@dataclass(frozen=True)
class TrainingSpec:
    """What to simulate. ``link``: every link's rate and latency ("1gbit,20ms", as
    GOSSIP_LINK; None: communication takes no time); with ``regions`` (K >= 2) and ``wan``,
    the peers are K blocks of consecutive ranks, ``link`` the links within a block and ``wan``
    those between; ``links``: a JSON file naming each peer's region and every link instead
    (gossip/simulation/links.py). ``deaths``: (rank, simulated second) pairs, each peer
    dying at its first step or exchange at or after its second (a rank listed again dies
    again after its restart); ``mtbf``: deaths drawn from the seed as well, one per ``mtbf``
    simulated seconds across the fleet on average (exponential gaps, each on a peer drawn
    uniformly from those alive then, and only while more than two are; with restarts, for as
    long as the run lasts: gossip/simulation/churn.py); the others count a dead
    peer lost ``detect_seconds`` later (the heartbeat timeout). Gossip and push-sum go on
    around a lost peer; synchronous and local SGD need ``policy_options={"elastic": True}``
    (without it a death fails the job, as on real peers): the survivors re-form the group
    (sim_host.SimHost.recover) and go on. ``restarts``: (rank, simulated second) pairs, a dead
    peer's new process asking to join at that second (after its death, before its next), or
    with ``restart_after`` every dead peer's, that long after each death: the members admit it
    at the next step boundary and it takes a member's state (fabric.py); ``leaves``: (rank,
    simulated second) pairs, each leaving as ``peer.leave()`` does under the policy: at once
    (the leaver goes at its own next step boundary, the others hear, end what they were
    doing and re-form the group without it: ``leaves_at_once``), or, under push-sum, at the
    next step boundary the group meets at (the leaver hands its mass over); ``joins``:
    simulated seconds at which new peers ask to join (slots ``peers``, ``peers`` + 1, ...: admitted as restarts are;
    the data is sharded over ``slots``, every peer that ever takes part). ``step_seconds``: each
    step's compute (``measure_step_seconds`` gives this machine's), ``step_jitter``: each
    step's compute times a lognormal factor of mean 1 and this sigma, drawn from (seed, rank,
    step) so two runs draw alike;
    ``straggler``: (rank, factor), that peer's steps take factor times as long; ``non_iid``:
    each peer's mix of classes drawn from Dirichlet(``non_iid``), as the demo's --non-iid
    (gossip.demo.data.shard)."""

    policy: str = "gossip"
    peers: int = 4
    topology: str = "ring"
    steps: int = 200
    link: str | None = None
    step_seconds: float = 0.01
    step_jitter: float = 0.0
    straggler: tuple[int, float] | None = None
    lr: float = 0.05
    momentum: float = 0.0
    batch: int = 16
    hidden: int = 128
    seed: int = 0
    policy_options: dict = field(default_factory=dict)
    non_iid: float | None = None   # Dirichlet alpha of the peers' class mixes (None: iid)
    regions: int | None = None
    wan: str | None = None
    links: str | None = None
    deaths: tuple[tuple[int, float], ...] = ()
    mtbf: float | None = None
    detect_seconds: float = 2.0
    restarts: tuple[tuple[int, float], ...] = ()
    restart_after: float | None = None
    leaves: tuple[tuple[int, float], ...] = ()
    joins: tuple[float, ...] = ()
    trace_points: int = 10   # points of TrainingResult.trace (0: none; trace.py)

    def __post_init__(self) -> None:
        if self.policy not in SIMULATED_POLICIES:
            raise ValueError(f"simulate: policy {self.policy!r} is not simulated; "
                             f"one of {', '.join(SIMULATED_POLICIES)}")
        for name, value, low in (("peers", self.peers, 1), ("steps", self.steps, 0),
                                 ("batch", self.batch, 1), ("hidden", self.hidden, 1),
                                 ("trace_points", self.trace_points, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"simulate: {name} must be an int >= {low}, got {value!r}")
        if not self.step_seconds >= 0:
            raise ValueError(f"simulate: step_seconds must be >= 0, got {self.step_seconds!r}")
        if not 0 <= self.step_jitter <= 3:
            raise ValueError(f"simulate: step_jitter (a lognormal sigma) must be from 0 to 3, "
                             f"got {self.step_jitter!r}")
        if self.straggler is not None and not (0 <= self.straggler[0] < self.peers
                                               and self.straggler[1] >= 1):
            raise ValueError(f"simulate: straggler must be (rank, factor >= 1) with a rank of "
                             f"the {self.peers} peers, got {self.straggler!r}")
        parse_link(self.link or "", "link")   # (checked here: a bad one names the setting)
        if (self.regions is None) != (self.wan is None):
            raise ValueError("simulate: regions and wan go together (--regions K --wan "
                             "RATE,LATENCY: K blocks of peers, wan the links between them)")
        if self.links is not None and (self.link or self.regions is not None):
            raise ValueError("simulate: links (a file of every link) replaces link, regions "
                             "and wan; give one or the other")
        self.network()   # (a bad region count, wan or file names itself here)
        if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < math.inf
                   for t in self.joins):
            raise ValueError(f"simulate: joins must be simulated seconds >= 0, got "
                             f"{self.joins!r}")
        slots = f"the {self.slots} slots (the {self.peers} peers" + (
            f" and {len(self.joins)} joiners)" if self.joins else ")")
        if self.deaths or self.mtbf is not None:
            if self.policy not in ("gossip", "push-sum", "asynchronous") and \
                    not self.policy_options.get("elastic"):
                raise ValueError(f"simulate: with deaths, {self.policy} needs elastic=True "
                                 "(policy_options; --elastic): without it a death fails the "
                                 "job, as on real peers")
            for death in self.deaths:
                if len(death) != 2 or not 0 <= death[0] < self.slots or not death[1] >= 0:
                    raise ValueError(f"simulate: deaths must be (rank, seconds >= 0) pairs of "
                                     f"{slots}, got {death!r}")
            if self.mtbf is not None and not 0 < self.mtbf < float("inf"):
                raise ValueError(f"simulate: mtbf must be positive seconds, got {self.mtbf!r}")
            if not 0 <= self.detect_seconds < float("inf"):
                raise ValueError(f"simulate: detect_seconds must be >= 0, got "
                                 f"{self.detect_seconds!r}")
        if self.restart_after is not None:
            if not 0 <= self.restart_after < float("inf"):
                raise ValueError(f"simulate: restart_after must be seconds >= 0, got "
                                 f"{self.restart_after!r}")
            if not self.deaths and self.mtbf is None:
                raise ValueError("simulate: restart_after restarts the dead, and nobody dies: "
                                 "give deaths or mtbf too")
        for restart in self.restarts:
            if len(restart) != 2 or not 0 <= restart[0] < self.slots or not restart[1] >= 0:
                raise ValueError(f"simulate: restarts must be (rank, seconds) pairs of ranks "
                                 f"that die (deaths), after their death, got {restart!r}")
        if self.restarts and self.restart_after is not None:
            raise ValueError("simulate: restarts (a schedule) or restart_after (every "
                             "death), not both")
        self._check_lives()
        if self.leaves:
            dying = {int(r) for r, _ in self.deaths}
            for leave in self.leaves:
                if len(leave) != 2 or not 0 <= leave[0] < self.peers or not leave[1] >= 0 \
                        or leave[0] in dying:
                    raise ValueError(f"simulate: leaves must be (rank, seconds >= 0) pairs of "
                                     f"the {self.peers} peers, none of which dies, got "
                                     f"{leave!r}")
            if len({r[0] for r in self.leaves}) != len(self.leaves):
                raise ValueError("simulate: a rank leaves once (leaves lists one twice)")
            if self.mtbf is not None:
                raise ValueError("simulate: leaves with mtbf: the draws could pick a leaver; "
                                 "give deaths instead")
        if self.non_iid is not None and not (isinstance(self.non_iid, (int, float))
                                             and not isinstance(self.non_iid, bool)
                                             and 0 < self.non_iid < float("inf")):
            raise ValueError(f"simulate: non_iid must be a positive Dirichlet alpha, got "
                             f"{self.non_iid!r}")
        self._check_policy_options()

    def _check_policy_options(self) -> None:
        """The policy takes ``policy_options`` (made once here, as every peer makes it: a
        refused option fails the spec before any peer runs, not the run halfway)."""
        from gossip.policies import make

        try:
            make(self.policy, **self.policy_options)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"simulate: policy {self.policy!r} with policy_options="
                             f"{self.policy_options!r}: {exc}") from None

    def _check_lives(self) -> None:
        """Each slot's deaths and restarts alternate: it starts (at 0 s, or at its join),
        dies, restarts after that death, may die again after its restart, and so on."""
        deaths, restarts = _by_rank(self.deaths), _by_rank(self.restarts)
        for rank in sorted(set(deaths) | set(restarts)):
            died, back = sorted(deaths.get(rank, [])), sorted(restarts.get(rank, []))
            if self.restart_after is not None:
                back = [when + self.restart_after for when in died]
            first = 0.0 if rank < self.peers else float(self.joins[rank - self.peers])
            starts = [first] + back
            if len(back) > len(died):
                raise ValueError(f"simulate: restarts must be (rank, seconds) pairs of ranks "
                                 f"that die (deaths), after their death: rank {rank} restarts "
                                 f"{len(back)} times and dies {len(died)}")
            for k, when in enumerate(died):
                if k >= len(starts):
                    raise ValueError(f"simulate: rank {rank} dies again at {when:g} s with no "
                                     f"restart since its death at {died[k - 1]:g} s (a rank "
                                     "dies once per life: give its restarts)")
                if when < starts[k] or (k and starts[k] <= died[k - 1]):
                    what = ("joins" if rank >= self.peers and k == 0 else
                            "restarts" if k else "starts")
                    raise ValueError(f"simulate: rank {rank}'s deaths and restarts must "
                                     f"alternate, each restart after its death: it "
                                     f"{what} at {starts[k]:g} s and dies at {when:g} s"
                                     + (f" (its death before at {died[k - 1]:g} s)" if k else ""))
            if len(back) == len(died) and back and back[-1] <= died[-1]:
                raise ValueError(f"simulate: restarts must come after their death: rank "
                                 f"{rank} dies at {died[-1]:g} s and restarts at "
                                 f"{back[-1]:g} s")

    def churn(self) -> Churn:
        """The lives of every slot (churn.py) this spec describes: the listed deaths,
        restarts and joins, ``restart_after``, ``mtbf``'s draws from the seed."""
        requests = {self.peers + k: [float(t)] for k, t in enumerate(self.joins)}
        for rank, times in _by_rank(self.restarts).items():
            requests.setdefault(rank, []).extend(times)
        return Churn(self.slots, self.peers, deaths=_by_rank(self.deaths), requests=requests,
                     restart_after=self.restart_after, mtbf=self.mtbf, seed=self.seed)

    @property
    def leaves_at_once(self) -> bool:
        """Whether a leave takes effect at once under this spec's policy, as
        ``peer.leave()`` does on real peers (every policy but those that hand their state off
        at a leave, push-sum: those leave at a step boundary the group agrees on)."""
        from gossip.policies import make

        return not make(self.policy, **self.policy_options).hands_off_at_leave

    @property
    def scheduled(self) -> bool:
        """Whether the run's peers are virtual threads, one running at a time in
        virtual-time order (scheduler.py): the asynchronous policy's, whose background
        threads meet on timed channels."""
        return self.policy == "asynchronous"

    @property
    def slots(self) -> int:
        """Every peer that takes part at some point: ``peers`` and the ``joins``."""
        return self.peers + len(self.joins)

    def network(self) -> Links:
        """Every directed link of the simulated peers (the joiners' too), as the spec
        describes them."""
        if self.links is not None:
            return Links.from_file(self.slots, self.links)
        link = parse_link(self.link or "", "link")
        if self.regions is not None:
            wan = parse_link(self.wan or "", "wan")
            if wan is None:
                raise ValueError(f"simulate: wan={self.wan!r}: the links between regions need "
                                 "a rate, e.g. 100mbit,40ms")
            return Links.regions(self.slots, self.regions, link, wan)
        return Links.uniform(self.slots, link)


def _by_rank(pairs: tuple[tuple[int, float], ...]) -> dict[int, list[float]]:
    """(rank, seconds) pairs -> rank -> its seconds, ascending."""
    out: dict[int, list[float]] = {}
    for rank, when in pairs:
        out.setdefault(int(rank), []).append(float(when))
    return {rank: sorted(times) for rank, times in out.items()}


@dataclass(frozen=True)
class PeerResult:
    """One peer's end: its flat parameters, test accuracy, losses per step and clock."""

    rank: int
    parameters: np.ndarray
    accuracy: float
    losses: list[float]
    clocks: list[float]
    bytes_sent: int
    first_step: int = 0   # (a restarted peer's: the step it joined at)


@dataclass(frozen=True)
class TrainingResult:
    """What simulate_training measured (``to_dict()`` for JSON)."""

    spec: TrainingSpec
    peers: list[PeerResult]     # the survivors'
    consensus: float            # the peers' mean distance to their average
    averaged_accuracy: float    # the averaged model's test accuracy
    simulated_seconds: float    # the latest peer's clock at the end
    seconds: float              # real time the simulation took
    died: list[int] = field(default_factory=list)   # a rank per death, ascending
    #: Bytes sent over each directed link that carried any, (src, dst) -> bytes: messages
    #: and each collective's algorithm (Links.collective_sends), the dead's included.
    link_bytes: dict[tuple[int, int], int] = field(default_factory=dict)
    region: list[int] = field(default_factory=list)  # each peer's region (links.py)
    restarted: list[int] = field(default_factory=list)   # a rank per restart, ascending
    left: list[int] = field(default_factory=list)        # planned leavers (not in peers)
    joined: list[int] = field(default_factory=list)      # new peers' slots, admitted
    #: About ten points of the run (trace_points): accuracy, averaged accuracy and consensus
    #: against simulated time (trace.py).
    trace: list[dict] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        """The peers' own models' mean test accuracy."""
        return float(np.mean([p.accuracy for p in self.peers]))

    def bytes_between_regions(self) -> np.ndarray:
        """Bytes sent from region a to region b (K x K; 1 x 1 without regions): the load of
        each WAN link when peers are grouped in regions."""
        count = max(self.region, default=0) + 1
        out = np.zeros((count, count), dtype=np.int64)
        for (a, b), n in self.link_bytes.items():
            out[self.region[a], self.region[b]] += n
        return out

    def to_dict(self) -> dict[str, Any]:
        spec = asdict(self.spec)
        return {"spec": spec, "accuracy": self.accuracy,
                "worst_accuracy": min(p.accuracy for p in self.peers),
                "averaged_accuracy": self.averaged_accuracy, "consensus": self.consensus,
                "simulated_seconds": self.simulated_seconds, "seconds": self.seconds,
                "died": list(self.died),
                "bytes_per_peer": float(np.mean([p.bytes_sent for p in self.peers])),
                "bytes_sent": {str(p.rank): p.bytes_sent for p in self.peers},
                # Each peer's clock at its last step's end (asynchronous peers end apart).
                "peer_seconds": {str(p.rank): p.clocks[-1] if p.clocks else 0.0
                                 for p in self.peers},
                "bytes_per_link": [[a, b, n] for (a, b), n in sorted(
                    self.link_bytes.items(), key=lambda item: (-item[1], item[0]))],
                "bytes_between_regions": self.bytes_between_regions().tolist(),
                "restarted": list(self.restarted), "left": list(self.left),
                "joined": list(self.joined),
                # The steps some peer that ended the run took part in (with churn every
                # one of them may have joined after the first steps), and at each the mean
                # loss and the latest clock of those peers.
                "steps": [k for k, _ in self._by_step("losses")],
                "loss": [float(np.mean(col)) for _, col in self._by_step("losses")],
                "time": [max(col) for _, col in self._by_step("clocks")],
                "trace": [dict(point) for point in self.trace]}

    def _by_step(self, what: str) -> list[tuple[int, list[float]]]:
        """(step, ``what`` (losses or clocks) of every peer that ran that step) for every step
        one of ``peers`` ran (a restarted peer's from the step it joined at; its earlier
        lives, which died, are not among them)."""
        steps = max(p.first_step + len(getattr(p, what)) for p in self.peers)
        out: list[list[float]] = [[] for _ in range(steps)]
        for p in self.peers:
            for k, value in enumerate(getattr(p, what)):
                out[p.first_step + k].append(value)
        return [(k, col) for k, col in enumerate(out) if col]


def measure_step_seconds(hidden: int = 128, batch: int = 16, *, steps: int = 30) -> float:
    """This machine's compute of one step of the task's MLP (``hidden`` units, ``batch``
    samples; one torch thread, as each simulated peer): the median of ``steps`` timed steps
    after a few untimed ones, for TrainingSpec.step_seconds."""
    import torch
    import torch.nn.functional as F

    x, y, _, _ = _task_data()
    torch.set_num_threads(1)
    model = _model(hidden)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rng = np.random.default_rng(0)
    times = []
    for k in range(steps + 5):
        batch_rows = torch.from_numpy(rng.integers(0, len(y), batch))
        start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x[batch_rows]), y[batch_rows]).backward()
        opt.step()
        if k >= 5:
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def _model(hidden: int) -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def train_peer(peer: Any, spec: TrainingSpec, tick: Callable[[float], None] = lambda s: None,
               trace: Callable[[int, Any], None] = lambda steps, model: None) -> PeerResult:
    """The loop every peer runs: the digits MLP (seeded weights, this rank's shard, seeded
    batches), ``spec.steps`` steps through gossip.DistributedOptimizer with ``spec.policy``;
    ``tick(seconds)`` charges each step's compute (the simulator's clock; a no-op for real);
    ``trace(steps, model)`` after each step counted (the simulator's TrainingTrace)."""
    import torch
    import torch.nn.functional as F

    import gossip
    from gossip.demo.data import shard
    from gossip.demo.evaluation import evaluate, flat_parameters
    from gossip.policies import make

    x, y, test_x, test_y = _task_data()
    # Its slot: the rank it starts with (a view change renumbers; a restarted peer keeps its
    # slot's) of the spec's peers (its shard, its seeds).
    n, rank = spec.slots, getattr(peer, "starting_rank", peer.rank)
    rows = torch.from_numpy(shard(len(y), rank, n, seed=spec.seed, labels=y.numpy(),
                                  alpha=spec.non_iid)
                            if len(y) >= n else np.arange(len(y)))
    rng = np.random.default_rng([spec.seed, rank])
    with _SEEDING:   # (torch's seed is the process's: simulated peers are threads of one)
        torch.manual_seed(spec.seed)
        model = _model(spec.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=spec.momentum)
    dopt = gossip.DistributedOptimizer(opt, peer=peer, policy=make(spec.policy,
                                                                  **spec.policy_options))
    slow = spec.straggler[1] if spec.straggler and spec.straggler[0] == rank else 1.0
    sigma = spec.step_jitter
    jitter = np.random.default_rng([spec.seed, rank, 1]).lognormal(
        -sigma * sigma / 2, sigma, spec.steps) if sigma else np.ones(spec.steps)
    losses: list[float] = []     # of every step counted, from ``first``
    clocks: list[float] = []     # the simulated clock at each counted step's end
    first = dopt.policy.step     # (0, or a restarted peer's: the state it took goes on there)
    try:
        # Until the policy counted spec.steps steps: a step a recovery cut off is begun again
        # (not counted: Policy.after_step), as a real loop driven by the step count does.
        while (k := dopt.policy.step) < spec.steps:
            batch = rows[torch.from_numpy(rng.integers(0, len(rows), spec.batch))]
            dopt.zero_grad()
            tick(spec.step_seconds * slow * float(jitter[k]))   # the step's compute, before
            #                                                    what backward sends
            loss = F.cross_entropy(model(x[batch]), y[batch])
            loss.backward()
            dopt.step()
            # (A change at once can move the count on by more than one, to the step count of
            # the member furthest on: the steps it passed end here too.)
            for done in range(k + 1, dopt.policy.step + 1):
                losses.append(loss.item())
                clocks.append(float(getattr(peer, "clock", 0.0)))
                trace(done, model)
            if getattr(peer, "departed", False):   # (a simulated planned leave took effect)
                break
        accuracy = evaluate(model, test_x, test_y)[0]
        sent = int(peer.stats()["bytes_sent"])
    finally:
        dopt.close()
    return PeerResult(rank, flat_parameters(model), accuracy, losses, clocks, sent, first)


def simulate_training(spec: TrainingSpec, *, timeout: float = 600.0) -> TrainingResult:
    """Run ``spec.peers`` peers of ``spec.policy`` in this process (one thread each; torch set
    to one intra-op thread) on the virtual clock; every wait bounded by ``timeout`` real
    seconds (OperationTimeout naming what it waited for)."""
    import torch

    import topologies
    from gossip.demo.evaluation import flat_parameters

    torch.set_num_threads(1)
    topology = topologies.parse(spec.topology, spec.peers)
    fabric = Fabric(spec.slots, spec.network(), timeout=timeout, churn=spec.churn(),
                    detect=spec.detect_seconds,
                    leaves={int(r): float(t) for r, t in spec.leaves},
                    leave_at_once=bool(spec.leaves) and spec.leaves_at_once,
                    scheduled=spec.scheduled)
    results: list[PeerResult | None] = [None] * spec.slots
    errors: list[BaseException] = []
    started = time.perf_counter()
    test = _task_data()[2:]
    tracer = TrainingTrace(spec.steps, lambda model: _accuracy(model, test),
                           points=spec.trace_points)

    def tracing(rank: int) -> Callable[[int, Any], None]:
        def trace(steps: int, model: Any) -> None:
            if tracer.wants(steps):
                tracer.record(steps, rank, fabric.life_of(rank), fabric.clock[rank], model,
                              flat_parameters(model))
        return trace

    def run(rank: int) -> None:
        # The slot's lives one after the other: a process per life, the next one (a restart)
        # asking to join once the one before died, as long as the churn says one does.
        joining = rank >= spec.peers
        while True:
            host = SimHost(fabric, rank, topology, timeout=timeout, joining=joining)
            try:
                if joining and not host.wait_admitted():
                    return   # (the others ended before it was admitted)
                results[rank] = train_peer(host, spec, lambda s: fabric.advance(rank, s),
                                           tracing(rank))
                fabric.finished(rank)
                return
            except SimulatedDeath:
                if not fabric.mark_dead(rank):
                    return
                joining = True
            except BaseException as exc:   # (reported below, with the rank)
                errors.append(exc)
                fabric.abort(f"rank {rank} failed: {type(exc).__name__}: {exc}")
                return

    if fabric.scheduler is not None:   # (virtual threads: one at a time, by virtual time)
        for r in range(spec.slots):
            fabric.scheduler.spawn(functools.partial(run, r), r, f"simulated-peer-{r}",
                                   main=True)
        fabric.scheduler.run()
        if fabric.scheduler.failed is not None and not errors:   # (a deadlock)
            raise fabric.scheduler.failed
    else:
        threads = [threading.Thread(target=run, args=(r,), name=f"simulated-peer-{r}",
                                    daemon=True) for r in range(spec.slots)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    done = [r for r in results if r is not None and r.rank not in fabric.left]
    if not done:
        raise RuntimeError(f"simulate: every peer died ({sorted(fabric.dead)})")
    stacked = np.stack([p.parameters.astype(np.float64) for p in done])
    average = stacked.mean(axis=0)
    consensus = float(np.linalg.norm(stacked - average, axis=1).mean())
    data_model = _averaged_accuracy(average, spec)
    return TrainingResult(spec, done, consensus, data_model,
                          max(fabric.clock[p.rank] for p in done), time.perf_counter() - started,
                          sorted(fabric.died), dict(fabric.link_bytes),
                          [int(r) for r in fabric.links.region],
                          sorted(r for r, life in fabric.admitted if life >= 1),
                          sorted(fabric.left),
                          sorted(r for r, life in fabric.admitted if life == 0),
                          tracer.points(lambda mean: _averaged_accuracy(mean, spec)))


def _accuracy(model: Any, test: tuple[Any, Any]) -> float:
    """``model``'s test accuracy as evaluate() counts it (one forward pass: the digits' 359
    test images are one of its chunks), without its loss: a fifth of its time, for the
    trace's every peer at every point."""
    import torch

    x, y = test
    with torch.no_grad():
        return int((model(x).argmax(1) == y).sum()) / len(y)


_DATA: list[tuple[Any, Any, Any, Any]] = []   # the task's tensors, made once a process


def _task_data() -> tuple[Any, Any, Any, Any]:
    """(train x, train y, test x, test y) of the digits, normalised as the demo does; made
    once per process and shared, read-only, by every simulated peer."""
    with _SEEDING:
        if not _DATA:
            from gossip.demo.data import load_digits
            from gossip.demo.evaluation import pixel_statistics, tensors

            data = load_digits()
            mean, std = pixel_statistics(data)
            _DATA.append(tensors(data.train_images, data.train_labels, data.max_value, mean,
                                 std)
                         + tensors(data.test_images, data.test_labels, data.max_value, mean,
                                   std))
        return _DATA[0]


def _averaged_accuracy(parameters: np.ndarray, spec: TrainingSpec) -> float:
    import torch

    from gossip.demo.evaluation import evaluate

    _, _, test_x, test_y = _task_data()
    model = _model(spec.hidden)
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(torch.from_numpy(parameters.astype(np.float32)),
                                            model.parameters())
    return evaluate(model, test_x, test_y)[0]
