"""Snapshots of a peer's training state: exact round trips (numpy, torch optimizers, every
policy), digests and mismatches that name the tensor, chunked transfer from two donors,
torn files on disk, and a whole job saved by 2 real peers and resumed by a new spawn, which
must continue exactly as a run that never stopped."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading

import msgpack
import numpy as np
import pytest

import gossip
from gossip import Snapshot, SnapshotCorrupt, SnapshotError, SnapshotMismatch, SnapshotReceiver
from gossip.testing import spawn
from helpers import mlp, train

torch = pytest.importorskip("torch")


def same(a, b) -> bool:
    """Equal values of equal types, arrays bit for bit with their dtypes."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, (np.ndarray, np.generic)):
        return a.dtype == b.dtype and np.shape(a) == np.shape(b) and np.array_equal(
            a, b, equal_nan=True)
    return a == b or (a != a and b != b)


def numpy_arrays():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((3, 4)).astype(np.float32), np.arange(7, dtype=np.int8),
            rng.standard_normal(5).astype(">f8"), np.array([True, False, True]),
            (rng.standard_normal(4) + 1j).astype(np.complex64), np.float16([1.5, -2.0]),
            np.array(3.25), np.zeros((0, 3), dtype=np.uint64)]


EXTRA = {"step": 12, "rate": 0.1, "name": "run-7", "none": None, "flags": [True, False],
         "betas": (0.9, 0.999), 3: "an int key", "$tag": "a key like a tag", "raw": b"\x00\xff",
         "scalar": np.float32(2.5), "nested": {"deep": [(1, 2), {"x": np.arange(3)}]}}


# ---------------------------------------------------------------------------- round trips
def test_numpy_arrays_and_extra_round_trip_through_disk(tmp_path):
    arrays = numpy_arrays()
    snap = Snapshot.of(params=arrays, extra=EXTRA)
    snap.save(str(tmp_path))
    back = Snapshot.load(str(tmp_path))
    assert back.digest == snap.digest and back.names == snap.names
    assert same(back.extra, EXTRA)
    fresh = [np.full_like(a, 7) for a in arrays]
    back.restore_into(params=fresh)
    assert all(same(a, b) for a, b in zip(arrays, fresh))
    # The data file is the flat byte space, nothing else; the manifest is plain msgpack.
    names = sorted(os.listdir(tmp_path))
    assert names[0].startswith("snapshot-") and names[1] == "snapshot.msgpack"
    data = (tmp_path / names[0]).read_bytes()
    assert data == b"".join(a.tobytes() for a in snap.arrays.values()) == snap.read(
        0, snap.nbytes)
    assert data.startswith(b"".join(a.tobytes() for a in arrays))   # params first, then extra
    head = msgpack.unpackb((tmp_path / names[1]).read_bytes(), raw=False)
    assert head["manifest"] == snap.manifest and head["digest"] == snap.digest


def test_numpy_snapshots_never_import_torch(tmp_path):
    code = ("import sys, numpy as np, gossip; s = gossip.Snapshot.of(params=[np.ones(3)], "
            f"extra={{'step': 1}}); s.save({str(tmp_path)!r}); "
            f"r = gossip.SnapshotReceiver(gossip.Snapshot.load({str(tmp_path)!r}).manifest); "
            "r.write(0, s.read(0, 24)); r.finish(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]


def test_snapshot_refers_to_live_arrays_unless_copied():
    x = np.zeros(4, dtype=np.float32)
    live, frozen = Snapshot.of(params=[x]), Snapshot.of(params=[x], copy=True)
    view = live.read(0, 16)
    assert isinstance(view, memoryview) and view.readonly
    x += 1
    assert bytes(view) == x.tobytes() and live.arrays["params/0"] is x
    assert not frozen.arrays["params/0"].any()


def test_torch_adam_and_sgd_momentum_state_round_trip_exactly(tmp_path):
    torch.set_num_threads(1)
    for make in (lambda p: torch.optim.Adam(p, lr=1e-2, betas=(0.8, 0.99)),
                 lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True)):
        model = mlp(0)
        opt = make(model.parameters())
        train(model, opt, 0, range(3))
        Snapshot.of(model=model, optimizer=opt).save(str(tmp_path))
        twin = mlp(1)
        twin_opt = make(twin.parameters())
        Snapshot.load(str(tmp_path)).restore_into(model=twin, optimizer=twin_opt)
        assert same(opt.state_dict(), twin_opt.state_dict())   # betas a tuple, step tensors
        assert same(model.state_dict(), twin.state_dict())
        train(model, opt, 0, [3])
        train(twin, twin_opt, 0, [3])
        assert same(model.state_dict(), twin.state_dict())


