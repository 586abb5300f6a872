"""One simulated peer as its policy sees it: a PolicyHost (gossip/policies/base/policy_host.py)
over a Fabric, so the project's own policy classes run unchanged, many peers in one process.

Collectives and neighbour exchanges move numpy arrays and CPU torch tensors (their memory, in
place) through the fabric and advance this peer's virtual clock; a non-blocking call
completes before it returns (its Work is done). Deaths (fabric.py) are seen as on real peers:
``lost_peers`` names a dead peer once this peer's clock passes its detection, an exchange with
one raises PeerLost (the round skipped), or with ``partial`` completes without it and raises
ExchangeIncomplete (a missing destination's share stays with the sender), and the policies'
own channels (a gossip graph's healing proposals) carry their messages. An elastic policy
(synchronous, local SGD with ``elastic=True``) that loses a peer in a collective recovers
through ``recover``: the survivors re-form the group (Fabric.reform), the policy's own
view-change hooks run, and every survivor goes on from the same step, as a recovery at once
on real peers. A restarted peer (``joining``) waits until the members admit it at a step
boundary (``wait_admitted``; ``at_boundary`` on the members' side), then takes the source's
state at attach (``attached``: gossip.membership.state_transfer's state_of and load_state).
Each host keeps its own view (its rank and size change when it takes a change); the fabric
names peers by their starting rank. A leave (scheduled, TrainingSpec.leaves) is at once
under the policies that do not hand their state off: the leaver goes at its own boundary
(Fabric.depart) and ``departed`` turns True, or as it hears of its own change; the
others hear of it a notice after its request (``changing_now``), start no operation of the
old view from then on (ViewChanging; those waiting on a member that is re-forming end too),
and re-form the group (``_recovery``, from the policy's recovery or at a boundary): the commit is the real coordinator's, the
survivors going on from the step count of the one furthest on, those behind taking its
state when the policy's replicas are identical or share a part (local SGD). Push-sum's
leave is planned: at a boundary the group meets at, the leaver hands its state over
(``policy.hand_off``: its mass). A non-blocking neighbour exchange (push-sum's overlap) sends
at once and receives and combines at its Work's ``wait()``, on the waiter's clock; inside a
view change (``_switch_to``, where push-sum's overlap completes the exchange in flight) it
takes no death (a message that arrives after this peer's death is missing, as its sender
counted it: the death comes at the next step). The asynchronous policy's background threads
run on the fabric's Scheduler (one virtual thread at a time, by virtual time).

Codecs (``compression=``) run as the real collectives run them
(collectives/algorithms/compressed.py), on the same codec objects and in the same order, so
the bits are the real ones: the neighbour exchange sends one encoding to each destination and
combines the decoded encodings in float32 (float64 for float64 arrays); the allreduce of an
array of at most DEFAULT_SMALL_BYTES (as float32) or with top-k gathers every peer's encoding
(error feedback in the caller's residual) and sums the decoded ones in rank order, a larger
one with a dense codec runs the ring on encodings (each hop's partial sum encoded again). The
messages are charged their encodings' bytes (links.py names each scheme's cost)."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

import numpy as np

from collectives import NeighborPlan
from collectives.algorithms.compressed import CodecStats, encode_with_feedback, padded_count
from collectives.codecs.catalog import parse as parse_codec
from collectives.codecs.codec import Codec
from collectives.codecs.float32 import as_float32, write_back
from collectives.communicator import DEFAULT_SMALL_BYTES
from collectives.operations.compressed_allreduce import compressed_input
from collectives.staging import flat_of
from collectives.group import Member, Switch, View
from collectives.work import Work
from gossip.errors import ExchangeIncomplete, PeerLost, ViewChanging
from gossip.policies.base.concurrency import REAL_CONCURRENCY, Concurrency
from gossip.policies.neighborhood.policy_graph import resize_topology
from gossip.simulation.fabric import Fabric

__all__ = ["SimHost"]

log = logging.getLogger("gossip")

_OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def _numpy(x: Any) -> np.ndarray:
    """``x``'s memory as a numpy array (a CPU torch tensor's, shared)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach") and getattr(x, "device", None) is not None \
            and str(x.device) == "cpu":
        return x.detach().numpy()
    raise TypeError(f"the simulator moves numpy arrays and CPU torch tensors, got "
                    f"{type(x).__name__}")


