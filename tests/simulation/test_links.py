"""The simulator's network when links differ (gossip/simulation/links.py): regions with a WAN
between them, a file naming every link, each message charged by its own link and each
collective by the slowest pair of each step of its algorithm."""
from __future__ import annotations

import json

import numpy as np
import pytest

from collectives.communicator import DEFAULT_SMALL_BYTES
from collectives.transport.emulation import parse_link
from gossip.simulation import Fabric, Links, TrainingSpec, collective_seconds, simulate_training

LOCAL = parse_link("10gbit,0.5ms")
WAN = parse_link("100mbit,40ms")


def _cost(link, nbytes: float) -> float:
    return link.latency + nbytes / link.rate


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 13, 1024])
@pytest.mark.parametrize("op", ["allreduce", "allgather", "broadcast", "barrier"])
@pytest.mark.parametrize("nbytes", [4096, 4 << 20])
def test_one_region_is_the_uniform_formula(n: int, op: str, nbytes: int) -> None:
    got = Links.uniform(n, LOCAL).collective_seconds(op, nbytes)
    steps = int(np.ceil(np.log2(n))) if n > 1 else 0
    expected = {"allreduce": steps * _cost(LOCAL, nbytes) if nbytes < DEFAULT_SMALL_BYTES
                else 2 * (n - 1) * _cost(LOCAL, nbytes / n),
                "allgather": (n - 1) * _cost(LOCAL, nbytes),
                "broadcast": steps * _cost(LOCAL, nbytes),
                "barrier": steps * LOCAL.latency}[op] if n > 1 else 0.0
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert collective_seconds(op, nbytes, n, LOCAL) == got


def test_a_message_is_charged_by_its_own_link_within_and_between_regions() -> None:
    fabric = Fabric(4, Links.regions(4, 2, LOCAL, WAN))   # ranks 0, 1 | 2, 3
    data = np.zeros(250_000, np.float32)                  # 1 MB
    fabric.send(0, 1, data)
    fabric.recv(1, 0, "a test")
    assert fabric.clock[1] == pytest.approx(_cost(LOCAL, data.nbytes), rel=1e-12)
    fabric.send(1, 2, data)
    fabric.recv(2, 1, "a test")
    assert fabric.clock[2] == pytest.approx(fabric.clock[1] + _cost(WAN, data.nbytes),
                                            rel=1e-12)


def test_a_collective_waits_for_the_slowest_pair_of_each_step() -> None:
    links = Links.regions(4, 2, LOCAL, WAN)
    big, small = 8 << 20, 4096
    # The ring crosses the WAN (1 -> 2, 3 -> 0): every one of its 2(n-1) steps waits for it.
    assert links.collective_seconds("allreduce", big) == pytest.approx(
        6 * _cost(WAN, big / 4), rel=1e-12)
    # Recursive doubling: step 0 pairs 0-1 and 2-3 (within), step 1 pairs 0-2 and 1-3 (WAN).
    assert links.collective_seconds("allreduce", small) == pytest.approx(
        _cost(LOCAL, small) + _cost(WAN, small), rel=1e-12)
    # Binomial broadcast from 0: 0 -> 1 (within), then 0 -> 2 and 1 -> 3 (WAN).
    assert links.collective_seconds("broadcast", big) == pytest.approx(
        _cost(LOCAL, big) + _cost(WAN, big), rel=1e-12)


def test_regions_are_blocks_of_consecutive_ranks() -> None:
    assert Links.regions(10, 3, LOCAL, WAN).region.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]


def _write(tmp_path, data) -> str:
    path = tmp_path / "links.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_file_can_say_what_regions_say_and_the_training_is_the_same(tmp_path) -> None:
    path = _write(tmp_path, {"regions": [0, 0, 0, 0, 1, 1, 1, 1],
                             "links": [["10gbit,0.5ms", "100mbit,40ms"],
                                       ["100mbit,40ms", "10gbit,0.5ms"]]})
    common = {"policy": "gossip", "peers": 8, "steps": 5, "step_seconds": 0.01}
    by_regions = simulate_training(TrainingSpec(**common, link="10gbit,0.5ms", regions=2,
                                                wan="100mbit,40ms"))
    by_file = simulate_training(TrainingSpec(**common, links=path))
    uniform = simulate_training(TrainingSpec(**common, link="10gbit,0.5ms"))
    assert by_file.simulated_seconds == by_regions.simulated_seconds
    for a, b, c in zip(by_file.peers, by_regions.peers, uniform.peers):
        assert a.clocks == b.clocks
        # A lockstep policy's numbers do not depend on the times: only the clocks moved.
        assert np.array_equal(a.parameters, c.parameters)
    # Each round waits for the WAN: at least its latency a step more than within a site.
    assert by_regions.simulated_seconds > uniform.simulated_seconds + 5 * WAN.latency * 0.9