def test_torch_dtypes_and_zero_dim_tensors_round_trip(tmp_path):
    tensors = [torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), torch.tensor(4.0),
               torch.tensor([True, False]), torch.ones(3, dtype=torch.complex64),
               torch.arange(10.0)[::2], torch.zeros(2, 2).t()]   # two non-contiguous
    Snapshot.of(params=tensors).save(str(tmp_path), shard=3)
    back = Snapshot.load(str(tmp_path), shard=3)
    assert all(same(a.contiguous(), b) for a, b in zip(tensors, back.arrays.values()))
    with pytest.raises(FileNotFoundError, match="shard-3"):
        Snapshot.load(str(tmp_path))


def restore_every_policy(peer, directory):
    torch.set_num_threads(1)
    problems = []
    for name in gossip.policies.names():
        for kind in ("torch", "numpy"):
            if kind == "torch":
                model = mlp(peer.rank)
                opt = gossip.DistributedOptimizer(
                    torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), peer=peer,
                    policy=name)
                policy = opt.policy
                train(model, opt, peer.rank, range(3))
                parts = {"model": model, "optimizer": opt}   # the optimizer brings the policy
            else:
                params = [np.full(10, peer.rank, np.float64), np.ones((2, 3), np.float32)]
                policy = gossip.policies.make(name).attach(peer, params)
                for _ in range(3):
                    for p in params:
                        p *= 0.5
                    policy.after_step()
                parts = {"params": params, "policy": policy}
            if name == "asynchronous":
                policy.quiesce()   # nothing in flight: the weights hold still
            state = policy.state_dict()
            where = os.path.join(directory, f"{name}-{kind}")
            Snapshot.of(**parts).save(where, shard=peer.rank)
            snap = Snapshot.load(where, shard=peer.rank)
            if kind == "torch":
                twin = mlp(peer.rank + 10)
                twin_opt = gossip.DistributedOptimizer(
                    torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9), peer=peer,
                    policy=name)
                snap.restore_into(model=twin, optimizer=twin_opt)
                twin_policy = twin_opt.policy
                ok = (same(model.state_dict(), twin.state_dict())
                      and same(opt.optimizer.state_dict(), twin_opt.optimizer.state_dict()))
            else:
                twin_params = [np.zeros_like(p) for p in params]
                twin_policy = gossip.policies.make(name).attach(peer, twin_params)
                snap.restore_into(params=twin_params, policy=twin_policy)
                ok = all(same(a, b) for a, b in zip(params, twin_params))
            if not (ok and same(state, twin_policy.state_dict())):
                problems.append(f"{name} {kind}: {state} vs {twin_policy.state_dict()}")
            policy.close()
            twin_policy.close()
    return problems


def test_every_policy_state_round_trips_with_torch_and_numpy(tmp_path):
    assert spawn(restore_every_policy, n=2, timeout=120, args=(str(tmp_path),)) == [[], []]