def _done(result: Any, what: str, error: BaseException | None = None) -> Work:
    work = Work(what)
    work.finish(result, error)
    return work


class _Deferred(Work):
    """A simulated non-blocking exchange whose receives and combine run at the first
    ``wait()`` (in the waiting thread, on its clock); ``done()`` is False until then (whether
    the messages arrived by the caller's clock is known only once it waits: the senders'
    threads may not have sent yet in real time)."""

    __slots__ = ("_complete",)

    def __init__(self, description: str, complete: Any) -> None:
        super().__init__(description)
        self._complete = complete

    def wait(self, timeout: float | None = None) -> Any:
        complete, self._complete = self._complete, None
        if complete is not None:
            try:
                result = complete()
            except BaseException as exc:   # (raised below, as a real handle's error is)
                self.finish(None, exc)
            else:
                self.finish(result)
        return super().wait(timeout)


def _call(wait: bool, what: str, run: Any) -> Any:
    """``run()``'s result, or with ``wait=False`` a finished Work holding it, or holding the
    PeerLost it raised (raised by ``wait()``, as a real non-blocking call's)."""
    if wait:
        return run()
    try:
        return _done(run(), what)
    except PeerLost as exc:
        return _done(None, what, exc)


class _Sent:
    """A simulated isend's request: the message left at once (its link's time is charged to
    its arrival)."""

    def test(self) -> bool:
        return True

    def wait(self, timeout: float | None = None) -> None:
        return None


class _Channel:
    """A policy's channel between simulated peers: point-to-point arrays in order. In a run
    of round-based policies free of simulated time (a gossip graph's healing proposals); in
    a scheduled run (the asynchronous policy's threads: scheduler.py) timed as the exchanges
    are, each message charged its link's latency and bytes, with isend, probe and wait_any.
    The rest of a peer channel is refused."""

    def __init__(self, host: "SimHost", number: int) -> None:
        self._fabric = host.fabric
        self._host = host
        self._rank = host.starting_rank
        self.number = number
        self._timed = host.fabric.scheduler is not None
        # (Timed) the channel of this view: a channel is its view's communicator's, as on a
        # real peer, so a receive of the view being left never takes the next one's message.
        self._key = (number, host.view_number)

    def send(self, dst: int, x: Any, *, timeout: float | None = None) -> None:
        if self._timed:
            self._fabric.send(self._rank, self._host.members[dst], _numpy(x),
                              channel=self._key)
        else:
            self._fabric.post(self.number, self._rank, self._host.members[dst], _numpy(x))

    def isend(self, dst: int, x: Any, *, timeout: float | None = None) -> _Sent:
        if not self._timed:
            return self.__getattr__("isend")
        self.send(dst, x, timeout=timeout)
        return _Sent()

    def recv(self, src: int, out: Any = None, *, timeout: float | None = None) -> Any:
        peer = self._host.members[src]
        if self._timed:
            got = self._fabric.channel_take(
                self._key, self._rank, peer, timeout,
                f"a message on channel {self.number} from rank {src}")
        else:
            got = self._fabric.take(self.number, self._rank, peer,
                                    self._fabric.timeout if timeout is None else timeout)
        if out is None:
            return got
        np.copyto(_numpy(out), got.reshape(_numpy(out).shape))
        return out

    def probe(self, src: int) -> bool:
        if self._timed:
            return self._fabric.channel_probe(self._key, self._rank, self._host.members[src])
        return self._fabric.waiting(self.number, self._rank, self._host.members[src])

    def wait_any(self, sources: Sequence[int], timeout: float | None = None) -> int | None:
        if not self._timed:
            return self.__getattr__("wait_any")
        members = self._host.members
        found = self._fabric.channel_wait_any(
            self._key, self._rank, [members[j] for j in sources], timeout,
            f"a message on channel {self.number} from ranks {list(sources)}")
        return None if found is None else self._host.view_rank_of(found)

    def __getattr__(self, name: str) -> Any:
        raise NotImplementedError(
            f"the simulator's peer channels send, receive and probe (channel {self.number}."
            f"{name}): the policies the simulator runs use no more")


