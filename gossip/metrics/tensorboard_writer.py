"""TensorBoard scalars of one peer (GOSSIP_TENSORBOARD=DIR): a run folder ``DIR/rank<R>``,
one scalar per series at each flush, its step the flush's sequence number (0, 1, ...). The tag
is the series' name, then its labels but ``rank``: ``gossip_link_bytes_sent_total/peer=1``.
A histogram writes its ``_sum`` and ``_count`` (not its buckets)."""
from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gossip.metrics.metric_family import MetricFamily

__all__ = ["TensorBoardWriter", "tensorboard_tag"]


def tensorboard_tag(name: str, labels: Sequence[tuple[str, str]]) -> str:
    """The tag of one series: its name, then ``/label=value`` for each label but rank."""
    rest = [f"{k}={v}" for k, v in labels if k != "rank"]
    return "/".join([name, *rest])


class TensorBoardWriter:
    """A SummaryWriter (torch.utils.tensorboard) for ``folder``; needs the tensorboard package:
    RuntimeError naming GOSSIP_TENSORBOARD and ``pip install tensorboard`` without it."""

    def __init__(self, folder: Path, *, rank: int) -> None:
        try:
            if importlib.util.find_spec("tensorboard") is None:   # SummaryWriter needs it
                raise ImportError("No module named 'tensorboard'")
            # By name: mypy would follow it into tensorboard, which ships no types.
            summary_writer = importlib.import_module("torch.utils.tensorboard").SummaryWriter
        except ImportError as exc:
            raise RuntimeError(f"rank {rank}: GOSSIP_TENSORBOARD={str(folder.parent)!r} needs "
                               f"torch and tensorboard (pip install tensorboard, or "
                               f"pip install gossip[metrics]): {exc}") from exc
        self.folder = folder
        self._writer: Any = summary_writer(log_dir=str(folder))
        self._sequence = 0

    def write(self, families: Sequence[MetricFamily], rank: int) -> None:
        step = self._sequence
        self._sequence += 1
        for family in families:
            for s in family.samples:
                if s.name.endswith("_bucket") or not math.isfinite(s.value):
                    continue
                self._writer.add_scalar(tensorboard_tag(s.name, s.labels), s.value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
