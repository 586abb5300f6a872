"""Asynchronous(exchange="pairwise"): AD-PSGD's atomic pairwise average in push-sum form
(gossip/policies/asynchronous/pairs.py). Real peer processes over real sockets, a straggler
among them: the exchanges keep the mass exact, leave every step's move in place (none lost,
none counted twice, whichever thread ran first), and mix the peers to their mean."""
from __future__ import annotations

import numpy as np
import pytest

import topologies
from gossip.policies import Asynchronous
from gossip.testing import spawn, wait_until

LENGTH = 500
STEPS = 150
STRAGGLER = 3


def start(rank: int) -> np.ndarray:
    return np.random.default_rng([29, rank]).normal(loc=rank, size=LENGTH)


def move(rank: int) -> np.ndarray:
    """What each step of ``rank`` adds to its parameters (a stand-in for the optimizer)."""
    return np.random.default_rng([31, rank]).normal(size=LENGTH) * 1e-3


def exchanging(peer, moving: bool, per_step: int = 1):
    x = start(peer.rank)
    # Every weight stays at 1 (no view change): a move of the parameters is a move of the
    # mass (w m) by the same amount.
    policy = Asynchronous(topology=topologies.Ring(peer.world_size), exchange="pairwise",
                          exchanges_per_step=per_step).attach(peer, [x])
    steps = STEPS // 2 if peer.rank == STRAGGLER else STEPS
    u = move(peer.rank)
    a = np.random.default_rng(peer.rank).standard_normal((120, 120))
    for _ in range(steps):
        if moving:
            x += u
        policy.after_step()
        # A step's compute, four times as long on the straggler: the others exchange with
        # it meanwhile, its receiving thread answering.
        for _ in range(12 if peer.rank == STRAGGLER else 3):
            a = np.tanh(a @ a.T / 120)
    policy.quiesce()           # nothing in flight anywhere; every exchange's change folded in
    out = x.copy(), policy.weights[0], steps, policy.stats()
    policy.close()
    return out


@pytest.mark.parametrize("per_step", [1, 3])
def test_pairwise_exchanges_keep_the_mass_and_bring_the_peers_to_their_mean(per_step):
    n = 4
    out = spawn(exchanging, n=n, timeout=120, args=(False, per_step))
    initial = sum(start(r) for r in range(n))
    total = sum(w * x for x, w, _, _ in out)
    assert np.abs(total - initial).max() < 1e-9 * np.abs(initial).max(), \
        np.abs(total - initial).max()
    assert abs(sum(w for _, w, _, _ in out) - n) < 1e-12
    mean = initial / n
    spread = max(float(np.abs(x - mean).max()) for x, _, _, _ in out)
    assert spread < 1e-6, spread
    for rank, (_, _, _, stats) in enumerate(out):
        assert stats["exchange"] == "pairwise"
        # Each peer both asked (answers taken) and was asked (requests answered): the
        # straggler too, whose receiving thread answers while its step runs.
        assert stats["exchange_answers_taken"] > 0 and stats["requests_answered"] > 0, \
            (rank, stats)
        assert stats["dropped_peers"] == [], (rank, stats)
        assert stats["exchanges_per_step"] == per_step
    if per_step > 1:
        # The step's further exchanges ran: more started than rounds began them.
        assert all(s["exchanges_started"] > s["background_rounds"] for _, _, _, s in out), \
            [(s["exchanges_started"], s["background_rounds"]) for _, _, _, s in out]


@pytest.mark.parametrize("per_step", [1, 3])
def test_every_step_s_move_stays_in_the_sum_whatever_the_exchanges(per_step):
    """x += u each step beside the exchanges: after quiesce() the sum of the models is the
    starting sum plus every move made (the training thread adds the exchanges' changes to
    its parameters, the moves stay on top; a step's further exchanges, on the pushing
    thread, run while the training thread moves)."""
    n = 4
    out = spawn(exchanging, n=n, timeout=120, args=(True, per_step))
    expected = sum(start(r) + steps * move(r) for r, (_, _, steps, _) in enumerate(out))
    total = sum(w * x for x, w, _, _ in out)
    assert np.abs(total - expected).max() < 1e-9 * np.abs(expected).max(), \
        np.abs(total - expected).max()


