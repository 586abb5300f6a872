"""The runtime's default times, in one place, each derived from the ones it depends on.

A user usually sets one number, the operation ``timeout``; the liveness times follow from it so
that a silent peer is reported as lost (``PeerLost``) before an operation waiting on it times
out. The other values are the transport's internal pacing: how often its I/O thread looks at
things it cannot be woken for. They are not settings; they live here so each is written once,
with its reason, and tests or benchmarks that need the same figure import it.

=======================  =========  ====================  ==================================
name                     value      derived from          why
=======================  =========  ====================  ==================================
TIMEOUT                  60 s       -                     every blocking call's deadline
heartbeat_timeout(t)     0.5-15 s   t/2, in [0.5, 15]     silent peer: PeerLost within t
heartbeat_interval(h)    0.1-1 s    h/4, in [0.1, 1]      4 pings per heartbeat timeout
DISCONNECT_GRACE         0.25 s     -                     a leaver's last messages land
PUMP_SLICE               10 ms      -                     socket-reading caller sees close()
PARK_MIN                 1 ms       -                     I/O thread's look, caller reading
PARK_MAX                 16 ms      PARK_MIN doubled      its longest; hand back at MAX/4
STARVED_REPEAT           50 ms      -                     STARVED at most this often
SLOT_RETRY               1 ms       -                     bound on a lost CREDIT
SUSPECT_POLL             50 ms      DISCONNECT_GRACE/5    lateness of declaring a suspect
IDLE_POLL                100 ms     -                     idle I/O thread looks at timers
MAX_LOGGED_DROPS         20         -                     drops logged one by one
DROP_SUMMARY_INTERVAL    10 s       -                     then one summary this often
RECONNECT_INTERVAL       200 ms     -                     libzmq reconnect to a peer
GOODBYE_LINGER           50 ms      -                     BYE leaves; dead peer can't hold
GOODBYE_FLUSH            0.5 s      -                     same, behind a window's data
CLOSE_TIMEOUT            1 s        -                     close() returns within
RING_MAPPED_SHARE        1/2        of close()'s timeout  wait for receivers to map rings
CLOSE_DRAIN_STALL        5 s        -                     Peer.close: a receiver taking none
DRAIN_LOOK               5 ms       -                     ... looked at this often
REACH_POLL_MAX           20 ms      -                     first connection: look for a loss
HELD_PAUSE               64 MiB     HELD_PER_LINK/4       then the sender is asked to wait
HELD_RESUME              32 MiB     HELD_PAUSE/2          and below it, to go on
HELD_PER_LINK            256 MiB    4 x a 64 MiB array    held for unstarted operations
SEND_WINDOW              32 MiB     see below             unacknowledged bytes per link
ACK_EVERY                8 MiB      SEND_WINDOW/4         receiver acknowledges this often
HELD_TOTAL               1 GiB      4 x HELD_PER_LINK     the same, all links together
HELD_OVERHEAD            2 KiB      measured 1.5 KiB      counted per held message
MAX_STRIKES              8          -                     bad messages before a link is cut
OPEN_HELD_TOTAL          64 MiB     -                     no key: held, all links together
OPEN_HELD_PER_LINK       32 MiB     OPEN_HELD_TOTAL/2     no key: held from one source
OPEN_HELD_PAUSE          8 MiB      OPEN_HELD_TOTAL/8     no key: pause one source, or all
OPEN_SEND_WINDOW         16 MiB     see below             no key: unacknowledged per link
RENDEZVOUS_CLIENT_GRACE  0.5 s      -                     past rank 0's time: its verdict
RENDEZVOUS_POLL          0.5 s      -                     rank 0 looks at its deadline
VERDICT_LINGER           5 s        -                     failed rank 0 tells late comers
LAUNCHER_GRACE           5 s        -                     polite signal, then SIGKILL
STATUS_WAIT              2 s        -                     a timed-out wait asks who is missing
LONG_WAIT                10 s       -                     a wait says once what it waits for
=======================  =========  ====================  ==================================

The held bound, derived (collectives/transport/flow_control.py). A receiver pauses a source
once it holds more than HELD_PAUSE from it, so at most HELD_PAUSE + one message M then; from
then on it acknowledges nothing to that source until it resumes it, and the source never has
more than max(SEND_WINDOW, ACK_EVERY + M) unacknowledged. So what it can hold from an honest
source is HELD_PAUSE + M + max(SEND_WINDOW, ACK_EVERY + M): 64 + 4 + 32 = 100 MiB with whole
messages of 4 MiB (whole_message_bytes), 200 MiB even for frames of 64 MiB (the ROUTER's
maxmsgsize), both under HELD_PER_LINK (256 MiB), and an honest sender is never cut. (An operation
that waits on a paused source resumes it, and each such resume may let one more window land:
the hard bound applies then.) SEND_WINDOW is 32 MiB: four times the two 4 MiB kernel buffers of
a connection (socket_buffer_bytes), so the sockets stay full while an ACK travels (measured: a
64 MiB p2p stream or allreduce over tcp as fast as without a window), and small against the
192 MiB between HELD_PAUSE and HELD_PER_LINK. ACK_EVERY = SEND_WINDOW/4 keeps three quarters of the
window in flight while an ACK is on its way, for one small message per 8 MiB read.

Without a cluster key anyone who reaches the port can send as a free rank, so what all senders
together can make a peer hold is bounded by OPEN_HELD_TOTAL (64 MiB), OPEN_HELD_PER_LINK (32
MiB) from one source, and the same flow control keeps honest senders inside it with smaller
figures (flow_control.HeldBounds): a source is paused past OPEN_HELD_PAUSE (8 MiB) of its own,
and every source that delivers is paused while the total passes OPEN_HELD_PAUSE; the window is
OPEN_SEND_WINDOW (16 MiB, ACKs every 4 MiB). From one honest source: 8 + M + max(16, 4 + M) =
28 MiB with whole 4 MiB messages, under 32; all together: 8 + M + k x 16 MiB for k sources
sending unstarted data at once, under 64 MiB for k <= 3 (an allreduce's ring has k = 1, a
neighbour exchange k = in-degree, a group of 4 at most 3). Past that, or for a source that
ignores HOLD, what comes is dropped: over the link's bound it is a strike ("over-bound"), over
the total only a drop ("over-total": a source inside its own bound is not blamed for the
others); and a source asked to wait that sends past its window is struck at once (no honest
one can: flow_control.py), so one that ignores HOLD is cut at about 8 + 16 MiB. The window is
half the keyed one: at 8 MiB a gossip round of 64 MiB over tcp took 9% longer (medians of 5,
4 peers on 2 busy cores), at 16 MiB it was within the noise of 32. With a key the bounds
above stay: only key holders can send.
"""
from __future__ import annotations

