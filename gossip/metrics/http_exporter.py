"""The Prometheus exporter of one peer: a ThreadingHTTPServer in a daemon thread serving
``/metrics`` (the text exposition, collected at each scrape in the server's thread). A port
it cannot bind is a WARNING naming the port and GOSSIP_METRICS_PORT, and the peer trains on
without it. Both that warning and the line with the address go to the events logger, which an
operator sees by default (gossip/logs.py)."""
from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer

from collectives.notices import events
from gossip.metrics.scrape_handler import ScrapeHandler

__all__ = ["HttpExporter"]

class HttpExporter:
    """Serves ``scrape()`` at ``http://HOST:PORT/metrics`` once start() bound the port;
    close() stops the server and its thread (idempotent)."""

    def __init__(self, host: str, port: int, scrape: Callable[[], str], *, rank: int) -> None:
        self.host, self.port, self.rank = host, port, rank
        self._scrape = scrape
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    @property
    def serving(self) -> bool:
        return self._server is not None

    def start(self) -> bool:
        """Bind and serve; False (and a WARNING) if the port cannot be bound."""
        handler = functools.partial(ScrapeHandler, scrape=self._scrape)
        try:
            server = ThreadingHTTPServer((self.host, self.port), handler)
        except OSError as exc:
            events.warning("rank %d: the metrics exporter cannot listen on %s:%d "
                        "(GOSSIP_METRICS_PORT + local rank): %s; training goes on without "
                        "it", self.rank, self.host, self.port, exc.strerror or exc)
            return False
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={
            "poll_interval": 0.2}, name=f"gossip-metrics-http-r{self.rank}", daemon=True)
        self._thread.start()
        events.info("rank %d: metrics at %s", self.rank, self.url)
        return True

    def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