@dataclass(frozen=True)
class _ViewTransport:
    """What a policy reads of a simulated peer's transport: this peer's rank, and that no
    change at once interrupted its waits (a real inbox closed by one stops sleeping; the
    simulated channels' waits always sleep their timeout)."""

    rank: int
    interrupted: bool = False


def _sum_of_encodings(codec: Codec, encodings: Sequence[np.ndarray], count: int,
                      op: str) -> np.ndarray:
    """gather_allreduce's sum: every peer's encoding decoded and summed in rank order, in
    float32 (divided by n for a mean)."""
    acc = np.empty(count, dtype=np.float32)
    part = np.empty(count, dtype=np.float32)
    for i, encoding in enumerate(encodings):
        codec.decode(encoding, acc if i == 0 else part)
        if i:
            acc += part
    if op == "mean" and len(encodings) > 1:
        acc /= len(encodings)
    return acc


def _ring_on_encodings(codec: Codec, arrays: Sequence[np.ndarray], op: str) -> np.ndarray:
    """ring_allreduce_compressed's result over every peer's float32 array (rank order), hop
    by hop as the peers compute it: at hop s rank r encodes its partial sum of segment r - s
    and its right neighbour adds the decoded encoding to its own; then each rank encodes the
    segment r + 1 it finished, and every peer decodes those."""
    n, count = len(arrays), arrays[0].size
    seg = padded_count(count, n)
    size = codec.encoded_nbytes(seg)
    accs = []
    for x in arrays:
        acc = np.zeros(n * seg, dtype=np.float32)
        acc[:count] = x
        accs.append(acc)
    part = np.empty(seg, dtype=np.float32)
    for s in range(n - 1):
        sent = []
        for r in range(n):
            j = (r - s) % n
            encoding = np.empty(size, dtype=np.uint8)
            codec.encode(accs[r][j * seg:(j + 1) * seg], encoding)
            sent.append(encoding)
        for r in range(n):   # what its left neighbour sent: its partial sum of segment k
            k = (r - s - 1) % n
            codec.decode(sent[(r - 1) % n], part)
            accs[r][k * seg:(k + 1) * seg] += part
    result = np.empty(n * seg, dtype=np.float32)
    encoding = np.empty(size, dtype=np.uint8)
    for r in range(n):
        owned = (r + 1) % n
        codec.encode(accs[r][owned * seg:(owned + 1) * seg], encoding)
        codec.decode(encoding, part)
        result[owned * seg:(owned + 1) * seg] = part
    out = result[:count].copy()
    if op == "mean" and n > 1:
        out /= n
    return out


