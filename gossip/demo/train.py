"""What each peer of `gossip demo` runs: the CNN trained on its shard under each averaging
policy in turn, evaluated on the test set during training (4 times per epoch by default).

    results = gossip.testing.spawn(run_peer, n=4, args=(dataset, TrainConfig(...)))

Every policy starts from the same weights (same seed on every peer) and the same data
order, so the policies differ only in how the peers combine their work. At each evaluation
every peer evaluates its *own* model on the whole test set; accuracy and losses are then
averaged over the peers (an allreduce), and the consensus distance (the peers' mean distance
to their average model, Policy.consensus_distance) is measured. Those diagnostics are
collectives, so their traffic is measured once per policy (calibration) and taken out of
the bytes sent during training that the policy is charged with.

Rank 0 reports progress as JSON lines appended to ``TrainConfig.progress_path`` (the launching
process draws the progress bars from them), and after the last policy trains the
single-process SGD baseline while the other peers have finished.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gossip.demo.data import Dataset, DataError, shard
from gossip.demo.model import count_parameters, make_cnn

__all__ = ["TrainConfig", "run_peer", "make_policy", "BASELINE"]

#: The name of the single-process SGD baseline in results and reports.
BASELINE = "baseline"
_EVAL_CHUNK = 1000  # test images per forward pass: bounds memory on MNIST's 10000


@dataclass(frozen=True)
class TrainConfig:
    """How every peer trains; the same object goes to every peer."""

    policies: tuple[str, ...]             # policy names, trained one after the other
    epochs: int = 20                      # passes over each peer's shard, per policy
    batch_size: int = 16                  # samples per peer per step
    lr: float = 0.05                      # SGD learning rate
    momentum: float = 0.9                 # SGD momentum (local to each peer)
    seed: int = 0                         # weights, shards and batch order
    target_accuracy: float = 0.95         # "time to X% accuracy" is measured for this X
    baseline: bool = True                 # rank 0 also trains one process at n x batch
    progress_path: str | None = None      # where rank 0 appends JSON-lines progress events
    progress_every: int = 4               # progress events per epoch (step granularity)
    evals_per_epoch: int = 4              # test-set evaluations per epoch (the curves' points)
    policy_options: dict = field(default_factory=dict)  # name -> extra policy kwargs


def make_policy(name: str, peer: Any, **options: Any) -> Any:
    """The policy ``name`` as the demo runs it: every policy that runs on a graph (its class
    has a ``default_topology``: gossip, push-sum, asynchronous) on the peers' topology, which
    is what the demo's --topology sets (push-sum and asynchronous would otherwise pick their
    own default graph), the others with their defaults."""
    from gossip import policies

    if policies.policy_class(name).default_topology is not None and "topology" not in options:
        options["topology"] = peer.topology
    return policies.make(name, **options)


class _Progress:
    """JSON-lines progress events, written by rank 0 only."""

    def __init__(self, path: str | None, rank: int) -> None:
        self._file = open(path, "a", buffering=1) if path and rank == 0 else None

    def emit(self, **event: Any) -> None:
        if self._file is not None:
            self._file.write(json.dumps(event) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _tensors(images: np.ndarray, labels: np.ndarray, max_value: float, mean: float,
             std: float) -> tuple[Any, Any]:
    import torch

    x = (images.astype(np.float32) / max_value - mean) / std
    return torch.from_numpy(x[:, None]), torch.from_numpy(labels.astype(np.int64))


def _evaluate(model: Any, x: Any, y: Any) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of ``model`` on (x, y)."""
    import torch
    import torch.nn.functional as F

    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for lo in range(0, len(y), _EVAL_CHUNK):
            logits = model(x[lo:lo + _EVAL_CHUNK])
            target = y[lo:lo + _EVAL_CHUNK]
            loss += float(F.cross_entropy(logits, target, reduction="sum"))
            correct += int((logits.argmax(1) == target).sum())
    model.train()
    return correct / len(y), loss / len(y)


