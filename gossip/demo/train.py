"""What each peer of `gossip demo` runs: the CNN trained on its shard under each averaging
policy in turn, evaluated on the test set during training (4 times per epoch by default).

    results = gossip.testing.spawn(run_peer, n=4, args=(dataset, TrainConfig(...)))

Every policy starts from the same weights (same seed on every peer) and the same data
order, so the policies differ only in how the peers combine their work. At each evaluation
every peer evaluates its *own* model on the whole test set and records the result and its
parameters (gossip/demo/records.py); the launching process averages them over the peers and
computes the consensus distance. No diagnostic is a collective: they cost the policies no
traffic and no waiting, and they go on while a peer is dead (``--kill``).

A peer's place is its *slot*, the rank it was launched with (``peer.settings.rank``): its
shard and its batch order follow the slot, so a process that takes a killed peer's slot over
(gossip/demo/kill.py) trains on that peer's data from the step it joins at, while its rank in
the group's view may differ.

The reporting slot (0, or 1 when peer 0 is the one killed) appends progress as JSON lines to
``TrainConfig.progress_path`` (the launching process draws the progress bars from them);
slot 0 also trains the single-process SGD baseline after the last policy, when asked to.
"""
from __future__ import annotations

import inspect
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from gossip.demo.data import Dataset, DataError, shard
from gossip.demo.evaluation import evaluate, flat_parameters, pixel_statistics, tensors
from gossip.demo.kill import Kill, die
from gossip.demo.straggler import Straggler
from gossip.demo.loop import Loop
from gossip.demo.model import count_parameters, make_cnn
from gossip.demo.pace import SpeedShare
from gossip.demo.records import PeerRecords, finished_training

__all__ = ["TrainConfig", "run_peer", "run_baseline", "make_policy", "BASELINE"]

#: The name of the single-process SGD baseline in results and reports.
BASELINE = "baseline"

#: Seconds a peer that finished waits for the other live members to finish (under --kill,
#: a policy whose peers count their own steps): _end_together_after_a_death.
FINISH_WAIT = 60.0

log = logging.getLogger("gossip")


@dataclass(frozen=True)
class TrainConfig:
    """How every peer trains; the same object goes to every peer."""

    policies: tuple[str, ...]             # policy names, trained one after the other
    records_dir: str                      # where the peers write their records (records.py)
    epochs: int = 20                      # passes over each peer's shard, per policy
    batch_size: int = 16                  # samples per peer per step
    lr: float = 0.05                      # SGD learning rate
    momentum: float = 0.9                 # SGD momentum (local to each peer)
    seed: int = 0                         # weights, shards and batch order
    target_accuracy: float = 0.95         # "time to X% accuracy" is measured for this X
    baseline: bool = True                 # slot 0 also trains one process at n x batch
    progress_path: str | None = None      # where the reporting slot appends progress events
    progress_every: int = 4               # progress events per epoch (step granularity)
    evals_per_epoch: int = 4              # test-set evaluations per epoch (the curves' points)
    policy_options: dict = field(default_factory=dict)  # name -> extra policy kwargs
    kill: Kill | None = None              # a peer that dies and is started again (kill.py)
    non_iid: float | None = None          # Dirichlet alpha of the peers' class mixes (None: iid)
    straggler: Straggler | None = None    # a peer that takes k times as long per step

    @property
    def reporter(self) -> int:
        """The slot that reports progress: one that is never killed, nor the straggler."""
        special = {x.rank for x in (self.kill, self.straggler) if x is not None}
        return min(set(range(len(special) + 1)) - special)


def make_policy(name: str, peer: Any, *, kill: bool = False, **options: Any) -> Any:
    """The policy ``name`` as the demo runs it: every policy that runs on a graph (its class
    has a ``default_topology``: gossip, push-sum, asynchronous) on the peers' topology, which
    is what the demo's --topology sets (push-sum and asynchronous would otherwise pick their
    own default graph), the others with their defaults. ``kill``: a peer will die, so a policy
    that can re-form its group (an ``elastic`` argument: synchronous, local-sgd, elastic) does, instead
    of raising PeerLost."""
    from gossip import policies

    cls = policies.policy_class(name)
    if cls.default_topology is not None and "topology" not in options:
        options["topology"] = peer.topology
    if kill and "elastic" in inspect.signature(cls).parameters:
        options.setdefault("elastic", True)
    return policies.make(name, **options)


