"""What a committed view change does to a Peer (gossip/membership.py has the why): the
attached policies finish what they must in the old view (``_view_changing``: push-sum's
exchange in flight, a planned leaver's mass), the new transport and communicators take over,
the topology is recomputed over the new size, the attached policies are told, the members
named stale take the source's state, state spread over the members moves (``_settle_view``:
the sharded EASGD centre, cut again over the new view; a joiner's too, in take_state), and
everybody meets in a barrier of the new view before
the old transport closes (so nothing of the old view is read as a loss in the new one, and a
joiner enters at the boundary itself). A planned leaver (``leave_at_boundary``) takes rounds
until its boundary, hands its state over there, and goes.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from collectives.communicator import Communicator
from gossip.errors import OperationTimeout, PeerLost
from gossip.membership import resize_topology
from gossip.state_transfer import Prefetch, load_state, receive_state, send_state, state_of

__all__ = ["take_switch", "take_state", "prefetch", "leave_at_boundary", "depart"]

log = logging.getLogger("gossip")


def take_switch(peer: Any, switch: Any, policy: Any = None) -> int:
    """Install ``switch`` (a member's view change) on ``peer``; ``policy``: the policy whose
    state moves (the one at whose boundary or recovery this happens). Returns the step count
    to go on from. A member lost while the state moves (a joiner that dies, or refuses the
    state: another model) is left out by a recovery at once, whatever the policy: the
    others' state is untouched, so the group goes on as before."""
    old_transport, old_comms = peer._transport, [peer._comm, *peer._channels.values()]
    for p in peer.policies:
        p._view_changing(switch)
    old_comms += [c for c in peer._channels.values() if c not in old_comms]
    _install(peer, switch)
    rank = switch.transport.rank
    try:
        if policy is not None and switch.receivers:
            if rank in switch.senders:
                send_state(peer, state_of(policy), switch.receivers, switch.step,
                           policy.timeout, switch.senders)
                if rank == switch.source:
                    policy._state_sent()   # (push-sum: the source alone gave its share)
            elif rank in switch.receivers:
                step, snapshot = receive_state(peer, switch.senders, state_of(policy),
                                               policy.timeout)
                load_state(policy, snapshot, step)
        if policy is not None:
            # One step count in the new view (a time-varying graph's phase depends on it).
            policy._step = switch.step
        for p in peer.policies:   # state spread over the members (the sharded EASGD centre)
            p._settle_view()
        # The barrier also waits for the donors' sends: a donor sending to a joiner that died
        # before it connected learns so only at its send's deadline, and then proposes the
        # recovery that ends everyone's waits. A member waiting here must outlast that.
        transfer = policy.timeout if policy is not None and switch.receivers else 0.0
        peer.barrier(timeout=peer.timeout + transfer)
    except PeerLost as exc:
        log.warning("rank %d: a member was lost while view %d settled (%s): leaving it out",
                    peer.rank, switch.view.number, exc)
        return take_switch(peer, peer._membership.recover(switch.step), policy)
    finally:
        for comm in old_comms:
            comm.close(timeout=0.5)
        old_transport.close()
    for callback in list(peer._view_callbacks):
        callback(switch.view)
    return switch.step


def leave_at_boundary(peer: Any, policy: Any) -> bool:
    """A planned leave (a policy that ``hands_off_at_leave``): ask for it, then take
    ``policy``'s rounds (after_step, no local update) until the boundary where the others go
    on without this peer (at_boundary then calls depart()). False if that did not happen
    within the membership timeout: the caller leaves at once instead."""
    changes = peer._membership.changes
    if not changes.request_leave():
        return False   # the last member: nobody to hand anything to
    deadline = time.monotonic() + changes.timeout
    try:
        while not peer._departed and time.monotonic() < deadline and not policy.closed:
            policy.after_step()
    except (PeerLost, OperationTimeout) as exc:   # no commit came (its coordinator died)
        log.warning("rank %d: its planned leave failed (%s)", peer.rank, exc)
    if not peer._departed:
        log.warning("rank %d: its planned leave was not committed within %gs: leaving at "
                    "once", peer.rank, changes.timeout)
    return peer._departed


def depart(peer: Any, departure: Any) -> None:
    """A planned leaver at its boundary: each policy hands what it holds to the member the
    commit named (on this view's transport), then the peer is done."""
    for p in peer.policies:
        p._hand_off(departure.to)
    peer._departed = True
    log.info("rank %d: left; view %d goes on without it (its state went to rank %d)",
             peer.rank, departure.number, departure.to)


def prefetch(peer: Any, switch: Any) -> Prefetch:
    """A joiner starts receiving the source's state as soon as it is admitted."""
    return Prefetch(peer, switch.senders, peer._membership.changes.timeout)


def take_state(peer: Any, switch: Any, policy: Any, fetched: Prefetch) -> None:
    """A joiner's first policy attached: take the source's state (``fetched`` since the
    admission), then meet the members at the boundary where they admitted it. If the state
    does not fit (another model) or does not arrive, the joiner closes at once, so the
    members leave it out without waiting."""
    try:
        step, snapshot = fetched.result(peer, state_of(policy))
        load_state(policy, snapshot, step)
        policy._settle_view()   # with the members' (take_switch), before the barrier
        peer.barrier()
    except BaseException:
        peer.close()
        raise
    peer.join_stats = {"state_bytes": fetched.nbytes, "receive_seconds": fetched.seconds,
                       "donors": fetched.donors}
    log.info("rank %d: took the state at step %d from ranks %s (%.1f MiB received in %.3f s);"
             " training from there", peer.rank, step, fetched.donors, fetched.nbytes / 2**20,
             fetched.seconds)


def _install(peer: Any, switch: Any) -> None:
    old = peer._transport.stats()
    for name in peer._earlier_totals:
        peer._earlier_totals[name] += old[name]
    peer._transport = switch.transport
    peer._comm = Communicator(switch.transport)
    peer._channels = {}
    peer._membership.use(switch.transport)
    topology = resize_topology(peer.topology, len(switch.view))
    if topology.size != getattr(peer.topology, "size", topology.size):
        try:
            gap = f"{topology.spectral_gap():.4f}"
        except Exception:  # a time-varying graph may have none
            gap = "n/a"
        log.info("rank %d: topology recomputed for %d peers: %r (spectral gap %s)",
                 peer.rank, topology.size, topology, gap)
    peer.topology = topology
    for p in peer.policies:
        p._view_changed()
