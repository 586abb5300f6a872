"""Link emulation: a slow network on one machine (GOSSIP_LINK=1gbit,2ms).

On one host every peer is on loopback or shared memory, so communication costs almost nothing
and a policy that saves bytes or rounds looks no better than one that does not. With a link
setting, every directed link (this peer -> one destination) behaves as a link of ``rate``
bytes/s and one-way ``latency``: a message is not *released* to the socket or the ring before

    sent + its bytes / rate (queued behind earlier ones on the same link) + latency

so it cannot be delivered earlier either. The delay is applied on the sending side, in the
link's own queue (link.py): the I/O thread releases a queued message once its time has come,
using the next release time as its poll timeout (never a busy spin); a calling thread never
waits on it beyond what a full queue already makes it wait (a tracked send's ticket).

The rate is a token bucket (GCRA form: one number, the time the bucket's backlog clears) with a
burst of BURST_BYTES or ``rate`` x BURST_TIME, whichever is larger: a message that fits the
tokens left goes at once, a larger one waits until its bytes are paid for. Every message of
the link is paced by its bytes (payload plus header; a shared-memory chunk by its payload) and
delayed by the latency, control messages included, except the few that go ahead of the queue
(HOLD, ACK, STARVED, BYE): those bypass the bucket but never reorder data, as before.

Wake-ups are at the I/O thread's poll granularity (1 ms), so each delay is rounded up to the
next millisecond: a lower bound, like the emulated network's. On close() what is still held is
released at once (it was sent before close(), as on a real network it would be in flight).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

__all__ = ["LinkSpec", "Pacer", "parse_link", "emulation_stats", "BURST_BYTES", "BURST_TIME"]

#: The bucket's smallest burst: one 64 KiB chunk goes at once on an idle link ...
BURST_BYTES = 64 << 10
#: ... or what the rate sends in this time, if that is more (1 ms: 125 KB at 1gbit).
BURST_TIME = 0.001

# Rates: bits with a decimal prefix (as links are sold), or bytes per second.
_RATE_UNITS = {
    "bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
    "bps": 1 / 8, "kbps": 1e3 / 8, "mbps": 1e6 / 8, "gbps": 1e9 / 8,
    "b/s": 1, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9,
    "kib/s": 1 << 10, "mib/s": 1 << 20, "gib/s": 1 << 30,
}
_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
_RATE = re.compile(rf"({_NUMBER})\s*([a-z/]*)")
_TIME = re.compile(rf"({_NUMBER})\s*(s|ms|us|)")


@dataclass(frozen=True)
class LinkSpec:
    """One emulated link: ``rate`` in bytes/s, one-way ``latency`` in seconds."""
    rate: float
    latency: float
    text: str = ""  # as the user wrote it, for stats and messages

    @property
    def burst(self) -> int:
        """Bytes that may go at once on an idle link (the module docstring says why)."""
        return max(BURST_BYTES, int(self.rate * BURST_TIME))

    def __str__(self) -> str:
        return self.text or f"{self.rate:g}B/s,{self.latency:g}s"


def parse_link(text: str, setting: str = "GOSSIP_LINK") -> LinkSpec | None:
    """``"RATE,LATENCY"`` (``1gbit,2ms``, ``100mbit,500us``, ``500MB/s,0``, ``125000000``: a
    plain number is bytes/s; a latency without unit is seconds) as a LinkSpec; None for an
    empty text or ``off``/``0`` (no emulation). ValueError naming ``setting`` otherwise."""
    raw = text.strip()
    if raw.lower() in ("", "off", "none", "0"):
        return None
    rate_text, _, latency_text = raw.partition(",")
    rate_match = _RATE.fullmatch(rate_text.strip().lower())
    latency_match = _TIME.fullmatch((latency_text.strip() or "0").lower())
    unit = rate_match.group(2) if rate_match else None
    if rate_match is None or unit not in _RATE_UNITS and unit != "" \
            or latency_match is None or raw.count(",") > 1:
        raise ValueError(
            f"{setting}={text!r}: expected RATE[,LATENCY], e.g. 1gbit,2ms, 100mbit,500us or "
            f"500MB/s,0 (rates: a number of bytes/s or with {', '.join(_RATE_UNITS)}; "
            "latencies: s, ms, us)")
    rate = float(rate_match.group(1)) * (_RATE_UNITS[unit] if unit else 1.0)
    latency = float(latency_match.group(1)) * _TIME_UNITS[latency_match.group(2)]
    if not rate > 0 or rate == float("inf") or latency > 60:
        raise ValueError(f"{setting}={text!r}: the rate must be positive and finite, the "
                         "latency at most 60 s")
    return LinkSpec(rate, latency, raw)


class Pacer:
    """The bucket and the latency of one directed link (used under the link's lock): ``due``
    stamps each message, in order, with the time it may be released."""

    __slots__ = ("spec", "_per_byte", "_burst_s", "_clear", "bytes_delayed", "seconds_held",
                 "messages_delayed")

    def __init__(self, spec: LinkSpec) -> None:
        self.spec = spec
        self._per_byte = 1.0 / spec.rate
        self._burst_s = spec.burst / spec.rate
        self._clear = 0.0          # when the backlog of what was stamped so far is paid for
        self.bytes_delayed = 0     # stats: bytes of messages that had to wait, ...
        self.messages_delayed = 0
        self.seconds_held = 0.0    # ... and how long they waited in all

    def due(self, nbytes: int, now: float | None = None) -> float:
        """When a message of ``nbytes`` sent now may be released (``now`` or later)."""
        now = time.monotonic() if now is None else now
        # A full bucket is a backlog that cleared burst_s ago: no more tokens than that.
        clear = max(self._clear, now - self._burst_s) + nbytes * self._per_byte
        self._clear = clear
        due = max(now, clear) + self.spec.latency
        if due > now:
            self.bytes_delayed += nbytes
            self.messages_delayed += 1
            self.seconds_held += due - now
        return due

    def stats(self) -> dict:
        return {"bytes_delayed": self.bytes_delayed, "messages_delayed": self.messages_delayed,
                "seconds_held": self.seconds_held}


def emulation_stats(spec: LinkSpec, pacers) -> dict:
    """One peer's ``stats()["link_emulation"]``: the setting, and what the pacers of its links
    (None for a link without one) held back, all together."""
    held = {"link": str(spec), "bytes_delayed": 0, "messages_delayed": 0, "seconds_held": 0.0}
    for pacer in pacers:
        if pacer is not None:
            for name, value in pacer.stats().items():
                held[name] += value
    return held
