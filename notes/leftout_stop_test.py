import os, sys, signal, time, numpy as np
from gossip.testing import spawn, wait_until

def member(peer, workdir):
    from gossip.policies import Synchronous
    import logging
    h = logging.FileHandler(f"{workdir}/log{peer.rank}.txt"); h.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    for n in ("gossip", "collectives"):
        lg = logging.getLogger(n); lg.addHandler(h); lg.setLevel(logging.INFO)
    x = np.full(1000, float(peer.rank))
    policy = Synchronous(elastic=True).attach(peer, [x])
    name = peer.view.members[peer.rank].name
    out = []
    while policy.step < 100_000:
        if name == "rank3" and policy.step == 15 and not os.path.exists(f"{workdir}/pid"):
            open(f"{workdir}/pid", "w").write(str(os.getpid()))
            wait_until(lambda: os.path.exists(f"{workdir}/cont"), 60, what="cont")  # (we are stopped here anyway)
        if peer.world_size == 3 and peer.rank == 0 and not os.path.exists(f"{workdir}/reformed"):
            open(f"{workdir}/reformed", "w").close()
        if peer.world_size == 4 and peer.view.number >= 2 and policy.step >= 60:
            break
        x += 1.0
        try:
            policy.after_step()
        except Exception as exc:
            return ("error", name, repr(exc)[:400])
        np.ones((96, 96)) @ np.ones((96, 96))
    return (name, peer.world_size, peer.view.number, policy.step, float(x[0]), float(np.ptp(x)))

if __name__ == "__main__":
    import threading
    wd = sys.argv[1]; os.makedirs(wd, exist_ok=True)
    for f in ("pid", "cont", "reformed"):
        try: os.remove(f"{wd}/{f}")
        except FileNotFoundError: pass
    def driver():
        wait_until(lambda: os.path.exists(f"{wd}/pid"), 60, what="pid")
        pid = int(open(f"{wd}/pid").read())
        os.kill(pid, signal.SIGSTOP)
        t = time.time()
        wait_until(lambda: os.path.exists(f"{wd}/reformed"), 60, what="reformed")
        print("reformed after", round(time.time() - t, 2), flush=True)
        open(f"{wd}/cont", "w").close()
        os.kill(pid, signal.SIGCONT)
    th = threading.Thread(target=driver); th.start()
    r = spawn(member, n=4, timeout=120, peer_timeout=float(sys.argv[2]), args=(wd,))
    th.join()
    for x in r: print(x)
