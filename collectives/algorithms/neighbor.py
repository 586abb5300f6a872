"""The neighbour exchange that gossip needs: send x to the out-neighbours, combine what the
in-neighbours sent: x <- self_weight * x + sum_j w_j * x_j. Works for any directed or
time-varying pattern, since the caller passes this round's ranks and weights explicitly.

With ``dst_weights`` each out-neighbour receives its own scaled copy (push-sum sends
w_ij * x_j); without, every out-neighbour gets x itself, zero-copy.

``partial=True`` (push-sum's rule for lost peers): a peer that is lost or silent past the
timeout does not end the round. A source that delivered nothing of its message contributes
nothing; a destination whose send failed, or that was a source and delivered nothing, is
missing from the round, and with ``dst_weights`` its share stays with the sender (added to
``self_weight``): a peer absorbs a round only once it has received every message of it and
its own sends have left, so one that sent nothing this round absorbed nothing of it. The
peers that took part are combined as usual, and the caller gets the missing ranks back.
A source lost after part of its message arrived still fails the whole round (what arrived
of it is already summed in): that is a death in the middle of a round.
"""
from __future__ import annotations

from typing import Any

from collectives.algorithms.p2p import Call, post_range, recv_range, wait_reached, wait_sent
from collectives.algorithms.pattern import (MISSING, announce, check_pairing, plan_bits,
                                            unpaired)
from collectives.arrays.adapter import ArrayAdapter
from collectives.errors import ExchangeIncomplete
from collectives.neighbor_plan import NeighborPlan

__all__ = ["neighbor_exchange", "incomplete", "refuse", "combine", "UNCHECKED"]

# The signature's suffix of an exchange called with check_pattern=False: no plans travel and
# no pairing is checked (a peer that checks meets a call of another signature instead).
UNCHECKED = "(unchecked)"


def incomplete(rank: int, seq: int, missing: dict[int, Exception],
               dst_ranks) -> ExchangeIncomplete:
    """The error of a partial round that completed without the ``missing`` peers."""
    operation = f"neighbor_allreduce at sequence {seq}"
    return ExchangeIncomplete(
        f"rank {rank}: {operation} completed without rank(s) {sorted(missing)}: "
        + "; ".join(str(e) for e in missing.values()), missing=missing,
        missing_destinations=sorted(d for d in dst_ranks if d in missing), operation=operation)


def neighbor_exchange(call: Call, adapter: ArrayAdapter, flat: Any, plan: NeighborPlan, *,
                      scratch: Any, send_buffers: list | None = None,
                      out: Any = None) -> dict[int, Exception]:
    """Run ``plan`` on ``flat``: combine in place into ``flat``, or into ``out`` if given
    (``flat`` is then only sent); ``scratch`` is a caller-owned buffer of the same size (reused
    across rounds, so a round allocates nothing of the array's size; unused with ``out``).
    With ``plan.dst_weights``, ``send_buffers`` holds one caller-owned buffer per destination
    for the scaled copies (reused too; they are free again when this returns). Returns the
    peers missing from the round (rank -> error): always empty unless ``plan.partial``."""
    src_weights, dst_ranks, dst_weights = plan.src_weights, plan.dst_ranks, plan.dst_weights
    self_weight, partial = plan.self_weight, plan.partial
    size = adapter.size(flat)
    missing: dict[int, Exception] | None = {} if partial else None
    peers = plan.peers
    checked = plan.check_pattern
    if checked:
        announce(call, peers, src_weights, dst_ranks, missing)
    if dst_weights is not None and send_buffers is None:
        raise ValueError("a plan with dst_weights needs send_buffers, one per destination")
    tickets = []
    for i, dst in enumerate(dst_ranks):
        # The plan rides on the data.
        bits = plan_bits(dst, src_weights, dst_ranks) if checked else 0
        try:
            if dst_weights is None or send_buffers is None:
                tickets.append(post_range(call, dst, adapter, flat, 0, size, track=True,
                                          plan=bits))
            else:
                scaled = send_buffers[i]
                adapter.scaled_copy(scaled, dst_weights[dst], flat)
                tickets.append(post_range(call, dst, adapter, scaled, 0, size, track=True,
                                          plan=bits))
        except MISSING as exc:
            if missing is None:
                raise
            missing[dst] = exc
            tickets.append(None)
    # The plans are read after the data went out: checking costs no round trip before it.
    problems = check_pairing(call, peers, src_weights, dst_ranks, missing) if checked else None
    if problems:
        refuse(call, peers, problems, tickets)
    missing = missing if missing is not None else {}
    # What the in-neighbours send adds up in `scratch` (in `out` if given); `flat` is still
    # read by the sends, and is combined last, in one pass (combine).
    heard = _absorb(call, adapter, flat, plan, scratch if out is None else out, missing)
    for dst, ticket in zip(dst_ranks, tickets):
        if dst in missing:
            continue
        try:
            wait_sent(call, ticket)
            if dst not in src_weights:
                # A destination this round does not hear from: nothing else would notice
                # that it died before it was ever reached.
                wait_reached(call, dst)
        except MISSING as exc:
            if not partial:
                raise
            missing[dst] = exc
    if missing and dst_weights is not None:
        # The shares of the destinations missing from the round were not absorbed there.
        self_weight += sum(dst_weights[d] for d in dst_ranks if d in missing)
    combine(adapter, flat, self_weight, scratch, out, heard=heard)
    return missing


