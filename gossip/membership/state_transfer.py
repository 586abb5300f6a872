"""Moving a member's training state to the members that need it after a view change (a
joiner; after a recovery, a replica that did not finish the step the source finished).

The state is a Snapshot (gossip/snapshot): the parameters' buckets, the optimizer's state
when a DistributedOptimizer drives the policy (momentum, Adam's moments: without them a
joiner's updates would differ from the replicas'), and the policy's own state. The source
sends, on a communicator of its own (PeerChannel.MEMBERSHIP), first a manifest (msgpack:
every array's name, dtype, shape and digest, the state dicts' structure, the step, the
peer's tracked objects such as an ElasticSampler's cursor; never a pickle), then the
snapshot's bytes in chunks that never cross an array's end, each read in place. The
receiver checks the manifest's parameters against its own before anything is allocated (a
model of other shapes is a SnapshotMismatch, a ValueError, naming the first of the user's
parameters that differs, by its own name when it has one (``fc.weight``: the manifest
describes every parameter the source's policy holds, not only the buckets they are packed
in); the group is unaffected: the source only sends), receives each chunk straight into
the array it belongs to, checks every array's digest (SnapshotCorrupt naming the first bad
one), then loads the optimizer and the policy.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from gossip.errors import ProtocolError, SnapshotCorrupt, SnapshotMismatch
from gossip.peer_channels import PeerChannel
from gossip.snapshot import Snapshot, SnapshotReceiver, crc
from gossip.snapshot.array_specs import PIECE_BYTES

if TYPE_CHECKING:
    from gossip.membership.contracts import MembershipHost, MembershipParticipant

__all__ = ["send_state", "receive_state", "Prefetch", "state_of", "params_of", "load_state",
           "CHUNK_BYTES"]

log = logging.getLogger("gossip")

# Bytes per message of a transfer: the transport's whole-message size, so none is cut again,
# and one piece of the digest (snapshot.array_specs.PIECE_BYTES), checksummed as it lands.
CHUNK_BYTES = PIECE_BYTES
_MAX_MANIFEST = 64 << 20


def _flats(policy: MembershipParticipant) -> list:
    """numpy views of a policy's bucket buffers (a torch CPU tensor shares its memory)."""
    return [b.flat if isinstance(b.flat, np.ndarray) else b.flat.detach().numpy()
            for b in policy.buckets]


def state_of(policy: MembershipParticipant) -> Snapshot:
    """A member's state as a Snapshot: the parameters' buckets, the optimizer's state if a
    DistributedOptimizer drives the policy (``policy.transfer_optimizer``), and the policy's
    own state (its step included)."""
    policy.buckets.copy_in()
    return Snapshot.of(params=_flats(policy), optimizer=policy.transfer_optimizer,
                       policy=policy)


def params_of(policy: MembershipParticipant) -> list[list]:
    """The parameters a policy holds, as the user gave them: [name or None, dtype, shape]
    each (BucketSet.describe), what a receiver checks its own model against."""
    return policy.buckets.describe()


def load_state(policy: MembershipParticipant, snapshot: Snapshot, step: int) -> None:
    """Load the source's ``snapshot`` (checked already) into the policy's buckets, its
    optimizer and itself, then go on from ``step``."""
    optimizer = policy.transfer_optimizer if "optimizer" in snapshot.parts else None
    snapshot.restore_into(params=_flats(policy), optimizer=optimizer, policy=policy)
    policy.took_state(step)


def send_state(peer: MembershipHost, snapshot: Snapshot, receivers: list[int], step: int,
               timeout: float, donors: list[int] | None = None, *,
               params: list | None = None) -> None:
    """Send ``snapshot`` to each of ``receivers`` (ranks of the peer's current view): all of
    it, or with ``donors`` (identical replicas, the source first) this peer's share of the
    chunks (every len(donors)-th from its place); the source also sends the manifest, which
    the receivers check every donor's chunks by, with ``params`` (params_of: the source's
    parameters, which a receiver checks its own against by name)."""
    comm = peer.channel(PeerChannel.MEMBERSHIP)
    donors = donors or [peer.rank]
    share = donors.index(peer.rank)
    raw = None
    if share == 0:   # only the source's manifest (and so its digests) is ever read
        tracked = peer.tracked_states()
        # The pieces' CRCs too: with several donors a bad piece names the donor that sent it.
        manifest = {"snapshot": snapshot.manifest, "step": step, "tracked": tracked,
                    "pieces": snapshot.piece_crcs if len(donors) > 1 else None,
                    "params": params}
        raw = np.frombuffer(msgpack.packb(manifest, use_bin_type=True), dtype=np.uint8)
    ranges = snapshot.layout().ranges(CHUNK_BYTES)[share::len(donors)]
    for r in receivers:
        if raw is not None:
            comm.send(r, raw, timeout=timeout)
        for offset, length in ranges:
            comm.send(r, np.frombuffer(snapshot.read(offset, length), dtype=np.uint8),
                      timeout=timeout)
    log.info("rank %d: sent %s of its state (%d arrays, %.1f MiB) to ranks %s", peer.rank,
             "all" if len(donors) == 1 else f"share {share + 1} of {len(donors)}",
             len(snapshot.names), snapshot.nbytes / 2**20, receivers)


