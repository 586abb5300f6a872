"""SequenceOrder (collectives/algorithms/order.py): the shared-memory calls of one peer run
one at a time, lowest reserved sequence number first, whatever thread runs each."""
import threading
import time

import pytest

from collectives.algorithms.order import SequenceOrder
from collectives.errors import OperationTimeout, PeerLost


class _Transport:
    """What a turn reads of a call's transport: its rank and whether it closed."""

    def __init__(self) -> None:
        self.rank = 0
        self.closed = False


class _Call:
    def __init__(self, seq: int, transport: _Transport, timeout: float = 30.0) -> None:
        self.seq, self.transport = seq, transport
        self.deadline = time.monotonic() + timeout

    def describe(self) -> str:
        return f"allreduce at sequence {self.seq}"


def test_a_later_call_waits_for_the_earlier_reserved_one_and_runs_as_it_ends():
    order, t = SequenceOrder(), _Transport()
    order.reserve(0)
    order.reserve(1)
    ran: list[str] = []
    started = threading.Event()

    def later() -> None:
        started.set()
        with order.turn(_Call(1, t)):
            ran.append("1")

    thread = threading.Thread(target=later)
    thread.start()
    started.wait()
    thread.join(0.3)   # (it cannot run: 0 is reserved and not done)
    assert thread.is_alive() and ran == []
    with order.turn(_Call(0, t)):
        ran.append("0")
    thread.join(30)
    assert not thread.is_alive() and ran == ["0", "1"]
    # Nothing is left reserved: the next call runs at once, in this thread.
    with order.turn(_Call(2, t)):
        ran.append("2")
    assert ran == ["0", "1", "2"]


def test_a_body_that_raises_still_hands_the_turn_over():
    order, t = SequenceOrder(), _Transport()
    order.reserve(0)
    order.reserve(1)
    with pytest.raises(RuntimeError):
        with order.turn(_Call(0, t)):
            raise RuntimeError("the call failed")
    with order.turn(_Call(1, t, timeout=5)):
        pass


def test_a_turn_that_never_comes_times_out_naming_the_calls_before_it():
    order, t = SequenceOrder(), _Transport()
    order.reserve(3)
    with pytest.raises(OperationTimeout, match=r"shared-memory calls \[3\] of this peer"):
        with order.turn(_Call(4, t, timeout=0.2)):
            pass
    # The refused call gave its number back: 3, run now, is alone.
    with order.turn(_Call(3, t)):
        pass


def test_a_closed_peer_stops_waiting_for_its_turn():
    order, t = SequenceOrder(), _Transport()
    order.reserve(0)
    t.closed = True
    with pytest.raises(PeerLost, match="this peer was closed"):
        with order.turn(_Call(1, t)):
            pass


def test_wait_before_returns_once_the_earlier_calls_ended():
    order, t = SequenceOrder(), _Transport()
    order.reserve(0)
    done = threading.Event()

    def waiter() -> None:
        order.wait_before(1, time.monotonic() + 30, t, "barrier at sequence 1")
        done.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    assert not done.wait(0.3)
    with order.turn(_Call(0, t)):
        pass
    thread.join(30)
    assert done.is_set()
