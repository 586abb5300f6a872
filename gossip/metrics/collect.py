"""Turning a peer's snapshots into metric families: peer.stats() (the transport's counters and
the membership controller's), each attached policy's stats() (never with ``consensus=True``:
that is a collective). Runs in the exporter's thread at scrape or flush time, so the training
thread does nothing for the metrics; a policy whose stats() fails at that moment (closing) is
left out of that collection, and said so once."""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from gossip.metrics.metric_catalog import METRICS, spec
from gossip.metrics.metric_family import MetricFamily
from gossip.metrics.metrics_source import MetricsSource

__all__ = ["collect"]

log = logging.getLogger("gossip")
_warned: set[str] = set()

# peer.stats() totals -> counter families
_TOTALS = {"bytes_sent": "gossip_bytes_sent_total",
           "bytes_received": "gossip_bytes_received_total",
           "messages_sent": "gossip_messages_sent_total",
           "messages_received": "gossip_messages_received_total"}
# peer.stats()["peers"][r] fields -> per-link counter families
_LINKS = {"bytes_sent": "gossip_link_bytes_sent_total",
          "bytes_received": "gossip_link_bytes_received_total",
          "messages_sent": "gossip_link_messages_sent_total",
          "messages_received": "gossip_link_messages_received_total"}
# policy.stats() numbers -> families labelled by policy
_POLICY = {"steps": "gossip_steps_total", "comm_seconds": "gossip_comm_seconds_total",
           "compute_seconds": "gossip_compute_seconds_total",
           "bytes_sent": "gossip_policy_bytes_sent_total",
           "skipped_steps": "gossip_skipped_steps_total",
           "recoveries": "gossip_recoveries_total",
           "rounds_skipped": "gossip_rounds_skipped_total",
           "staleness_waits": "gossip_staleness_waits_total",
           "consensus_distance_last": "gossip_consensus_distance",
           "consensus_distance_estimate": "gossip_consensus_distance_estimate"}
# transport ops fields -> families labelled by op
_OPS = {"calls": "gossip_op_calls_total", "failed": "gossip_op_failures_total",
        "bytes": "gossip_op_bytes_total"}
# membership counts -> counter families
_MEMBERSHIP = {"view_changes": "gossip_view_changes_total",
               "members_joined": "gossip_members_joined_total",
               "members_left": "gossip_members_left_total",
               "member_restarts": "gossip_member_restarts_total",
               "member_deaths": "gossip_member_deaths_total"}


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) or math.isinf(value) else None


def _warn_once(key: str, message: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)
    else:
        log.debug(message, *args)


def collect(source: MetricsSource) -> list[MetricFamily]:
    """The families of METRICS, in its order, filled from ``source``'s snapshots now. A
    family with nothing to say (no policy attached, no ``ops`` in the transport's stats) is
    there with no samples (the text format then writes its HELP and TYPE alone)."""
    stats = source.stats()
    rank = int(stats.get("rank", source.rank))
    families = {m.name: MetricFamily(m, rank) for m in METRICS}
    _transport(families, stats)
    _ops(families, stats)
    _membership(families, stats)
    for policy in list(source.policies):
        name = str(getattr(policy, "name", type(policy).__name__))
        try:
            pstats = policy.stats()   # type: ignore[attr-defined]
        except Exception as exc:   # closing, or not attached yet: this collection goes without
            _warn_once(f"{name}:{type(exc).__name__}", "rank %d: metrics left out policy %s "
                       "this time: its stats() raised %s: %s", rank, name,
                       type(exc).__name__, exc)
            continue
        _policy(families, name, pstats)
    return [families[m.name] for m in METRICS]


def _transport(families: Mapping[str, MetricFamily], stats: Mapping) -> None:
    for key, family in _TOTALS.items():
        value = _number(stats.get(key))
        if value is not None:
            families[family].add(value)
    for peer, counters in sorted((stats.get("peers") or {}).items()):
        for key, family in _LINKS.items():
            value = _number(counters.get(key))
            if value is not None:
                families[family].add(value, peer=peer)
    dropped = dict(stats.get("dropped_by_reason") or {})
    door = stats.get("door") or {}
    if door.get("dropped"):
        dropped["door"] = dropped.get("door", 0) + door["dropped"]
    for reason, n in sorted(dropped.items()):
        families["gossip_dropped_messages_total"].add(n, reason=reason)
    for reason, n in sorted((stats.get("disconnected_by_reason") or {}).items()):
        families["gossip_disconnects_total"].add(n, reason=reason)
    for reason, n in sorted((stats.get("handshakes_refused") or {}).items()):
        families["gossip_handshakes_refused_total"].add(n, reason=reason)
    codec = stats.get("codec") or {}
    if "rejected" in codec:
        families["gossip_codec_rejected_total"].add(codec["rejected"])
    families["gossip_lost_peers"].add(len(stats.get("lost") or {}))


def _ops(families: Mapping[str, MetricFamily], stats: Mapping) -> None:
    """The transport's per-operation figures and waits, when it has them (older transports
    do not: the families stay empty)."""
    for op, figures in sorted((stats.get("ops") or {}).items()):
        for key, family in _OPS.items():
            value = _number(figures.get(key))
            if value is not None:
                families[family].add(value, op=op)
        buckets = [(float(le), float(n)) for le, n in figures.get("buckets") or []]
        if "seconds" in figures and "calls" in figures:
            families["gossip_op_seconds"].add_histogram(
                buckets, float(figures["seconds"]), float(figures["calls"]), op=op)
    for peer, seconds in sorted((stats.get("waited_seconds") or {}).items()):
        families["gossip_wait_seconds_total"].add(seconds, peer=peer)


def _membership(families: Mapping[str, MetricFamily], stats: Mapping) -> None:
    if stats.get("view") is not None:
        families["gossip_view"].add(stats["view"])
    if stats.get("members") is not None:
        families["gossip_members"].add(stats["members"])
    for key, family in _MEMBERSHIP.items():
        value = _number((stats.get("membership") or {}).get(key))
        if value is not None:
            families[family].add(value)


def _policy(families: Mapping[str, MetricFamily], name: str, pstats: Mapping) -> None:
    for key, family in _POLICY.items():
        value = _number(pstats.get(key))
        if value is not None:
            families[family].add(value, policy=name)
    weights = [w for w in (_number(w) for w in pstats.get("weights") or []) if w is not None]
    if weights:
        families["gossip_push_sum_weight"].add(min(weights), policy=name)
    per_step = pstats.get("codec_bytes_per_step") or {}
    for key, family in (("raw_bytes", "gossip_codec_raw_bytes_per_step"),
                        ("encoded_bytes", "gossip_codec_encoded_bytes_per_step")):
        value = _number(per_step.get(key))
        if value is not None:
            families[spec(family).name].add(value, policy=name)
