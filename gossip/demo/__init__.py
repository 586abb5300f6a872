"""`gossip demo`: train a small CNN on handwritten digits with every averaging policy on
peers of this machine, and compare accuracy, time, throughput, traffic and consensus.

    gossip demo                                   # all policies, 4 peers, digits
    gossip demo --policy synchronous,gossip --epochs 5 --out /tmp/demo
    gossip demo --dataset mnist --data-dir ~/data/mnist
    gossip demo --kill 2@0.33                     # peer 2 SIGKILLed at a third, restarted

    from gossip.demo import DemoOptions, run_demo
    run_demo(DemoOptions(policies=("gossip",), peers=2, epochs=3, out="demo-out"))

The modules: data (digits, the IDX reader for MNIST, shards), model (the CNN), train (what
each peer runs), loop (the training loop), records (what each peer records, put together
by the launcher), kill (--kill: a peer SIGKILLed and started again), progress (bars from
the peers' progress), report (table, PNG, JSON), runner (checks, launch, failure handling).
torch, matplotlib and tqdm are imported where used.
"""
from gossip.demo.data import (IDX_DTYPES, MNIST_FILES, DataError, Dataset, load_digits,
                              load_mnist, read_idx, shard, write_idx)
from gossip.demo.kill import Kill
from gossip.demo.model import count_parameters, make_cnn
from gossip.demo.progress import ProgressDisplay
from gossip.demo.records import PeerRecords, collect
from gossip.demo.report import figures, format_table, summarize, write_json, write_png
from gossip.demo.runner import (DATASETS, DEFAULT_EPOCHS, JSON_NAME, KILL_EPOCHS, PNG_NAME,
                                DemoFailed, DemoOptions, load_dataset, run_demo)
from gossip.demo.train import BASELINE, TrainConfig, make_policy, run_baseline, run_peer

__all__ = [
    "Dataset", "DataError", "load_digits", "load_mnist", "read_idx", "write_idx", "shard",
    "MNIST_FILES", "IDX_DTYPES", "make_cnn", "count_parameters", "TrainConfig", "run_peer",
    "run_baseline", "make_policy", "BASELINE", "ProgressDisplay", "summarize",
    "format_table", "figures", "write_json", "write_png", "DemoOptions", "DemoFailed",
    "run_demo", "load_dataset", "DATASETS", "DEFAULT_EPOCHS", "KILL_EPOCHS", "PNG_NAME",
    "JSON_NAME", "Kill", "PeerRecords", "collect",
]