def _pixel_statistics(dataset: Dataset) -> tuple[float, float]:
    """Mean and standard deviation of the training pixels on the [0, 1] scale: every peer
    normalises with the whole training set's, so they agree. From a histogram of the uint8
    values, so MNIST's 47 MB never becomes a float copy."""
    counts = np.bincount(dataset.train_images.ravel(), minlength=256).astype(np.float64)
    values = np.arange(len(counts)) / dataset.max_value
    mean = float(counts @ values / counts.sum())
    std = float(np.sqrt(counts @ (values - mean) ** 2 / counts.sum()))
    return mean, std or 1.0


def run_peer(peer: Any, dataset: Dataset, config: TrainConfig) -> dict:
    """Train every policy of ``config`` on this peer's shard; returns this peer's records
    (rank 0's also hold the baseline)."""
    import torch

    torch.set_num_threads(1)  # n peers share the machine's cores: no oversubscription
    rank, n = peer.rank, peer.world_size
    scale = dataset.max_value
    mean, std = _pixel_statistics(dataset)
    rows = shard(len(dataset.train_labels), rank, n, seed=config.seed)
    x, y = _tensors(dataset.train_images[rows], dataset.train_labels[rows], scale, mean, std)
    test_x, test_y = _tensors(dataset.test_images, dataset.test_labels, scale, mean, std)
    steps_per_epoch = len(rows) // config.batch_size
    if steps_per_epoch < 1:
        raise DataError(f"a shard of {len(rows)} samples is smaller than one batch of "
                        f"{config.batch_size}: use fewer peers or a smaller batch")
    progress = _Progress(config.progress_path, rank)
    out: dict[str, Any] = {"rank": rank, "world_size": n, "steps_per_epoch": steps_per_epoch,
                           "shard_size": len(rows), "policies": {}}
    try:
        for name in config.policies:
            out["policies"][name] = _train_policy(peer, name, config, x, y, test_x, test_y,
                                                  dataset, steps_per_epoch, progress)
        if config.baseline and rank == 0:
            xs, ys = _tensors(dataset.train_images, dataset.train_labels, scale, mean, std)
            out[BASELINE] = _train_baseline(n, config, xs, ys, test_x, test_y, dataset,
                                            steps_per_epoch, progress)
    finally:
        progress.close()
    return out


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


def _calibrate(peer: Any, policy: Any) -> int:
    """Bytes this peer sends for one round of the demo's diagnostics (consensus distance and
    the metrics allreduce), measured by running them once while nothing else is sent: the
    background threads of the asynchronous policies only push after a training step."""
    before = peer.stats()["bytes_sent"]
    policy.consensus_distance()
    peer.allreduce(np.zeros(3), op="mean")
    return peer.stats()["bytes_sent"] - before


