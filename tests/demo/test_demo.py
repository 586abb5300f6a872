"""Tests of `gossip demo`: the command end to end as a user runs it (a subprocess), the MNIST
IDX reader on files written here (plain, gzipped, hostile), bad arguments, a dying peer."""
from __future__ import annotations

import gzip
import io
import json
import os
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest

from gossip.demo.data import DataError, load_mnist, read_idx, shard, write_idx
from gossip.demo.progress import ProgressDisplay
from gossip.demo.runner import DemoFailed, DemoOptions, run_demo
from gossip.testing import wait_until

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAULTY_DEMO = os.path.join(REPO, "tests", "demo", "workers", "faulty_demo.py")


def _env() -> dict[str, str]:
    # The script runs by path, so the repository is not on sys.path by itself.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH", "")]))
    return env


def _demo(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    # stderr is a pipe, not a terminal: the progress is plain lines, not tqdm bars.
    return subprocess.run([sys.executable, "-m", "gossip", "demo", *args],
                          capture_output=True, text=True, timeout=timeout)


def _table_rows(stdout: str) -> dict[str, list[str]]:
    """policy -> the table row's cells, from the printed table."""
    lines = stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("policy "))
    rows = {}
    for line in lines[head + 2:]:
        if not line.strip():
            break
        name = line.split("  ")[0].strip()
        rows[name] = line[len(name):].split()
    return rows


# ---------------------------------------------------------------------- end to end


@pytest.mark.slow   # 7-9 s; the story and straggler tests below run the same path
def test_demo_trains_two_policies_and_writes_the_figures(tmp_path) -> None:
    out = tmp_path / "out"
    proc = _demo("--policy", "synchronous,gossip", "--epochs", "2", "--peers", "2",
                 "--out", str(out), "--non-iid", "0.5")
    assert proc.returncode == 0, proc.stderr
    assert "non-iid shards (Dirichlet alpha 0.5)" in proc.stdout
    assert "Traceback" not in proc.stderr
    # Visible progress, one line per policy start and end when not on a terminal.
    assert "synchronous: training" in proc.stderr and "gossip: done in" in proc.stderr

    rows = _table_rows(proc.stdout)
    assert list(rows) == ["synchronous", "gossip", "baseline (1 process)"]
    assert "sent/peer" in proc.stdout and "time to 95%" in proc.stdout
    assert rows["synchronous"][-1] == "0"  # identical replicas: no consensus distance

    png = (out / "demo.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE) and len(png) > 20_000
    doc = json.loads((out / "demo.json").read_text())
    assert doc["run"]["peers"] == 2 and doc["run"]["dataset"] == "digits"
    assert doc["run"]["non_iid"] == 0.5
    table = {row["policy"]: row for row in doc["table"]}
    assert set(table) == {"synchronous", "gossip", "baseline"}
    for row in table.values():
        assert row["final_accuracy"] > 0.5, row  # chance is 0.1
        assert row["throughput"] > 0
    assert table["synchronous"]["bytes_per_peer"] > 0
    assert table["baseline"]["bytes_per_peer"] == 0
    figures = doc["figures"]
    for key in ("test_accuracy_vs_wall_time", "loss_vs_wall_time"):
        assert set(figures[key]) == {"synchronous", "gossip", "baseline"}
    curve = figures["test_accuracy_vs_wall_time"]["gossip"]
    assert len(curve["time"]) == len(curve["accuracy"]) == 1 + 4 * 2  # start + 4 per epoch
    assert curve["time"] == sorted(curve["time"])
    assert set(figures["consensus_distance_vs_round"]) == {"synchronous", "gossip"}


@pytest.mark.slow
def test_asynchronous_beside_a_straggler_splits_the_steps_by_speed_and_does_not_diverge(
        tmp_path) -> None:
    # AD-PSGD's setting: the group trains as many steps in all as the others, the fast peers
    # more of them. Before, each peer stopped at its own count and the straggler trained its
    # last three quarters alone; with the optimizer's move scaled by 1/w (SGP's numerator
    # step, tried and reverted) and momentum 0.9 the peers diverged here: averaged model
    # 9-19%, consensus distance 19-23 (now about 97% and 1-3).
    out = tmp_path / "out"
    proc = _demo("--policy", "asynchronous", "--straggler", "3@4", "--epochs", "6",
                 "--no-baseline", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "demo.json").read_text())
    (row,) = doc["table"]
    total = 6 * doc["run"]["steps_per_epoch"]
    assert row["steps"] > total, row["steps"]   # the fast peers took more than their 1/4
    samples = row["throughput"] * row["train_seconds"]
    batch = doc["run"]["batch_size_per_peer"]
    assert abs(samples - 4 * total * batch) <= 0.1 * 4 * total * batch, (samples, total)
    assert row["averaged_model_accuracy"] > 0.9, row
    assert row["consensus"] < 10, row["consensus"]
    curve = doc["figures"]["test_accuracy_vs_wall_time"]["asynchronous"]
    assert len(curve["time"]) == 1 + 4 * 6   # every peer's k-th evaluation is one point


