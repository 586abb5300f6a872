"""Running the demo: check the settings, load the data, start the peers on this machine
(gossip.testing.spawn: real processes on loopback, a global deadline, the first failure stops
the rest), follow their progress, then print the table and write the PNG and JSON.

    code = run_demo(DemoOptions(peers=4, policies=("synchronous", "gossip"), epochs=5,
                                out="demo-out"))

Everything the user can get wrong is checked before any process starts, as a ValueError
with one line. A peer that fails or dies stops the run: the message names the peer, what
happened and the policy being trained; every peer's traceback and output go to
OUT/failure.log.
"""
from __future__ import annotations

import importlib.util
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import IO

from collectives import defaults
from gossip.demo.data import Dataset, load_digits, load_mnist
from gossip.demo.progress import ProgressDisplay
from gossip.demo.report import format_table, summarize, write_json, write_png
from gossip.demo.train import BASELINE, TrainConfig, run_peer

__all__ = ["DemoOptions", "DemoFailed", "run_demo", "load_dataset", "DATASETS",
           "DEFAULT_EPOCHS", "PNG_NAME", "JSON_NAME"]

DATASETS = ("digits", "mnist")
#: Epochs per policy when not given: enough on digits for every policy to pass 95%.
DEFAULT_EPOCHS = {"digits": 20, "mnist": 2}
PNG_NAME = "demo.png"
JSON_NAME = "demo.json"
MAX_PEERS = 64
_PEER_TIMEOUT_S = defaults.TIMEOUT  # each blocking call; a dead peer is noticed at once anyway


class DemoFailed(RuntimeError):
    """A peer failed or died, or the run passed its deadline; the message is one line."""


@dataclass(frozen=True)
class DemoOptions:
    """What `gossip demo` runs; every field is checked at construction (ValueError)."""

    policies: tuple[str, ...]          # canonical policy names, in the order to train them
    peers: int = 4                     # peer processes on this machine
    topology: str = "ring"             # the peers' graph (gossip, push-sum, asynchronous)
    epochs: int | None = None          # per policy; None: DEFAULT_EPOCHS of the data set
    dataset: str = "digits"            # "digits" (inside scikit-learn) or "mnist" (IDX files)
    data_dir: str | None = None        # where MNIST's IDX files are
    out: str = "gossip-demo"           # directory for demo.png and demo.json
    batch_size: int = 16               # samples per peer per step
    lr: float = 0.05                   # SGD learning rate
    seed: int = 0                      # weights, shards and batch order
    baseline: bool = True              # also train one process with the total batch
    timeout: float = 1800.0            # deadline of the whole run, seconds
    bars: bool | None = None           # progress bars: None = when stderr is a terminal
    policy_options: dict = field(default_factory=dict)  # name -> extra policy kwargs

    def __post_init__(self) -> None:
        from gossip.policies import names

        known = names()
        if not self.policies:
            raise ValueError(f"no policy given; known policies: {', '.join(known)}, or all")
        for p in self.policies:
            if p not in known:
                raise ValueError(f"unknown policy {p!r}; known policies: {', '.join(known)}, "
                                 "or all")
        if len(set(self.policies)) != len(self.policies):
            raise ValueError(f"policy listed twice in {','.join(self.policies)}")
        if not isinstance(self.peers, int) or not 2 <= self.peers <= MAX_PEERS:
            raise ValueError(f"--peers must be between 2 and {MAX_PEERS}, got {self.peers}")
        if self.epochs is not None and (not isinstance(self.epochs, int) or self.epochs < 1):
            raise ValueError(f"--epochs must be at least 1, got {self.epochs}")
        if self.dataset not in DATASETS:
            raise ValueError(f"unknown dataset {self.dataset!r}; known: {', '.join(DATASETS)}")
        if self.dataset == "mnist" and not self.data_dir:
            raise ValueError("--dataset mnist needs --data-dir PATH, the directory with "
                             "MNIST's four IDX files")
        if self.dataset != "mnist" and self.data_dir:
            raise ValueError(f"--data-dir is for --dataset mnist; {self.dataset} ships inside "
                             "scikit-learn")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"--batch-size must be at least 1, got {self.batch_size}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"--lr must be a positive number, got {self.lr}")
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError(f"--timeout must be a positive number of seconds, got "
                             f"{self.timeout}")

    @property
    def epochs_per_policy(self) -> int:
        """``epochs``, or the data set's DEFAULT_EPOCHS when not given."""
        return self.epochs if self.epochs is not None else DEFAULT_EPOCHS[self.dataset]


def load_dataset(options: DemoOptions) -> Dataset:
    """The data set ``options`` name: MNIST from ``data_dir``, or the digits; DataError if it cannot
    be loaded."""
    if options.dataset == "mnist":
        return load_mnist(options.data_dir)
    return load_digits()


def _check_topology(options: DemoOptions) -> str:
    import topologies

    # topologies.TopologyError is a ValueError: one line via the command's error handling.
    return repr(topologies.parse(options.topology, options.peers))


def _check_plotting() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError("the demo draws its figures with matplotlib, which is not installed; "
                         "pip install 'gossip[demo]'")


