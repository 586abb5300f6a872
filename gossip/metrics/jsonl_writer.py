"""The JSON lines file of one peer (GOSSIP_METRICS_FILE): one record per flush,
``{"time": UNIX_SECONDS, "rank": R, "sequence": N, "samples": [{"name", "labels", "value"},
...]}`` with the same series a scrape of ``/metrics`` shows."""
from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

from gossip.metrics.metric_family import MetricFamily

__all__ = ["JsonLinesWriter"]


class JsonLinesWriter:
    """Appends one line per write() to ``path`` (its folder is made); each line is flushed
    to the file before write() returns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")
        self._sequence = 0

    def write(self, families: Sequence[MetricFamily], rank: int) -> None:
        samples = [{"name": s.name, "labels": s.label_dict,
                    "value": s.value if math.isfinite(s.value) else str(s.value)}
                   for family in families for s in family.samples]
        record = {"time": time.time(), "rank": rank, "sequence": self._sequence,
                  "samples": samples}
        self._sequence += 1
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
