"""Point-to-point messaging between peers: the sockets and their owner, the I/O loop, the wire
format, what arrives (validated, then dispatched by kind), liveness, the shared-memory protocol
between peers on one host, the inbox, and link emulation (a slow network on one machine). The
algorithms above see only ``Transport``."""
from collectives.transport.channels import Channel
from collectives.transport.emulation import LinkSpec, parse_link
from collectives.transport.link import SendTicket
from collectives.transport.transport import PeerCounters, Transport, host_id

__all__ = ["Transport", "SendTicket", "PeerCounters", "Channel", "host_id", "LinkSpec",
           "parse_link"]
