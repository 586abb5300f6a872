"""One sample of a metric family: a series (its name, which may carry the family's suffix such
as ``_bucket``, and its labels) and its value at collection time."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MetricSample"]


@dataclass(frozen=True)
class MetricSample:
    """A value of one series: ``name`` is the family's name or it with a suffix (a histogram's
    ``_bucket``, ``_sum``, ``_count``); ``labels`` in the order they are written."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    @property
    def label_dict(self) -> dict[str, str]:
        """The labels as a dict (JSON lines, tests)."""
        return dict(self.labels)
