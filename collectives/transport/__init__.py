"""Point-to-point messaging between peers: the sockets, the I/O loop that owns them, the wire
format, what arrives (validated, then delivered to the inbox) and the shared-memory path between
peers on one host. The algorithms above see only ``Transport``."""
from collectives.transport.transport import SendTicket, Transport

__all__ = ["Transport", "SendTicket"]