__all__ = [
    "TIMEOUT", "heartbeat_timeout", "heartbeat_interval", "DISCONNECT_GRACE", "PUMP_SLICE",
    "PARK_MIN", "PARK_MAX", "STARVED_REPEAT", "SLOT_RETRY", "SUSPECT_POLL", "IDLE_POLL",
    "MAX_LOGGED_DROPS", "DROP_SUMMARY_INTERVAL", "RECONNECT_INTERVAL", "GOODBYE_LINGER",
    "GOODBYE_FLUSH",
    "CLOSE_TIMEOUT", "RING_MAPPED_SHARE", "CLOSE_DRAIN_STALL", "DRAIN_LOOK", "REACH_POLL_MAX",
    "HELD_PAUSE", "HELD_RESUME", "HELD_PER_LINK", "HELD_TOTAL", "HELD_OVERHEAD", "MAX_STRIKES",
    "SEND_WINDOW", "ACK_EVERY", "OPEN_HELD_TOTAL", "OPEN_HELD_PER_LINK",
    "OPEN_HELD_PAUSE", "OPEN_SEND_WINDOW",
    "RENDEZVOUS_CLIENT_GRACE", "RENDEZVOUS_POLL", "VERDICT_LINGER", "LAUNCHER_GRACE",
    "STATUS_WAIT", "LONG_WAIT",
]

# Seconds any blocking wait may take before it raises (GOSSIP_TIMEOUT, init(timeout=)).
TIMEOUT = 60.0


def heartbeat_timeout(timeout: float) -> float:
    """Silence after which a connection drops: half the timeout, so a silent peer is PeerLost
    (not a timeout) within ``timeout``; at least 0.5 s (scheduling noise on a loaded host), at
    most 15 s (a dead machine is noticed in reasonable time even with long timeouts)."""
    return max(0.5, min(15.0, timeout / 2))


def heartbeat_interval(heartbeat_timeout: float) -> float:
    """ZMTP ping period: four pings per heartbeat timeout, so one late pong is no drop."""
    return max(0.1, min(1.0, heartbeat_timeout / 4))


