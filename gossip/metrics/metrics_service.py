"""The metrics of one peer, as gossip.init() starts them when a variable asks (Peer.start_metrics)
and Peer.close() stops them: the Prometheus exporter at GOSSIP_METRICS_PORT + local rank
(on GOSSIP_METRICS_HOST), and one background thread that writes the JSON lines file
(GOSSIP_METRICS_FILE) and the TensorBoard scalars (GOSSIP_TENSORBOARD) every
GOSSIP_METRICS_INTERVAL seconds, and once more at close. Everything is collected from the
peer's snapshots in these threads (gossip.metrics.collect): the training thread does nothing
for them. What collecting costs is counted in those threads' CPU time and exported with the
rest (``gossip_metrics_cpu_seconds_total``): the metrics' whole cost to the peer, short of
what their threads take from others by holding the GIL while they run, which is at most the
same time."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from gossip.metrics.collect import collect
from gossip.metrics.http_exporter import HttpExporter
from gossip.metrics.jsonl_writer import JsonLinesWriter
from gossip.metrics.metric_family import MetricFamily
from gossip.metrics.metrics_settings import MetricsSettings, metrics_file_for
from gossip.metrics.metrics_source import MetricsSource
from gossip.metrics.tensorboard_writer import TensorBoardWriter
from gossip.metrics.text_format import render

__all__ = ["MetricsService"]

log = logging.getLogger("gossip")


class MetricsService:
    """Exporter, writers and flush thread of one peer. ``local_rank`` picks the port
    (GOSSIP_METRICS_PORT + local rank); ``rank`` and ``world_size`` the file and run names
    (the launch rank: they stay the same when a view change renumbers the peers)."""

    def __init__(self, source: MetricsSource, settings: MetricsSettings, *, rank: int,
                 local_rank: int, world_size: int) -> None:
        self.settings = settings
        self._source = source
        self._rank = rank
        self._lock = threading.Lock()   # one collection-and-write at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._flush_failed = False
        self._flushes = 0
        self._cost_lock = threading.Lock()
        self._collections = 0
        self._cpu_seconds = 0.0
        self.writers: list[JsonLinesWriter | TensorBoardWriter] = []
        self.http: HttpExporter | None = None
        try:
            if settings.file:
                path = metrics_file_for(settings.file, rank, world_size)
                try:
                    self.writers.append(JsonLinesWriter(path))
                except OSError as exc:
                    raise RuntimeError(f"rank {rank}: GOSSIP_METRICS_FILE={settings.file!r}: "
                                       f"cannot open {path} for appending: {exc}") from exc
            if settings.tensorboard:
                self.writers.append(TensorBoardWriter(Path(settings.tensorboard) / f"rank{rank}",
                                                      rank=rank))
        except BaseException:
            for writer in self.writers:
                writer.close()
            raise
        if settings.port is not None:
            self.http = HttpExporter(settings.host, settings.port + local_rank, self.scrape,
                                     rank=rank)

    def start(self) -> None:
        """Bind the exporter (a port in use: WARNING, no exporter) and start the flush
        thread (when there is a file or a TensorBoard folder)."""
        if self.http is not None:
            self.http.start()
        if self.writers:
            self._thread = threading.Thread(target=self._flush_loop, daemon=True,
                                            name=f"gossip-metrics-flush-r{self._rank}")
            self._thread.start()

    def collect(self) -> list[MetricFamily]:
        """The families now (gossip.metrics.collect of the peer, and the metrics' own cost
        up to this collection)."""
        families = collect(self._source)
        with self._cost_lock:
            own = {"gossip_metrics_collections_total": self._collections,
                   "gossip_metrics_cpu_seconds_total": self._cpu_seconds}
        for family in families:
            if family.name in own:
                family.add(own[family.name])
        return families

    def _counted(self, began: float) -> None:
        """Count one collection that began at thread CPU time ``began`` (this thread's)."""
        spent = time.thread_time() - began
        with self._cost_lock:
            self._collections += 1
            self._cpu_seconds += spent

    def cost(self) -> tuple[int, float]:
        """Collections so far, and the CPU seconds they took."""
        with self._cost_lock:
            return self._collections, self._cpu_seconds

    def scrape(self) -> str:
        """The text exposition now (what ``/metrics`` answers)."""
        began = time.thread_time()
        try:
            return render(self.collect())
        finally:
            self._counted(began)

    def flush(self) -> None:
        """Collect once and write every writer (the flush thread does every interval)."""
        with self._lock:
            if not self.writers:
                return
            began = time.thread_time()
            try:
                families = self.collect()
                rank = families[0].rank if families else self._rank
                for writer in self.writers:
                    writer.write(families, rank)
            finally:
                self._counted(began)
            self._flushes += 1

    @property
    def flushes(self) -> int:
        """How many times the writers were written (every interval, and at close)."""
        return self._flushes

    def _flush_loop(self) -> None:
        while not self._stop.wait(self.settings.interval):
            self._flush_logged()

    def _flush_logged(self) -> None:
        try:
            self.flush()
        except Exception as exc:   # the metrics must not stop training
            level = logging.DEBUG if self._flush_failed else logging.WARNING
            self._flush_failed = True
            log.log(level, "rank %d: writing the metrics (GOSSIP_METRICS_FILE, "
                    "GOSSIP_TENSORBOARD) failed: %s: %s", self._rank, type(exc).__name__, exc)

    def close(self) -> None:
        """Stop the flush thread, write once more, close the writers, stop the exporter.
        Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.interval + 5.0)
            self._thread = None
            self._flush_logged()
        writers, self.writers = self.writers, []
        for writer in writers:
            try:
                writer.close()
            except Exception as exc:
                log.warning("rank %d: closing the metrics writer %r failed: %s", self._rank,
                            writer, exc)
        if self.http is not None:
            self.http.close()