@pytest.mark.slow   # the IDX reader is tested below on its own; this is the path through
def test_demo_reads_mnist_idx_files(tmp_path) -> None:
    """--dataset mnist on a tiny MNIST-shaped data set (gzipped and plain files mixed)."""
    rng = np.random.default_rng(0)
    data = tmp_path / "mnist"
    data.mkdir()
    labels = np.arange(96, dtype=np.uint8) % 10
    images = (rng.random((96, 28, 28)) * 60).astype(np.uint8)
    for k in range(10):  # each class its own bright square: learnable
        images[labels == k, 2 * k:2 * k + 6, 4:10] = 255
    write_idx(data / "train-images-idx3-ubyte.gz", images[:64], compress=True)
    write_idx(data / "train-labels-idx1-ubyte.gz", labels[:64], compress=True)
    write_idx(data / "t10k-images-idx3-ubyte", images[64:])
    write_idx(data / "t10k-labels-idx1-ubyte", labels[64:])
    out = tmp_path / "out"
    proc = _demo("--dataset", "mnist", "--data-dir", str(data), "--policy", "local-sgd",
                 "--epochs", "1", "--peers", "2", "--batch-size", "8", "--no-baseline",
                 "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert list(_table_rows(proc.stdout)) == ["local-sgd"]
    doc = json.loads((out / "demo.json").read_text())
    assert doc["run"]["dataset"] == "mnist" and doc["run"]["image_shape"] == [28, 28]
    assert doc["run"]["train_samples"] == 64 and doc["run"]["test_samples"] == 32


@pytest.mark.slow
def test_a_dying_peer_fails_the_demo_with_one_clear_line(tmp_path) -> None:
    out = tmp_path / "out"
    # The demo's own command, with peer 1's optimizer a faulty variant that exits (code 3)
    # right after its 5th step: tests/demo/workers/faulty_demo.py.
    proc = subprocess.run([sys.executable, FAULTY_DEMO, "1", "5", "--policy", "synchronous",
                           "--epochs", "2", "--peers", "2", "--out", str(out),
                           "--timeout", "100"],
                          capture_output=True, text=True, timeout=150, env=_env())
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gossip demo: error: peer 1 died (exit code 3) while training "
                           "synchronous"), proc.stderr
    assert (out / "failure.log").is_file() and str(out / "failure.log") in last
    assert not (out / "demo.png").exists()


def test_a_peer_raising_fails_the_demo_naming_the_error_and_policy(tmp_path) -> None:
    options = DemoOptions(policies=("gossip",), peers=2, epochs=1, out=str(tmp_path),
                          baseline=False, bars=False, timeout=100,
                          policy_options={"gossip": {"period": 3}})  # Gossip has no period
    with pytest.raises(DemoFailed) as info:
        run_demo(options, stdout=io.StringIO(), stderr=io.StringIO())
    message = str(info.value)
    assert "\n" not in message
    assert "failed: TypeError:" in message and "'period'" in message, message
    assert "while training gossip" in message and "failure.log" in message


# ---------------------------------------------------------------------- --kill

# 60 epochs of 22 steps: peer 2 dies after step 132 of 1320, so the process that takes its
# slot over has nine tenths of the run (about 10 s) to come back in (it takes 2-4 s here).
KILL_EPOCHS, KILL_STEP, KILL_TOTAL = 60, 132, 1320