# A dropped connection's peer is declared lost this long after the drop: what it sent before
# it went travels on its own connection and may be read after the monitor's event.
DISCONNECT_GRACE = 0.25
# How long a caller reading the ROUTER (leader/follower) keeps it per turn before it looks at
# close() again.
PUMP_SLICE = 0.01
# While a caller reads the ROUTER, the I/O thread looks for its return after PARK_MIN,
# doubling up to PARK_MAX while the caller keeps it (a long wait on a slow peer).
PARK_MIN = 0.001
PARK_MAX = 0.016
# Seconds between two STARVED messages while a shared-memory ring stays full.
STARVED_REPEAT = 0.05
# While a chunk waits for a free shared-memory slot, the I/O thread re-checks this often (a
# CREDIT lost to store/load reordering between the ring's two flags costs at most this).
SLOT_RETRY = 0.001
# The I/O thread's poll timeout while a suspect waits out DISCONNECT_GRACE, and when idle.
SUSPECT_POLL = DISCONNECT_GRACE / 5
IDLE_POLL = 0.1
# Drops are logged one by one up to MAX_LOGGED_DROPS, then summarised once per interval: a
# fuzzer or a flood must not turn into one log line per message.
MAX_LOGGED_DROPS = 20
DROP_SUMMARY_INTERVAL = 10.0
# libzmq's reconnect period on a dropped connection to a peer.
RECONNECT_INTERVAL = 0.2
# Linger of a DEALER at close: the goodbye gets out, a dead peer cannot hold us longer.
GOODBYE_LINGER = 0.05
# ... and behind data not yet acknowledged (a full window): time to get it and the goodbye out.
GOODBYE_FLUSH = 0.5
# close() of a transport or a communicator returns within about this many seconds.
CLOSE_TIMEOUT = 1.0
# Share of close()'s time spent waiting for receivers to map our rings (a receiver maps a ring
# through our /proc/<pid>/fd: what we left in it is gone if we exit first).
RING_MAPPED_SHARE = 0.5
# Peer.close() first waits for what it queued for live peers to leave (Transport.drain): a peer
# that takes none of it for this long is given up (it paused this one and does not read), and
# what is queued for it is dropped, with a warning. The drain looks at the queues this often.
CLOSE_DRAIN_STALL = 5.0
DRAIN_LOOK = 0.005
# A send waiting for the first connection to its peer (a millisecond on one host) is woken as
# the handshake succeeds, and looks for a loss or its deadline at least this often.
REACH_POLL_MAX = 0.02
# What a receiver holds for operations it has not started (payload bytes plus HELD_OVERHEAD per
# message), per sending link and in total: a peer one blocking collective
# ahead holds at most one operation's share, and four 64 MiB operations fit; beyond it a
# message is dropped ("over-bound") instead of growing the process without bound.
HELD_PER_LINK = 256 << 20
HELD_TOTAL = 4 * HELD_PER_LINK
# Flow control (collectives/transport/flow_control.py, Holds): past HELD_PAUSE from one source
# the receiver asks it to hold its sends, below HELD_RESUME to go on. The gap to HELD_PER_LINK
# is for what was in flight when it paused, which the send window bounds in bytes (the
# derivation is in the docstring above): libzmq's queues bound it only in messages, and 128
# whole 4 MiB messages are 512 MiB.
HELD_PAUSE = HELD_PER_LINK // 4
HELD_RESUME = HELD_PAUSE // 2
# The send window (collectives/transport/flow_control.py, Acks): bytes a link may have sent
# and not had acknowledged (payloads plus HELD_OVERHEAD per message, the held bound's units),
# and how often a receiver acknowledges what it read from a source.
SEND_WINDOW = 32 << 20
ACK_EVERY = SEND_WINDOW // 4
# Measured (tracemalloc): a held message's mailbox, deque, header and frame objects cost about
# 1.5 KiB besides its payload; counting 2 KiB keeps a flood of empty messages inside the bound.
HELD_OVERHEAD = 2048
# After this many malformed, foreign or over-bound messages on one connection, it is cut: its
# TCP (or ipc) connection is shut down (collectives/transport/offenders.py); a rank's identity
# cut so stays cut (all it sends from then on is dropped unread, and what it left in unstarted
# mailboxes is freed).
MAX_STRIKES = 8
# Without a cluster key (see the derivation above): what all senders together may make a peer
# hold for operations it has not started, from one source, when sources are asked to wait
# (one source past it, or every source while the total is past it), and the send window.
OPEN_HELD_TOTAL = 64 << 20
OPEN_HELD_PER_LINK = OPEN_HELD_TOTAL // 2
OPEN_HELD_PAUSE = OPEN_HELD_TOTAL // 8
OPEN_SEND_WINDOW = 16 << 20
# Rendezvous clients wait this much past rank 0's deadline (rank 0 tells each client how long
# it still waits), so rank 0's verdict (which ranks are missing) reaches them before their own;
# a client rank 0 never answers fails after its timeout plus this (issue: within timeout + 1 s).
# Rank 0 looks at its deadline every RENDEZVOUS_POLL.
RENDEZVOUS_CLIENT_GRACE = 0.5
RENDEZVOUS_POLL = 0.5
# A rank 0 that failed the rendezvous early (a world size, a setting or a rank that disagrees)
# answers the registrations still coming with its verdict for up to this long, or until every
# rank heard it: peers started a few seconds apart (imports, a launcher's stagger) learn the
# reason, not "no answer from the rendezvous" at their timeout.
VERDICT_LINGER = 5.0
# The launcher's seconds between the polite signal (SIGTERM/SIGINT) and SIGKILL.
LAUNCHER_GRACE = 5.0

# After a wait timed out, how long in all the peer asks along the chain of waiting peers which
# one is missing (each answer is one round trip to an I/O thread: milliseconds on one host), so
# an error is at most this late.
STATUS_WAIT = 2.0

# A wait (the rendezvous, a collective's wait for a peer, a join's admission, a view change's
# boundary, a state transfer) that lasts longer than this says once, at WARNING, what it waits
# for and how much of its timeout it spent (collectives/notices.py's LongWait): a missing rank
# is named long before the timeout (60 s by default) ends the wait. Shorter than the shortest
# timeout people set for real jobs (30 s), longer than any wait of a healthy step.
LONG_WAIT = 10.0