class SimHost:
    """Peer ``rank`` of ``fabric``'s (its starting rank), on ``topology`` (PEER_TOPOLOGY's
    graph)."""

    def __init__(self, fabric: Fabric, rank: int, topology: Any, *, timeout: float = 300.0,
                 joining: bool = False) -> None:
        self._fabric = fabric
        self._rank = rank   # global: the fabric's number for this peer, whatever the view
        self._topology = topology
        self._timeout = timeout
        self._closed = False
        self._joining = joining
        self._admission: Any = None   # (a restarted peer) the view change that admitted it
        self._departed = False        # a planned leaver, gone
        # This peer's view (it changes when this peer takes a change, as a real peer's).
        self._set_view(0, list(fabric.members))
        self._exchanges = 0   # this view's neighbour exchanges: the number their messages carry
        self._switching = False   # inside a view change's policy hooks (_switch_to)
        self._codec_stats = CodecStats()   # what its compressed calls encoded (stats()["codec"])

    # -- identity and settings ----------------------------------------------------------------
    @property
    def fabric(self) -> Fabric:
        return self._fabric

    @property
    def members(self) -> list[int]:
        """This peer's view: the starting ranks of its members, in rank order."""
        return self._view[1]

    @property
    def rank(self) -> int:
        """This peer's rank in its view (its starting rank until a view change)."""
        return self._position[self._rank]

    @property
    def view_number(self) -> int:
        """The number of this peer's view (0 at the start; one more at each change)."""
        return self._view[0]

    @property
    def world_size(self) -> int:
        return len(self._view[1])

    @property
    def starting_rank(self) -> int:
        """The rank this peer started with (the fabric's clocks and counts use it)."""
        return self._rank

    @property
    def timeout(self) -> float:
        return self._timeout

    @property
    def topology(self) -> Any:
        return self._topology

    @property
    def transport(self) -> Any:
        """What a policy reads of the transport: this peer's rank, and ``interrupted``."""
        return _ViewTransport(self.rank)

    @property
    def concurrency(self) -> Concurrency:
        """The fabric's virtual threads in a scheduled run (scheduler.py), else the standard
        library's (the round-based policies start no thread)."""
        return self._fabric.scheduler or REAL_CONCURRENCY

    def view_rank_of(self, peer: int) -> int:
        """Fabric peer ``peer``'s rank in this peer's view."""
        return self._position[peer]

    @property
    def view(self) -> View:
        """This peer's view (members named by slot, of their present life's incarnation)."""
        return self._view_object

    @property
    def joining(self) -> bool:
        return self._joining

    @property
    def departed(self) -> bool:
        """True once this peer's leave took effect (at once, or planned: it handed its state
        over)."""
        return self._departed

    @property
    def entering(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def clock(self) -> float:
        """This peer's simulated time, seconds."""
        return self._fabric.clock[self._rank]

    def stats(self) -> dict[str, Any]:
        return {"bytes_sent": self._fabric.bytes_sent[self._rank],
                "messages_sent": self._fabric.messages_sent[self._rank],
                "codec": self._codec_stats.snapshot()}

    def lost_peers(self) -> dict[int, str]:
        """The current view's ranks this peer counts lost (a view re-formed without the dead
        lists none of them)."""
        lost = self._fabric.lost_for(self._rank)
        return {self._position[d]: why for d, why in lost.items() if d in self._position}

    def close(self) -> None:
        self._closed = True

    # -- communication ------------------------------------------------------------------------
    def channel(self, number: int) -> Any:
        return _Channel(self, number)

    def allreduce(self, x: Any, op: str = "sum", *, wait: bool = True,
                  timeout: float | None = None, algorithm: str = "auto",
                  compression: Any = None, residual: Any = None) -> Any:
        codec = parse_codec(compression)
        if codec is not None:
            return self._compressed_allreduce(x, op, codec, wait, residual)
        if op not in _OPS and op != "mean":
            raise ValueError(f"allreduce: unknown op {op!r}")
        mine = _numpy(x)
        ufunc = _OPS.get(op, np.add)

        def combine(parts: Sequence[np.ndarray]) -> np.ndarray:
            total = reduce(lambda a, b: ufunc(a, b), parts[1:], parts[0].copy())
            if op == "mean":
                total = total / len(parts)
            return total.astype(mine.dtype, copy=False)

        def run() -> Any:
            self._check_change("allreduce")
            np.copyto(mine, self._fabric.collective(self._rank, "allreduce", mine.copy(),
                                                    mine.nbytes, combine))
            return x
        return _call(wait, "simulated allreduce", run)

    def _compressed_allreduce(self, x: Any, op: str, codec: Codec, wait: bool,
                              residual: Any) -> Any:
        """allreduce(compression=codec), as collectives/operations/compressed_allreduce.py
        runs it (the same checks, scheme and arithmetic; the module docstring)."""
        adapter, flat, _, x32 = compressed_input(x, op, codec, residual)
        count = x32.size
        small = count * 4 <= DEFAULT_SMALL_BYTES

        def run() -> Any:
            self._check_change("allreduce")
            n = self.world_size
            if codec.dense and not small:   # the ring on encodings
                seg = padded_count(count, n)
                size = codec.encoded_nbytes(seg)
                for _ in range(n):   # (its n - 1 hops' partial sums and its own segment)
                    self._codec_stats.encoded(seg, size)
                result = self._fabric.collective(
                    self._rank, "allreduce", x32.copy(), n * size,
                    lambda parts: _ring_on_encodings(codec, parts, op), cost="ring_allreduce")
            else:   # one encoding a peer, gathered (straight from each if small)
                size = codec.encoded_nbytes(count)
                encoding = np.empty(size, dtype=np.uint8)
                encode_with_feedback(codec, x32, encoding, residual)
                self._codec_stats.encoded(count, size)
                result = self._fabric.collective(
                    self._rank, "allreduce", encoding, size,
                    lambda parts: _sum_of_encodings(codec, parts, count, op),
                    cost="direct_allgather" if small else "allgather")
            x32[...] = result
            write_back(adapter, flat, x32)
            return x
        return _call(wait, f"simulated allreduce({op},{codec.name})", run)

    def broadcast(self, x: Any, root: int = 0, *, wait: bool = True,
                  timeout: float | None = None) -> Any:
        mine = _numpy(x)

        def run() -> Any:
            self._check_change("broadcast")
            np.copyto(mine, self._fabric.collective(self._rank, "broadcast", mine.copy(),
                                                    mine.nbytes, lambda parts: parts[root]))
            return x
        return _call(wait, "simulated broadcast", run)

    def allgather(self, x: Any, *, out: Any = None, variable: bool = False,
                  wait: bool = True, timeout: float | None = None) -> Any:
        mine = _numpy(x)

        def run() -> Any:
            self._check_change("allgather")
            parts = self._fabric.collective(self._rank, "allgather", mine.copy(), mine.nbytes,
                                            lambda ps: [p.copy() for p in ps])
            if variable:
                return parts
            gathered = np.stack(parts)
            if out is not None:
                np.copyto(_numpy(out), gathered.reshape(_numpy(out).shape))
                return out
            return gathered
        return _call(wait, "simulated allgather", run)

    def neighbor_exchange(self, x: Any, plan: NeighborPlan, *, scratch: Any = None,
                          out: Any = None, wait: bool = True,
                          timeout: float | None = None) -> Any:
        fabric, rank = self._fabric, self._rank
        fabric.check_alive(rank)
        self._check_change("neighbour exchange")
        tag = (self._view[0], self._exchanges)
        self._exchanges += 1
        what = f"neighbour exchange #{tag[1]}"
        members = self.members   # view rank -> the fabric's
        missing: dict[int, Exception] = {}
        codec = plan.compression
        if codec is not None:   # one encoding to every destination (compressed_exchange)
            adapter, flat, dtype = flat_of(x)
            x32 = as_float32(adapter, flat, dtype)
            payload = np.empty(codec.encoded_nbytes(x32.size), dtype=np.uint8)
            codec.encode(x32, payload)
            self._codec_stats.encoded(x32.size, payload.size)
        else:
            mine = _numpy(x)
        for dst in plan.dst_ranks:
            scale = None if plan.dst_weights is None else plan.dst_weights[dst]
            data = payload if codec is not None else mine if scale is None else mine * scale
            if not fabric.send(rank, members[dst], data, tag):
                missing[dst] = PeerLost(f"simulated rank {rank}: rank {dst} died before "
                                        f"{what} reached it", rank=dst, operation=what)

        def receive() -> list[tuple[int, np.ndarray]]:
            received = []
            for src in sorted(plan.src_weights):
                try:
                    received.append((src, fabric.recv(rank, members[src], what, tag,
                                                      dying=not self._switching)))
                except PeerLost as exc:
                    missing[src] = exc
            if not self._switching:   # (a death inside a view change comes at the next step)
                fabric.check_alive(rank)   # (what arrived at or after it is not absorbed)
            if missing and not plan.partial:
                first = min(missing)
                raise missing[first]   # the round costs this peer its combine, as a real one
            return received

        def complete_compressed() -> Any:
            assert codec is not None
            # As compressed_exchange: w_self D(E(x)) + sum_j w_j D(E(x_j)), in rank order.
            own = np.empty_like(x32)
            codec.decode(payload, own)
            accumulate = "float64" if dtype == "float64" else "float32"
            acc = own.astype(accumulate)
            acc *= plan.self_weight
            part = np.empty_like(x32)
            for src, got in receive():
                codec.decode(got, part)
                acc += plan.src_weights[src] * part.astype(accumulate, copy=False)
            x32[...] = own
            if out is not None and out is not x:   # x keeps what its neighbours received
                write_back(adapter, flat, x32)
                out_adapter, out_flat, _ = flat_of(out)
                write_back(out_adapter, out_flat, acc)
                return out
            write_back(adapter, flat, acc)
            return x

        def complete() -> Any:
            if codec is not None:
                return complete_compressed()
            received = receive()
            self_weight = plan.self_weight
            if plan.dst_weights is not None:   # a missing destination's share stays here
                self_weight += sum(plan.dst_weights[d] for d in plan.dst_ranks if d in missing)
            result = mine * self_weight
            for src, got in received:
                result += plan.src_weights[src] * got
            target = mine if out is None else _numpy(out)
            np.copyto(target, result.astype(target.dtype, copy=False))
            if missing:
                raise ExchangeIncomplete(
                    f"simulated rank {rank}: {what} completed without rank(s) "
                    f"{sorted(missing)}", missing=missing,
                    missing_destinations=sorted(d for d in plan.dst_ranks if d in missing),
                    operation=what)
            return x if out is None else out

        if wait:
            return complete()
        # In flight while the caller goes on (push-sum's overlap): what was sent left at this
        # clock; the receives and the combine happen at wait(), the clock moving to the last
        # arrival if that is later than the caller's by then.
        return _Deferred("simulated neighbour exchange", complete)

    # -- membership: recoveries, restarts, leaves ------------------------------------------------
    def register_policy(self, policy: Any) -> None:
        pass

    def unregister_policy(self, policy: Any) -> None:
        pass

    def at_boundary(self, policy: Any, step: int) -> bool:
        """After step ``step``: a leaver at once whose request came goes now; a member that
        heard of a change at once re-forms the group here (_recovery); while a restart or a
        planned leave is pending, meet the members here (Fabric.boundary); a change that
        admits restarted peers is taken as take_switch takes it (gossip/membership/
        controller.py): the policy's view_changing, the new view, view_changed, the source's
        state to the joiners, resume_at, settle_view, the barrier. True if the view
        changed."""
        if self._fabric.leave_due(self._rank):   # a leave at once: this peer goes now
            self._fabric.depart(self._rank)
            self._departed = True
            return True
        if self.changing_now():   # a change at once it heard of: it re-forms the group here
            self._recovery(policy, step, pending=False)
            return True
        admission = self._fabric.boundary(self._rank, step)
        if admission is None:
            if self.changing_now():   # (it heard of a change at once at the boundary)
                self._recovery(policy, step, pending=False)
                return True
            return False
        if self._rank in admission.leavers:   # a planned leaver: hand over, then done
            policy.hand_off(self._position[admission.leavers[self._rank]])
            self._departed = True
            return True
        me = admission.members.index(self._rank)
        handoffs = [(me, self._position[r]) for r, taker in admission.leavers.items()
                    if taker == self._rank]
        self._switch_to(policy, admission.number, admission.members, step,
                        receivers=admission.receivers, source=admission.source,
                        handoffs=handoffs)
        if me == admission.source:
            from gossip.membership.state_transfer import state_of
            self._fabric.post_state(admission, state_of(policy))
            policy.state_sent()
        policy.resume_at(step, complete=False)
        policy.settle_view()
        self._fabric.settle(self._rank, admission)
        return True

    def wait_admitted(self) -> bool:
        """(A restarted peer, before its policy attaches.) Wait until the members admit it
        and take their view; False if they ended first (it never joins)."""
        admission = self._fabric.admission(self._rank)
        if admission is None:
            return False
        self._admission = admission
        self._set_view(admission.number, admission.members)
        self._topology = resize_topology(self._topology, len(admission.members))
        return True

    def attached(self, policy: Any) -> None:
        """(A restarted peer.) Take the source's state into ``policy``, as a joiner does at
        attach (controller.attached), then meet the members at the switch's end."""
        admission = self._admission
        if admission is None or not self._joining:
            return
        from gossip.membership.state_transfer import load_state
        load_state(policy, self._fabric.take_state(admission), admission.step)
        policy.resume_at(admission.step, complete=False)
        policy.settle_view()
        self._joining = False
        self._fabric.settle(self._rank, admission, loaded=True)

    def recover(self, policy: Any, step: int, pending: bool = False) -> int:
        """A peer was lost mid-step (an elastic policy, Policy._recover), or a change at once
        ended the step's operations (a leave at once, any policy): re-form the group with
        the survivors and go on, as PeerMembership.recover does (_recovery)."""
        return self._recovery(policy, step, pending)

    def _recovery(self, policy: Any, step: int, pending: bool) -> int:
        """Meet the survivors (Fabric.reform: the commit names the source, the survivor that
        completed most steps, and the step count everyone goes on from); the policy's hooks
        run as a real view change runs them (gossip/membership/controller.py, take_switch):
        view_changing, the new view, view_changed, the source's state to those behind it
        when the policy's replicas are identical or share a part (local SGD's average),
        resume_at, settle_view. ``pending``: this peer's parameters hold its update of
        ``step``, not yet combined; a member that takes the source's state completes the
        step if the source's were pending. Returns the step count to go on from. A leaver
        at once whose request came goes instead (the change it heard of is its own)."""
        fabric = self._fabric
        fabric.check_alive(self._rank)   # (its clock moved to the detection: its own death?)
        if fabric.leave_due(self._rank):   # the change it hears of is its own leave: it goes
            fabric.depart(self._rank)
            self._departed = True
            return step
        resync = bool(policy.identical_replicas or policy.shared_state)
        change = fabric.reform(self._rank, step, pending, resync)
        me = change.members.index(self._rank)
        received = me in change.receivers
        self._switch_to(policy, change.number, change.members, change.step,
                        receivers=change.receivers, source=change.source,
                        completes=change.completes, at_once=True)
        if change.receivers:
            from gossip.membership.state_transfer import load_state, state_of
            if me == change.source:
                fabric.post_state(change, state_of(policy))
                policy.state_sent()
            elif received:
                load_state(policy, fabric.take_state(change), change.step)
                log.info("simulated rank %d: took the state of rank %d at step %d (the view "
                         "re-formed at once, %d members)", self._rank,
                         change.members[change.source], change.step, len(change.members))
        policy.resume_at(change.step, complete=change.completes if received else pending)
        policy.settle_view()
        if change.receivers:
            fabric.settle(self._rank, change, loaded=received)
        return change.step

    def _switch_to(self, policy: Any, number: int, members: list[int], step: int, *,
                   receivers: list[int] | None = None, source: int = 0,
                   completes: bool = False, at_once: bool = False,
                   handoffs: list[tuple[int, int]] | None = None) -> None:
        """The policy's hooks around this peer's move to view ``number`` of ``members``:
        view_changing in the old view, then the new view and topology, then view_changed."""
        view = self._make_view(number, members, step)
        switch = Switch(view, _ViewTransport(members.index(self._rank)), source=source,
                        step=step, receivers=list(receivers or []),
                        at_once=at_once or not receivers,
                        completes=completes, handoffs=list(handoffs or []))
        self._switching = True   # (push-sum's overlap completes its exchange in flight here)
        scheduler = self._fabric.scheduler
        try:   # (a scheduled peer's death inside the hooks comes at its next step too)
            with scheduler.deferring_death(self._rank) if scheduler is not None \
                    else contextlib.nullcontext():
                policy.view_changing(switch)
                self._set_view(number, members, view)
                self._topology = resize_topology(self._topology, len(members))
                policy.view_changed()
        finally:
            self._switching = False

    def _make_view(self, number: int, members: list[int], step: int) -> View:
        """View ``number`` of ``members`` (starting ranks), each member named by its slot
        and of the incarnation of its present life (a restarted peer is another member)."""
        return View("simulation", number, tuple(
            Member(f"peer-{m}", self._fabric.life_of(m), "") for m in members), step)

    def _set_view(self, number: int, members: list[int], view: View | None = None) -> None:
        self._view = (number, list(members))
        self._view_object = view if view is not None else self._make_view(number, members, 0)
        self._position = {m: k for k, m in enumerate(members)}
        self._exchanges = 0

    def _check_change(self, what: str) -> None:
        """A peer that heard of a change at once starts no operation of the old view: it
        raises ViewChanging, and its policy re-forms the group (Policy._recover)."""
        if self.changing_now():
            raise ViewChanging(f"simulated rank {self._rank}: {what} not started: view "
                               f"{self._view[0]} changes at once", operation=what)

    def changing_now(self) -> bool:
        """True once this peer heard of a change at once in its view (a leave at once: the
        view's notice, Fabric.depart), until it took the change."""
        notice = self._fabric.notice(self._view[0])
        return notice is not None and self.clock >= notice

    def leave(self) -> None:
        raise NotImplementedError("the simulator's leaves are scheduled (TrainingSpec.leaves), "
                                  "not called")
