"""`gossip run --log-dir DIR --tee N`, torchrun's: every stream goes to DIR/rank{R}.stdout and
.stderr; --tee chooses which are also shown here (0 none, 1 stdout, 2 stderr, 3 both, the
default; or per local rank, 0:3,1:2), prefixed by rank."""
from __future__ import annotations

from pathlib import Path

import pytest

from test_launcher import _lines, _run, _script


def _files(folder: Path, rank: int) -> tuple[str, str]:
    return ((folder / f"rank{rank}.stdout").read_text(),
            (folder / f"rank{rank}.stderr").read_text())


@pytest.mark.parametrize("tee, shown", [
    ("0", {0: (False, False), 1: (False, False)}),
    ("1", {0: (True, False), 1: (True, False)}),
    ("2", {0: (False, True), 1: (False, True)}),
    ("3", {0: (True, True), 1: (True, True)}),
    ("0:2", {0: (False, True), 1: (False, False)}),   # ranks not named show nothing
    ("0:1,1:3", {0: (True, False), 1: (True, True)}),
])
def test_tee_chooses_the_streams_shown_and_the_files_keep_both(tmp_path, tee, shown) -> None:
    logs = tmp_path / "logs"
    proc = _run("-n", "2", "--log-dir", str(logs), "--tee", tee, _script("show_env.py"), "x")
    assert proc.returncode == 0, proc.stderr
    for rank, (out_shown, err_shown) in shown.items():
        out, err = _files(logs, rank)
        assert out.splitlines()[1] == "ARGS x" and err == f"stderr line of rank {rank}\n"
        assert ("ARGS x" in _lines(proc.stdout, rank)) == out_shown, proc.stdout
        assert (f"stderr line of rank {rank}" in _lines(proc.stderr, rank)) == err_shown, \
            proc.stderr


@pytest.mark.timeout(120)
def test_a_failure_not_shown_is_named_with_its_file(tmp_path) -> None:
    logs = tmp_path / "logs"
    proc = _run("-n", "3", "--log-dir", str(logs), "--tee", "0", _script("raise_one.py"))
    assert proc.returncode == 1, proc.stderr
    assert "[rank" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert (f"gossip run: rank 2 failed with exit code 1 (ValueError: bad batch at step 3; "
            f"see {logs / 'rank2.stderr'})") in proc.stderr, proc.stderr
    _, err = _files(logs, 2)
    assert err.startswith("Traceback (most recent call last):\n"), err
    assert err.rstrip().endswith("ValueError: bad batch at step 3"), err


@pytest.mark.parametrize("args, words", [
    (["--tee", "1"], "--tee 1 needs --log-dir"),
    (["--tee", "5", "--log-dir", "{tmp}"], "expected 0 (none), 1 (stdout), 2 (stderr), 3"),
    (["--tee", "0:1,2:3", "--log-dir", "{tmp}"], "'2' is not a local rank (0..1)"),
])
def test_bad_tee_is_a_one_line_error(tmp_path, args, words) -> None:
    args = [a.format(tmp=tmp_path) for a in args]
    proc = _run("-n", "2", *args, _script("show_env.py"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gossip run: error: --tee"), proc.stderr
    assert words in lines[0], lines[0]
    assert proc.stdout == ""


def test_tee_3_without_a_log_dir_is_the_default_output() -> None:
    # torchrun users pass --tee 3 by habit: with nowhere else to keep them, every stream is
    # shown anyway, so it is accepted.
    proc = _run("-n", "2", "--tee", "3", _script("show_env.py"), "y")
    assert proc.returncode == 0, proc.stderr
    for rank in range(2):
        assert _lines(proc.stdout, rank)[1] == "ARGS y"
        assert _lines(proc.stderr, rank) == [f"stderr line of rank {rank}"]
