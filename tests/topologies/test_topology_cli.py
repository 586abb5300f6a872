"""Tests of `gossip topology`, run as a real subprocess like a user would."""

from __future__ import annotations

import subprocess
import sys

import pytest

from topologies import OnePeerExponential, Ring, Torus


def _gossip(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
    entry = ["-c", code] if code else ["-m", "gossip"]
    cmd = [sys.executable, *entry, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_cli_describes_a_ring() -> None:
    proc = _gossip("topology", "ring", "-n", "8")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("Ring(8): 8 peers, undirected, static")
    assert f"spectral gap: {Ring(8).spectral_gap():.6f}" in out
    assert f"(SLEM): {Ring(8).second_eigenvalue():.6f}" in out
    assert "rounds to cut disagreement 1000x: 32" in out
    assert "   7  0.3333  0:0.3333  6:0.3333" in out
    assert "mixing matrix" in out


def test_cli_torus_takes_its_size_from_the_spec() -> None:
    proc = _gossip("topology", "torus:8x8")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Torus(8, 8): 64 peers")
    assert f"spectral gap: {Torus(8, 8).spectral_gap():.6f}" in proc.stdout
    assert "mixing matrix" not in proc.stdout  # too big to print


def test_cli_time_varying_and_large_sizes() -> None:
    proc = _gossip("topology", "one-peer-exponential", "-n", "100", "--step", "2")
    assert proc.returncode == 0, proc.stderr
    assert "per period of 7 steps" in proc.stdout and "showing step 2" in proc.stdout
    rounds = OnePeerExponential(100).rounds_to_reduce()
    assert f"1000x: {rounds} steps ({rounds // 7} periods of 7)" in proc.stdout
    assert "84 more peers elided" in proc.stdout


def test_cli_compare_prints_a_row_per_topology() -> None:
    proc = _gossip("topology", "--compare", "-n", "16")
    assert proc.returncode == 0, proc.stderr
    for name in (
        "Ring(16)",
        "Torus(4, 4)",
        "Exponential(16)",
        "OnePeerExponential(16)",
        "Complete(16)",
        "RandomGraph(16, degree=3, seed=0)",
    ):
        assert sum(line.startswith(name + " ") for line in proc.stdout.splitlines()) == 1
    odd = _gossip("topology", "--compare", "-n", "13")
    assert odd.returncode == 0 and "skipped torus" in odd.stdout and "skipped random" in odd.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["topology", "hypercube", "-n", "8"], "unknown topology"),
        (["topology", "ring"], "-n 8"),
        (["topology", "--compare"], "--compare needs"),
        (["topology", "ring", "-n", "4", "--step", "-1"], "step must be at least 0"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_code_2(args: list[str], message: str) -> None:
    proc = _gossip(*args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gossip topology: error:") and message in lines[0]


def test_cli_plot_writes_a_png(tmp_path) -> None:
    target = tmp_path / "g.png"
    proc = _gossip("topology", "exponential", "-n", "8", "--plot", str(target), "--plot-weights")
    assert proc.returncode == 0, proc.stderr
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_plot_without_matplotlib_says_what_to_install(tmp_path) -> None:
    # A real interpreter in which `import matplotlib` fails, as on an install without extras.
    code = (
        "import sys; sys.modules['matplotlib'] = None; sys.argv[0] = 'gossip'; "
        "from gossip.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = _gossip("topology", "ring", "-n", "4", "--plot", str(tmp_path / "g.png"), code=code)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "pip install matplotlib (or '.[demo]' in gossip's checkout)" in proc.stderr, proc.stderr
    assert not (tmp_path / "g.png").exists()


def test_cli_stops_quietly_when_the_reader_goes_away() -> None:
    # `gossip topology torus:8x8 | head -1`: the pipe closes before we write.
    proc = subprocess.Popen(
        [sys.executable, "-m", "gossip", "topology", "torus:8x8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()
    try:
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 141
    finally:
        proc.kill()
        proc.stderr.close()
    assert err == ""
