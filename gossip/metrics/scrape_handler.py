"""The HTTP handler of the Prometheus exporter: ``GET /metrics`` answers the text exposition
that ``scrape()`` renders at that moment; any other path is a 404 naming ``/metrics``."""
from __future__ import annotations

import logging
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from gossip.metrics.text_format import CONTENT_TYPE

__all__ = ["ScrapeHandler"]

log = logging.getLogger("gossip")


class ScrapeHandler(BaseHTTPRequestHandler):
    """One request (http.server makes one handler per request: ``scrape`` is given with
    functools.partial, as http.server's own handlers take their ``directory``)."""

    server_version = "gossip-metrics"

    def __init__(self, *args: Any, scrape: Callable[[], str], **kwargs: Any) -> None:
        self._scrape = scrape
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path != "/metrics":
            self._answer(404, "text/plain; charset=utf-8",
                         b"gossip metrics are at /metrics\n")
            return
        try:
            body = self._scrape().encode("utf-8")
        except Exception as exc:   # the scraper sees the failure; the peer goes on
            log.warning("metrics scrape failed: %s: %s", type(exc).__name__, exc)
            self._answer(500, "text/plain; charset=utf-8",
                         f"collecting the metrics failed: {exc}\n".encode())
            return
        self._answer(200, CONTENT_TYPE, body)

    def _answer(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics %s: " + format, self.address_string(), *args)
