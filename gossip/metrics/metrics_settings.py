"""The metrics' settings, from the environment: where the Prometheus text is served
(GOSSIP_METRICS_PORT + local rank, on GOSSIP_METRICS_HOST), the JSON lines file
(GOSSIP_METRICS_FILE), the TensorBoard folder (GOSSIP_TENSORBOARD) and how often the last
two are written (GOSSIP_METRICS_INTERVAL)."""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MetricsSettings", "DEFAULT_INTERVAL", "DEFAULT_HOST", "metrics_file_for"]

DEFAULT_INTERVAL = 10.0
"""Seconds between two writes of the JSON lines file and the TensorBoard scalars."""
DEFAULT_HOST = "127.0.0.1"
"""Where the exporter listens unless GOSSIP_METRICS_HOST says otherwise: this host alone."""


def metrics_file_for(path: str, rank: int, world_size: int) -> Path:
    """The JSON lines file of ``rank``: ``{rank}`` in ``path`` becomes the rank; without it,
    a group of several inserts ``.rank<R>`` before the file's suffix (``metrics.jsonl`` ->
    ``metrics.rank1.jsonl``), and a world of one writes ``path`` itself."""
    if "{rank}" in path:
        return Path(path.replace("{rank}", str(rank)))
    p = Path(path)
    if world_size <= 1:
        return p
    return p.with_name(f"{p.stem}.rank{rank}{p.suffix}")


@dataclass(frozen=True)
class MetricsSettings:
    """What the metrics of one peer do; every field None (or the default) when unset."""

    # GOSSIP_METRICS_PORT: the port of local rank 0; local rank k serves port + k.
    port: int | None = None
    # GOSSIP_METRICS_HOST: the address the exporter binds.
    host: str = DEFAULT_HOST
    # GOSSIP_METRICS_FILE: the JSON lines path (see metrics_file_for).
    file: str | None = None
    # GOSSIP_TENSORBOARD: the folder of the TensorBoard runs (one subfolder per rank).
    tensorboard: str | None = None
    # GOSSIP_METRICS_INTERVAL: seconds between two writes of the file and the scalars.
    interval: float = DEFAULT_INTERVAL

    @property
    def enabled(self) -> bool:
        return self.port is not None or bool(self.file) or bool(self.tensorboard)

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None,
                         rank: int = 0) -> MetricsSettings:
        """Read the variables; ValueError naming the variable, its value and the rank when
        one does not parse."""
        variables = os.environ if env is None else env
        port_text = variables.get("GOSSIP_METRICS_PORT", "").strip()
        port = None
        if port_text:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ValueError(f"rank {rank}: GOSSIP_METRICS_PORT={port_text!r} is not a TCP "
                                 "port (1-65535); the metrics exporter cannot start")
            port = int(port_text)
        interval_text = variables.get("GOSSIP_METRICS_INTERVAL", "").strip()
        interval = DEFAULT_INTERVAL
        if interval_text:
            try:
                interval = float(interval_text)
            except ValueError:
                interval = math.nan
            if not math.isfinite(interval) or interval <= 0:
                raise ValueError(f"rank {rank}: GOSSIP_METRICS_INTERVAL={interval_text!r}: "
                                 "expected a positive number of seconds")
        return cls(port=port,
                   host=variables.get("GOSSIP_METRICS_HOST", "").strip() or DEFAULT_HOST,
                   file=variables.get("GOSSIP_METRICS_FILE", "").strip() or None,
                   tensorboard=variables.get("GOSSIP_TENSORBOARD", "").strip() or None,
                   interval=interval)
