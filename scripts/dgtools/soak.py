"""./scripts/soak: UD, RD and RC traffic under injected loss, reordering and duplication, with
programs starting and stopping, for minutes to hours (issue "Hardening", item 8).

Long-lived preloaded servers (soakpeer.py: a UD echo server, an RD echo server, a TCP echo
server carried over RC) serve short-lived preloaded clients that start, check every byte they
get back, and stop; one client in ten is killed with SIGKILL mid-run instead. Beside them the
verbs-level dgstress runs RD and UD streams under the same faults, one pair after the other.
The run is cut into rounds; at the end of each round nothing new starts, the clients finish,
and the servers' resident memory and descriptor count are sampled at rest. Pass: every client
and every dgstress pair checked out (RD and RC: every byte exactly once and in order; UD:
nothing corrupt), the servers never saw a bad or out-of-order datagram, the UD/RD clients'
traffic was framed and the TCP clients' connections carried (their exit summaries), and the
servers' descriptors and memory at rest are flat: the last sample at most one descriptor and
max(4 MiB, 10 %) of memory above the sample after the first round (which fills pools).
Exit 0 on pass, 1 on a failure, 2 on a bad option.
"""
import argparse, itertools, json, os, random, re, signal, subprocess, sys, tempfile, time

from . import runner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER = os.path.join(ROOT, "scripts", "dgtools", "soakpeer.py")
SUMMARY = re.compile(r"dgshim\[\d+\]: info: summary:(.*)")
live = []
serial = itertools.count(1)


def summary(text):
    """The counters of the shim's exit summaries in text, summed."""
    out = {}
    for m in SUMMARY.findall(text):
        for k, v in re.findall(r"(\w+)=(\d+)", m):
            out[k] = out.get(k, 0) + int(v)
    return out


def proc_sample(pid):
    """(VmRSS in kB, open descriptors) of a live process."""
    rss = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return rss, len(os.listdir("/proc/%d/fd" % pid))


class Proc:
    def __init__(self, name, cmd, env, tmp):
        self.name = name
        self.log = os.path.join(tmp, "%s.%d.log" % (name, next(serial)))
        self.err = open(self.log, "w")
        self.p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=self.err, text=True)
        self.killed = False
        self.kill_at = None
        live.append(self)

    def done(self):
        return self.p.poll() is not None

    def finish(self, timeout=30):
        """(exit status, stdout, stderr) once the process ended (killed after timeout)."""
        try:
            out, _ = self.p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            out, _ = self.p.communicate()
        self.err.close()
        if self in live:
            live.remove(self)
        return self.p.returncode, out, open(self.log, errors="replace").read()