def receive_state(peer: MembershipHost, donors: list[int], mine: Snapshot,
                  timeout: float, *, params: list | None = None) -> tuple[int, Snapshot]:
    """Receive the state ``donors`` send (the source first: its manifest, then each donor's
    share of the chunks), checked against ``mine`` (this peer's own, for the parameters'
    names, dtypes and shapes; ``params``: its params_of) before anything is allocated;
    returns (the source's step, its snapshot), and loads the tracked objects' state."""
    step, snapshot, tracked = _receive(peer, donors, timeout, mine, params)
    peer.load_tracked_states(tracked)
    return step, snapshot


class Prefetch:
    """A joiner's state, received in a thread of its own: the manifest from the moment the
    joiner is admitted (a model of other shapes is refused as soon as the policy attaches,
    before any array moves), the arrays once ``result(peer, mine)`` names where they go: the
    joiner's own parameters, memory its model has touched already (fresh pages cost a fault
    each, on this project's 2-core machine 0.8 GB/s against a copy's 20), with no copy
    afterwards. Until then the source's chunks wait in its send window (32 MiB), not here."""

    def __init__(self, peer: MembershipHost, donors: list[int], timeout: float) -> None:
        self._outcome: tuple | BaseException | None = None
        self.donors = list(donors)
        self._timeout = timeout
        self._mine: Snapshot | None = None
        self._params: list | None = None   # the joiner's params_of
        self._ready = threading.Event()   # set with _mine by result()
        self.seconds = 0.0   # from the targets named to the last digest checked
        self.nbytes = 0
        self._thread = threading.Thread(target=self._run, args=(peer, self.donors, timeout),
                                        name="gossip state prefetch", daemon=True)
        self._thread.start()

    def _run(self, peer: MembershipHost, donors: list[int], timeout: float) -> None:
        try:
            crc.warm()   # the threads that check the chunks, started while there is time
            step, theirs, manifest = _manifest(peer, donors[0], timeout)
            mine = self._mine if self._ready.wait(timeout) else None   # (set with _ready)
            if mine is None:
                raise ProtocolError(f"rank {peer.rank}: no policy attached within "
                                    f"{timeout:g}s to take the running job's state")
            start = time.monotonic()
            _check_fits(peer, mine, self._params, manifest, donors[0])
            into = {name: a for name, a in mine.arrays.items()
                    if name.startswith("params/")}
            snapshot = _arrays(peer, donors, timeout, theirs, into, manifest.get("pieces"))
            self.seconds = time.monotonic() - start
            self.nbytes = snapshot.nbytes
            self._outcome = (step, snapshot, manifest.get("tracked") or {})
        except BaseException as exc:  # handed to result()
            self._outcome = exc

    def result(self, peer: MembershipHost, mine: Snapshot,
               params: list | None = None) -> tuple[int, Snapshot]:
        """The source's (step, snapshot), received into ``mine``'s parameters (this peer's
        own state, checked against the source's first; ``params``: its params_of)."""
        self._mine, self._params = mine, params
        self._ready.set()
        self._thread.join(self._timeout)
        outcome = self._outcome
        if outcome is None:
            raise ProtocolError(f"rank {peer.rank}: the running job's state did not arrive "
                                f"within {self._timeout:g}s")
        if isinstance(outcome, BaseException):
            raise outcome
        step, snapshot, tracked = outcome
        peer.load_tracked_states(tracked)
        return step, snapshot


def _receive(peer: MembershipHost, donors: list[int], timeout: float,
             mine: Snapshot | None, params: list | None) -> tuple[int, Snapshot, dict]:
    step, theirs, manifest = _manifest(peer, donors[0], timeout)
    if mine is not None:
        _check_fits(peer, mine, params, manifest, donors[0])
    return step, _arrays(peer, donors, timeout, theirs, None, manifest.get("pieces")), \
        manifest.get("tracked") or {}


def _check_fits(peer: MembershipHost, mine: Snapshot, params: list | None, manifest: dict,
                source: int) -> None:
    """SnapshotMismatch unless this peer's parameters fit the source's state: first parameter
    by parameter as the users gave them (``params`` against the manifest's, when both sides
    describe them), naming the first that differs by its name and place; then the buckets
    they are packed in (a source that does not describe its parameters). This peer's fresh
    optimizer has no state yet: only the parameters must agree."""
    theirs = manifest.get("params")
    if params is not None and isinstance(theirs, list):
        _compare_params(params, theirs, f"rank {peer.rank} (this peer)",
                        f"rank {source}'s state")
    mine.check_compatible(manifest["snapshot"], parts=("params",))


