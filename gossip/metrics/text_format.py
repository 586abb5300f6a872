"""The Prometheus text exposition format, version 0.0.4: for each family a ``# HELP`` and a
``# TYPE`` line, then one line per sample, ``name{label="value",...} value``. Label values
escape backslash, double quote and newline; help text escapes backslash and newline. Values
are Go-style floats (``+Inf``, ``-Inf``, ``NaN``)."""
from __future__ import annotations

import math
from collections.abc import Iterable

from gossip.metrics.metric_family import MetricFamily

__all__ = ["CONTENT_TYPE", "render", "escape_label_value", "format_value"]

#: The Content-Type of a scrape's answer.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def escape_label_value(text: str) -> str:
    """A label value as the format writes it between double quotes."""
    return text.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """A sample's value: integers without a fraction, the infinities and NaN as Go writes
    them."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2 ** 53:
        return str(int(value))
    return repr(value)


def render(families: Iterable[MetricFamily]) -> str:
    """The exposition of ``families``: what a scrape of ``/metrics`` answers."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape_help(family.spec.help)}")
        lines.append(f"# TYPE {family.name} {family.spec.kind}")
        for sample in family.samples:
            labels = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in sample.labels)
            series = f"{sample.name}{{{labels}}}" if labels else sample.name
            lines.append(f"{series} {format_value(sample.value)}")
    return "\n".join(lines) + "\n"
