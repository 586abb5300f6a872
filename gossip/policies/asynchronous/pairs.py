"""The pair an asynchronous peer offers to pairwise exchanges (AD-PSGD's atomic average, in
push-sum form): its model m and push-sum weight w as the training thread last published
them, changed in place by each exchange, and the change since then, which the training
thread adds to its parameters at its next step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from collectives.arrays import adapter_for

__all__ = ["Pairs", "TAIL", "Unanswered"]

#: Elements after the model in a request or an answer: the exchange's number (the initiator's
#: count of exchanges modulo 2**24, which float32 holds exactly; an answer repeats it), then
#: the push-sum weight.
TAIL = 2
SEQUENCE_MODULUS = 2 ** 24


@dataclass
class Unanswered:
    """An exchange whose answer did not come in time (a partner stalled, or one that closed
    its policy): the requests of its last ``buckets`` (index, a copy of what was sent), kept
    until their answers come, since the partner may have answered: its side is then
    applied, and the late answers complete this side, whenever they arrive."""

    dst: int
    buckets: list[tuple[int, Any]] = field(default_factory=list)


class Pairs:
    """Per bucket: the published model ``m`` (a buffer), its weight ``w`` (a float64), and
    ``delta``, what exchanges changed ``m`` by since the training thread last synced. One
    lock makes each exchange atomic against the other thread and the training thread's sync.

    The exchange of buckets k between an initiator i and a partner j, both holding their
    pairs as x = w m (the push-sum numerator) and w:

    - i sends its published (m_i, w_i) (``begin``; w_i as the buffer's dtype holds it) and
      starts no other exchange until this one is over (``end``);
    - j pools it with its own pair (``answer``): W = w_i + w_j, M = (w_i m_i + w_j m_j) / W;
      it keeps (M, W - g) and answers (M, g), g = W / 2 as the dtype rounds it; a j that
      has not published yet refuses (answers g = 0), and the pair of i is unchanged;
    - i takes the answer (``apply``): x_i <- x_i - w_i m_i + g M, w_i <- w_i - w_i + g,
      which leaves any move its training thread made since it sent, and any request it
      answered meanwhile, on top.

    The sums of x and of w over the two are what they were before, to float rounding: no
    mass is made or lost, and with every w at 1 (no view change) it is AD-PSGD's
    x_i, x_j <- (x_i + x_j) / 2. Refused requests cost a round trip and change nothing.

    A peer whose own exchange is under way answers one request per bucket before its
    answer comes, and refuses the others. Refusing them all (as AD-PSGD's locks do) left
    45% of the exchanges refused on 4 peers of a 2-core machine, every step starting one
    and a round trip lasting about a step (8% with the overlap; benchmarks/
    asynchronous_mixing.py, docs/results.md "Asynchronous mixing"). With the one overlap,
    j busy with k and asked by i: i ends with (x_i + x_j) / 2, k with (x_j + x_k) / 2, and
    j, its answer applied on top of the pool, with (x_i + x_k) / 2 (w alike): a doubly stochastic
    mix of the three, the sums exact, and every weight the mean of two positive ones, so no
    w can reach 0 (a second overlap, with l, could: w_j would end at
    (w_i + 2 w_l + 2 w_k - w_j) / 4).

    ``handled_from[j]``: requests of source j taken (answered, refused, or dropped as
    malformed), under ``cond``, notified after each: quiesce() and a view change wait on it.
    """

    def __init__(self, buckets: Any, *, rank: int, world_size: int,
                 cond: Any, lock: Any) -> None:
        self._cond = cond
        self._lock = lock
        self._pub = [adapter_for(b.flat).clone(b.flat) for b in buckets]
        self._delta = [b.new() for b in buckets]
        self._dirty = [False] * len(self._pub)
        self._w = [1.0] * len(self._pub)
        self._busy: int | None = None   # partner of the exchange this peer started
        # Per bucket: a request answered while this peer's own exchange is under way (at
        # most one each: see the class docstring).
        self._overlapped = [False] * len(self._pub)
        # Refuse every request until the training thread first publishes: the parameters
        # at attach may not be the model yet (the initial broadcast, a joiner's state).
        self._open = False
        self.handled_from = [0] * world_size
        self.answered = self.refused = 0            # requests of others
        self.completed = self.declined = 0          # this peer's own exchanges (per bucket)
        self.renumber(rank, world_size)

    def renumber(self, rank: int, world_size: int) -> None:
        """(No thread running.) A new view's ranks: the counts per source start again."""
        self.rank = rank
        with self._cond:
            self.handled_from = [0] * world_size

    # ------------------------------------------------------------------ weights
    def weights(self) -> list[float]:
        with self._lock:
            return list(self._w)

    def set_weights(self, weights: list[float]) -> None:
        """(A view change, a state received or sent.) The weights, atomically."""
        with self._lock:
            self._w = [float(w) for w in weights]

    def scale_weights(self, factor: float) -> None:
        with self._lock:
            self._w = [w * factor for w in self._w]

    # ------------------------------------------------------------------ training thread
    def sync(self, buckets: Any) -> None:
        """Add what exchanges changed since the last sync to the parameters (the optimizer's
        moves since then stay on top) and publish the result."""
        with self._lock:
            for k, b in enumerate(buckets):
                adapter = adapter_for(b.flat)
                if self._dirty[k]:
                    adapter.axpy(b.flat, 1.0, self._delta[k])
                    self._dirty[k] = False
                adapter.copy(self._pub[k], b.flat)
            self._open = True

    def close(self) -> None:
        """(A view change.) Refuse every request until the training thread publishes again:
        the switch's weights (scaled, a join's share given or taken) settle first."""
        with self._lock:
            self._open = False

    def reset(self, buckets: Any) -> None:
        """(A joiner that took a member's state.) Publish the parameters as they are, with
        nothing of earlier exchanges to add (none was answered before the first sync)."""
        with self._lock:
            for k, b in enumerate(buckets):
                adapter_for(b.flat).copy(self._pub[k], b.flat)
            self._dirty = [False] * len(self._pub)

    def begin(self, dst: int, out: list, number: int) -> None:
        """Copy the published pair into the request buffers ``out`` (model, then TAIL) as
        exchange ``number`` and mark this peer busy with ``dst``."""
        with self._lock:
            for k, o in enumerate(out):
                adapter_for(o).copy(o[:-TAIL], self._pub[k])
                o[-2] = number % SEQUENCE_MODULUS
                o[-1] = self._w[k]
            self._busy = dst
            self._overlapped = [False] * len(self._pub)

    def end(self) -> None:
        """This peer's exchange is over (answered, refused, or its partner failed)."""
        with self._lock:
            self._busy = None

    @property
    def busy(self) -> int | None:
        return self._busy

    # ------------------------------------------------------------------ the two threads
    def answer(self, k: int, request: Any) -> bool:
        """(Receiving thread.) Pool ``request`` (a model, its weight last) with bucket k and
        turn it into the answer in place; False, with the weight 0, if this peer has not
        published yet, or is busy with an exchange of its own and answered a request for
        bucket k since it began."""
        with self._lock:
            if not self._open or (self._busy is not None and self._overlapped[k]):
                request[-1] = 0
                self.refused += 1
                return False
            if self._busy is not None:
                self._overlapped[k] = True
            w_r = float(request[-1])
            pool = self._w[k] + w_r
            m = request[:-TAIL]
            adapter_for(m).lerp(m, self._pub[k], self._w[k] / pool)   # M
            request[-1] = pool / 2
            self._w[k] = pool - float(request[-1])
            self._moved(k, m, replace=True)
            self.answered += 1
            return True

    def apply(self, k: int, sent: Any, got: Any) -> bool:
        """(Pushing thread.) The answer ``got`` to request ``sent`` for bucket k; False if
        it was a refusal. ``got`` is used as scratch."""
        given = float(got[-1])
        if given == 0.0:
            self.declined += 1
            return False
        with self._lock:
            w_pub, w_sent = self._w[k], float(sent[-1])
            w_new = w_pub - w_sent + given
            if not w_new > 0:   # (a late answer after others' exchanges moved w away)
                self.declined += 1
                return False
            d, adapter = got[:-TAIL], adapter_for(got)
            # m_new - m_pub = (g M - w_sent m_sent + (w_pub - w_new) m_pub) / w_new
            adapter.scale(d, given / w_new)
            adapter.axpy(d, -w_sent / w_new, sent[:-TAIL])
            if w_pub != w_new:
                adapter.axpy(d, (w_pub - w_new) / w_new, self._pub[k])
            self._moved(k, d, replace=False)
            self._w[k] = w_new
            self.completed += 1
            return True

    def _moved(self, k: int, new: Any, *, replace: bool) -> None:
        """(Holding the lock.) The published model of bucket k becomes ``new`` (``replace``)
        or moves by ``new``; delta follows."""
        adapter, pub, delta = adapter_for(new), self._pub[k], self._delta[k]
        if replace:
            if self._dirty[k]:
                adapter.axpy(delta, 1.0, new)
            else:
                adapter.copy(delta, new)
            adapter.axpy(delta, -1.0, pub)
            adapter.copy(pub, new)
        else:
            if self._dirty[k]:
                adapter.axpy(delta, 1.0, new)
            else:
                adapter.copy(delta, new)
            adapter.axpy(pub, 1.0, new)
        self._dirty[k] = True

    def handled(self, src: int) -> None:
        with self._cond:
            self.handled_from[src] += 1
            self._cond.notify_all()