# slow (19 s): the default run is near its 10-minute budget; the restart path is also covered
# by tests/membership/test_membership.py's kill-and-restart tests, which run by default
@pytest.mark.slow
def test_demo_kill_reports_the_death_and_the_restart_and_trains_to_the_end(tmp_path):
    # synchronous (elastic), one run of about 18 s on 2 cores (every policy: the slow test
    # below; a gossip restart: tests/membership/test_membership.py).
    out = tmp_path / "out"
    proc = _demo("--policy", "synchronous", "--epochs", str(KILL_EPOCHS), "--kill",
                 "2@0.1", "--no-baseline", "--out", str(out), timeout=280)
    assert proc.returncode == 0, proc.stderr[-5000:]
    doc = json.loads((out / "demo.json").read_text())
    assert "Traceback" not in proc.stderr
    assert f"synchronous: peer 2 SIGKILLed itself after step {KILL_STEP}" in proc.stderr
    assert doc["run"]["kill"] == {"rank": 2, "fraction": 0.1, "step": KILL_STEP}
    table = {row["policy"]: row for row in doc["table"]}
    assert list(table) == ["synchronous"]
    for name, row in table.items():
        restart = row["restart"]
        assert restart["rank"] == 2 and restart["killed_at_step"] == KILL_STEP, restart
        assert row["steps"] == KILL_TOTAL and row["final_accuracy"] > 0.9, row  # chance: 0.1
        assert row["throughput"] > 0
        # The survivors re-form the group (elastic), the new process takes their state at a
        # step boundary. "stopped": it came back too late (a machine loaded by other work).
        assert restart["status"] in ("rejoined", "stopped"), (name, restart)
        if restart["status"] == "rejoined":
            # At the kill step itself when the new process asked to join before the others
            # saw the death: the recovery that leaves the dead one out takes it in at once.
            assert KILL_STEP <= restart["rejoined_at_step"] <= KILL_TOTAL, restart
            assert restart["rejoin_seconds"] > 0 and restart["state_bytes"] > 0, restart
            cell = " ".join(_table_rows(proc.stdout)[name])
            assert f"{KILL_STEP} -> {restart['rejoined_at_step']}," in cell, cell
    # Replicas bitwise identical again at the end, the new one too (consensus exactly 0).
    assert table["synchronous"]["consensus"] == 0


@pytest.mark.slow
def test_demo_kill_every_policy_rejoins_or_says_why_not(tmp_path) -> None:
    from gossip.policies import names, policy_class

    out = tmp_path / "out"
    proc = _demo("--epochs", "60", "--kill", "2@0.33", "--out", str(out), timeout=900)
    assert proc.returncode == 0, proc.stderr[-5000:]
    table = {row["policy"]: row for row in json.loads((out / "demo.json").read_text())["table"]}
    assert list(table) == [*names(), "baseline"] and "restart" not in table["baseline"]
    for name in names():
        restart = table[name]["restart"]
        if not policy_class(name).follows_view_changes:
            # (A policy that does not follow view changes fails on the death.)
            assert restart["status"] == "others failed" and "PeerLost" in restart["detail"], \
                (name, restart)
            continue
        # Every policy takes the restart back, unless the others finished first (stopped).
        assert restart["status"] in ("rejoined", "stopped"), (name, restart)
        assert table[name]["final_accuracy"] > 0.9, (name, table[name])


# ---------------------------------------------------------------------- bad arguments


@pytest.mark.slow   # 7 s; the codecs' byte counts are tested in test_policies_compression.py
def test_demo_compression_encodes_what_the_policies_send(tmp_path) -> None:
    out = tmp_path / "out"
    proc = _demo("--policy", "synchronous,push-sum", "--epochs", "1", "--peers", "2",
                 "--compression", "int8", "--no-baseline", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "uncompressed (they refuse the codec): push-sum" in proc.stderr, proc.stderr
    table = {row["policy"]: row for row in json.loads((out / "demo.json").read_text())["table"]}
    # One epoch, the same steps: int8 gradients cost about a quarter of push-sum's float32
    # parameters (each peer sends its whole model once per step to its one neighbour).
    assert table["synchronous"]["bytes_per_peer"] < 0.5 * table["push-sum"]["bytes_per_peer"]
    assert table["synchronous"]["final_accuracy"] > 0.5


@pytest.mark.parametrize("args, says", [
    (["--policy", "bogus"], "unknown policy 'bogus'"),
    (["--policy", "gossip,,elastic"], "empty name"),
    (["--peers", "0"], "--peers must be between 2"),
    (["--peers", "many"], "invalid int value"),
    (["--topology", "torus:3x5"], "describes 15 peers"),
    (["--topology", "hypercube"], "unknown topology"),
    (["--epochs", "0"], "--epochs must be at least 1"),
    (["--dataset", "mnist"], "needs --data-dir"),
    (["--dataset", "cifar"], "unknown dataset"),
    (["--dataset", "mnist", "--data-dir", "{empty}"], "missing train-images-idx3-ubyte"),
    (["--dataset", "mnist", "--data-dir", "{empty}/nowhere"], "does not exist"),
    (["--kill", "2"], "expected RANK@FRACTION"),
    (["--kill", "two@0.5"], "expected RANK@FRACTION"),
    (["--kill", "9@0.5"], "rank 9 is not one of the 4 peers"),
    (["--kill", "1@1.5"], "the fraction must be between 0 and 1"),
    (["--kill", "1@0.5", "--epochs", "1", "--batch-size", "359"], "needs at least 2 training"),
    (["--compression", "fp8"], "unknown codec 'fp8'"),
    (["--link", "fast"], "--link='fast': expected RATE[,LATENCY]"),
    (["--straggler", "3"], "expected RANK@FACTOR"),
    (["--straggler", "1@0.5"], "the factor must be above 1"),
    (["--straggler", "7@2"], "rank 7 is not one of the 4 peers"),
    (["--scenario", "nope"], "unknown scenario 'nope'; known: slow-network, straggler"),
    (["--scenario", "death", "--policy", "gossip"], "--scenario sets the policies"),
])
def test_bad_arguments_give_one_line(tmp_path, args, says) -> None:
    args = [a.replace("{empty}", str(tmp_path)) for a in args]
    proc = _demo(*args, "--out", str(tmp_path / "out"), timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gossip demo: error: ") and says in lines[0], lines[0]
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


# ---------------------------------------------------------------------- the IDX reader


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "float32", "float64"])
def test_idx_round_trip(tmp_path, compress, dtype) -> None:
    array = (np.arange(2 * 3 * 4) - 5).astype(dtype).reshape(2, 3, 4)
    path = tmp_path / "a.idx"
    write_idx(path, array, compress=compress)
    assert path.read_bytes().startswith(b"\x1f\x8b") == compress
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and back.shape == (2, 3, 4)
    np.testing.assert_array_equal(back, array)


