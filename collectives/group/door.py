"""A member's door: where the other members and joining processes reach it about membership.

Every member (and every process asking to join) has one: a ROUTER socket in a ZeroMQ context
of its own (the transport of a view is replaced when the view changes; the door stays), read by
a thread of its own so a join is heard while the training loop computes. Messages are one-way
msgpack maps ``{"v", "kind", "job", "from", ...}`` where ``from`` is the sender's door: every
answer is a message to that door, so no request waits on a socket and a dead member is noticed
by the protocol's deadlines, never by a hang. ``tell(address, message)`` sends; handlers,
registered by kind, run in the door's thread.

Nothing is unpickled; every message is size-capped and must carry this door's job id, or it is
dropped (counted, logged once per sender). With a cluster key the door is a CURVE server and
its outgoing sockets CURVE clients, like the data sockets: only key holders can knock.
A door may also listen at a second address (``listen_also``): the lowest live member on the
rendezvous host takes the rendezvous address over, so a restarted process that starts the way
it started the first time finds the running job there.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

from collectives.config import TransportConfig
from collectives.rendezvous import bind_address
from collectives.security import ZapHandler
from collectives.transport.refusals import Refusals

__all__ = ["Door", "DOOR_VERSION", "MAX_DOOR_MESSAGE", "request"]

log = logging.getLogger("collectives")

DOOR_VERSION = 1
MAX_DOOR_MESSAGE = 1 << 20   # a view of many members fits; a state chunk never comes here
_POLL_MS = 100               # the thread looks at close() this often
_RETRY_BIND = 0.5            # seconds between tries to bind a wanted address


class Door:
    """One process's membership endpoint: ``address`` is where others reach it."""

    def __init__(self, config: TransportConfig, who: str) -> None:
        self.config = config
        self.who = who  # for log lines: "rank 3" or "joiner rank3#2"
        self._context = zmq.Context()
        self._router = self._context.socket(zmq.ROUTER)
        self._router.linger = 0
        self._router.maxmsgsize = MAX_DOOR_MESSAGE
        if config.key is not None:
            config.key.apply_server(self._router)
        # A joiner without the cluster key is refused in the handshake, before any message:
        # the monitor is how the members log it (as the data sockets' refusals.py does).
        self.refusals = Refusals(f"{who}'s door", self._router)
        self._zap = (ZapHandler(self._context, config.key, on_denied=self.refusals.zap_denied)
                     if config.key is not None else None)
        lo, hi = config.data_ports
        host = config.advertise_host or config.bind_host
        if host in ("0.0.0.0", "*"):
            host = "127.0.0.1"
        port = self._router.bind_to_random_port(f"tcp://{config.bind_host}", min_port=lo,
                                                max_port=hi + 1, max_tries=200)
        self.address = f"tcp://{host}:{port}"
        log.debug("%s: the membership door listens at %s", who, self.address)
        self._handlers: dict[str, Callable[[dict], None]] = {}
        self._requests: dict[str, Callable[[dict], dict]] = {}
        # A rendezvous registration (a restarted process starting as it did the first time)
        # reaching a door at the rendezvous address: answered on its own connection.
        self.on_registration: Callable[[dict], dict | None] | None = None
        self._tickers: list[Callable[[], None]] = []
        self._out: dict[str, zmq.Socket] = {}
        self._out_lock = threading.Lock()   # tell() runs in any thread; sockets are not shared
        self._also: list[str] = []          # addresses bound besides its own
        self._wanted: list[str] = []        # ... and those it tries to bind (door thread)
        self._next_try = 0.0
        # Called (door thread) with an address it wants but someone else holds: the holder
        # may be a restarted process's rendezvous, waiting for a group that is running.
        self.on_held: Callable[[str], None] | None = None
        self._closing = threading.Event()
        self.dropped = 0
        self._warned: set = set()
        self._thread = threading.Thread(target=self._serve, name=f"gossip door ({who})",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ receiving
    def on(self, kind: str, handler: Callable[[dict], None]) -> None:
        """Run ``handler(message)`` in the door's thread for every valid message of ``kind``."""
        self._handlers[kind] = handler

    def on_request(self, kind: str, handler: Callable[[dict], dict]) -> None:
        """Answer every valid message of ``kind`` with ``handler(message)`` on the connection it
        came on (door thread): a request and its reply (``request()``), for a client that
        has no door of its own (``gossip status``). A request of another job is answered
        with ``{"refused": why}``, naming this door's job."""
        self._requests[kind] = handler

    def every_poll(self, ticker: Callable[[], None]) -> None:
        """Run ``ticker()`` in the door's thread at least every 100 ms (protocol deadlines)."""
        self._tickers.append(ticker)

    def listen_also(self, address: str) -> None:
        """Listen at ``address`` too (the rendezvous address, once its first holder is gone).
        The door's thread binds it, trying again twice a second while someone else holds it
        (telling the holder through ``on_held``)."""
        with self._out_lock:
            if address not in self._wanted:
                self._wanted.append(address)
                self._next_try = 0.0

    @property
    def listening_also(self) -> list[str]:
        """The addresses bound besides the door's own."""
        return list(self._also)

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self.refusals.monitor, zmq.POLLIN)
        if self._zap is not None:
            poller.register(self._zap.socket, zmq.POLLIN)
        while not self._closing.is_set():
            self._bind_wanted()
            for ticker in self._tickers:
                try:
                    ticker()
                except Exception:
                    log.exception("%s: a door ticker failed", self.who)
            try:
                events = dict(poller.poll(_POLL_MS))
            except zmq.ZMQError:
                return
            if self._zap is not None and self._zap.socket in events:
                self._zap.handle()
            if self.refusals.monitor in events:
                self.refusals.on_events()
            self.refusals.tick()  # a summary due (throttled_log.py)
            if self._router not in events:
                continue
            while True:
                try:
                    frames = self._router.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                except zmq.ZMQError:
                    return
                self._dispatch(frames)

    def _bind_wanted(self) -> None:
        now = time.monotonic()
        if now < self._next_try:
            return
        with self._out_lock:
            wanted = [a for a in self._wanted if a not in self._also]
        for address in wanted:
            try:
                self._router.bind(bind_address(address))
                self._also.append(address)
                log.info("%s: the door now also listens at %s", self.who, address)
            except zmq.ZMQError as exc:
                self._next_try = now + _RETRY_BIND
                log.debug("%s: cannot listen at %s yet (%s)", self.who, address,
                          exc.strerror)
                if self.on_held is not None:
                    self.on_held(address)

    def _dispatch(self, frames: list) -> None:
        if len(frames) == 2 and self.on_registration is not None:
            registration = _registration(frames[1])
            if registration is not None:
                reply = self.on_registration(registration)
                if reply is not None:
                    self._router.send_multipart([frames[0], msgpack.packb(reply)],
                                                zmq.NOBLOCK)
                return
        message = self._decode(frames[-1]) if len(frames) == 2 else None
        if message is None:
            self._drop(f"a malformed message ({len(frames)} frames)")
            return
        request = self._requests.get(message["kind"])
        if request is not None:
            self._answer(frames[0], message, request)
            return
        if message.get("job", "") != self.config.job_id:
            theirs = message.get("job")
            reason = (f"this door belongs to job {_job_text(self.config.job_id)} and the message "
                      f"to job {_job_text(theirs)}")
            if self.config.job_id:
                reason += f" (to join this job, set GOSSIP_JOB_ID={self.config.job_id})"
            self._drop(f"a message of another job: {reason}", key=message.get("from"))
            if message.get("kind") == "join" and isinstance(theirs, str):
                # A joiner of another job hears why (in its own job's name, or its door
                # would drop the answer too).
                self._tell_as(theirs, message["from"], "refused", reason=reason)
            return
        kind = message.get("kind")
        handler = self._handlers.get(kind) if isinstance(kind, str) else None
        if handler is None:
            self._drop(f"a message of unknown kind {message.get('kind')!r}")
            return
        try:
            handler(message)
        except Exception:  # a handler's bug must not stop the door
            log.exception("%s: the door's %r handler failed", self.who, message.get("kind"))

    def _answer(self, identity: bytes, message: dict,
                handler: Callable[[dict], dict]) -> None:
        """Answer a request on its connection: ``handler``'s reply, or why it is refused."""
        if message.get("job", "") != self.config.job_id:
            reply: dict = {"refused": f"this door belongs to job "
                                      f"{_job_text(self.config.job_id)}, the request names job "
                                      f"{_job_text(message.get('job'))}"}
            self._drop(f"a {message['kind']} request of another job", key=message.get("from"))
        else:
            try:
                reply = handler(message)
            except Exception as exc:   # a handler's bug must not stop the door
                log.exception("%s: the door's %r request handler failed", self.who,
                              message["kind"])
                reply = {"error": f"{type(exc).__name__}: {exc}"}
        raw = msgpack.packb(dict(reply, v=DOOR_VERSION), use_bin_type=True, default=str)
        if len(raw) > MAX_DOOR_MESSAGE:
            raw = msgpack.packb({"v": DOOR_VERSION, "error": f"the answer ({len(raw)} bytes) "
                                 f"is over the door's {MAX_DOOR_MESSAGE} bytes"})
        try:
            self._router.send_multipart([identity, raw], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("%s: could not answer a %s request: %s", self.who, message["kind"], exc)

    @staticmethod
    def _decode(raw: bytes) -> dict | None:
        obj = _unpack(raw)
        if obj is None or obj.get("v") != DOOR_VERSION:
            return None
        if not isinstance(obj.get("from"), str) or not isinstance(obj.get("kind"), str):
            return None
        return obj

    def _drop(self, what: str, key: Any = None) -> None:
        self.dropped += 1
        key = key if isinstance(key, str) else what
        if key not in self._warned and len(self._warned) < 64:
            self._warned.add(key)
            log.warning("%s: the door dropped %s", self.who, what)

    # ------------------------------------------------------------------ sending
    def tell(self, address: str, kind: str, **fields: Any) -> bool:
        """Send ``{kind, fields}`` to the door at ``address`` (any thread). False if it could
        not even be queued (the door is closing, or the connection's queue is full): the
        protocol's deadlines handle a message that is lost after that."""
        return self._tell_as(self.config.job_id, address, kind, **fields)

    def _tell_as(self, job: str, address: str, kind: str, **fields: Any) -> bool:
        message = dict(fields, v=DOOR_VERSION, kind=kind, job=job, **{"from": self.address})
        raw = msgpack.packb(message, use_bin_type=True)
        with self._out_lock:
            if self._closing.is_set():
                return False
            sock = self._out.get(address)
            if sock is None:
                sock = self._context.socket(zmq.DEALER)
                sock.linger = 0
                sock.sndhwm = 1000
                if self.config.key is not None:
                    self.config.key.apply_client(sock)
                log.debug("%s: connecting to the door at %s (to tell %s)", self.who, address,
                          kind)
                sock.connect(address)
                self._out[address] = sock
            try:
                sock.send(raw, zmq.NOBLOCK)
                return True
            except zmq.ZMQError:
                return False

    def announce(self, address: str, message: dict) -> None:
        """Send ``message`` as-is (not a door message: a rendezvous answer) to ``address``
        from a short-lived socket, for a restarted rank 0's rendezvous (rendezvous.py)."""
        with self._out_lock:
            if self._closing.is_set():
                return
            sock = self._context.socket(zmq.DEALER)
        sock.linger = 200
        if self.config.key is not None:
            self.config.key.apply_client(sock)
        sock.connect(address)
        try:
            sock.send(msgpack.packb(dict(message, job=self.config.job_id), use_bin_type=True),
                      zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        finally:
            sock.close()

    def knock(self, address: str, timeout: float) -> bool:
        """Whether nothing listens at ``address`` (``tcp://host:port``; any thread): True when
        a connection to it is refused within ``timeout`` seconds, as it is at once on the port
        of a process that is gone. False when it connects (the handshake is let complete
        before the socket closes, so the door there counts no refused handshake), when
        nothing is heard in time (a stopped process's port still accepts; a host that is
        down answers nothing), or when this door closes meanwhile."""
        if not address.startswith("tcp://"):
            return False
        with self._out_lock:
            if self._closing.is_set():
                return False
            sock = self._context.socket(zmq.DEALER)
        monitor = None
        try:
            sock.linger = 0
            if self.config.key is not None:
                self.config.key.apply_client(sock)
            monitor = sock.get_monitor_socket(zmq.EVENT_CONNECT_RETRIED
                                              | zmq.EVENT_HANDSHAKE_SUCCEEDED
                                              | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                                              | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                              | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
            sock.connect(address)
            deadline = time.monotonic() + timeout
            while not self._closing.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if monitor.poll(min(_POLL_MS, max(1, int(left * 1000)))):
                    event = recv_monitor_message(monitor)["event"]
                    return event == zmq.EVENT_CONNECT_RETRIED
            return False
        finally:
            if monitor is not None:
                sock.disable_monitor()
                monitor.close(linger=0)
            sock.close(linger=0)

    def forget(self, address: str) -> None:
        """Close the connection to ``address`` (a member that left)."""
        with self._out_lock:
            sock = self._out.pop(address, None)
        if sock is not None:
            sock.close(linger=0)

    def close(self) -> None:
        """Stop the thread and close every socket (linger: what was told in the last moments
        may still leave, briefly)."""
        if self._closing.is_set():
            return
        with self._out_lock:
            self._closing.set()
            out, self._out = list(self._out.values()), {}
        self._thread.join(2.0)
        for sock in out:
            sock.close(linger=200)
        self.refusals.close()
        self._router.close(linger=0)
        if self._zap is not None:
            self._zap.close()
        self._context.term()


def request(config: TransportConfig, address: str, kind: str, timeout: float,
            **fields: Any) -> dict:
    """Ask the door at ``address`` (``tcp://host:port``) a ``kind`` request and return its
    answer, from a process without a door (a DEALER socket of its own, CURVE with
    ``config.key``, in job ``config.job_id``). Raises TimeoutError naming the address when
    no answer comes within ``timeout`` seconds (nothing listens there, another key, a
    member too busy to answer)."""
    context: zmq.Context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.maxmsgsize = MAX_DOOR_MESSAGE + 4096
    if config.key is not None:
        config.key.apply_client(sock)
    try:
        sock.connect(address)
        message = dict(fields, v=DOOR_VERSION, kind=kind, job=config.job_id,
                       **{"from": ""})
        sock.send(msgpack.packb(message, use_bin_type=True))
        if not sock.poll(max(0, int(timeout * 1000))):   # (negative: zmq's "for ever")
            raise TimeoutError(f"no answer from the door at {address} within {timeout:g} s "
                               f"(is a member of the job listening there, with this key?)")
        answer = _unpack(sock.recv())
        if answer is None:
            raise TimeoutError(f"the door at {address} answered something unreadable")
        return answer
    finally:
        sock.close(linger=0)


def _job_text(job: Any) -> str:
    """A job id as messages quote it: 'exp-7', or (unnamed)."""
    return repr(job) if job else "(unnamed)"


def _unpack(raw: bytes) -> dict | None:
    """A size-capped msgpack map off the wire, or None (never anything but plain values)."""
    if len(raw) > MAX_DOOR_MESSAGE:
        return None
    try:
        obj = msgpack.unpackb(raw, raw=False, strict_map_key=True,
                              max_bin_len=MAX_DOOR_MESSAGE, max_str_len=MAX_DOOR_MESSAGE)
    except Exception:
        return None
    return obj if isinstance(obj, dict) else None


def _registration(raw: bytes) -> dict | None:
    """A rendezvous registration (rendezvous.py's format), or None."""
    obj = _unpack(raw)
    if obj is not None and "kind" not in obj and type(obj.get("rank")) is int:
        return obj
    return None
