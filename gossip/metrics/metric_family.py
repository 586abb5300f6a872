"""A metric family as exported: its spec and the samples collected for it at one scrape."""
from __future__ import annotations

from collections.abc import Mapping

from gossip.metrics.metric_sample import MetricSample
from gossip.metrics.metric_spec import MetricSpec

__all__ = ["MetricFamily"]


class MetricFamily:
    """The samples of one MetricSpec, collected at one moment. ``add`` takes a series' labels
    (``rank`` is added first) and its value; ``add_histogram`` a histogram's cumulative
    buckets, sum and count."""

    def __init__(self, spec: MetricSpec, rank: int) -> None:
        self.spec = spec
        self.rank = rank
        self.samples: list[MetricSample] = []

    @property
    def name(self) -> str:
        return self.spec.name

    def _labels(self, labels: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
        unknown = set(labels) - set(self.spec.labels) - {"le"}
        if unknown:
            raise ValueError(f"metric {self.name}: labels {sorted(unknown)} are not its "
                             f"{list(self.spec.labels)}")
        return (("rank", str(self.rank)),) + tuple((k, str(v)) for k, v in labels.items())

    def add(self, value: float, **labels: object) -> None:
        """One series of a counter or gauge."""
        self.samples.append(MetricSample(self.name, self._labels(labels), float(value)))

    def add_histogram(self, buckets: list[tuple[float, float]], total: float, count: float,
                      **labels: object) -> None:
        """One histogram series: ``buckets`` are (upper bound in seconds, cumulative count)
        in increasing order; the ``+Inf`` bucket (``count``) is added when missing."""
        for le, n in buckets:
            le_text = "+Inf" if le == float("inf") else repr(float(le))
            self.samples.append(MetricSample(f"{self.name}_bucket",
                                             self._labels({**labels, "le": le_text}), float(n)))
        if not buckets or buckets[-1][0] != float("inf"):
            self.samples.append(MetricSample(f"{self.name}_bucket",
                                             self._labels({**labels, "le": "+Inf"}),
                                             float(count)))
        self.samples.append(MetricSample(f"{self.name}_sum", self._labels(labels), float(total)))
        self.samples.append(MetricSample(f"{self.name}_count", self._labels(labels),
                                         float(count)))

    def __repr__(self) -> str:
        return f"MetricFamily({self.name}, {len(self.samples)} samples)"
