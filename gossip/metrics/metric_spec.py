"""What one exported metric is: its name, type, labels and help text (a row of the catalog
that the collector fills and the documentation's metric table is generated from)."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MetricSpec", "KINDS"]

#: The Prometheus types a family may have.
KINDS = ("counter", "gauge", "histogram")


@dataclass(frozen=True)
class MetricSpec:
    """One metric family of the catalog (gossip.metrics.metric_catalog)."""

    # The family's name: ``gossip_*``; a counter's ends in ``_total``.
    name: str
    # "counter", "gauge" or "histogram".
    kind: str
    # The labels its series carry besides ``rank`` (every series has ``rank``).
    labels: tuple[str, ...]
    # One line: what it counts, and where the value comes from.
    help: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if not self.name.startswith("gossip_"):
            raise ValueError(f"metric {self.name}: names start with gossip_")
        if (self.kind == "counter") != self.name.endswith("_total"):
            raise ValueError(f"metric {self.name}: a counter's name, and only a counter's, "
                             "ends in _total")