def one_closes_early(peer):
    """Rank 3 closes its policy once every peer took 10 steps, and stays (as a peer that
    finished its share of the steps does, waiting for the others at a barrier): it answers
    no more. The others take 400 more steps."""
    x = start(peer.rank)
    policy = Asynchronous(topology=topologies.Ring(peer.world_size),
                          exchange="pairwise").attach(peer, [x])
    a = np.random.default_rng(peer.rank).standard_normal((120, 120))

    def steps(count):
        for _ in range(count):
            policy.after_step()
            for _ in range(3):
                a[:] = np.tanh(a @ a.T / 120)

    steps(10)
    peer.barrier()
    if peer.rank == 3:
        policy.close()
    peer.barrier()
    before = policy.stats()["exchange_answers_taken"] if peer.rank != 3 else 0
    if peer.rank != 3:
        steps(400)
    stats = policy.stats() if peer.rank != 3 else {}
    if peer.rank != 3:
        policy.close()
    peer.barrier()
    return before, stats


def test_a_partner_that_closed_its_policy_holds_nobody_up():
    """Ranks 0 and 2 have rank 3 as a neighbour: once it stops answering, an exchange with
    it waits answer_wait (0.25 s) where it waited send_timeout (5 s, longer than the 400
    steps take here, and the peer refuses every request meanwhile), and it is not asked
    again until it answers, so they go on exchanging with rank 1."""
    out = spawn(one_closes_early, n=4, timeout=120)
    for rank in (0, 2):
        before, stats = out[rank]
        assert stats["exchange_answers_taken"] - before >= 20, (rank, before, stats)
        assert stats["dropped_peers"] == [], (rank, stats)   # closed is not lost


def test_pairwise_refuses_the_push_only_settings():
    with pytest.raises(ValueError, match="push_fraction.*exchange='push'"):
        Asynchronous(exchange="pairwise", push_fraction=0.5)
    with pytest.raises(ValueError, match="min_weight.*exchange='push'"):
        Asynchronous(exchange="pairwise", min_weight=0.25)
    with pytest.raises(ValueError, match="exchange='both'.*pairwise, push"):
        Asynchronous(exchange="both")
    with pytest.raises(ValueError, match="exchanges_per_step.*exchange='pairwise'"):
        Asynchronous(exchange="push", exchanges_per_step=2)
    with pytest.raises(ValueError, match="exchanges_per_step"):
        Asynchronous(exchanges_per_step=0)


def stalled_partner(peer, folder: str):
    """Two peers: rank 0 stops rank 1's process (SIGSTOP) for 50 of its steps and until an
    exchange with its only partner went unanswered, then lets it go on (SIGCONT) and steps
    until 20 more of its exchanges were answered (at most 60 s: the bug this guards against
    left rank 0 never asking rank 1 again)."""
    import os
    import signal
    x = start(peer.rank)
    policy = Asynchronous(topology=topologies.Ring(2)).attach(peer, [x])
    a = np.random.default_rng(peer.rank).standard_normal((120, 120))

    def steps(count):
        for _ in range(count):
            policy.after_step()
            a[:] = np.tanh(a @ a.T / 120)

    steps(10)
    peer.barrier()
    if peer.rank == 1:
        with open(os.path.join(folder, "pid"), "w") as f:
            f.write(str(os.getpid()))
    peer.barrier()
    if peer.rank == 0:
        pid = int(open(os.path.join(folder, "pid")).read())
        os.kill(pid, signal.SIGSTOP)
        steps(50)
        # (answer_wait after the last request: the exchange gives up waiting and goes on.)
        due = wait_until(lambda: steps(1) or policy.stats()["answers_due_from"], 30,
                         what="rank 1's answer due")
        os.kill(pid, signal.SIGCONT)
        before = policy.stats()["exchange_answers_taken"]
        wait_until(lambda: steps(1) or policy.stats()["exchange_answers_taken"] - before >= 20,
                   60, what="20 exchanges with rank 1 answered after it went on")
        after = policy.stats()
    else:
        steps(300)
        due, before, after = None, None, policy.stats()
    peer.barrier()
    policy.close()
    return due, before, after


