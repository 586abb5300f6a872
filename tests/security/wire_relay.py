"""A recording TCP relay for tests: it sits between two peers, so a test sees exactly the bytes
that travel on the wire (what tcpdump would capture) and can act as a man in the middle.

    relay = Relay(("127.0.0.1", port_of_rank_0))   # listens on relay.endpoint
    ... make rank 1 connect to relay.endpoint instead of rank 0 ...
    relay.wire()  # every byte seen, both directions

In the client-to-server direction (a peer's DEALER to another's ROUTER) it also parses ZMTP 3
frames (the NULL mechanism's, i.e. without a cluster key), keeps copies of the first
``capture`` DATA messages, and with ``replay_every=k`` sends every k-th DATA message a second
time (up to ``max_replays``), at a frame boundary, so the duplicate arrives on the genuine
peer's own connection: a replay by a man in the middle.
"""
from __future__ import annotations

import socket
import threading

__all__ = ["Relay", "is_data"]

_GREETING = 64
_MORE, _LONG, _COMMAND = 0x01, 0x02, 0x04


def is_data(header: bytes) -> bool:
    """A gossip DATA header: a 13-field msgpack array, any version, kind 1."""
    return len(header) > 3 and header[0] == 0x9D and header[2] == 0x01


class Relay:
    def __init__(self, target: tuple[str, int], *, capture: int = 0, replay_every: int = 0,
                 max_replays: int = 0, record_limit: int = 64 << 20) -> None:
        self.target = target
        self.capture = capture
        self.replay_every = replay_every
        self.max_replays = max_replays
        self.record_limit = record_limit
        self.captured: list[list[bytes]] = []  # DATA messages, as their frames' bodies
        self.replayed = 0
        self.data_seen = 0
        self._recorded = bytearray()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.endpoint = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        self._start(self._accept)

    def _start(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True, name="test-relay")
        t.start()
        self._threads.append(t)

    def wire(self) -> bytes:
        with self._lock:
            return bytes(self._recorded)

    def _record(self, data: bytes) -> None:
        with self._lock:
            if len(self._recorded) < self.record_limit:
                self._recorded += data

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except (socket.timeout, OSError):
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.settimeout(0.1)
                self._socks.append(s)
            self._start(self._pump, client, server, True)
            self._start(self._pump, server, client, False)

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        buffer = bytearray()
        greeting = _GREETING  # bytes of it still to pass on
        message: list[bytes] = []   # raw frames of the message being read
        while not self._closing.is_set():
            try:
                data = src.recv(1 << 16)
            except socket.timeout:
                continue
            except OSError:
                break
            if not data:
                break
            self._record(data)
            try:
                if not upstream:
                    dst.sendall(data)
                    continue
                if greeting:
                    # libzmq sends the greeting in parts and waits for the other side's: pass
                    # it on as it comes.
                    head, data = data[:greeting], data[greeting:]
                    dst.sendall(head)
                    greeting -= len(head)
                buffer += data
                for frame, flags, body in _frames(buffer):
                    dst.sendall(frame)
                    if flags & _COMMAND:
                        continue
                    message.append((frame, body))
                    if not flags & _MORE:
                        self._on_message(message, dst)
                        message = []
            except OSError:
                break
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _on_message(self, message: list, dst: socket.socket) -> None:
        if not is_data(message[0][1]):
            return
        self.data_seen += 1
        if len(self.captured) < self.capture:
            self.captured.append([body for _, body in message])
        if (self.replay_every and self.replayed < self.max_replays
                and self.data_seen % self.replay_every == 0):
            dst.sendall(b"".join(frame for frame, _ in message))
            self.replayed += 1

    def close(self) -> None:
        self._closing.set()
        for t in self._threads:
            t.join(5)
        for s in self._socks:
            s.close()
        self._listener.close()


def _frames(buffer: bytearray):
    """Complete ZMTP frames at the head of ``buffer`` (consumed): (raw, flags, body)."""
    while len(buffer) >= 2:
        flags = buffer[0]
        if flags & _LONG:
            if len(buffer) < 9:
                return
            size, head = int.from_bytes(buffer[1:9], "big"), 9
        else:
            size, head = buffer[1], 2
        if len(buffer) < head + size:
            return
        raw = bytes(buffer[:head + size])
        del buffer[:head + size]
        yield raw, flags, raw[head:]
