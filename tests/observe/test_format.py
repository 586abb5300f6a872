"""The text format and the catalog: what the parser reads back, escaping, the names the docs
table shows, and settings that do not parse."""
from __future__ import annotations

from pathlib import Path

import pytest
from metrics_helpers import REPO, parse, series

from gossip.metrics import (
    METRICS,
    MetricFamily,
    MetricSpec,
    MetricsSettings,
    collect,
    metrics_file_for,
    render,
    spec,
)


class _Source:
    """A snapshot as Peer.stats() gives it, with the transport's ops and waits."""

    rank = 3
    policies: list = []

    def stats(self) -> dict:
        return {"rank": 3, "peers": {1: {"bytes_sent": 10, "bytes_received": 5,
                                         "messages_sent": 2, "messages_received": 1}},
                "bytes_sent": 10, "bytes_received": 5, "messages_sent": 2,
                "messages_received": 1, "dropped_by_reason": {'bad "header"\n\\x': 2},
                "handshakes_refused": {"inbound": 1}, "lost": {2: "died"}, "view": 4,
                "members": 3, "membership": {"view_changes": 4, "members_joined": 1,
                                             "members_left": 2, "member_restarts": 1},
                "codec": {"rejected": 0},
                "ops": {"allreduce": {"calls": 3, "failed": 1, "bytes": 300, "seconds": 0.25,
                                      "buckets": [[0.001, 1], [0.1, 2], [1.0, 3]]}},
                "waited_seconds": {0: 1.5, 1: 0.25}}


def test_the_parser_reads_back_every_series_with_its_escaped_labels() -> None:
    text = render(collect(_Source()))
    values = series(parse(text))
    assert values[("gossip_dropped_messages_total",
                   (("rank", "3"), ("reason", 'bad "header"\n\\x')))] == 2
    assert values[("gossip_op_bytes_total", (("op", "allreduce"), ("rank", "3")))] == 300
    assert values[("gossip_op_seconds_bucket", (("le", "0.1"), ("op", "allreduce"),
                                                ("rank", "3")))] == 2
    assert values[("gossip_op_seconds_bucket", (("le", "+Inf"), ("op", "allreduce"),
                                                ("rank", "3")))] == 3
    assert values[("gossip_op_seconds_sum", (("op", "allreduce"), ("rank", "3")))] == 0.25
    assert values[("gossip_wait_seconds_total", (("peer", "0"), ("rank", "3")))] == 1.5
    assert values[("gossip_member_restarts_total", (("rank", "3"),))] == 1
    assert values[("gossip_lost_peers", (("rank", "3"),))] == 1
    # HELP and TYPE of every family of the catalog, in its order, even without samples.
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert types == [m.name for m in METRICS]


def test_every_family_collected_is_in_the_catalog_and_the_docs_page_shows_the_catalog() -> None:
    families = collect(_Source())
    assert [f.name for f in families] == [m.name for m in METRICS]
    page = (REPO / "docs" / "how-to" / "observe.md").read_text(encoding="utf-8")
    assert "<!-- generated: metrics -->" in page
    import importlib.util
    hook = importlib.util.spec_from_file_location("generate", REPO / "docs/hooks/generate.py")
    assert hook is not None and hook.loader is not None
    module = importlib.util.module_from_spec(hook)
    hook.loader.exec_module(module)
    table = module.expand(page, "how-to/observe.md")
    for m in METRICS:
        assert f"| `{m.name}` | {m.kind} |" in table


def test_names_follow_the_conventions() -> None:
    with pytest.raises(ValueError, match="_total"):
        MetricSpec("gossip_steps", "counter", (), "x")
    with pytest.raises(ValueError, match="gossip_"):
        MetricSpec("steps_total", "counter", (), "x")
    family = MetricFamily(spec("gossip_steps_total"), rank=0)
    with pytest.raises(ValueError, match="labels"):
        family.add(1, peer=2)


@pytest.mark.parametrize("variable, value", [("GOSSIP_METRICS_PORT", "http"),
                                             ("GOSSIP_METRICS_PORT", "70000"),
                                             ("GOSSIP_METRICS_INTERVAL", "0"),
                                             ("GOSSIP_METRICS_INTERVAL", "often")])
def test_a_setting_that_does_not_parse_names_the_variable_and_the_rank(variable: str,
                                                                       value: str) -> None:
    with pytest.raises(ValueError, match=rf"rank 2: {variable}="):
        MetricsSettings.from_environment({variable: value}, rank=2)


def test_the_file_name_of_each_rank() -> None:
    assert metrics_file_for("m-{rank}.jsonl", 3, 4) == Path("m-3.jsonl")
    assert metrics_file_for("/x/metrics.jsonl", 1, 2) == Path("/x/metrics.rank1.jsonl")
    assert metrics_file_for("/x/metrics.jsonl", 0, 1) == Path("/x/metrics.jsonl")