def _absorb(call: Call, adapter: ArrayAdapter, flat: Any, plan: NeighborPlan, acc: Any,
            missing: dict[int, Exception]) -> bool:
    """``acc`` <- what the in-neighbours of ``plan`` (but the ``missing``) send, weighted;
    returns whether any sent something (else ``acc`` is not written). The first source in
    rank order writes each range (a scaled copy: nothing clears ``acc`` first) and the others
    add theirs once it has; chunks are taken as they come, always from the source whose next
    chunk starts lowest (ties in rank order), one held per source while the first one has not
    reached its end. So every element is summed in rank order, whatever the timing and the
    chunk sizes, as when the sources were read one after the other, and no source's chunks
    pile up unread behind another's, to be summed only after the last byte arrived (a tail
    of one pass over the array per source after the network's last byte). A source lost
    before it delivered anything of a ``partial`` plan joins ``missing`` (the next in rank
    order then writes); one lost later fails the round (what it sent is summed in)."""
    src_weights = plan.src_weights
    order = [src for src in sorted(src_weights) if src not in missing]
    sources = {src: recv_range(call, src, adapter, 0, adapter.size(flat)) for src in order}
    at = dict.fromkeys(order, 0)                    # elements received from each source
    held: dict[int, tuple[int, int, Any]] = {}      # a chunk not summed yet, by source
    got: set[int] = set()
    written = 0                                     # acc[:written] holds the first's share
    while True:
        live = [src for src in order if src not in missing]
        if not live:
            return False
        # (A source is read only once every source before it in rank order delivered a
        # chunk, so the one that becomes first when the first is lost holds nothing yet.)
        first = live[0]
        for src in [src for src, (_, b, _) in held.items() if b <= written]:
            a, b, chunk = held.pop(src)
            adapter.axpy(adapter.slice(acc, a, b), src_weights[src], chunk)
        ready = [src for src in sources if src not in held]
        if not ready:
            return bool(got)
        src = min(ready, key=lambda s: (at[s], s))
        try:
            a, b, chunk = next(sources[src])
        except StopIteration:
            del sources[src]
            continue
        except MISSING as exc:
            if not plan.partial or src in got:
                raise
            missing[src] = exc
            del sources[src]
            continue
        got.add(src)
        at[src] = b
        if src == first:
            adapter.scaled_copy(adapter.slice(acc, a, b), src_weights[src], chunk)
            written = b
        elif b <= written:
            adapter.axpy(adapter.slice(acc, a, b), src_weights[src], chunk)
        else:
            held[src] = (a, b, chunk)


def combine(adapter: ArrayAdapter, flat: Any, self_weight: float, scratch: Any, out: Any,
            heard: bool) -> None:
    """The round's last pass: ``flat`` (or ``out``) <- self_weight * flat + what the
    in-neighbours sent, summed in ``scratch`` (in ``out`` when given); ``heard``: some
    in-neighbour did send."""
    if out is not None:
        if not heard:
            adapter.scaled_copy(out, self_weight, flat)
        elif self_weight:
            adapter.axpy(out, self_weight, flat)
    elif not heard:
        adapter.scale(flat, self_weight)  # no in-neighbours this round
    else:
        adapter.scale_add(flat, self_weight, scratch)


def refuse(call: Call, peers, problems: list[str], tickets) -> None:
    """Raise the ValueError of a pattern that does not pair, once the peers involved were told
    (those whose own check passed would otherwise wait for this peer's data) and this peer's
    sends are off its buffer (the caller may change it once this raises)."""
    t = call.transport
    message = unpaired(call, problems)
    t.abort(peers, call.channel, call.seq, message)
    for ticket in tickets:
        if ticket is None:
            continue
        try:
            wait_sent(call, ticket)
        except Exception:  # the pattern error is the one to report
            pass
    raise ValueError(message)
