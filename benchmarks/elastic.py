#!/usr/bin/env python3
"""How long a process that joins a running group takes to count: from its start to its first
step, split into start-up (Python and ``import gossip``), admission (the view change) and the
state transfer, against the point-to-point bandwidth measured in the same run.

Usage:
  python benchmarks/elastic.py [-n 4] [--sizes 4M,64M,256M] [--repeats 3] [--json rows.jsonl]
                               [--insecure]

``n - 1`` members train ``Synchronous`` on float32 parameters of each size (numpy: an
allreduce of the parameters per step, every step a few milliseconds apart); a new process
then joins with ``gossip.init(join=True)``. The joiner stamps: its start (first line of the
script), ``init()`` returned (admitted: it has a rank in the new view), its model built (the
user's part: ``np.full`` of the parameters, whose fresh pages fault in slowly on these VMs),
``attach()`` returned (it holds the state, verified by digest) and its first
``after_step()``. ``recv s`` is the state's own time (the joiner's receiver); ``step s`` the members' step
before the join (a view change waits for the next step boundary, so admission takes up to a
step or two). Before the join, rank
0 sends rank 1 the same bytes point to point (``peer.send``, 3 times, median): the bandwidth
the transfer is compared with. Medians over ``--repeats``. On this 2-core machine the
members and the joiner contend for the cores: compare within a run. The group and the joiner
hold a cluster key made for the run, as `gossip run`'s do (``--insecure``: none).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import numpy as np

from collectives.security import write_cluster_key
from gossip.testing import spawn, wait_until

JOINER = textwrap.dedent("""
    import time
    t0 = time.time()
    import json, sys, numpy as np
    import gossip
    from gossip.policies import Synchronous
    t_import = time.time()
    peer = gossip.init(join=True, timeout=120)
    t_admitted = time.time()
    # Initialised parameters, as a model's are (np.zeros' pages would fault in during the
    # transfer, at about 0.8 GB/s here, where the members' bandwidth runs over warm buffers).
    x = np.full(int(sys.argv[1]), 0.5, dtype=np.float32)
    t_built = time.time()
    policy = Synchronous().attach(peer, [x])
    t_state = time.time()
    policy.after_step()
    t_step = time.time()
    join = peer.stats()["join"]
    print("ROW", json.dumps({"start": t_import - t0, "admission": t_admitted - t_import,
                             "build": t_built - t_admitted, "transfer": t_state - t_built,
                             "first_step": t_step - t_state,
                             "total": t_step - t0, "view": peer.view.number,
                             "receive": join["receive_seconds"]}), flush=True)
    peer.close()
""")


def member(peer, workdir: str, count: int):
    from gossip.policies import Synchronous
    x = np.ones(count, dtype=np.float32)
    bandwidth = []
    if peer.world_size > 1:   # the point-to-point rate of these bytes, here and now
        buf = np.empty_like(x)
        for _ in range(5):   # the first one faults buf's pages in: the median is warm
            peer.barrier()
            t = time.perf_counter()
            if peer.rank == 0:
                peer.send(1, x)
                peer.recv(1, out=buf[:1])
            elif peer.rank == 1:
                peer.recv(0, out=buf)
                peer.send(0, buf[:1])
            bandwidth.append(x.nbytes / (time.perf_counter() - t))
    policy = Synchronous().attach(peer, [x])
    if peer.rank == 0:
        with open(os.path.join(workdir, "address.tmp"), "w") as f:
            f.write(peer.settings.rendezvous)
        os.replace(os.path.join(workdir, "address.tmp"), os.path.join(workdir, "address"))
    n0 = peer.world_size
    steps = []   # the members' step (an allreduce of the parameters): a view change waits for
    while peer.world_size == n0 and policy.step < 100_000:   # the next boundary
        t = time.perf_counter()
        policy.after_step()
        steps.append(time.perf_counter() - t)
        time.sleep(0.002)
    policy.after_step()   # the joiner's first step
    return (statistics.median(bandwidth) if bandwidth else 0.0,
            statistics.median(steps[:-1] or steps))


def run_once(n: int, nbytes: int, insecure: bool = False) -> dict:
    count = nbytes // 4
    workdir = tempfile.mkdtemp(prefix="gossip-elastic-")   # mode 0700: the key's home
    out: dict = {}
    key = None if insecure else write_cluster_key(os.path.join(workdir, "cluster.key")).path

    def joiner() -> None:
        address = wait_until(lambda: os.path.exists(os.path.join(workdir, "address"))
                             and open(os.path.join(workdir, "address")).read(), 300,
                             what="the members' address")
        script = os.path.join(workdir, "joiner.py")
        with open(script, "w") as f:
            f.write(JOINER)
        env = dict(os.environ, GOSSIP_RENDEZVOUS=address, GOSSIP_MEMBER_NAME="joiner",
                   **({"GOSSIP_KEY": key} if key else {"GOSSIP_KEY": "",
                                                      "GOSSIP_INSECURE": "1"}))
        proc = subprocess.run([sys.executable, script, str(count)],
                              capture_output=True, text=True, env=env, timeout=600)
        out["text"] = proc.stdout + proc.stderr

    thread = threading.Thread(target=joiner)
    thread.start()
    try:
        results = spawn(member, n=n - 1, timeout=900, args=(workdir, count),
                        peer_timeout=300, **({"key": key} if key else {"insecure": True}))
    finally:
        thread.join(600)
        shutil.rmtree(workdir, ignore_errors=True)   # the joiner's script, the key
    rows = [line[4:] for line in out.get("text", "").splitlines() if line.startswith("ROW ")]
    if not rows:
        raise RuntimeError(f"the joiner reported nothing:\n{out.get('text', '')[-3000:]}")
    row = json.loads(rows[0])
    row.update(bytes=nbytes, n=n, curve=key is not None, p2p_GBps=results[0][0] / 1e9,
               member_step=results[0][1],
               receive_GBps=nbytes / row["receive"] / 1e9 if row["receive"] > 0 else 0.0)
    row["receive_vs_p2p"] = row["receive_GBps"] / row["p2p_GBps"] if row["p2p_GBps"] else 0.0
    return row


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=4, help="group size after the join")
    parser.add_argument("--sizes", default="4M,64M,256M")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="append every row to this file")
    parser.add_argument("--insecure", action="store_true",
                        help="no cluster key (default: one made for each run)")
    args = parser.parse_args(argv)
    print(f"{'bytes':>10} {'start s':>8} {'admit s':>8} {'build s':>8} {'attach s':>8} "
          f"{'1st step s':>10} {'step s':>7} "
          f"{'total s':>8} {'recv s':>7} {'recv GB/s':>9} {'p2p GB/s':>9} {'ratio':>6}")
    for size in args.sizes.split(","):
        rows = [run_once(args.n, _size(size), args.insecure) for _ in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "view"}
        print(f"{size:>10} {med['start']:8.2f} {med['admission']:8.2f} {med['build']:8.2f} "
              f"{med['transfer']:8.2f} "
              f"{med['first_step']:10.3f} {med['member_step']:7.3f} {med['total']:8.2f} {med['receive']:7.2f} "
              f"{med['receive_GBps']:9.2f} {med['p2p_GBps']:9.2f} {med['receive_vs_p2p']:6.2f}",
              flush=True)
        if args.json:
            with open(args.json, "a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