def run_demo(options: DemoOptions, *, stdout: IO[str] | None = None,
             stderr: IO[str] | None = None) -> int:
    """Run the demo; returns 0. Bad settings or data raise ValueError (one line), a failed
    run raises DemoFailed (one line; details in OUT/failure.log)."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    graph = _check_topology(options)
    _check_plotting()
    dataset = load_dataset(options)
    shard_size = len(dataset.train_labels) // options.peers
    if shard_size < options.batch_size:
        raise ValueError(f"{options.peers} peers get {shard_size} training samples each, "
                         f"fewer than one batch of {options.batch_size}: use fewer peers or "
                         "a smaller --batch-size")
    os.makedirs(options.out, exist_ok=True)
    epochs = options.epochs_per_policy
    per_policy = f"{epochs} epoch{'s' if epochs != 1 else ''} per policy"
    with tempfile.TemporaryDirectory(prefix="gossip-demo-") as tmp:
        progress_path = os.path.join(tmp, "progress.jsonl")
        config = TrainConfig(policies=tuple(options.policies), epochs=epochs,
                             batch_size=options.batch_size, lr=options.lr, seed=options.seed,
                             baseline=options.baseline, progress_path=progress_path,
                             policy_options=dict(options.policy_options))
        print(f"gossip demo: {dataset.describe()}; {options.peers} peers on {graph} "
              f"(loopback); {per_policy} of {shard_size // options.batch_size} steps, batch "
              f"{options.batch_size} per peer, SGD lr {config.lr:g} momentum "
              f"{config.momentum:g}", file=stderr, flush=True)
        print(f"starting {options.peers} peer processes...", file=stderr, flush=True)
        with ProgressDisplay(progress_path, stream=stderr, bars=options.bars) as display:
            try:
                results = _launch(options, dataset, config)
            except Exception as exc:
                display.close()
                raise _failure(exc, display.current, options) from None

    rows = summarize(results, baseline=BASELINE)
    parameters = results[0]["policies"][options.policies[0]]["parameters"]
    table_header = (f"{dataset.describe()}, CNN of {parameters:,} parameters; "
                    f"{options.peers} peers on {graph}, {per_policy}")
    print(format_table(rows, target=config.target_accuracy, header=table_header),
          file=stdout, flush=True)
    png = os.path.join(options.out, PNG_NAME)
    js = os.path.join(options.out, JSON_NAME)
    info = {"dataset": dataset.name, "train_samples": len(dataset.train_labels),
            "test_samples": len(dataset.test_labels), "image_shape": list(dataset.image_shape),
            "peers": options.peers, "topology": graph, "epochs": epochs,
            "steps_per_epoch": results[0]["steps_per_epoch"],
            "batch_size_per_peer": options.batch_size, "lr": config.lr, "momentum": config.momentum,
            "seed": options.seed, "parameters": parameters,
            "target_accuracy": config.target_accuracy, "policies": list(options.policies)}
    write_json(js, rows, info)
    write_png(png, rows, title=table_header, target=config.target_accuracy)
    print(f"\nwrote {png} and {js}", file=stdout, flush=True)
    return 0


def _launch(options: DemoOptions, dataset: Dataset, config: TrainConfig) -> list[dict]:
    from gossip.testing import spawn

    return spawn(run_peer, n=options.peers, timeout=options.timeout,
                 topology=options.topology, args=(dataset, config),
                 peer_timeout=_PEER_TIMEOUT_S)


def _cause(outcome) -> str:
    """The last line of a peer's traceback: the exception and its message."""
    lines = [ln.strip() for ln in (outcome.error or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _failure(exc: Exception, policy: str | None, options: DemoOptions) -> Exception:
    """A one-line DemoFailed for a failed spawn (details to OUT/failure.log), or ``exc``
    itself when it is not about the peers."""
    from gossip.testing import SpawnError, SpawnTimeout

    if not isinstance(exc, SpawnError):
        return exc
    during = f" while training {policy}" if policy else " while starting"
    log = os.path.join(options.out, "failure.log")
    try:
        with open(log, "w") as f:
            f.write(str(exc) + "\n")
        details = f"; every peer's traceback and output: {log}"
    except OSError:
        details = ""
    if isinstance(exc, SpawnTimeout):
        return DemoFailed(f"the peers did not finish within the {options.timeout:g} s "
                          f"deadline{during}; stopped them{details}")
    outcomes = exc.outcomes
    # The root cause first: a peer that died, then one whose error is not merely the
    # consequence of another's death (PeerLost, timeouts), then any.
    died = [o for o in outcomes if o.status == "died"]
    errors = [o for o in outcomes if o.status == "error"]
    primary = [o for o in errors if not any(k in _cause(o) for k in (
        "PeerLost", "OperationTimeout", "SpawnError"))]
    if died:
        o = died[0]
        what = f"peer {o.rank} died (exit code {o.exitcode})"
    elif primary or errors:
        o = (primary or errors)[0]
        what = f"peer {o.rank} failed: {_cause(o)}"
    else:
        what = str(exc).splitlines()[0]
    return DemoFailed(f"{what}{during}; the other peers were stopped{details}")