def _compare_params(mine: list, theirs: list, here: str, there: str) -> None:
    """SnapshotMismatch naming the first parameter whose dtype or shape differ between two
    params_of descriptions (or that one side lacks); nothing for a description that is not
    one (a damaged manifest: the buckets' comparison follows)."""
    def spec(entry: Any) -> tuple[Any, str, list] | None:
        if isinstance(entry, (list, tuple)) and len(entry) == 3 \
                and isinstance(entry[2], (list, tuple)):
            return entry[0], str(entry[1]), [int(d) for d in entry[2]]
        return None

    def text(entry: tuple) -> str:
        return f"{entry[1]} [{', '.join(map(str, entry[2]))}]"

    for i in range(max(len(mine), len(theirs))):
        a = spec(mine[i]) if i < len(mine) else None
        b = spec(theirs[i]) if i < len(theirs) else None
        if (i < len(mine) and a is None) or (i < len(theirs) and b is None):
            return
        if a is not None and b is not None and a[1:] == b[1:]:
            continue
        either = a if a is not None else b
        assert either is not None   # (i is below one of the two lengths)
        name = either[0]
        what = f"{name} (#{i})" if isinstance(name, str) and name else f"#{i}"
        mine_text = text(a) if a is not None else "absent"
        theirs_text = text(b) if b is not None else "absent"
        raise SnapshotMismatch(
            f"first mismatched parameter {what} of the params attached: {mine_text} in "
            f"{here}, {theirs_text} in {there} ({len(mine)} parameters here, {len(theirs)} "
            "there): this peer's model is not the running job's",
            tensor=name if isinstance(name, str) and name else f"params #{i}")


def _manifest(peer: MembershipHost, source: int, timeout: float) -> tuple[int, dict, dict]:
    """The source's (step, snapshot manifest, whole manifest), checked as msgpack."""
    comm = peer.channel(PeerChannel.MEMBERSHIP)
    raw = comm.recv(source, timeout=timeout)
    if raw.nbytes > _MAX_MANIFEST:
        raise ProtocolError(f"rank {peer.rank}: rank {source}'s state manifest is "
                            f"{raw.nbytes} bytes")
    try:
        manifest = msgpack.unpackb(raw.tobytes(), raw=False, strict_map_key=False)
        return int(manifest["step"]), manifest["snapshot"], manifest
    except Exception as exc:
        raise ProtocolError(f"rank {peer.rank}: rank {source}'s state manifest is "
                            f"malformed: {exc}") from None


def _arrays(peer: MembershipHost, donors: list[int], timeout: float, theirs: dict,
            into: dict | None, pieces: Any = None) -> Snapshot:
    """The arrays of ``theirs``, each chunk received in place (into ``into``'s arrays where
    they fit) and checksummed as it lands, from each donor in turn (its share: every
    len(donors)-th chunk from its place, as send_state cuts them); every digest checked. A
    bad one names the donors of its bad chunks (by the source's ``pieces``, its pieces'
    CRCs), or of all the tensor's chunks without them."""
    comm = peer.channel(PeerChannel.MEMBERSHIP)
    receiver = SnapshotReceiver(theirs, into)
    ranges = receiver.layout.ranges(CHUNK_BYTES)
    for i, (offset, length) in enumerate(ranges):
        # Chunk i comes from donor i mod k: taken in that order, every donor's link is busy.
        comm.recv(donors[i % len(donors)],
                  out=np.frombuffer(receiver.target(offset, length), dtype=np.uint8),
                  timeout=timeout)
        receiver.wrote(offset, length)
    try:
        return receiver.finish()
    except SnapshotCorrupt as exc:
        if len(donors) == 1 or exc.offset is None:
            raise
        lo, hi = exc.offset, exc.offset + (exc.nbytes or 0)
        bad = _bad_chunks(receiver, ranges, pieces)
        senders = sorted({donors[i % len(donors)] for i, (o, n) in enumerate(ranges)
                          if o < hi and o + n > lo and (bad is None or i in bad)})
        which = "its bad chunks" if bad is not None else "its chunks"
        raise SnapshotCorrupt(f"{exc} ({which} came from ranks {senders}: replicas that "
                              "should be identical are not)", tensor=exc.tensor,
                              offset=exc.offset, nbytes=exc.nbytes) from None


def _bad_chunks(receiver: SnapshotReceiver, ranges: list, pieces: Any) -> set | None:
    """Indices of the chunks whose piece CRC differs from the source's ``pieces`` (None
    when those are missing or do not fit: the caller blames every chunk of the tensor).
    Chunks are pieces (CHUNK_BYTES == PIECE_BYTES, cut from each array's start)."""
    got = receiver.piece_crcs()
    if not (isinstance(pieces, list) and len(pieces) == len(got)
            and all(isinstance(p, list) and len(p) == len(g) for p, g in zip(pieces, got))):
        return None
    flat_got = [c for g in got for c in g]
    flat_want = [c for p in pieces for c in p]
    if len(flat_got) != len(ranges):
        return None
    return {i for i, (g, w) in enumerate(zip(flat_got, flat_want)) if g != w}

