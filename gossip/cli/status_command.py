"""`gossip status ADDRESS`: a live view of a running job (members, steps, what each runs now
and how long it has waited, who waits on whom, the straggler; stacks on request)."""
from __future__ import annotations

import argparse
import json
import sys
import time

__all__ = ["register", "main"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `status` subcommand to the `gossip` parser."""
    parser = subparsers.add_parser(
        "status",
        help="show a running job: members, steps, current operations, who waits on whom",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Ask a running job how it is, through the door at ADDRESS (the rendezvous\n"
            "address `gossip run` prints): each member's rank, name, host, pid, step,\n"
            "steps/s, bytes/s, the operation it runs now and how long it has waited in\n"
            "it, and the last consensus distance its policy measured; then which rank the\n"
            "others wait on (and where that rank is in its own code) and the straggler\n"
            "(the rank the others spent most time waiting on). Members answer from their\n"
            "door's thread: the job is not paused. A keyed job needs its key file (--key or\n"
            "GOSSIP_KEY) and a named job its id (--job or GOSSIP_JOB_ID)."),
    )
    parser.add_argument("address", help="the job's rendezvous address, host:port")
    parser.add_argument("--job", default=None,
                        help="the job id (default: GOSSIP_JOB_ID; `gossip run` prints it)")
    parser.add_argument("--key", default=None,
                        help="the job's cluster key file (default: GOSSIP_KEY)")
    parser.add_argument("--timeout", type=float, default=2.0,
                        help="seconds to wait for each member's answer (default 2)")
    parser.add_argument("--stacks", action="store_true",
                        help="also print every member's thread stacks")
    parser.add_argument("--json", action="store_true",
                        help="print the whole answer as JSON (for scripts)")
    parser.add_argument("--watch", type=float, nargs="?", const=2.0, default=None,
                        metavar="SECONDS",
                        help="refresh in place every SECONDS (default 2) until Ctrl-C")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Print the job's status (once, or refreshed with --watch); 1 if a member did not
    answer, 3 if the job could not be reached."""
    from gossip.status.job_status import job_status
    from gossip.status.render import render

    while True:
        try:
            job = job_status(args.address, job_id=args.job, key=args.key,
                             timeout=args.timeout, stacks=args.stacks)
        except (TimeoutError, RuntimeError) as exc:
            print(f"gossip status: {exc}", file=sys.stderr)
            if args.watch is None:
                return 3
            time.sleep(args.watch)
            continue
        if args.json:
            text = json.dumps(job.as_dict(), indent=1, default=str)
        else:
            text = render(job, stacks=args.stacks)
        if args.watch is None:
            print(text)
            return 1 if job.errors else 0
        sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")   # in place: home, clear, draw
        sys.stdout.flush()
        time.sleep(args.watch)
