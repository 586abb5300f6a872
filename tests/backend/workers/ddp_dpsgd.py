"""Run under torchrun: a DDP training script on the digits (an MLP, 3 epochs, each rank its
shard), as a DDP user writes it, in one of three modes (argv[1]):

- ``gloo``: plain DDP over Gloo (the reference);
- ``averager``: DDP over the "gossip" backend with ``ddp_hooks.local_hook`` and a
  ``GossipAverager`` after each optimizer step (D-PSGD on the backend's ring);
- ``gossip_hook``: DDP over "gossip" with ``ddp_hooks.gossip_hook`` (neighbour gradient
  averaging).

argv[2], the seed (0 if absent), picks the initial weights, the shards and the batches' order.
Every rank evaluates its own replica on the test set; rank 0 prints one line
``RESULT <mode> mean=<acc> worst=<acc> consensus=<distance> topology=<the peer's graph>``.
The teardown is the one torch's docs ask for: a barrier, the DDP model (which holds the
process group) released, then destroy_process_group(); without it Gloo's threads sometimes
outlive the group and abort the process at exit ("terminate called without an active
exception": 2 runs in 12 here)."""
import gc
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import gossip  # noqa: F401  (after torch: registers the "gossip" backend)
from gossip import ddp_hooks
from gossip.demo.data import load_digits, shard
from gossip.demo.evaluation import pixel_statistics, tensors
from gossip.torch_backend import GossipAverager
from replica_report import report

EPOCHS, BATCH, LR = 3, 16, 0.05


def main(mode: str, seed: int) -> None:
    dist.init_process_group("gloo" if mode == "gloo" else "gossip")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    data = load_digits()
    mean, std = pixel_statistics(data)
    rows = shard(len(data.train_labels), rank, world, seed=seed)
    x, y = tensors(data.train_images[rows], data.train_labels[rows], data.max_value, mean, std)
    test_x, test_y = tensors(data.test_images, data.test_labels, data.max_value, mean, std)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    averager = None
    if mode == "averager":
        ddp.register_comm_hook(None, ddp_hooks.local_hook)
        averager = GossipAverager()
    elif mode == "gossip_hook":
        ddp.register_comm_hook(ddp_hooks.HookState(), ddp_hooks.gossip_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
    order = torch.Generator().manual_seed(1000 * seed + rank)
    for _ in range(EPOCHS):
        for batch in torch.randperm(len(y), generator=order).split(BATCH)[:len(y) // BATCH]:
            optimizer.zero_grad()
            F.cross_entropy(ddp(x[batch]), y[batch]).backward()
            optimizer.step()
            if averager is not None:
                averager.average_parameters(ddp.parameters())
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean()
    peer = getattr(dist.group.WORLD, "peer", None)
    report(mode, accuracy, model.parameters(),
           f"topology={peer.topology if peer is not None else '-'}")
    dist.barrier()
    del ddp, optimizer, averager
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