# ---------------------------------------------------------------------------- mismatches
def test_shape_and_dtype_mismatches_name_the_first_tensor():
    snap = Snapshot.of(model=mlp(0, sizes=(20, 32, 5)))
    with pytest.raises(SnapshotMismatch) as info:
        snap.restore_into(model=mlp(0, sizes=(20, 16, 5)))
    assert info.value.tensor == "model/0.weight"
    assert "[32, 20] in the snapshot" in str(info.value) and "[16, 20]" in str(info.value)
    other = mlp(0)
    other[2].double()
    with pytest.raises(SnapshotMismatch, match=r"'model/2\.weight'.*float32 \[5, 32\] in this "
                                               r"snapshot, torch float64 \[5, 32\] in the other"):
        snap.check_compatible(Snapshot.of(model=other).manifest)
    wider = Snapshot.of(model=torch.nn.Sequential(mlp(0), torch.nn.Linear(5, 2)))
    with pytest.raises(SnapshotMismatch, match="'model/0.weight'.*absent from the other"):
        snap.check_compatible(wider)
    with pytest.raises(SnapshotMismatch, match="no optimizer state"):
        snap.restore_into(optimizer=torch.optim.SGD(mlp(0).parameters(), lr=0.1))
    with pytest.raises(SnapshotMismatch, match="'params/1'.*float32 \\[3\\].*float32 \\[4\\]"):
        Snapshot.of(params=[np.zeros(2), np.zeros(4, np.float32)]).restore_into(
            params=[np.zeros(2), np.zeros(3, np.float32)])


def test_digest_follows_every_byte_and_names_the_tensor_changed():
    arrays = numpy_arrays()
    snap = Snapshot.of(params=arrays, copy=True)
    assert Snapshot.of(params=arrays).digest == snap.digest
    arrays[2][1] += 1.0
    other = Snapshot.of(params=arrays)
    assert other.digest != snap.digest
    changed = [n for n, a, b in zip(snap.names, snap.digests, other.digests) if a != b]
    assert changed == ["params/2"]
    # The same bytes under another dtype are another array.
    assert (Snapshot.of(params=[np.zeros(4, np.int32)]).digest
            != Snapshot.of(params=[np.zeros(4, np.float32)]).digest)


def test_hostile_manifests_are_refused_before_anything_is_allocated():
    good = Snapshot.of(params=[np.zeros(3)], extra={"a": 1}).manifest
    for change in ({"dtype": "|O"}, {"dtype": "<f4", "kind": "pickle"}, {"shape": [-1]},
                   {"shape": [1 << 20] * 70}, {"digest": "00"}, {"dtype": "float"}):
        bad = dict(good, arrays=[dict(good["arrays"][0], **change)])
        with pytest.raises(SnapshotError):
            SnapshotReceiver(bad)
    for parts in ({"extra": {"$a": 5}}, {"extra": {"$x": 1, "$y": 2}}, {"weights": {}}):
        with pytest.raises(SnapshotError):
            SnapshotReceiver(dict(good, parts=parts)).finish().extra


# ---------------------------------------------------------------------------- transfer
def donor_state():
    model = mlp(0, sizes=(20, 64, 64, 5))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    train(model, opt, 0, range(2))
    return model, opt


