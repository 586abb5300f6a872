"""Point-to-point messaging between peers: the sockets and their owner (sockets.py, link.py),
the I/O loop (io_loop.py), the wire format and channel registry (wire.py), what arrives
(validated, then dispatched by kind: dispatch.py), liveness, the shared-memory protocol
between peers on one host (shm.py, shm_ring.py, shm_arena.py, cma.py, futex.py), the inbox,
flow control (flow_control.py), what a peer's operations are doing (activity.py), the errors
of a failed wait (wait_errors.py), counted and throttled logs of drops and refused handshakes
(throttled_log.py, refusals.py), and link emulation (a slow network on one machine). The
algorithms above see only ``Transport``."""
from collectives.transport.emulation import LinkSpec, parse_link
from collectives.transport.link import SendTicket
from collectives.transport.transport import PeerCounters, Transport, host_id
from collectives.transport.wire import Channel, channel_pair

__all__ = ["Transport", "SendTicket", "PeerCounters", "Channel", "channel_pair", "host_id",
           "LinkSpec", "parse_link"]