def test_a_partner_that_answers_late_is_asked_again_when_it_is_the_only_one(tmp_path):
    # With every partner's answer due, no exchange started, and late answers were taken
    # only when one did: rank 0 never asked rank 1 again. Now the pushing thread takes them.
    out = spawn(stalled_partner, n=2, timeout=120, args=(str(tmp_path),))
    due, before, after = out[0]
    assert due == [1], due               # the stall was seen: rank 1's answer was due
    assert after["answers_due_from"] == [], after
    assert after["exchange_answers_taken"] - before >= 20, (before, after)


class _Bucket:
    """A bucket as Pairs reads one: its flat parameters and a new buffer of their shape."""

    def __init__(self, flat: np.ndarray) -> None:
        self.flat = flat

    def new(self) -> np.ndarray:
        return np.zeros_like(self.flat)


def _pair(rank: int, values: np.ndarray, weight: float):
    import threading

    from gossip.policies.asynchronous.pairs import Pairs
    pairs = Pairs([_Bucket(values)], rank=rank, world_size=4, cond=threading.Condition(),
                  lock=threading.Lock())
    pairs.set_weights([weight])
    pairs.sync([_Bucket(values)])   # published: it answers from now on
    return pairs


def _request(pairs, dst: int, number: int) -> np.ndarray:
    from gossip.policies.asynchronous.pairs import TAIL
    out = np.zeros(LENGTH + TAIL)
    pairs.begin(dst, [out], number)
    return out


def test_a_busy_peer_answers_one_request_and_the_three_mix_doubly_stochastically():
    """j asks k; before k's answer comes, i asks j (answered: the one overlap) and l asks j
    (refused: a second could drive j's weight below 0). The sums of w m and of w are
    exact; i ends with the pool of i and j, k with that of j and k, j with that of i and k;
    every weight is the mean of two."""
    values = {r: start(r) for r in range(4)}
    weights = {0: 0.5, 1: 1.5, 2: 1.25, 3: 0.75}
    i, j, k, l = (_pair(r, values[r].copy(), weights[r]) for r in range(4))
    x = {r: weights[r] * values[r] for r in range(4)}

    to_k = _request(j, 2, 1)
    to_j = _request(i, 1, 1)
    assert j.answer(0, to_j_answer := to_j.copy())            # the overlap
    from_l = _request(l, 1, 1)
    assert not j.answer(0, refused := from_l.copy()) and refused[-1] == 0
    l.end()
    assert k.answer(0, to_k_answer := to_k.copy())
    assert j.apply(0, to_k, to_k_answer)
    j.end()
    assert i.apply(0, to_j, to_j_answer)
    i.end()

    def pair(p, rank):
        buf = values[rank].copy()
        p.sync([_Bucket(buf)])   # the exchanges' changes, added to the parameters
        return buf, p.weights()[0]

    got = {r: pair(p, r) for r, p in enumerate((i, j, k, l))}
    total_x = sum(w * m for m, w in got.values())
    assert np.abs(total_x - sum(x.values())).max() < 1e-12
    assert abs(sum(w for _, w in got.values()) - sum(weights.values())) < 1e-12
    for rank, (a, b) in {0: (0, 1), 2: (1, 2), 1: (0, 2)}.items():
        m, w = got[rank]
        assert w == pytest.approx((weights[a] + weights[b]) / 2, abs=1e-12), rank
        expected = (x[a] + x[b]) / (weights[a] + weights[b])
        assert np.abs(m - expected).max() < 1e-12, rank
    assert np.array_equal(got[3][0], values[3]) and got[3][1] == weights[3]   # refused