class _Progress:
    """JSON-lines progress events, written by the reporting slot only (``always``: by this
    peer whatever its slot, for its own news: killed, back)."""

    def __init__(self, path: str | None, enabled: bool) -> None:
        self._path = path
        self._file = open(path, "a", buffering=1) if path and enabled else None

    def emit(self, **event: Any) -> None:
        if self._file is not None:
            self._file.write(json.dumps(event) + "\n")

    def always(self, **event: Any) -> None:
        if self._path:
            # One short line with O_APPEND: it lands whole beside the reporter's lines.
            with open(self._path, "a") as f:
                f.write(json.dumps(event) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


@dataclass
class _Data:
    """This peer's shard, the test set and the loop's shape."""

    x: Any
    y: Any
    test_x: Any
    test_y: Any
    steps_per_epoch: int


def _data(dataset: Dataset, slot: int, n: int, config: TrainConfig) -> _Data:
    scale = dataset.max_value
    mean, std = pixel_statistics(dataset)
    rows = shard(len(dataset.train_labels), slot, n, seed=config.seed,
                 labels=dataset.train_labels, alpha=config.non_iid)
    x, y = tensors(dataset.train_images[rows], dataset.train_labels[rows], scale, mean, std)
    test_x, test_y = tensors(dataset.test_images, dataset.test_labels, scale, mean, std)
    steps_per_epoch = len(rows) // config.batch_size
    if steps_per_epoch < 1:
        raise DataError(f"a shard of {len(rows)} samples is smaller than one batch of "
                        f"{config.batch_size}: use fewer peers or a smaller batch")
    return _Data(x, y, test_x, test_y, steps_per_epoch)


def run_peer(peer: Any, dataset: Dataset, config: TrainConfig) -> dict:
    """Train every policy of ``config`` on this peer's shard (its records go to
    ``config.records_dir``); slot 0 then trains the baseline if ``config.baseline``. Returns
    the slot and the steps trained per policy."""
    import torch

    torch.set_num_threads(1)  # n peers share the machine's cores: no oversubscription
    # The launch rank and size: a restarted process's rank in the view may be another.
    slot, n = peer.settings.rank, peer.settings.world_size
    incarnation = int(os.environ.get("GOSSIP_INCARNATION", "") or 0)
    data = _data(dataset, slot, n, config)
    progress = _Progress(config.progress_path, slot == config.reporter)
    out: dict[str, Any] = {"slot": slot, "incarnation": incarnation, "policies": {}}
    try:
        for name in config.policies:
            out["policies"][name] = _train_policy(peer, name, config, data, dataset,
                                                  progress, slot=slot,
                                                  incarnation=incarnation)
        if config.baseline and slot == 0:
            _train_baseline(n, config, dataset, progress)
    finally:
        progress.close()
    return out


def run_baseline(peer: Any, dataset: Dataset, config: TrainConfig, peers: int) -> dict:
    """The baseline alone (``gossip demo --kill`` starts a group per policy): one process,
    the batch of ``peers`` peers."""
    import torch

    torch.set_num_threads(1)
    progress = _Progress(config.progress_path, True)
    try:
        _train_baseline(peers, config, dataset, progress)
    finally:
        progress.close()
    return {"slot": peer.rank, "policies": {}}


def _sgd_step(model: Any, optimizer: Any) -> Any:
    """One training step on a batch, returning its loss: the same for a plain torch optimizer
    (the baseline) and a gossip.DistributedOptimizer (the policies)."""
    import torch.nn.functional as F

    def train_step(xb: Any, yb: Any) -> float:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        return loss.item()
    return train_step


def _slowed(train_step: Any, straggler: Straggler) -> Any:
    """--straggler: the step, then a sleep of (factor - 1) times its duration."""
    def slow_step(xb: Any, yb: Any) -> float:
        start = time.perf_counter()
        loss = train_step(xb, yb)
        time.sleep(straggler.delay(time.perf_counter() - start))
        return loss
    return slow_step


def _train_policy(peer: Any, name: str, config: TrainConfig, data: _Data, dataset: Dataset,
                  progress: _Progress, *, slot: int, incarnation: int) -> dict:
    import torch

    import gossip

    progress.emit(event="prepare", policy=name)  # so a failure in set-up names the policy
    joining = peer.joining   # a restarted process: it takes the running job's state below
    torch.manual_seed(config.seed)  # the same initial weights on every peer
    model = make_cnn(dataset.image_shape, dataset.classes)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    policy = make_policy(name, peer, kill=config.kill is not None,
                         **config.policy_options.get(name, {}))
    records = PeerRecords(config.records_dir, name, slot, incarnation)
    try:
        dopt = gossip.DistributedOptimizer(opt, peer=peer, policy=policy)  # joiner: the state
        if joining:
            joined = peer.stats().get("join", {})
            records.write("joined", step=dopt.policy.step, wall=time.time(),
                          state_bytes=joined.get("state_bytes"),
                          receive_seconds=joined.get("receive_seconds"),
                          donors=joined.get("donors"))
            progress.always(event="rejoined", policy=name, slot=slot, step=dopt.policy.step)
        else:
            peer.barrier()   # every original peer starts the clock together
        kill_step = None
        if config.kill is not None and config.kill.rank == slot and incarnation == 0:
            kill_step = config.kill.step(config.epochs * data.steps_per_epoch)

        def measure(point: dict) -> dict:
            point["accuracy"], point["test_loss"] = evaluate(model, data.test_x, data.test_y)
            records.evaluation(point, flat_parameters(model))
            return point

        sent = peer.stats()["bytes_sent"]
        loop = Loop(name, config, data.steps_per_epoch, config.batch_size,
                    np.random.default_rng([config.seed, slot]), progress)

        def after_step(step: int) -> None:
            if kill_step is not None and step >= kill_step:
                _die(records, progress, name, slot, step, loop.samples,
                     peer.stats()["bytes_sent"] - sent)

        train_step = _sgd_step(model, dopt)
        if config.straggler is not None and config.straggler.rank == slot:
            train_step = _slowed(train_step, config.straggler)
        share = None
        if (policy.own_steps and config.epochs > 1
                and (config.straggler is not None or config.kill is not None)):
            share = SpeedShare(peer, config.records_dir, name, slot=slot,
                               slots=peer.world_size, total=config.epochs * data.steps_per_epoch,
                               steps_per_epoch=data.steps_per_epoch,
                               first_step=dopt.policy.step, allreduce=config.kill is None)
        try:
            record = loop.run(data.x, data.y, train_step, measure,
                              lambda: dopt.policy.step, after_step, share)
            if policy.own_steps and loop.last_point is not None:
                if config.kill is None:
                    _end_together(peer, dopt.policy, loop.last_point, measure)
                else:
                    _end_together_after_a_death(peer, dopt.policy, loop.last_point, measure,
                                                records)
            sent = peer.stats()["bytes_sent"] - sent
            stats = dopt.stats()
        finally:
            dopt.close()
        # The next policy starts together, after this one's threads stopped; and nobody
        # closes its sockets while another still waits for its last message. Under --kill
        # a policy that does not re-form its group may still count the dead peer in it: a
        # barrier would wait on it, so those peers end on their own (their last exchange
        # has had the last evaluation's time to land; one that did not costs a neighbour
        # its last gossip round, nothing more).
        if config.kill is None or getattr(policy, "elastic", False):
            peer.barrier()
        record.update(policy=name, bytes_sent=sent, comm_seconds=stats["comm_seconds"],
                      parameters=count_parameters(model), mixing=_mixing_counters(stats))
        records.write("done", **record)
    finally:
        records.close()
    progress.emit(event="done", policy=name, accuracy=loop.last_accuracy,
                  wall=record["wall_seconds"])
    return {"steps": record["steps"], "first_step": record["first_step"]}


def _end_together(peer: Any, policy: Any, last: dict, measure: Callable[[dict], dict]) -> None:
    """(A policy whose peers count their own steps: asynchronous.) A peer that finished its
    share waits for the others with its policy open, so it goes on answering their exchanges
    (AD-PSGD's workers are averaged with until the run ends; closed, it would leave its
    neighbours without a partner for the end of theirs); once all finished, quiesce() lands
    every exchange in flight in the parameters, and the last evaluation is made again (same
    point: step, index, time) on the model as the run leaves it, the same moment for every
    peer. records.collect keeps the later of two evaluations of one point."""
    peer.barrier()
    policy.quiesce()
    measure(dict(last))


def _end_together_after_a_death(peer: Any, policy: Any, last: dict,
                                measure: Callable[[dict], dict], records: PeerRecords) -> None:
    """_end_together under --kill: a barrier would wait on the dead peer (a member until its
    restarted process takes its place), so the peer writes that it finished and waits, its
    policy open, until as many processes did as its view has live members (the restarted
    peer among them once admitted; not while its first incarnation is dead: a restart that
    comes after the others finished finds nobody stepping to admit it, and times out as
    before). Then quiesce() (a collective of the live members) and the last evaluation
    again, as _end_together. A member that does not finish within FINISH_WAIT seconds is
    not waited for longer (logged)."""
    records.write("finished", step=last["step"])
    until = time.monotonic() + FINISH_WAIT
    while True:
        live = peer.world_size - len(set(peer.lost_peers()))
        done = finished_training(records.directory, records.policy, peer.world_size)
        if done >= live:
            break
        if time.monotonic() > until:
            log.warning("rank %d: %d of %d live members finished %s after %gs; measuring "
                        "without the others", peer.rank, done, live, records.policy,
                        FINISH_WAIT)
            break
        time.sleep(0.05)
    policy.quiesce()
    measure(dict(last))


def _mixing_counters(stats: dict) -> dict:
    """The policy's own counters of how it mixed (policy.stats(): rounds, pushes held back,
    messages per peer, weights, ...), numbers and short lists only: what demo.json keeps per
    peer to trace the mixing (issue #39)."""
    out: dict = {}
    for key, value in stats.items():
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)):
            out[key] = value
        elif isinstance(value, (list, tuple)) and len(value) <= 64 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            out[key] = list(value)
    return out


