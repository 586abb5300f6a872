"""Run as a script: ``Trainer.fit`` on the digits (an MLP, 3 epochs, batch 16) with 4 CPU
processes that Lightning starts itself, under the strategy argv[1] names:

- ``ddp-gloo``: ``DDPStrategy(process_group_backend="gloo")`` (the reference);
- ``ddp-gossip``: ``DDPStrategy(process_group_backend="gossip")`` (DDP over gossip; this
  script never imports gossip before the fit: torch loads the backend);
- ``gossip``: ``Trainer(strategy="gossip")`` (the registered name: GossipStrategy, gossip policy);
- ``gossip:<policy>``: ``GossipStrategy(policy=<policy>)``, <policy> one of gossip.policies'
  names, or ``diloco`` (LocalSGD with DiLoCo's outer optimizer, every 8 steps).

After the fit every rank evaluates its own model on the test set; rank 0 prints
``RESULT <strategy> mean=<acc> worst=<acc> consensus=<distance> backend=<pg backend>
loss=<rank 0's last training loss>``."""
import sys

import lightning.pytorch as pl
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.strategies import DDPStrategy
from replica_report import report
from torch.utils.data import DataLoader, TensorDataset

from gossip.demo.data import load_digits
from gossip.demo.evaluation import pixel_statistics, tensors

EPOCHS, BATCH, LR = 3, 16, 0.05


class Digits(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 64),
                                       torch.nn.ReLU(), torch.nn.Linear(64, 10))
        self.last_loss = float("nan")

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.last_loss = float(loss.detach())
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=0.9)


def strategy_for(name: str):
    if name.startswith("ddp-"):
        return DDPStrategy(process_group_backend=name[4:])
    if name == "gossip":
        import gossip.lightning  # noqa: F401  (registers the name "gossip")
        return "gossip"
    from gossip.lightning import GossipStrategy
    policy = name.split(":", 1)[1]
    if policy == "diloco":
        from gossip.policies import LocalSGD
        return GossipStrategy(policy=lambda: LocalSGD(period=8, outer_optimizer="diloco"))
    return GossipStrategy(policy=policy)


def main(name: str) -> None:
    pl.seed_everything(0, verbose=False)
    data = load_digits()
    mean, std = pixel_statistics(data)
    x, y = tensors(data.train_images, data.train_labels, data.max_value, mean, std)
    test_x, test_y = tensors(data.test_images, data.test_labels, data.max_value, mean, std)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)
    model = Digits()
    trainer = pl.Trainer(accelerator="cpu", devices=4, strategy=strategy_for(name),
                         max_epochs=EPOCHS, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    with torch.no_grad():
        accuracy = (model.net(test_x).argmax(1) == test_y).float().mean()
    report(name, accuracy, model.parameters(),
           f"backend={dist.get_backend()} loss={model.last_loss:.4f}")
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
