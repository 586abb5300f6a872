"""Every metric a peer exports: the catalog the collector fills (gossip.metrics.collect) and
the documentation's table of metric names is generated from (docs/how-to/observe.md).

Every series has the label ``rank`` (this peer's rank in the current view); the others are
``peer`` (the other end of a link, by rank), ``op`` (a collective), ``policy`` (an attached
policy's registry name) and ``reason`` (why a message was dropped or a handshake refused).
"""
from __future__ import annotations

from gossip.metrics.metric_spec import MetricSpec

__all__ = ["METRICS", "spec", "markdown_table"]

_P = ("policy",)

METRICS: tuple[MetricSpec, ...] = (
    # -- the policies (policy.stats(), never its consensus collective)
    MetricSpec("gossip_steps_total", "counter", _P, "Steps the policy completed."),
    MetricSpec("gossip_comm_seconds_total", "counter", _P,
               "Seconds the policy's steps spent communicating."),
    MetricSpec("gossip_compute_seconds_total", "counter", _P,
               "Seconds between the policy's communications (the caller's compute)."),
    MetricSpec("gossip_policy_bytes_sent_total", "counter", _P,
               "Bytes this peer sent since the policy attached."),
    MetricSpec("gossip_skipped_steps_total", "counter", _P,
               "Steps the NaN guard skipped (a non-finite update)."),
    MetricSpec("gossip_recoveries_total", "counter", _P,
               "Steps a lost peer cut off that the elastic policy recovered from (the "
               "survivors re-formed the group and went on)."),
    MetricSpec("gossip_rounds_skipped_total", "counter", _P,
               "Gossip rounds skipped (no live neighbour; push-sum, D-PSGD)."),
    MetricSpec("gossip_push_sum_weight", "gauge", _P,
               "The lightest push-sum weight of the policy's buckets (push-sum, asynchronous)."),
    MetricSpec("gossip_staleness_waits_total", "counter", _P,
               "Steps the asynchronous policy waited for a staleness bound."),
    MetricSpec("gossip_codec_raw_bytes_per_step", "gauge", _P,
               "float32 bytes the policy's codec took in per step."),
    MetricSpec("gossip_codec_encoded_bytes_per_step", "gauge", _P,
               "Bytes of the policy's codec's encodings per step."),
    MetricSpec("gossip_consensus_distance", "gauge", _P,
               "The last consensus distance the policy measured (only once one was)."),
    MetricSpec("gossip_consensus_distance_estimate", "gauge", _P,
               "This peer's distance to its neighbours' weighted mean as its last gossip round "
               "began, estimated from the round's movement (no communication; the gossip policy)."),
    # -- the transport (peer.stats())
    MetricSpec("gossip_bytes_sent_total", "counter", (), "Bytes sent, every view's transport."),
    MetricSpec("gossip_bytes_received_total", "counter", (),
               "Bytes received, every view's transport."),
    MetricSpec("gossip_messages_sent_total", "counter", (), "Messages sent, every view's."),
    MetricSpec("gossip_messages_received_total", "counter", (),
               "Messages received, every view's."),
    MetricSpec("gossip_link_bytes_sent_total", "counter", ("peer",),
               "Bytes sent to one peer (the current view's transport: restarts at a view "
               "change)."),
    MetricSpec("gossip_link_bytes_received_total", "counter", ("peer",),
               "Bytes received from one peer (the current view's transport)."),
    MetricSpec("gossip_link_messages_sent_total", "counter", ("peer",),
               "Messages sent to one peer (the current view's transport)."),
    MetricSpec("gossip_link_messages_received_total", "counter", ("peer",),
               "Messages received from one peer (the current view's transport)."),
    MetricSpec("gossip_dropped_messages_total", "counter", ("reason",),
               "Messages dropped, by reason (the current view's transport; `door`: the "
               "membership door's)."),
    MetricSpec("gossip_disconnects_total", "counter", ("reason",),
               "Connections cut for bad messages, by reason."),
    MetricSpec("gossip_handshakes_refused_total", "counter", ("reason",),
               "Refused handshakes (data socket, rendezvous, membership door), by reason."),
    MetricSpec("gossip_codec_rejected_total", "counter", (),
               "Compressed payloads refused for not decoding (main channel)."),
    MetricSpec("gossip_lost_peers", "gauge", (), "Peers this peer found dead or departed."),
    # -- collectives, per operation (Transport.stats()'s ops, when it has them)
    MetricSpec("gossip_op_calls_total", "counter", ("op",), "Calls of one operation."),
    MetricSpec("gossip_op_failures_total", "counter", ("op",),
               "Calls of one operation that raised."),
    MetricSpec("gossip_op_bytes_total", "counter", ("op",),
               "Bytes of the caller's arrays, summed over the calls of one operation."),
    MetricSpec("gossip_op_seconds", "histogram", ("op",), "Seconds per call of one operation."),
    MetricSpec("gossip_wait_seconds_total", "counter", ("peer",),
               "Seconds this peer spent waiting on one other peer."),
    # -- membership (the membership controller's stats)
    MetricSpec("gossip_view", "gauge", (), "The current view's number."),
    MetricSpec("gossip_members", "gauge", (), "Members of the current view."),
    MetricSpec("gossip_view_changes_total", "counter", (), "View changes this peer took."),
    MetricSpec("gossip_members_joined_total", "counter", (),
               "Members new to the job in the views this peer took."),
    MetricSpec("gossip_members_left_total", "counter", (),
               "Members gone from the views this peer took (died, left, or replaced later)."),
    MetricSpec("gossip_member_restarts_total", "counter", (),
               "Members back under their name with a higher incarnation (a restart)."),
    MetricSpec("gossip_member_deaths_total", "counter", (),
               "Members the views this peer took left out or replaced that died: all but "
               "those that asked to leave or said goodbye, whether or not this peer had "
               "seen them go (a death, not a leave)."),
    # -- the metrics themselves (MetricsService: what collecting them has cost this peer)
    MetricSpec("gossip_metrics_collections_total", "counter", (),
               "Collections of these metrics (scrapes of /metrics, file and TensorBoard "
               "writes)."),
    MetricSpec("gossip_metrics_cpu_seconds_total", "counter", (),
               "CPU seconds the exporter's and the writers' threads spent collecting and "
               "rendering these metrics (the collections before this one)."),
)

_BY_NAME = {m.name: m for m in METRICS}


def spec(name: str) -> MetricSpec:
    """The catalog's row for ``name``; KeyError naming it otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not in gossip.metrics.METRICS") from None


def markdown_table() -> str:
    """The catalog as a markdown table (the documentation's list of metric names)."""
    rows = ["| Metric | Type | Labels | Meaning |", "|---|---|---|---|"]
    for m in METRICS:
        labels = ", ".join(f"`{label}`" for label in ("rank", *m.labels))
        rows.append(f"| `{m.name}` | {m.kind} | {labels} | {m.help} |")
    return "\n".join(rows) + "\n"
