"""What the metrics tests share: consecutive free ports, a scrape over HTTP parsed with
prometheus_client (the checking parser), and a `gossip run` whose output is read while it
runs."""
from __future__ import annotations

import socket
import urllib.request
from pathlib import Path
from typing import Any

from launched import Launcher   # gossip run with its output in files (tests/launched.py)

from gossip.testing import free_port

__all__ = ["REPO", "WAIT_S", "JOB_WAIT", "free_ports", "scrape", "parse", "series", "Launcher"]

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 60   # every wait; a hang fails the test instead of stalling the run
JOB_WAIT = Path(__file__).parent / "workers" / "metrics_job.py"


def free_ports(n: int) -> int:
    """A port P such that P .. P + n - 1 were all free a moment ago (a peer of local rank k
    serves P + k)."""
    for _ in range(100):
        base = free_port()
        if base + n >= 65536:
            continue
        sockets = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports found")


def scrape(url: str) -> str:
    """GET ``url`` (a peer's /metrics): its body, after checking the content type."""
    with urllib.request.urlopen(url, timeout=WAIT_S) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4"), \
            answer.headers["Content-Type"]
        return answer.read().decode("utf-8")


def parse(text: str) -> dict[str, Any]:
    """The families of an exposition, by name (prometheus_client's parser: a counter
    ``x_total`` is its family ``x``)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


def series(families: dict[str, Any]) -> dict[tuple[str, tuple], float]:
    """Every sample: (sample name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in families.values() for s in f.samples}