def main(argv):
    ap = argparse.ArgumentParser(prog="scripts/soak")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--seconds", type=float, help="overrides --minutes")
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "shim", "libdgshim.so"))
    ap.add_argument("--dgstress", default=os.path.join(ROOT, "build", "tests", "integration", "dgstress"))
    ap.add_argument("--port", type=int, default=25100)
    ap.add_argument("--fault", default="loss=1,reorder=1:3,dup=1")
    ap.add_argument("--clients", type=int, default=2, help="clients of each kind at a time")
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    secs = a.seconds if a.seconds else a.minutes * 60
    if secs < 20 or a.clients < 1:
        print("soak: run at least 20 seconds with at least one client per kind", file=sys.stderr)
        return 2
    for f in (a.lib, a.dgstress):
        if not os.path.exists(f):
            print("soak: %s is missing (build first: ./scripts/build)" % f, file=sys.stderr)
            return 1
    rnd = random.Random(a.seed)
    tmp = tempfile.mkdtemp(prefix="dgshim-soak.")
    base = {k: v for k, v in os.environ.items() if not k.startswith("DGSHIM_") and k != "LD_PRELOAD"}
    shim = dict(base, LD_PRELOAD=a.lib, DGSHIM_LOG="info", DGSHIM_CONF="/dev/null")
    # a sanitizer build (build-asan) needs its runtime first in the preload list; Python's
    # own leaks are not ours to judge
    ldd = subprocess.run(["ldd", a.lib], capture_output=True, text=True).stdout
    rt = [l.split()[2] for l in ldd.splitlines() if "libasan.so" in l and len(l.split()) > 2]
    if rt:
        shim.update(LD_PRELOAD=rt[0] + ":" + a.lib, ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0")
    # ThreadSanitizer's runtime right after the shim (docs/tsan.md): loaded only as the shim's
    # dependency it starts after the shim's constructor, and a provider thread made there (a
    # fault-injection setting opens the provider at start) crashed in TSan's thread entry
    tsan = [l.split()[2] for l in ldd.splitlines() if "libtsan.so" in l and len(l.split()) > 2]
    if tsan:
        shim.update(LD_PRELOAD=a.lib + ":" + tsan[0])
        rt = tsan
    fault = lambda: "%s,seed=%d" % (a.fault, rnd.randrange(1, 1 << 30))
    kinds = {  # name: (server env, client argv after PORT, port)
        "ud": (dict(shim, DGSHIM_MODE="ud"), "0", a.port),
        "rd": (dict(shim, DGSHIM_MODE="rd", SOAK_RELIABLE="1"), "1", a.port + 1),
        "rc": (dict(shim), None, a.port + 2),
    }
    failures = []
    res = {"seconds": secs, "fault": a.fault, "seed": a.seed, "rounds": [], "clients": {},
           "killed": 0, "dgstress": {"RD": 0, "UD": 0}}
    servers = {}
    for k, (env, _, port) in kinds.items():
        env = dict(env, DGSHIM_FAULT_RX=fault()) if k != "rc" else env
        role = "tcp-server" if k == "rc" else "udp-server"
        servers[k] = Proc("server-" + k, [sys.executable, PEER, role, str(port)], env, tmp)
    for k, s in servers.items():
        if s.p.stdout.readline().strip() != "ready":
            failures.append("%s server did not start: %s" % (k, s.finish(5)[2][-500:]))
    if failures:
        return report(res, failures, a, tmp)
    # the servers' "stat" lines would fill their pipes: a thread-free drain at every sample
    for s in servers.values():
        os.set_blocking(s.p.stdout.fileno(), False)

    clients = []  # (kind, Proc)
    stress = None
    sport = a.port + 10
    rounds = max(3, min(60, int(secs // 30)))
    t_round = secs / rounds
    counters = {k: {} for k in kinds}
    t0 = time.monotonic()
    print("soak: %d rounds of %.0f s, fault %s, seed %d, logs in %s" % (rounds, t_round, a.fault, a.seed, tmp),
          flush=True)

    def reap(wait):
        for c in list(clients):
            kind, p = c
            if not wait and not p.done():
                continue
            rc, out, err = p.finish()
            clients.remove(c)
            st = res["clients"].setdefault(kind, {"runs": 0, "failed": 0, "sent": 0, "echoed": 0, "lost": 0})
            st["runs"] += 1
            for key, v in summary(err).items():
                counters[kind][key] = counters[kind].get(key, 0) + v
            if p.killed:
                continue
            try:
                j = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                j = {}
            for key in ("sent", "echoed", "lost"):
                st[key] += j.get(key, 0)
            if rc != 0:
                st["failed"] += 1
                failures.append("%s client exit %d: %s" % (kind, rc, err.strip()[-400:]))

    def stress_step():
        nonlocal stress, sport
        if stress:
            if not all(p.done() for p in stress[1:]):
                return
            kind = stress[0]
            for p in stress[1:]:
                rc, out, err = p.finish()
                if rc != 0:
                    failures.append("dgstress %s %s exit %d: %s" % (kind, p.name, rc, (out + err).strip()[-400:]))
            res["dgstress"][kind] += 1
            stress = None
            return
        kind = rnd.choice(("RD", "RD", "UD"))
        sport = a.port + 10 + (sport - a.port - 9) % 50
        args = [a.dgstress, "-c", kind, "--fault", fault(), "-n", "300" if kind == "RD" else "200",
                "--seed", str(rnd.randrange(1, 1 << 30)), "-p", str(sport)]
        srv = Proc("dgstress-server", args + ["server"], base, tmp)
        time.sleep(0.2)
        cli = Proc("dgstress-client", args + ["client", "127.0.0.1"], base, tmp)
        stress = (kind, srv, cli)

    for r in range(rounds):
        t_end = t0 + (r + 1) * t_round
        while time.monotonic() < t_end - 3:
            reap(False)
            stress_step()
            for k, (env, rel, port) in kinds.items():
                while sum(1 for c in clients if c[0] == k) < a.clients:
                    life = rnd.uniform(0.5, min(6.0, t_round / 4))
                    seed = rnd.randrange(1, 1 << 31)
                    if k == "rc":
                        cmd = [sys.executable, PEER, "tcp-client", str(port), "%.2f" % life, str(seed)]
                        cenv = dict(shim)
                    else:
                        cmd = [sys.executable, PEER, "udp-client", str(port), rel, "%.2f" % life, str(seed)]
                        cenv = dict(shim, DGSHIM_MODE=k, DGSHIM_FAULT_RX=fault())
                    p = Proc("client-" + k, cmd, cenv, tmp)
                    if rnd.random() < 0.1:
                        p.killed = True
                        p.kill_at = time.monotonic() + rnd.uniform(0.2, life)
                        res["killed"] += 1
                    clients.append((k, p))
            now = time.monotonic()
            for k, p in clients:
                if p.killed and not p.done() and now >= p.kill_at:
                    p.p.kill()
            time.sleep(0.05)
        # at rest: the clients and the current dgstress pair finish, then the servers are sampled
        for k, p in clients:
            if p.killed and not p.done():
                p.p.kill()
        reap(True)
        while stress:
            stress_step()
            time.sleep(0.05)
        time.sleep(1.5)
        sample = {"t": round(time.monotonic() - t0, 1)}
        for k, s in servers.items():
            if s.done():
                failures.append("%s server died (exit %s): %s" % (k, s.p.returncode, s.finish(1)[2][-400:]))
                return report(res, failures, a, tmp)
            try:
                s.p.stdout.read()
            except (TypeError, OSError):
                pass
            sample[k] = proc_sample(s.p.pid)
        res["rounds"].append(sample)
        print("soak: round %d/%d at %.0f s: %s" % (r + 1, rounds, sample["t"], " ".join(
            "%s rss=%d kB fds=%d" % (k, sample[k][0], sample[k][1]) for k in servers)), flush=True)
        if failures:
            break

    for k, s in servers.items():
        s.p.send_signal(signal.SIGTERM)
        os.set_blocking(s.p.stdout.fileno(), True)
        rc, out, err = s.finish()
        final = [l for l in out.splitlines() if l.startswith("final ")]
        fin = json.loads(final[-1][6:]) if final else {}
        res.setdefault("servers", {})[k] = fin
        for key, v in summary(err).items():
            counters[k]["server_" + key] = v
        if rc != 0 or not final:
            failures.append("%s server exit %d (final %s): %s" % (k, rc, fin, err.strip()[-400:]))
        if k == "rd" and fin.get("order"):
            failures.append("RD server saw %d datagrams out of order or twice" % fin["order"])
    res["counters"] = counters
    for k in ("ud", "rd"):
        if not counters[k].get("tx_framed"):
            failures.append("%s clients sent nothing framed (summary: %s)" % (k, counters[k]))
    if not counters["rc"].get("rc_conns"):
        failures.append("TCP clients carried no connection over RC (summary: %s)" % counters["rc"])
    rs = res["rounds"]
    if rt:  # ASan's quarantine holds freed memory back: resident memory says nothing here
        print("soak: a sanitizer build: memory at rest is printed, not judged", flush=True)
    if len(rs) >= 2:
        first, last = rs[0], rs[-1]
        for k in servers:
            (r0, f0), (r1, f1) = first[k], last[k]
            if f1 > f0 + 1:
                failures.append("%s server descriptors grew at rest: %d -> %d" % (k, f0, f1))
            if r1 - r0 > max(4096, r0 // 10) and not rt:
                failures.append("%s server memory grew at rest: %d -> %d kB" % (k, r0, r1))
    return report(res, failures, a, tmp)


def report(res, failures, a, tmp):
    res["failures"] = failures
    res["passed"] = not failures
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    c = res.get("counters", {})
    print("soak: clients: " + ", ".join("%s %d runs (%d failed)" % (k, v["runs"], v["failed"])
                                       for k, v in sorted(res["clients"].items())) +
          "; %d killed mid-run; dgstress pairs RD %d, UD %d" % (res["killed"], res["dgstress"]["RD"], res["dgstress"]["UD"]))
    for k in ("ud", "rd", "rc"):
        if k in c:
            print("soak: %s counters: %s" % (k, " ".join("%s=%d" % kv for kv in sorted(c[k].items()) if kv[1])))
    if res["rounds"]:
        f, l = res["rounds"][0], res["rounds"][-1]
        for k in ("ud", "rd", "rc"):
            if k in f:
                print("soak: %s server at rest: rss %d -> %d kB, fds %d -> %d" % (k, f[k][0], l[k][0], f[k][1], l[k][1]))
    for m in failures[:10]:
        print("soak: FAIL " + m.replace("\n", "\n    "), flush=True)
    if len(failures) > 10:
        print("soak: ... and %d more failures (in the JSON and the logs)" % (len(failures) - 10))
    print("soak: %s (logs in %s)" % ("passed" if not failures else "FAILED", tmp), flush=True)
    return 0 if not failures else 1


def cleanup():
    for p in list(live):
        if not p.done():
            p.p.kill()
            p.p.wait()


if __name__ == "__main__":
    runner.trap_term()
    sys.exit(runner.run(lambda: main(sys.argv[1:]), cleanup))
