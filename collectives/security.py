"""CURVE encryption and authentication with libzmq's own mechanism, and the cluster key.

A *cluster key* is one CURVE key pair shared by every peer of a cluster (``gossip keygen``
writes it). Every server socket uses it as its server key and every client socket as its client
key; a ZAP handler admits only clients whose public key is the cluster's. Holding the public key
alone is not enough: the CURVE handshake makes the client prove it has the secret key, so a
process without the key file can neither connect, read nor inject.

Groups that our own tools start (``gossip run``, ``gossip.testing.spawn``, the demo) use a
``JobKey``: a fresh cluster key in a private temporary folder, made for the job and removed
when it ends. A process started under another launcher without a key is told so once
(``InsecureWarning``) unless GOSSIP_INSECURE=1 says the open group is meant.
"""
from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import zmq
from zmq.utils import z85

from collectives.errors import AuthenticationError

__all__ = ["ClusterKey", "write_cluster_key", "load_cluster_key", "JobKey", "InsecureWarning",
           "insecure_requested", "ZapHandler", "ZAP_ENDPOINT"]

log = logging.getLogger("collectives")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
_HEADER = "# gossip cluster key: every peer of the cluster needs this file; keep it secret.\n"


@dataclass(frozen=True)
class ClusterKey:
    """A cluster's CURVE key pair (z85-encoded, 40 bytes each) and the file it was read from;
    made by load_cluster_key (``gossip keygen`` or write_cluster_key writes the file). Its
    repr never shows the secret."""

    public: bytes  # z85, 40 bytes
    secret: bytes  # z85, 40 bytes
    path: str = ""

    def __repr__(self) -> str:  # never print the secret
        return f"ClusterKey(public={self.public.decode()!r}, path={self.path!r})"

    def apply_server(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE server with the cluster key pair; before it binds (libzmq reads the
        options then)."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True

    def apply_client(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE client that proves it holds the cluster key and expects the
        cluster's public key from the server; before it connects."""
        sock.curve_serverkey = self.public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


def _require_curve() -> None:
    if not zmq.has("curve"):
        raise AuthenticationError("this libzmq was built without CURVE support; install pyzmq "
                                  "from its wheels (they bundle libsodium) to use a cluster key")


def write_cluster_key(path: str | os.PathLike, *, overwrite: bool = False) -> ClusterKey:
    """Write a fresh cluster key to ``path`` (mode 0600) and return it."""
    _require_curve()
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; refusing to overwrite a cluster key "
                              "(peers holding the old key could no longer connect)")
    public, secret = zmq.curve_keypair()
    text = f"{_HEADER}public = {public.decode()}\nsecret = {secret.decode()}\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
    return ClusterKey(public, secret, str(path))


def load_cluster_key(path: str | os.PathLike) -> ClusterKey:
    """Read a cluster key written by write_cluster_key / ``gossip keygen``."""
    _require_curve()
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise AuthenticationError(f"cannot read cluster key {path}: {exc.strerror}") from None
    fields = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, _, value = line.partition("=")
            fields[name.strip()] = value.strip().encode()
    public, secret = fields.get("public", b""), fields.get("secret", b"")
    if len(public) != 40 or len(secret) != 40:
        raise AuthenticationError(f"{path} is not a gossip cluster key (expected 'public = ...' "
                                  "and 'secret = ...' lines of 40 z85 characters; make one "
                                  "with `gossip keygen PATH`)")
    try:
        derived = zmq.curve_public(secret)
    except zmq.ZMQError:
        derived = b""
    if derived != public:
        raise AuthenticationError(f"{path}: the public key does not belong to the secret key")
    mode = path.stat().st_mode
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning("cluster key %s is readable by other users; chmod 600 it", path)
    return ClusterKey(public, secret, str(path))


class InsecureWarning(UserWarning):
    """A group of several processes runs without a cluster key: anyone who can reach its
    ports can take a rank, read and inject data (GOSSIP_INSECURE=1 silences it)."""


def insecure_requested(env: Mapping[str, str] | None = None) -> bool:
    """GOSSIP_INSECURE is set to 1 (or true, yes, on): a group without a key is meant."""
    value = (os.environ if env is None else env).get("GOSSIP_INSECURE", "")
    return value.strip().lower() in ("1", "true", "yes", "on")


class JobKey:
    """A fresh cluster key for one job, in a private temporary folder (mode 0700, the key file
    0600), removed by ``close()`` or at the end of a ``with`` block; ``path`` is what the job's
    processes get as GOSSIP_KEY. A process killed before it closes leaves the folder (in
    the temporary directory, readable only by its user).

        with JobKey() as job_key:
            env["GOSSIP_KEY"] = job_key.path
    """

    def __init__(self, prefix: str = "gossip-key-") -> None:
        _require_curve()
        self.directory = tempfile.mkdtemp(prefix=prefix)   # mkdtemp: mode 0700, ours alone
        try:
            self.key = write_cluster_key(os.path.join(self.directory, "cluster.key"))
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    @property
    def path(self) -> str:
        """The key file's path."""
        return self.key.path

    def close(self) -> None:
        """Remove the folder and the key in it (idempotent)."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> "JobKey":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JobKey({self.path!r})"


class ZapHandler:
    """A ZAP (RFC 27) handler that admits CURVE clients holding the cluster key, and nobody
    else. It owns a REP socket bound at the context's ZAP endpoint; whoever owns the context's
    I/O loop polls ``socket`` and calls ``handle()``."""

    def __init__(self, context: zmq.Context, key: ClusterKey,
                 on_denied: Callable[[str, str], None] | None = None) -> None:
        self._allowed = z85.decode(key.public)
        # (mechanism, client address) of each denial: the owner logs it with the handshakes
        # libzmq refuses before ZAP is asked, throttled as one stream.
        self._on_denied = on_denied
        self.socket = context.socket(zmq.REP)
        self.socket.linger = 0
        self.socket.bind(ZAP_ENDPOINT)
        self.denied = 0
        self.admitted = 0

    def handle(self) -> None:
        """Answer every ZAP request waiting on ``socket``, without blocking: 200 for a CURVE client
        with the cluster's public key, 400 (logged, or reported to ``on_denied``) for anyone
        else, counted in ``admitted`` / ``denied``."""
        while True:
            try:
                request = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            version, request_id, _domain, address, _identity, mechanism = request[:6]
            credentials = request[6:]
            ok = (mechanism == b"CURVE" and len(credentials) == 1
                  and credentials[0] == self._allowed)
            if ok:
                self.admitted += 1
                reply = [version, request_id, b"200", b"OK", b"cluster", b""]
            else:
                self.denied += 1
                mech, client = mechanism.decode(errors="replace"), address.decode(errors="replace")
                if self._on_denied is not None:
                    self._on_denied(mech, client)
                else:
                    log.warning("refused a %s connection from %s: it does not hold the cluster "
                                "key", mech, client)
                reply = [version, request_id, b"400", b"not a cluster member", b"", b""]
            self.socket.send_multipart(reply)

    def close(self) -> None:
        """Close the REP socket; unanswered requests are dropped (linger 0)."""
        self.socket.close(linger=0)