def test_a_full_matrix_may_be_asymmetric(tmp_path) -> None:
    up, down = "10mbit,5ms", "1gbit,5ms"
    path = _write(tmp_path, {"links": [[None, up, up], [down, None, "1gbit,1ms"],
                                       [down, "1gbit,1ms", None]]})
    links = Links.from_file(3, path)
    assert links.link(0, 1) == (parse_link(up).rate, 0.005)
    assert links.link(1, 0) == (parse_link(down).rate, 0.005)
    assert links.link(1, 1) == (float("inf"), 0.0)


@pytest.mark.parametrize("data, message", [
    ({"links": [["1gbit,1ms"]]}, "needs one row per peer (4)"),
    ({"regions": [0, 0, 1, 2], "links": [["1gbit", "1gbit"], ["1gbit", "1gbit"]]},
     "region numbers from 0 to 1"),
    ({"regions": [0, 0, 1, 1], "links": [["1gbit", "1gbit"], ["1gbit"]]}, "row 1 is not"),
    ({"regions": [0, 0, 1, 1], "links": [["1gbit", "fast"], ["1gbit", "1gbit"]]},
     "links[0][1]"),
    ({"regions": [0, 0, 1, 1], "links": [["1gbit", 3], ["1gbit", "1gbit"]]}, "links[0][1]"),
    ([1, 2], "a JSON object"),
])
def test_a_bad_file_names_the_file_and_what_is_wrong(tmp_path, data, message) -> None:
    path = _write(tmp_path, data)
    with pytest.raises(ValueError, match=r"links file .*links.json") as err:
        TrainingSpec(peers=4, links=path)
    assert message in str(err.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"regions": 2}, "regions and wan go together"),
    ({"wan": "100mbit,40ms"}, "regions and wan go together"),
    ({"regions": 1, "wan": "100mbit,40ms"}, "regions must be an int from 2"),
    ({"regions": 5, "wan": "100mbit,40ms"}, "regions must be an int from 2"),
    ({"regions": 2, "wan": "off"}, "need a rate"),
    ({"regions": 2, "wan": "slow"}, "wan="),
    ({"links": "x.json", "link": "1gbit"}, "replaces link, regions and wan"),
    ({"links": "/nonexistent/links.json"}, "cannot read the links file"),
])
def test_bad_network_settings_name_the_setting(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        TrainingSpec(peers=4, **kwargs)


@pytest.mark.parametrize("n", [1, 2, 5, 8, 64])
@pytest.mark.parametrize("op", ["allreduce", "allgather", "broadcast", "barrier"])
@pytest.mark.parametrize("nbytes", [1000, 4 * DEFAULT_SMALL_BYTES])
def test_a_collective_s_sends_are_its_algorithm_s(n: int, op: str, nbytes: int) -> None:
    """Links.collective_sends: what each rank sends, over the pairs collective_seconds
    charges. A broadcast reaches every other rank once; the ring sends 2(n - 1)/n of the
    array (allreduce) or n - 1 arrays (allgather) to the next rank; recursive doubling one
    array to each partner below n; a barrier sends no bytes."""
    links = Links.uniform(n, parse_link("1gbit,1ms"))
    sends = {r: links.collective_sends(op, nbytes, r) for r in range(n)}
    assert all(0 <= dst < n and dst != r for r, out in sends.items() for dst, _ in out)
    if n == 1 or op == "barrier":
        assert all(out == [] for out in sends.values())
    elif op == "broadcast":
        received = sorted(dst for out in sends.values() for dst, _ in out)
        assert received == list(range(1, n))
    elif op == "allreduce" and nbytes < DEFAULT_SMALL_BYTES:
        partners = {r: sorted(dst for dst, _ in out) for r, out in sends.items()}
        assert all(r in partners[dst] for r, out in partners.items() for dst in out)
        if n & (n - 1) == 0:
            assert all(len(out) == n.bit_length() - 1 for out in sends.values())
    else:
        share = 2 * (n - 1) * nbytes // n if op == "allreduce" else (n - 1) * nbytes
        assert sends == {r: [((r + 1) % n, share)] for r in range(n)}


def test_bytes_are_counted_per_link_and_between_regions() -> None:
    """Gossip on a ring of 8 in two regions: each ring edge carries a message per step both
    ways, the links add up to the peers' bytes, and the two WAN edges (3-4, 7-0) carry a
    quarter of it."""
    steps = 6
    result = simulate_training(TrainingSpec(policy="gossip", peers=8, steps=steps,
                                            regions=2, wan="100mbit,20ms", link="1gbit,1ms"))
    nbytes = result.peers[0].parameters.nbytes
    assert result.link_bytes == {(r, (r + d) % 8): steps * nbytes
                                 for r in range(8) for d in (1, -1)}
    assert sum(result.link_bytes.values()) == sum(p.bytes_sent for p in result.peers)
    total = 16 * steps * nbytes
    assert result.bytes_between_regions().tolist() == [[6 * total // 16, 2 * total // 16],
                                                       [2 * total // 16, 6 * total // 16]]
    record = result.to_dict()
    assert record["bytes_per_link"][0][2] == steps * nbytes and len(record["bytes_per_link"]) == 16
    json.dumps(record)   # plain numbers: the CLI's --json writes it