def _fit(name: str, config: TrainConfig, x: Any, y: Any, batch: int, steps_per_epoch: int,
         order: np.random.Generator, train_step: Any, measure: Any, progress: _Progress) -> dict:
    """The training loop shared by the policies and the baseline: ``train_step(xb, yb)``
    returns the batch's loss; ``measure(time, step, epoch, train_loss)`` evaluates. The clock
    starts here and pauses while evaluating: the points' times, ``train_seconds`` and
    ``time_to_target`` are wall-clock seconds of training; ``wall_seconds`` also counts the
    evaluations (which are diagnostics, and would otherwise favour policies that train fast
    per evaluation)."""
    import torch

    every = max(1, steps_per_epoch // max(1, config.progress_every))
    evals = min(max(1, config.evals_per_epoch), steps_per_epoch)
    eval_at = {round(k * steps_per_epoch / evals) for k in range(1, evals + 1)}
    history = [measure(0.0, 0, 0.0, float("nan"))]
    progress.emit(event="start", policy=name, steps=config.epochs * steps_per_epoch)
    reached, eval_seconds, step = None, 0.0, 0
    start = time.perf_counter()
    for epoch in range(config.epochs):
        perm = torch.from_numpy(order.permutation(len(y)))
        loss_sum, losses = 0.0, 0
        for s in range(1, steps_per_epoch + 1):
            idx = perm[(s - 1) * batch:s * batch]
            loss_sum += train_step(x[idx], y[idx])
            losses += 1
            step += 1
            if step % every == 0:
                progress.emit(event="step", policy=name, step=step)
            if s in eval_at:
                trained = time.perf_counter()
                point = measure(trained - start - eval_seconds, step, epoch + s / steps_per_epoch,
                                loss_sum / losses)
                eval_seconds += time.perf_counter() - trained
                loss_sum, losses = 0.0, 0
                history.append(point)
                if reached is None and point["accuracy"] >= config.target_accuracy:
                    reached = point["time"]
        progress.emit(event="epoch", policy=name, epoch=epoch + 1, step=step,
                      accuracy=history[-1]["accuracy"], time=history[-1]["time"])
    wall = time.perf_counter() - start
    return {"steps": step, "samples": step * batch, "wall_seconds": wall,
            "train_seconds": wall - eval_seconds, "time_to_target": reached,
            "history": history}


def _train_policy(peer: Any, name: str, config: TrainConfig, x: Any, y: Any, test_x: Any,
                  test_y: Any, dataset: Dataset, steps_per_epoch: int,
                  progress: _Progress) -> dict:
    import torch

    import gossip

    progress.emit(event="prepare", policy=name)  # so a failure in set-up names the policy
    torch.manual_seed(config.seed)  # the same initial weights on every peer
    model = make_cnn(dataset.image_shape, dataset.classes)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    policy = make_policy(name, peer, **config.policy_options.get(name, {}))
    dopt = gossip.DistributedOptimizer(opt, peer=peer, policy=policy)
    rounds = 0

    train_step = _sgd_step(model, dopt)

    def measure(t: float, step: int, epoch: float, train_loss: float) -> dict:
        nonlocal rounds
        accuracy, test_loss = _evaluate(model, test_x, test_y)
        consensus = dopt.policy.consensus_distance()
        metrics = np.array([accuracy, test_loss, train_loss])
        peer.allreduce(metrics, op="mean")  # the peers' models, averaged
        rounds += 1
        return {"time": t, "step": step, "epoch": epoch, "accuracy": float(metrics[0]),
                "test_loss": float(metrics[1]), "train_loss": float(metrics[2]),
                "consensus": consensus}

    try:
        diag_bytes = _calibrate(peer, policy)
        peer.barrier()
        # The same batches, in the same order, for every policy.
        order = np.random.default_rng([config.seed, peer.rank])
        sent = peer.stats()["bytes_sent"]
        record = _fit(name, config, x, y, config.batch_size, steps_per_epoch, order,
                      train_step, measure, progress)
        sent = peer.stats()["bytes_sent"] - sent
        stats = dopt.stats()
    finally:
        dopt.close()
    peer.barrier()  # the next policy starts together, after this one's threads stopped
    # Charged to the policy: what this peer sent while training, less the evaluations'.
    record.update(policy=name, bytes_sent=sent - diag_bytes * rounds,
                  diagnostic_bytes=diag_bytes * rounds, comm_seconds=stats["comm_seconds"],
                  parameters=count_parameters(model))
    progress.emit(event="done", policy=name, accuracy=record["history"][-1]["accuracy"],
                  wall=record["wall_seconds"])
    return record


def _train_baseline(n: int, config: TrainConfig, x: Any, y: Any, test_x: Any, test_y: Any,
                    dataset: Dataset, steps_per_epoch: int, progress: _Progress) -> dict:
    """One process, plain SGD with the peers' total batch (n x batch_size) and the same
    number of steps: what synchronous training computes, without the network."""
    import torch

    torch.manual_seed(config.seed)
    model = make_cnn(dataset.image_shape, dataset.classes)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)

    train_step = _sgd_step(model, opt)

    def measure(t: float, step: int, epoch: float, train_loss: float) -> dict:
        accuracy, test_loss = _evaluate(model, test_x, test_y)
        return {"time": t, "step": step, "epoch": epoch, "accuracy": accuracy,
                "test_loss": test_loss, "train_loss": train_loss, "consensus": None}

    order = np.random.default_rng([config.seed, n])
    record = _fit(BASELINE, config, x, y, n * config.batch_size, steps_per_epoch, order,
                  train_step, measure, progress)
    record.update(policy=BASELINE, bytes_sent=0, diagnostic_bytes=0, comm_seconds=0.0,
                  parameters=count_parameters(model))
    progress.emit(event="done", policy=BASELINE, accuracy=record["history"][-1]["accuracy"],
                  wall=record["wall_seconds"])
    return record