def test_idx_reader_knows_gzip_by_content_not_name(tmp_path) -> None:
    path = tmp_path / "labels.idx"  # gzipped, but no .gz in the name
    write_idx(path, np.arange(7, dtype=np.uint8), compress=True)
    np.testing.assert_array_equal(read_idx(path), np.arange(7))


def _idx(code: int, dims: tuple[int, ...], payload: bytes, ndim: int | None = None) -> bytes:
    ndim = len(dims) if ndim is None else ndim
    return bytes([0, 0, code, ndim]) + struct.pack(f">{len(dims)}I", *dims) + payload


@pytest.mark.parametrize("content, says", [
    (b"", "not an IDX file"),
    (b"\x00\x00", "not an IDX file"),
    (b"PK\x03\x04" + bytes(100), "magic number 0x504b0304"),
    (_idx(0x07, (4,), bytes(4)), "unknown IDX data type 0x07"),
    (_idx(0x08, (), b"", ndim=0), "0 dimensions"),
    (_idx(0x08, (3, 3), b"", ndim=9), "9 dimensions"),
    (_idx(0x08, (10, 28), b"", ndim=3), "truncated IDX header"),
    (_idx(0x08, (10, 28, 28), bytes(100)), "truncated IDX data"),
    (_idx(0x08, (4,), bytes(5)), "trailing bytes"),
    (_idx(0x0E, (4,), bytes(31)), "need 32 bytes"),
    (_idx(0x08, (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), b""), "more than the"),
])
@pytest.mark.parametrize("compress", [False, True])
def test_hostile_idx_files_give_a_clear_error(tmp_path, content, says, compress) -> None:
    path = tmp_path / "bad-idx3-ubyte"
    path.write_bytes(gzip.compress(content) if compress else content)
    with pytest.raises(DataError) as info:
        read_idx(path)
    message = str(info.value)
    assert says in message and "bad-idx3-ubyte" in message and "\n" not in message