def _die(records: PeerRecords, progress: _Progress, name: str, slot: int, step: int,
         samples: int, sent: int) -> None:
    """--kill: record the death (what this process trained and sent), then SIGKILL."""
    records.write("killed", step=step, wall=time.time(), samples=samples, bytes_sent=sent)
    progress.always(event="killed", policy=name, slot=slot, step=step)
    records.close()
    die()


def _train_baseline(n: int, config: TrainConfig, dataset: Dataset, progress: _Progress) -> None:
    """One process, plain SGD with the peers' total batch (n x batch_size) and the same
    number of steps: what synchronous training computes, without the network."""
    import torch

    scale, (mean, std) = dataset.max_value, pixel_statistics(dataset)
    x, y = tensors(dataset.train_images, dataset.train_labels, scale, mean, std)
    test_x, test_y = tensors(dataset.test_images, dataset.test_labels, scale, mean, std)
    steps_per_epoch = len(dataset.train_labels) // n // config.batch_size   # as the peers'
    torch.manual_seed(config.seed)
    model = make_cnn(dataset.image_shape, dataset.classes)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    sgd_step = _sgd_step(model, opt)
    records = PeerRecords(config.records_dir, BASELINE, 0, 0)
    steps = 0

    def train_step(xb: Any, yb: Any) -> float:
        nonlocal steps
        steps += 1
        return sgd_step(xb, yb)

    def measure(point: dict) -> dict:
        point["accuracy"], point["test_loss"] = evaluate(model, test_x, test_y)
        records.evaluation(point, None)
        return point

    try:
        loop = Loop(BASELINE, config, steps_per_epoch, n * config.batch_size,
                    np.random.default_rng([config.seed, n]), progress)
        record = loop.run(x, y, train_step, measure, lambda: steps)
        record.update(policy=BASELINE, bytes_sent=0, comm_seconds=0.0,
                      parameters=count_parameters(model))
        records.write("done", **record)
    finally:
        records.close()
    progress.emit(event="done", policy=BASELINE, accuracy=loop.last_accuracy,
                  wall=record["wall_seconds"])
