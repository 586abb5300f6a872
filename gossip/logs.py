"""Logging: one logger per package ("gossip", "collectives", "topologies"), silent unless the
application configures logging or sets GOSSIP_LOG_LEVEL; and the events logger,
"gossip.events" (collectives/notices.py), which an operator sees by default.

The events logger says one line per peer death (who noticed it, which rank, why), heal, join,
leave and view change (its number and members), at INFO, and once for every wait longer than
defaults.LONG_WAIT (what it waits for), at WARNING. Who decides where it goes:

- GOSSIP_LOG_LEVEL set: the package loggers take that level (DEBUG, INFO: the events among
  the rest; WARNING: only the long waits), with a stderr handler if the application has none;
- else, an application that configured logging before gossip.init() (a handler on the root
  logger): its configuration, nothing added (the events logger's level is the root's, so
  ``logging.getLogger("gossip.events").setLevel(logging.INFO)`` shows them);
- else: the events logger at INFO to stderr, tagged with the launcher's rank; a handler the
  application installs on the root logger later takes them over (this one steps aside).
The library never prints otherwise.
"""
from __future__ import annotations

import logging
import os
import sys

from collectives.notices import EVENTS_LOGGER

__all__ = ["configure_logging", "check_log_level", "LOGGER_NAMES", "EVENTS_LOGGER"]

LOGGER_NAMES = ("gossip", "collectives", "topologies")
_configured = False


def _rank_tag() -> str:
    return os.environ.get("GOSSIP_RANK") or os.environ.get("RANK") or "-"


def configure_logging() -> None:
    """Apply GOSSIP_LOG_LEVEL (e.g. INFO, DEBUG) to the package loggers; when the application
    has no logging set up, also send their records to stderr, tagged with the rank. Without
    GOSSIP_LOG_LEVEL, give the events logger its default handler (the module docstring)."""
    global _configured
    level = check_log_level(os.environ.get("GOSSIP_LOG_LEVEL", ""))
    if not level:
        _default_events()
        return
    if _configured:
        return
    _configured = True
    rank = _rank_tag()
    handler = None
    if not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s [rank {rank}] %(name)s %(levelname)s: %(message)s"))
    for name in LOGGER_NAMES:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if handler is not None:
            logger.addHandler(handler)


class _DefaultEvents(logging.StreamHandler):
    """The events logger's stderr handler when nothing else is configured: it steps aside
    once the application installs a handler on the root logger (which the events then reach,
    as every record of the package does)."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return
        super().emit(record)


def _default_events() -> None:
    """The events logger at INFO to stderr, unless the application configured logging (the
    root logger's handlers) or the events logger itself."""
    events = logging.getLogger(EVENTS_LOGGER)
    if logging.getLogger().handlers or events.handlers or events.level != logging.NOTSET:
        return
    handler = _DefaultEvents(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s [rank {_rank_tag()}] %(name)s %(levelname)s: %(message)s"))
    events.addHandler(handler)
    events.setLevel(logging.INFO)


def check_log_level(text: str) -> str | int:
    """GOSSIP_LOG_LEVEL's value as logging takes it ("" when unset); ValueError naming the
    setting and the levels for anything else."""
    text = (text or "").strip()
    if not text:
        return ""
    if text.isdigit():
        return int(text)
    if isinstance(logging.getLevelName(text.upper()), int):
        return text.upper()
    raise ValueError(f"GOSSIP_LOG_LEVEL={text!r}: expected DEBUG, INFO, WARNING, ERROR, "
                     "CRITICAL or a number")


for _name in LOGGER_NAMES:
    logging.getLogger(_name).addHandler(logging.NullHandler())
