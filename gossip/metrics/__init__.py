"""A peer's metrics, exported: counters and gauges collected from the snapshots the peer
already keeps (Peer.stats(), each policy's stats(), the membership's), served as Prometheus
text at GOSSIP_METRICS_PORT + local rank, written as JSON lines (GOSSIP_METRICS_FILE) and
TensorBoard scalars (GOSSIP_TENSORBOARD). docs/how-to/observe.md shows them in use;
METRICS is the catalog of names."""
from __future__ import annotations

from gossip.metrics.collect import collect
from gossip.metrics.http_exporter import HttpExporter
from gossip.metrics.jsonl_writer import JsonLinesWriter
from gossip.metrics.metric_catalog import METRICS, markdown_table, spec
from gossip.metrics.metric_family import MetricFamily
from gossip.metrics.metric_sample import MetricSample
from gossip.metrics.metric_spec import KINDS, MetricSpec
from gossip.metrics.metrics_service import MetricsService
from gossip.metrics.metrics_settings import (
                                             DEFAULT_HOST,
                                             DEFAULT_INTERVAL,
                                             MetricsSettings,
                                             metrics_file_for,
)
from gossip.metrics.metrics_source import MetricsSource
from gossip.metrics.tensorboard_writer import TensorBoardWriter, tensorboard_tag
from gossip.metrics.text_format import CONTENT_TYPE, escape_label_value, format_value, render

__all__ = ["collect", "HttpExporter", "JsonLinesWriter", "METRICS", "markdown_table", "spec",
           "MetricFamily", "MetricSample", "KINDS", "MetricSpec", "MetricsService",
           "DEFAULT_HOST", "DEFAULT_INTERVAL", "MetricsSettings", "metrics_file_for",
           "MetricsSource", "TensorBoardWriter", "tensorboard_tag", "CONTENT_TYPE",
           "escape_label_value", "format_value", "render"]