def test_chunked_transfer_from_two_donors_reassembles_and_names_a_bad_chunk():
    model, opt = donor_state()
    donors = [Snapshot.of(model=model, optimizer=opt, copy=True) for _ in range(2)]
    assert donors[0].digest == donors[1].digest
    receiver = SnapshotReceiver(donors[0].manifest)
    assert receiver.digest == donors[1].digest and receiver.layout == donors[0].layout()
    # Ranges of 1000 bytes that straddle arrays, alternately from each donor, from two
    # threads at once, out of order.
    ranges = [(o, min(1000, donors[0].nbytes - o)) for o in range(0, donors[0].nbytes, 1000)]

    def pull(who):
        for offset, length in reversed(ranges[who::2]):
            receiver.write(offset, donors[who].read(offset, length))

    threads = [threading.Thread(target=pull, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert receiver.missing() == []
    copy = receiver.finish()
    assert copy.digest == donors[0].digest
    assert all(same(a, b) for a, b in zip(copy.arrays.values(), donors[0].arrays.values()))
    twin = mlp(5, sizes=(20, 64, 64, 5))
    twin_opt = torch.optim.Adam(twin.parameters(), lr=1e-2)
    copy.restore_into(model=twin, optimizer=twin_opt)
    assert same(twin_opt.state_dict(), opt.state_dict())

    # A corrupted chunk from the second donor, in the middle of an exp_avg.
    receiver = SnapshotReceiver(donors[0].manifest)
    layout = receiver.layout
    bad = layout.names.index("optimizer/state/2/exp_avg")
    for n, (offset, length) in enumerate(layout.ranges(512)):
        data = bytearray(donors[n % 2].read(offset, length))
        if layout.offsets[bad] <= offset < layout.offsets[bad] + layout.sizes[bad]:
            data[length // 2] ^= 0x10
        receiver.write(offset, data)
    with pytest.raises(SnapshotCorrupt) as info:
        receiver.finish()
    assert info.value.tensor == "optimizer/state/2/exp_avg"
    assert "'optimizer/state/2/exp_avg'" in str(info.value)
    # Its range is missing again: fetched from the other donor, the transfer completes.
    assert receiver.missing() == [(layout.offsets[bad], layout.sizes[bad])]
    with pytest.raises(SnapshotError, match="not received yet"):
        receiver.finish()
    receiver.write(layout.offsets[bad], donors[0].read(layout.offsets[bad], layout.sizes[bad]))
    assert receiver.finish().digest == donors[0].digest


def test_pieces_are_checksummed_as_they_land_and_received_in_place_into_given_arrays():
    from gossip.snapshot.array_specs import PIECE_BYTES
    rng = np.random.default_rng(7)
    big = rng.standard_normal((5 * PIECE_BYTES) // 8 + 3)   # 5 pieces and a short one
    donor = Snapshot.of(params=[big, np.arange(10, dtype=np.int64)], copy=True)
    mine = [np.zeros_like(big), np.zeros(10, dtype=np.int64)]

    receiver = SnapshotReceiver(donor.manifest, into={"params/0": mine[0],
                                                     "params/1": mine[1][::2]})
    layout = receiver.layout
    for offset, length in layout.ranges(PIECE_BYTES):      # whole pieces: summed as written
        receiver.target(offset, length)[:] = donor.read(offset, length)
        receiver.wrote(offset, length)
    # A piece written again in part after it was summed: summed again at finish().
    receiver.write(PIECE_BYTES + 8, donor.read(PIECE_BYTES + 8, 16))
    copy = receiver.finish()
    assert copy.digest == donor.digest
    # Received in place into the array that fits; the strided one was not used.
    assert copy.arrays["params/0"] is mine[0] and np.array_equal(mine[0], big)
    assert copy.arrays["params/1"] is not mine[1] and not mine[1].any()
    pointer = mine[0].__array_interface__["data"][0]
    copy.restore_into(params=mine)
    assert mine[0].__array_interface__["data"][0] == pointer
    assert np.array_equal(mine[0], big) and np.array_equal(mine[1], np.arange(10))

    # One flipped bit in the fourth piece of a whole-piece transfer names the tensor.
    receiver = SnapshotReceiver(donor.manifest)
    for offset, length in layout.ranges(PIECE_BYTES):
        data = bytearray(donor.read(offset, length))
        if offset == 3 * PIECE_BYTES:
            data[100] ^= 0x01
        receiver.target(offset, length)[:] = data
        receiver.wrote(offset, length)
    with pytest.raises(SnapshotCorrupt) as info:
        receiver.finish()
    assert info.value.tensor == "params/0"



def test_a_piece_written_in_parts_in_order_is_summed_part_by_part():
    from gossip.snapshot.array_specs import PIECE_BYTES
    big = np.random.default_rng(3).standard_normal((2 * PIECE_BYTES) // 8)   # 2 pieces
    donor = Snapshot.of(params=[big], copy=True)
    part = PIECE_BYTES // 4
    for order in ("in order", "out of order", "one part bad"):
        receiver = SnapshotReceiver(donor.manifest)
        starts = list(range(0, 2 * PIECE_BYTES, part))
        if order == "out of order":
            starts[1], starts[2] = starts[2], starts[1]
        for at in starts:
            data = bytearray(donor.read(at, part))
            if order == "one part bad" and at == PIECE_BYTES + part:
                data[5] ^= 0x10
            receiver.target(at, part)[:] = data
            receiver.wrote(at, part)
        # In order, both pieces' CRCs were summed as their parts landed (nothing is left for
        # finish() to sum); out of order, the first piece's is left to finish().
        summed = sorted(receiver._crcs[0])
        assert summed == ([1] if order == "out of order" else [0, 1]), (order, summed)
        if order == "one part bad":
            with pytest.raises(SnapshotCorrupt):
                receiver.finish()
            assert receiver.piece_crcs()[0][1] != donor.piece_crcs[0][1]
            assert receiver.piece_crcs()[0][0] == donor.piece_crcs[0][0]
        else:
            assert receiver.finish().digest == donor.digest, order


# ---------------------------------------------------------------------------- disk
def test_torn_or_corrupted_files_are_errors_and_a_crashed_save_keeps_the_old_one(tmp_path):
    model, opt = donor_state()
    snap = Snapshot.of(model=model, optimizer=opt)
    manifest_path = snap.save(str(tmp_path))
    data_path = next(p for p in tmp_path.iterdir() if p.suffix == ".bin")
    good = data_path.read_bytes()
    name = "model/2.weight"
    offset = snap.layout().offsets[snap.names.index(name)]

    data_path.write_bytes(good[:-100])                    # torn: cut short
    with pytest.raises(SnapshotCorrupt, match="torn"):
        Snapshot.load(str(tmp_path))
    flipped = bytearray(good)
    flipped[offset + 5] ^= 1                              # one bit in one tensor
    data_path.write_bytes(bytes(flipped))
    with pytest.raises(SnapshotCorrupt) as info:
        Snapshot.load(str(tmp_path))
    assert info.value.tensor == name and name in str(info.value)
    data_path.write_bytes(good)
    head = open(manifest_path, "rb").read()
    for torn in (head[:len(head) // 2], head[:-1] + bytes([head[-1] ^ 1])):
        open(manifest_path, "wb").write(torn)
        with pytest.raises(SnapshotCorrupt, match="snapshot.msgpack"):
            Snapshot.load(str(tmp_path))
    open(manifest_path, "wb").write(head)
    assert Snapshot.load(str(tmp_path)).digest == snap.digest

    # A save that died after writing its data file but before its manifest: the old
    # snapshot is what loads; the next save removes what no manifest names.
    train(model, opt, 0, [2])
    newer = Snapshot.of(model=model, optimizer=opt)
    (tmp_path / f"snapshot-{newer.digest[:16]}.bin").write_bytes(
        newer.read(0, newer.nbytes))
    (tmp_path / ".snapshot.1.abcdef01.tmp").write_bytes(b"half a file")
    assert Snapshot.load(str(tmp_path)).digest == snap.digest
    newer.save(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [f"snapshot-{newer.digest[:16]}.bin",
                                            "snapshot.msgpack"]
    assert Snapshot.load(str(tmp_path)).digest == newer.digest


# ---------------------------------------------------------------------------- a whole job
STEPS = 6


def numpy_grad(rank: int, step: int, x: np.ndarray) -> np.ndarray:
    return x - np.random.default_rng(1000 * rank + step).standard_normal(x.shape)


def run(peer, where, steps, *, resume=False, save=False):
    """Train from a fresh start (or from the checkpoint at ``where``, with ``resume``) over
    ``steps``, then save a checkpoint there if ``save``; each model's digest."""
    out = {}
    for name, make in (("synchronous", lambda p: torch.optim.Adam(p, lr=1e-2)),
                       ("push-sum", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))):
        model = mlp(peer.rank + (50 if resume else 0))   # other weights: the load must set them
        opt = gossip.DistributedOptimizer(make(model.parameters()), peer=peer, policy=name)
        if resume:
            extra = gossip.load_checkpoint(os.path.join(where, name), peer=peer, model=model,
                                           optimizer=opt)
            assert extra == {"step": steps[0]}
        train(model, opt, peer.rank, steps)
        if save:
            gossip.save_checkpoint(os.path.join(where, name), peer=peer, model=model,
                                   optimizer=opt, extra={"step": steps[-1] + 1})
        out[name] = hashlib.sha1(b"".join(p.detach().numpy().tobytes()
                                          for p in model.parameters())).hexdigest()
        opt.close()
    # numpy arrays in a hand-written loop
    for name in ("gossip", "push-sum"):
        params = [np.full(6, float(peer.rank)), np.full((2, 2), 1.0 + peer.rank)]
        policy = gossip.policies.make(name).attach(peer, params)
        where_numpy = os.path.join(where, f"numpy-{name}")
        if resume:
            gossip.load_checkpoint(where_numpy, peer=peer, params=params, policy=policy)
        for t in steps:
            for p in params:
                p -= 0.1 * numpy_grad(peer.rank, t, p)
            policy.after_step()
        if save:
            gossip.save_checkpoint(where_numpy, peer=peer, params=params, policy=policy)
        out[f"numpy-{name}"] = (hashlib.sha1(b"".join(p.tobytes() for p in params))
                                .hexdigest(), policy.step)
        policy.close()
    return out


def first_job(peer, where):
    """A run that never stops, then one that stops half way and saves."""
    return (run(peer, where, range(2 * STEPS)),
            run(peer, where, range(STEPS), save=True))


def second_job(peer, where):
    return run(peer, where, range(STEPS, 2 * STEPS), resume=True)


def test_a_job_saved_by_two_peers_resumes_exactly_as_if_it_never_stopped(tmp_path):
    first = spawn(first_job, n=2, timeout=120, args=(str(tmp_path),))
    # Synchronous replicas are identical: rank 0 wrote one snapshot. The others: a shard each.
    assert sorted(os.listdir(tmp_path / "synchronous"))[1] == "snapshot.msgpack"
    assert len(os.listdir(tmp_path / "synchronous")) == 2
    assert {n for n in os.listdir(tmp_path / "push-sum") if n.endswith(".msgpack")} == {
        "shard-0.msgpack", "shard-1.msgpack"}
    resumed = spawn(second_job, n=2, timeout=120, args=(str(tmp_path),))
    straight = [never_stopped for never_stopped, _ in first]
    assert resumed == straight   # bit for bit, for every policy and both ranks
    assert straight[0]["synchronous"] == straight[1]["synchronous"]
    assert straight[0]["numpy-push-sum"][1] == 2 * STEPS


def mixed_saves(peer, directory):
    x = [np.full(3, float(peer.rank))]
    for step in (1, 2):
        gossip.save_checkpoint(os.path.join(directory, str(step)), peer=peer, params=x,
                               extra={"step": step})
    peer.barrier()
    if peer.rank == 1:   # rank 1's shard of the first save lands among the second's
        for name in os.listdir(os.path.join(directory, "1")):
            if name.startswith("shard-1"):
                os.replace(os.path.join(directory, "1", name),
                           os.path.join(directory, "2", name))
    peer.barrier()
    try:
        gossip.load_checkpoint(os.path.join(directory, "2"), peer=peer, params=x)
    except SnapshotMismatch as exc:
        return str(exc)
    return None


def test_a_directory_mixing_two_saves_is_refused_on_every_peer(tmp_path):
    for message in spawn(mixed_saves, n=2, timeout=60, args=(str(tmp_path),)):
        assert message is not None and "different saves" in message