def test_corrupt_gzip_is_a_clear_error(tmp_path) -> None:
    good = gzip.compress(_idx(0x08, (1000,), bytes(range(256)) * 3 + bytes(232)))
    cases = {
        "garbage": good[:10] + b"\xff" * (len(good) - 10),  # valid gzip header, bad deflate
        "cut": good[:len(good) // 2],                        # stream ends early
        "crc": good[:-8] + b"\x00" * 8,                      # checksum and size wrong
    }
    for name, content in cases.items():
        path = tmp_path / f"{name}.gz"
        path.write_bytes(content)
        with pytest.raises(DataError, match=f"{name}.gz"):
            read_idx(path)


def test_idx_reader_refuses_directories_and_missing_files(tmp_path) -> None:
    with pytest.raises(DataError, match="is a directory"):
        read_idx(tmp_path)
    with pytest.raises(DataError, match="no such file"):
        read_idx(tmp_path / "missing")


def _mnist_dir(tmp_path, *, train=(12, 28, 28), test=(4, 28, 28), labels=None,
               dotted=False) -> str:
    rng = np.random.default_rng(1)
    names = {"train-images-idx3-ubyte": rng.integers(0, 256, train, dtype=np.uint8),
             "train-labels-idx1-ubyte": (labels if labels is not None
                                         else np.arange(train[0], dtype=np.uint8) % 10),
             "t10k-images-idx3-ubyte": rng.integers(0, 256, test, dtype=np.uint8),
             "t10k-labels-idx1-ubyte": np.arange(test[0], dtype=np.uint8) % 10}
    for name, array in names.items():
        if dotted:
            name = name.replace("-idx", ".idx")
        write_idx(os.path.join(tmp_path, name), array)
    return str(tmp_path)


def test_load_mnist_accepts_the_dotted_names_of_some_mirrors(tmp_path) -> None:
    data = load_mnist(_mnist_dir(tmp_path, dotted=True))
    assert data.image_shape == (28, 28) and len(data.train_labels) == 12
    assert data.train_labels.dtype == np.int64 and data.max_value == 255


@pytest.mark.parametrize("kwargs, says", [
    ({"labels": np.arange(11, dtype=np.uint8) % 10}, "holds 12 images but"),
    ({"labels": np.full(12, 10, dtype=np.uint8)}, "label 10 outside 0..9"),
    ({"test": (4, 14, 14)}, "but test images"),
    ({"train": (12, 2, 28)}, "images of 2x28"),
    ({"train": (0, 28, 28), "labels": np.zeros(0, dtype=np.uint8)}, "holds no images"),
])
def test_load_mnist_checks_the_files_fit_together(tmp_path, kwargs, says) -> None:
    with pytest.raises(DataError, match=says):
        load_mnist(_mnist_dir(tmp_path, **kwargs))


def test_load_mnist_checks_element_types(tmp_path) -> None:
    _mnist_dir(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.arange(12, dtype=np.int32) % 10)
    with pytest.raises(DataError, match="expected unsigned bytes in 1 dimension, got int32"):
        load_mnist(tmp_path)


def test_shifted_digits_are_the_digits_at_seeded_places_on_a_larger_canvas() -> None:
    from gossip.demo.data import load_digits, load_shifted_digits

    plain, shifted = load_digits(), load_shifted_digits()
    assert shifted.image_shape == (12, 12) and shifted.max_value == plain.max_value
    assert len(shifted.train_labels) == 4 * len(plain.train_labels)
    assert len(shifted.test_labels) == 8 * len(plain.test_labels)
    # Same split: a test digit never trains, at any place.
    for images, labels, originals, copies in (
            (shifted.train_images, shifted.train_labels, plain.train_images, 4),
            (shifted.test_images, shifted.test_labels, plain.test_images, 8)):
        n = len(originals)
        assert np.array_equal(labels, np.tile(labels[:n], copies))
        offsets = set()
        for i in range(0, copies * n, 97):   # each image is its original, somewhere, on zeros
            image, original = images[i], originals[i % n]
            found = [(dy, dx) for dy in range(5) for dx in range(5)
                     if np.array_equal(image[dy:dy + 8, dx:dx + 8], original)
                     and image.sum() == original.sum()]
            assert found, i
            offsets.add(found[0])
        assert len(offsets) > 10   # placed at many offsets, not one
    again = load_shifted_digits()
    assert np.array_equal(again.train_images, shifted.train_images)
    assert np.array_equal(again.test_images, shifted.test_images)
    with pytest.raises(ValueError, match="canvas must be at least 8"):
        load_shifted_digits(canvas=6)


def test_shards_are_equal_disjoint_and_seeded() -> None:
    parts = [shard(103, r, 4, seed=3) for r in range(4)]
    assert all(len(p) == 25 for p in parts)
    assert len(set(np.concatenate(parts).tolist())) == 100
    np.testing.assert_array_equal(parts[1], shard(103, 1, 4, seed=3))
    with pytest.raises(DataError):
        shard(3, 0, 4)


def test_non_iid_shards_are_equal_disjoint_seeded_and_as_skewed_as_alpha_says() -> None:
    labels = np.repeat(np.arange(10), 100)          # 10 classes of 100
    def top2(alpha):   # the share of each peer's two largest classes, averaged
        parts = [shard(1000, r, 4, seed=1, labels=labels, alpha=alpha) for r in range(4)]
        assert all(len(p) == 250 for p in parts)
        assert len(set(np.concatenate(parts).tolist())) == 1000
        np.testing.assert_array_equal(parts[2], shard(1000, 2, 4, seed=1, labels=labels,
                                                      alpha=alpha))
        return np.mean([np.sort(np.bincount(labels[p], minlength=10))[-2:].sum() / 250
                        for p in parts])
    skewed, even = top2(0.1), top2(1000.0)
    # (every sample is dealt out, so a class runs out: 0.55 here at alpha 0.1, 0.25 at 1000)
    assert skewed > 0.45 and even < 0.35, (skewed, even)   # iid: 2 of 10 classes = 0.2
    with pytest.raises(ValueError, match="positive alpha"):
        shard(1000, 0, 4, labels=labels, alpha=0.0)
    with pytest.raises(ValueError, match="--non-iid must be a positive alpha"):
        DemoOptions(policies=("gossip",), non_iid=-1.0)


def test_progress_display_reads_events_written_in_pieces(tmp_path) -> None:
    path = tmp_path / "progress.jsonl"
    stream = io.StringIO()
    with ProgressDisplay(str(path), stream=stream, bars=False) as display:
        with open(path, "a") as f:
            f.write('{"event": "start", "policy": "gossip", "steps": 10}\n'
                    '{"event": "done", "pol')  # a writer caught in the middle of a line
            f.flush()
            wait_until(lambda: "gossip: training (10 steps)" in stream.getvalue(), 10,
                       what="the start line")
            assert "done" not in stream.getvalue()
            f.write('icy": "gossip", "accuracy": 0.5, "wall": 1.25}\nnot json\n')
    assert "gossip: done in 1.2 s, test accuracy 50.0%" in stream.getvalue()
    assert display.current == "gossip"


def _interrupted(args: list[str], stream: str, at: str) -> tuple[int, str, str]:
    """`gossip demo ARGS`, SIGINTed when a line of ``stream`` starts with ``at``: (exit code,
    stdout, stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "gossip", "demo", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())
    seen = []
    try:
        for line in getattr(proc, stream):
            seen.append(line)
            if line.startswith(at):
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if stream == "stdout":
        return proc.returncode, "".join(seen) + out, err
    return proc.returncode, out, "".join(seen) + err


def test_the_story_runs_each_scenario_and_writes_a_panel_for_each(tmp_path) -> None:
    out = tmp_path / "out"
    # (--dataset digits: the mechanics, at a quarter of the story's default data's steps.)
    proc = _demo("--scenario", "straggler,non-iid", "--epochs", "1", "--peers", "2",
                 "--dataset", "digits", "--no-baseline", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "=== scenario 1 of 2: straggler (the last peer 4x slower per step)" in proc.stdout
    summary = proc.stdout.rsplit("=== scenario 2 of 2", 1)[1]
    assert "straggler: the last peer 4x slower per step" in summary, summary
    assert "non-iid: each peer's classes drawn from Dirichlet(0.1)" in summary, summary
    story = json.loads((out / "story.json").read_text())
    assert [s["name"] for s in story["scenarios"]] == ["straggler", "non-iid"]
    straggler, non_iid = story["scenarios"]
    for scenario in story["scenarios"]:
        assert scenario["run"]["dataset"] == "digits", scenario["run"]
        assert scenario["run"]["target_accuracy"] == 0.95, scenario["run"]
    assert straggler["run"]["straggler"] == {"rank": 1, "factor": 4.0}, straggler["run"]
    assert non_iid["run"]["non_iid"] == 0.1 and non_iid["run"]["straggler"] is None
    assert [r["policy"] for r in straggler["table"]] == ["synchronous", "gossip",
                                                         "asynchronous"]
    for row in straggler["table"] + non_iid["table"]:
        assert row["worst_peer_accuracy"] <= row["final_accuracy"], row
    # Per peer, how each policy mixed (its own counters, demo.json's "mixing"): what traced
    # asynchronous's pushes in issue #39.
    mixing = {r["policy"]: r.get("mixing") for r in straggler["table"]}["asynchronous"]
    assert sorted(mixing) == ["0", "1"], mixing
    for counters in mixing.values():
        assert counters["background_rounds"] >= 1 and len(counters["messages_sent_to"]) == 2
        assert 0 < counters["weights"][0] <= 2 and counters["steps"] >= 1, counters
    for name in ("straggler", "non-iid"):   # each scenario's own run, as `gossip demo` writes
        assert (out / name / "demo.json").exists() and (out / name / "demo.png").exists()
    assert (out / "story.png").stat().st_size > 0
    # The time budget: the first policy to finish sets T, and its own accuracy at T is its
    # final one.
    for scenario in story["scenarios"]:
        rows = {r["policy"]: r for r in scenario["table"]}
        first = min(rows.values(), key=lambda r: r["train_seconds"])
        assert scenario["budget_seconds"] == first["train_seconds"], scenario
        assert scenario["accuracy_at_budget"][first["policy"]] == first["final_accuracy"]
        # ... and its averaged model's at T is its final averaged model's (both evaluated
        # from the same average, at the last point).
        assert (scenario["averaged_accuracy_at_budget"][first["policy"]]
                == first["averaged_model_accuracy"]), scenario
    assert "T = " in summary and "at T" in summary and "avg at T" in summary, summary


@pytest.mark.parametrize("args, dataset, epochs", [
    ([], "shifted-digits", {"slow-network": 4, "straggler": 4, "death": 8, "non-iid": 4}),
    (["--scenario", "death", "--epochs", "2"], "shifted-digits", {"death": 2}),
    (["--scenario", "straggler", "--dataset", "digits"], "digits", {"straggler": 20}),
    (["--policy", "gossip"], "digits", None),
    (["--policy", "gossip", "--dataset", "shifted-digits"], "shifted-digits", None),
])
def test_the_story_trains_on_the_shifted_digits_unless_a_data_set_is_named(args, dataset,
                                                                           epochs) -> None:
    # The story's scenarios differ beyond the seeds' noise only on the harder data; one run of
    # the user's own keeps the plain digits (and their figures in the README).
    from gossip.cli import build_parser
    from gossip.cli.demo_command import demo_options

    options, scenarios = demo_options(build_parser().parse_args(["demo", *args]))
    assert options.dataset == dataset
    if epochs is None:
        assert scenarios is None
    else:
        assert {s.name: s.options(options).epochs_per_policy for s in scenarios} == epochs


def _curve_doc(runs: dict) -> dict:
    """A demo.json's table and curves: runs = {policy: (train_seconds, [(time, acc), ...])}."""
    return {"table": [{"policy": p, "train_seconds": t} for p, (t, _) in runs.items()],
            "figures": {"test_accuracy_vs_wall_time": {
                p: {"time": [x for x, _ in c], "accuracy": [a for _, a in c]}
                for p, (_, c) in runs.items()}}}


def test_the_budget_is_the_first_finish_and_each_run_is_read_at_its_last_point_by_then():
    from gossip.demo.story import budget

    doc = _curve_doc({"fast": (1.0, [(0, 0.1), (0.5, 0.8), (1.0, 0.9)]),
                      "slow": (3.0, [(0, 0.1), (0.9, 0.6), (1.1, 0.7), (3.0, 0.95)]),
                      "late": (2.0, [(0, 0.1), (1.5, 0.5), (2.0, 0.6)]),
                      "baseline": (0.2, [(0, 0.1), (0.2, 0.99)])})
    t, at = budget(doc)
    assert t == 1.0   # the baseline, alone on the machine afterwards, sets no budget
    assert at == {"fast": 0.9, "slow": 0.6, "late": None, "baseline": 0.99}
    # The averaged models' curves where a run has them; the baseline's one model otherwise.
    curves = doc["figures"]["test_accuracy_vs_wall_time"]
    curves["fast"]["averaged_accuracy"] = [0.1, 0.85, 0.95]
    curves["slow"]["averaged_accuracy"] = [0.1, 0.7, 0.8, 0.96]
    assert budget(doc, "averaged_accuracy") == (1.0, {"fast": 0.95, "slow": 0.7, "late": None,
                                                      "baseline": 0.99})


@pytest.mark.slow   # the whole story, as a user runs it: about 3 minutes on 2 cores
@pytest.mark.timeout(700)
def test_the_story_separates_the_policies_where_the_readme_says(tmp_path) -> None:
    # The README's claims, each with a margin the four measured seeds (0-3) cleared by twice
    # or more: comparisons of accuracy at one time budget or at the end, never a time.
    out = tmp_path / "out"
    proc = _demo("--seed", "0", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    story = {s["name"]: s for s in json.loads((out / "story.json").read_text())["scenarios"]}
    assert list(story) == ["slow-network", "straggler", "death", "non-iid"]

    def rows(name):
        return {r["policy"]: r for r in story[name]["table"]}

    # A slow network: local-sgd is ahead of synchronous at T (6.6-15.9 points in the four
    # seeds; not of gossip beyond noise: 1.5-2.9 points there, -0.2 in a fifth run, where
    # elastic finished first and T fell between two of local-sgd's averages).
    at = story["slow-network"]["accuracy_at_budget"]
    assert at["local-sgd"] - at["synchronous"] > 0.03, at
    # A straggler: asynchronous finishes first; at T its averaged model is ahead of
    # synchronous (9.5-23.3 points) and of gossip's (2.9-6.6 points, against gossip's
    # averaged; `gossip demo --scenario straggler,death --seed S`, S = 0-3, 2026-12-04, with
    # the pairwise exchange; gossip's value at T moves with T, asynchronous's finish).
    averaged_at = story["straggler"]["averaged_accuracy_at_budget"]
    straggler = rows("straggler")
    assert min(straggler, key=lambda p: straggler[p]["train_seconds"]
               if p != "baseline" else float("inf")) == "asynchronous", straggler
    assert averaged_at["asynchronous"] - averaged_at["synchronous"] > 0.05, averaged_at
    assert averaged_at["asynchronous"] - averaged_at["gossip"] > 0.014, averaged_at
    # ... and its peers agree about as well as gossip's (issue #39): their own models end
    # within 1 point of gossip's (-0.9 to +1.1 points over seeds 0-3, quiet and beside a
    # CPU-bound process, 2026-12-05), the consensus distance 1.5-2.1x gossip's; asserted
    # with twice those margins.
    assert (straggler["asynchronous"]["final_accuracy"]
            > straggler["gossip"]["final_accuracy"] - 0.02), straggler
    assert (straggler["asynchronous"]["consensus"]
            < 5 * straggler["gossip"]["consensus"]), straggler
    # Non-iid data: gossip on a ring is behind synchronous at T (2.1-8.5 points over seeds
    # 0-3, 2026-12-05), and its worst peer ends below synchronous (1.0-10.4 points); their
    # means end within a point of each other (gossip -1.0 to +0.1).
    non_iid = rows("non-iid")
    at = story["non-iid"]["accuracy_at_budget"]
    assert at["synchronous"] - at["gossip"] > 0.01, at
    assert (non_iid["synchronous"]["final_accuracy"]
            - non_iid["gossip"]["worst_peer_accuracy"] > 0.005), non_iid
    # A death: every policy finished, past the dead peer; asynchronous's peers end within 1
    # point of gossip's (-0.9 to +0.7 over the same runs), asserted within 2.
    assert all(r.get("failed") is None for r in story["death"]["table"]), story["death"]
    death = rows("death")
    assert death["asynchronous"]["final_accuracy"] > death["gossip"]["final_accuracy"] - 0.02, \
        death


def test_the_story_draws_an_averaged_model_where_the_peers_disagree_late_in_the_run():
    from gossip.demo.story import _averaged_differs

    own = [0.1, 0.5, 0.8, 0.9, 0.92]
    assert not _averaged_differs({"accuracy": own})                      # no average at all
    assert not _averaged_differs({"accuracy": own, "averaged_accuracy": own})   # replicas
    # Apart early (a steep start), together late: one line is enough.
    assert not _averaged_differs({"accuracy": own,
                                  "averaged_accuracy": [0.1, 0.7, 0.81, 0.9, 0.925]})
    # Apart over the second half (asynchronous, elastic): the average gets its line.
    assert _averaged_differs({"accuracy": own,
                              "averaged_accuracy": [None, 0.55, 0.86, 0.93, 0.95]})


@pytest.mark.slow
def test_ctrl_c_keeps_the_scenarios_that_finished(tmp_path) -> None:
    # SIGINT once the second scenario starts: the first stays in story.json, exit 130.
    out = tmp_path / "out"
    returncode, _, err = _interrupted(
        ["--scenario", "non-iid,slow-network", "--epochs", "3", "--peers", "2",
         "--dataset", "digits", "--no-baseline", "--out", str(out)], "stdout",
        "=== scenario 2 of 2")
    assert returncode == 130, err[-3000:]
    assert "interrupted; the finished scenarios are in" in err, err[-3000:]
    assert "story.png: non-iid" in err, err[-3000:]
    story = json.loads((out / "story.json").read_text())
    assert [s["name"] for s in story["scenarios"]] == ["non-iid"]
    assert (out / "story.png").stat().st_size > 0


@pytest.mark.slow
def test_ctrl_c_keeps_the_runs_that_finished(tmp_path) -> None:
    # SIGINT once the first policy is done: its row is printed and written, exit 130.
    out = tmp_path / "out"
    returncode, stdout, err = _interrupted(
        ["--policy", "synchronous,gossip", "--epochs", "6", "--no-baseline", "--out", str(out)],
        "stderr", "synchronous: done")
    assert returncode == 130, err[-3000:]
    assert "interrupted; 1 finished run(s) reported: synchronous" in err, err[-3000:]
    assert "synchronous" in stdout and "gossip " not in stdout.split("policy", 1)[1], stdout
    info = json.loads((out / "demo.json").read_text())
    assert [row["policy"] for row in info["table"]] == ["synchronous"], info["table"]
    assert (out / "demo.png").stat().st_size > 0
