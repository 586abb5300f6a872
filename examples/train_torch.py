"""Data-parallel training of a small MLP on scikit-learn's digits with gossip.

The same file runs under every launcher, unchanged: gossip.init() reads the variables each
one sets (gossip's, torchrun's, SLURM's, OpenMPI's), and without any it is a world of one.

    python examples/train_torch.py                       # one process, no launcher
    gossip run -n 4 examples/train_torch.py --policy gossip
    torchrun --nproc-per-node 4 examples/train_torch.py  # see examples/multi_node.md
    srun --ntasks 8 python examples/train_torch.py       # see examples/slurm.sbatch
    mpirun -n 4 python examples/train_torch.py

Each peer trains on its own shard of the training set; the policy (--policy, one of
gossip.policies.names()) decides how the peers combine their work. Expect the test accuracy
to climb to about 0.95 within the default 8 epochs with any policy (chance is 0.10).

A peer that dies and is started again (``gossip run --max-restarts 1``, with a policy that
trains through a death: ``--policy gossip``) rejoins the running job: broadcast_parameters
is skipped on it (its weights, optimizer state and step count come from the members when
the DistributedOptimizer attaches its policy), and the loop, driven by the policy's step
count, takes it on from the step the job is at, so every peer reaches the final collectives
together.
"""
from __future__ import annotations

import argparse

import numpy as np


def parse_args() -> argparse.Namespace:
    import gossip  # light (no torch); imported here so --help lists the real policy names
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="synchronous", choices=gossip.policies.names(),
                        help="averaging policy (default: synchronous)")
    parser.add_argument("--epochs", type=int, default=8, help="passes over the data (default 8)")
    parser.add_argument("--batch-size", type=int, default=32, help="per peer (default 32)")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--hidden", type=int, default=64, help="hidden units (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def load_data(seed: int):
    """The digits (8x8 images, 10 classes), split identically on every peer."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)  # pixels are 0..16; SGD likes inputs near unit scale
    return train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)


def main() -> None:
    args = parse_args()
    import torch
    import gossip

    x_train, x_test, y_train, y_test = load_data(args.seed)
    with gossip.init() as peer:
        # Every peer must take the same number of steps per epoch, or the collectives of
        # synchronous policies would wait for a step that never comes: count batches on the
        # smallest shard.
        x_mine = torch.from_numpy(x_train[peer.rank::peer.world_size])
        y_mine = torch.from_numpy(y_train[peer.rank::peer.world_size])
        steps = max(1, len(x_train) // peer.world_size // args.batch_size)
        x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)

        # A different seed per rank on purpose: broadcast_parameters is what makes the
        # starting weights equal, not luck.
        torch.manual_seed(args.seed + peer.rank)
        model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(args.hidden, 10))
        gossip.broadcast_parameters(model, root=0, peer=peer)   # (skipped on a rejoining peer)
        opt = gossip.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
            peer=peer, policy=args.policy)
        loss_fn = torch.nn.CrossEntropyLoss()

        # The loop follows the policy's step count, not a counter of its own: a peer that
        # rejoins the running job goes on from the step it took with the state.
        losses: list[float] = []
        while opt.policy.step < args.epochs * steps:
            epoch, step = divmod(opt.policy.step, steps)
            # Shuffling differs per peer (its own shard) and epoch, but is reproducible.
            perm = torch.randperm(len(x_mine), generator=torch.Generator().manual_seed(
                args.seed * 100_000 + peer.rank * 1000 + epoch))
            idx = perm[step * args.batch_size:(step + 1) * args.batch_size]
            model.train()
            opt.zero_grad()
            loss = loss_fn(model(x_mine[idx]), y_mine[idx])
            loss.backward()
            opt.step()  # communication happens here, as the policy says
            losses.append(loss.item())
            if opt.policy.step % steps == 0:   # the epoch's last step
                # This peer's own replica: with gossip-type policies replicas differ slightly.
                print(f"rank {peer.rank} epoch {epoch + 1} loss {np.mean(losses):.4f} "
                      f"test accuracy {accuracy(model, x_test, y_test):.3f}", flush=True)
                losses = []

        # How far apart the replicas ended (0 for synchronous); a collective, so every peer
        # calls it.
        distance = opt.stats(consensus=True)["consensus_distance"]
        opt.close()  # stops background threads (asynchronous, elastic) before we average
        # The model to keep is the replicas' mean (identical to each one for synchronous).
        with torch.no_grad():
            for p in model.parameters():
                peer.allreduce(p.data, op="mean")
        if peer.rank == 0:
            print(f"final: {peer.world_size} peers, policy {args.policy}, consensus distance "
                  f"{distance:.2e}, averaged model test accuracy "
                  f"{accuracy(model, x_test, y_test):.3f} (chance 0.100)", flush=True)


def accuracy(model, x, y) -> float:
    import torch
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


if __name__ == "__main__":
    main()
