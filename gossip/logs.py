"""Logging: one logger per package ("gossip", "collectives", "topologies"), silent unless the
application configures logging or sets GOSSIP_LOG_LEVEL. The library never prints."""
from __future__ import annotations

import logging
import os

__all__ = ["configure_logging", "check_log_level", "LOGGER_NAMES"]

LOGGER_NAMES = ("gossip", "collectives", "topologies")
_configured = False


def configure_logging() -> None:
    """Apply GOSSIP_LOG_LEVEL (e.g. INFO, DEBUG) to the package loggers; when the application
    has no logging set up, also send their records to stderr, tagged with the rank."""
    global _configured
    level = check_log_level(os.environ.get("GOSSIP_LOG_LEVEL", ""))
    if not level or _configured:
        return
    _configured = True
    rank = os.environ.get("GOSSIP_RANK") or os.environ.get("RANK") or "-"
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
