"""Snapshots: one consistent description of a peer's whole training state (model, optimizer,
policy, flat parameters, your own values) that can be saved and resumed, or sent in chunks
from several donors and checked by digest.

    snap = gossip.Snapshot.of(model=model, optimizer=opt, extra={"step": t})   # no copy
    snap.save("ckpt")                       # atomic: data file, fsync, rename; then manifest
    gossip.Snapshot.load("ckpt").restore_into(model=model, optimizer=opt)

    # in chunks: the receiver needs only the manifest (msgpack values) to allocate and check
    receiver = gossip.SnapshotReceiver(snap.manifest)
    for offset, length in snap.layout().ranges(4 << 20):   # each range within one array
        receiver.write(offset, snap.read(offset, length))  # read: zero-copy memoryview
    copy = receiver.finish()                # every array's digest checked
    assert copy.digest == snap.digest

A snapshot is an ordered list of named arrays (numpy arrays, torch CPU tensors: names such as
"model/0.weight", "optimizer/state/3/exp_avg", "policy/center/0", "params/2") and a manifest
of plain msgpack values: each array's kind, dtype, shape and digest (blake2b over those and
the CRC-32 of each 4 MiB piece of its bytes) and the structure of each part, arrays replaced
by references, so state dicts come back exactly (tuples, int keys, 0-d step tensors of
their dtype). Nothing is pickled, on disk or anywhere else. The arrays lie back to back in
one flat byte space (layout()), which is what a data file holds and what a joiner pulls
disjoint ranges of.

Modules: ``snapshot`` (the Snapshot), ``receiver`` (SnapshotReceiver), ``files`` (disk),
``manifest`` (the description, its digest and the one comparison), ``structure`` (state
dicts as trees), ``array_specs`` (specs, byte views, digests), ``layout`` (the byte space).
"""
from gossip.snapshot.array_specs import ArraySpec
from gossip.snapshot.layout import Layout
from gossip.snapshot.receiver import SnapshotReceiver
from gossip.snapshot.snapshot import Snapshot

__all__ = ["Snapshot", "SnapshotReceiver", "Layout", "ArraySpec"]
