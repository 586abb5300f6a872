"""What `gossip demo` runs: its options, each checked at construction (ValueError, one line),
and the data sets and epoch counts they default to."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from gossip.demo.kill import Kill
from gossip.demo.straggler import Straggler

__all__ = ["DemoOptions", "DATASETS", "DEFAULT_EPOCHS", "KILL_EPOCHS", "TARGETS", "MAX_PEERS"]

DATASETS = ("digits", "shifted-digits", "mnist")
#: Epochs per policy when not given: enough on digits for every policy to pass 95%; on the
#: shifted digits (4 placements of each image, so 4x the steps per epoch) to pass 90%.
DEFAULT_EPOCHS = {"digits": 20, "shifted-digits": 5, "mnist": 2}
#: Under --kill: enough for the run to outlast the restart (a new process takes 2-4 s to come
#: back here; 20 epochs of digits are over in about 2 s).
KILL_EPOCHS = {"digits": 100, "shifted-digits": 25, "mnist": 2}
#: "Time to X% accuracy" is measured for this X: one that every policy passes on an easy run,
#: so that the column tells them apart by time (the shifted digits end at 93-97%).
TARGETS = {"digits": 0.95, "shifted-digits": 0.90, "mnist": 0.95}
MAX_PEERS = 64


@dataclass(frozen=True)
class DemoOptions:
    """What `gossip demo` runs; every field is checked at construction (ValueError)."""

    policies: tuple[str, ...]          # canonical policy names, in the order to train them
    peers: int = 4                     # peer processes on this machine
    topology: str = "ring"             # the peers' graph (gossip, push-sum, asynchronous)
    epochs: int | None = None          # per policy; None: DEFAULT_EPOCHS (KILL_EPOCHS) of the data
    dataset: str = "digits"            # "digits", "shifted-digits" (both inside scikit-learn)
                                       # or "mnist" (IDX files)
    data_dir: str | None = None        # where MNIST's IDX files are
    out: str = "gossip-demo"           # directory for demo.png and demo.json
    batch_size: int = 16               # samples per peer per step
    lr: float = 0.05                   # SGD learning rate
    seed: int = 0                      # weights, shards and batch order
    baseline: bool = True              # also train one process with the total batch
    timeout: float = 1800.0            # deadline of the whole run, seconds
    bars: bool | None = None           # progress bars: None = when stderr is a terminal
    policy_options: dict = field(default_factory=dict)  # name -> extra policy kwargs
    kill: Kill | None = None           # a peer SIGKILLed and started again, in every policy
    link: str | None = None            # emulated network per link, "1gbit,2ms" (GOSSIP_LINK)
    non_iid: float | None = None       # Dirichlet alpha of each peer's class mix (None: iid)
    straggler: Straggler | None = None  # a peer k times slower per step

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
        if self.kill is not None:
            self.kill.check(self.peers)
        if self.straggler is not None:
            self.straggler.check(self.peers)
        if self.link is not None:
            from collectives.transport.emulation import parse_link

            parse_link(self.link, "--link")  # a bad value fails here, not in every peer
        if self.non_iid is not None and not (math.isfinite(self.non_iid) and self.non_iid > 0):
            raise ValueError(f"--non-iid must be a positive alpha, got {self.non_iid}")
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError(f"--timeout must be a positive number of seconds, got "
                             f"{self.timeout}")

    @property
    def epochs_per_policy(self) -> int:
        """``epochs``, or the data set's DEFAULT_EPOCHS (KILL_EPOCHS under --kill) when not
        given."""
        if self.epochs is not None:
            return self.epochs
        return (DEFAULT_EPOCHS if self.kill is None else KILL_EPOCHS)[self.dataset]
