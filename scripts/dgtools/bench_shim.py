"""scripts/bench-shim: the shim's overhead on unmodified UDP programs (sockperf, udpbench) on
127.0.0.1, natively and preloaded on both ends in the same run; medians of alternating trials and
the ratio preloaded/native against the targets. Arguments: TRIALS UDPBENCH LIB BUILD_OK (the shell
entry point builds, finds udpbench and installs sockperf first)."""
import json, os, re, shutil, signal, socket, statistics, subprocess, sys, tempfile, time

from . import runner

HOST = "127.0.0.1"
PP_N = 50000          # udpbench timed round trips per run
RCVBUF = 4 << 20      # stream servers' SO_RCVBUF (net.core.rmem_max is 4 MiB here)
STREAM_S = 3
TRIALS = UDPBENCH = LIB = BUILD_OK = SHIM = WHY = TMP = None   # setup()
T0 = time.monotonic()
live = []             # servers still running, killed on any exit


def setup(argv):
    """argv: TRIALS UDPBENCH LIB BUILD_OK (1 or 0), as the shell entry point passes them."""
    global TRIALS, UDPBENCH, LIB, BUILD_OK, SHIM, WHY, T0, TMP
    TRIALS, UDPBENCH, LIB = int(argv[0]), argv[1], os.path.abspath(argv[2])
    BUILD_OK = argv[3] == "1"
    SHIM = BUILD_OK and os.path.isfile(LIB)
    WHY = "" if SHIM else ("./scripts/build failed" if not BUILD_OK else LIB + " missing")
    T0 = time.monotonic()
    TMP = tempfile.mkdtemp(prefix="bench-shim.")
    runner.trap_term()
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SUMMARY = re.compile(r"dgshim\[\d+\]: info: summary:.*")

def cleanup():
    for p in live:
        if p.poll() is None:
            p.kill()
            p.wait()
    if TMP:
        shutil.rmtree(TMP, ignore_errors=True)


class RunFailed(Exception):
    pass

def free_port():
    """A UDP port the kernel just handed out (both ends bind 127.0.0.1 only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]

def env(preload, log=False):
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    e.pop("DGSHIM_LOG", None)
    if preload:
        e["LD_PRELOAD"] = LIB
        if log:
            e["DGSHIM_LOG"] = "info"
    return e

def port_bound(port):
    pat = ":%04X " % port
    for f in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(f) as fh:
                if any(pat in line.split(None, 2)[1] + " " for line in fh.readlines()[1:]):
                    return True
        except OSError:
            pass
    return False

class Server:
    def __init__(self, cmd, port, preload, ready, log=False):
        self.out = os.path.join(TMP, "srv.%d.out" % port)
        self.err = os.path.join(TMP, "srv.%d.err" % port)
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.p = subprocess.Popen(cmd, env=env(preload, log), stdin=subprocess.DEVNULL,
                                      stdout=o, stderr=e)
        live.append(self.p)
        self.name = cmd[0]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise RunFailed("%s server exited at start (%d): %s" % (self.name, self.p.returncode, self.text()[-300:].strip()))
            if ready in self.text() or port_bound(port):
                time.sleep(0.05)
                return
            time.sleep(0.02)
        print("  (warning: %s server on port %d not seen ready after 5 s; going on)" % (self.name, port), flush=True)

    def text(self):
        with open(self.out) as o, open(self.err) as e:
            return ANSI.sub("", o.read() + e.read())

    def stop(self):
        """SIGINT, so the server returns from main (exit summaries, sockperf's count)."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
                print("  (warning: %s server ignored SIGINT for 3 s; killed)" % self.name, flush=True)
        live.remove(self.p)
        return self.text()

def client(cmd, preload, timeout, log=False):
    try:
        r = subprocess.run(cmd, env=env(preload, log), stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RunFailed("%s timed out after %d s" % (" ".join(cmd), timeout))
    if r.returncode:
        raise RunFailed("%s exited %d: %s" % (" ".join(cmd), r.returncode, (r.stderr or r.stdout).strip()[-300:]))
    return ANSI.sub("", r.stdout), ANSI.sub("", r.stderr)

def grab(pattern, text, what):
    m = re.search(pattern, text)
    if not m:
        raise RunFailed("no %s in output:\n%s" % (what, text[-600:]))
    return m

# ---------------------------------------------------------------- the measurements
# Each returns a dict; "key" names the figure compared, the others are shown alongside.

def sockperf_pp(preload, size):
    port = free_port()
    srv = Server(["sockperf", "server", "-i", HOST, "-p", str(port)], port, preload, "block on socket")
    try:
        out, _ = client(["sockperf", "ping-pong", "-i", HOST, "-p", str(port), "-m", str(size), "-t", "3"],
                        preload, 20)
    finally:
        srv.stop()
    # sockperf: [Valid Duration] RunTime=2.550 sec; SentMessages=89051; ReceivedMessages=89051
    # sockperf: ====> avg-latency=14.269 (std-dev=30.731)
    # sockperf: ---> percentile 99.000 =   44.193      ... percentile 50.000 =   11.676
    # sockperf: ---> <MIN> observation =    3.349
    v = grab(r"\[Valid Duration\] RunTime=([\d.]+) sec; SentMessages=(\d+); ReceivedMessages=(\d+)", out, "Valid Duration")
    return {"p50": float(grab(r"percentile 50\.000 =\s*([\d.]+)", out, "percentile 50")[1]),
            "avg": float(grab(r"avg-latency=([\d.]+)", out, "avg-latency")[1]),
            "p99": float(grab(r"percentile 99\.000 =\s*([\d.]+)", out, "percentile 99")[1]),
            "min": float(grab(r"<MIN> observation =\s*([\d.]+)", out, "MIN")[1]),
            "n": int(v[3])}

def udpbench_pp(preload, size):
    port = free_port()
    srv = Server([UDPBENCH, "server", str(port), "-b", HOST], port, preload, "listening on")
    try:
        out, _ = client([UDPBENCH, "pingpong", HOST, str(port), "-s", str(size), "-n", str(PP_N), "--json"],
                        preload, 30)
    finally:
        srv.stop()
    j = json.loads(grab(r"\{.*\}", out, "JSON line")[0])
    return {"p50": j["median_us"], "avg": j["avg_us"], "p99": j["p99_us"], "min": j["min_us"], "n": j["n"]}

def udpbench_stream(preload, size=1316):
    port = free_port()
    srv = Server([UDPBENCH, "server", str(port), "-b", HOST, "-R", str(RCVBUF)], port, preload, "listening on")
    try:
        out, _ = client([UDPBENCH, "stream", HOST, str(port), "-s", str(size), "-t", str(STREAM_S), "--json"],
                        preload, STREAM_S + 30)
    finally:
        srv.stop()
    j = json.loads(grab(r"\{.*\}", out, "JSON line")[0])
    return {"rx": j["recv_rate"], "tx": j["send_rate"], "loss": j["loss_pct"]}

def sockperf_tp(preload, size=1316):
    port = free_port()
    srv = Server(["sockperf", "server", "-i", HOST, "-p", str(port), "--buffer-size", str(RCVBUF)],
                 port, preload, "block on socket")
    try:
        out, _ = client(["sockperf", "throughput", "-i", HOST, "-p", str(port), "-m", str(size), "-t", str(STREAM_S)],
                        preload, STREAM_S + 30)
    finally:
        text = srv.stop()
    # client: sockperf: Total of 896561 messages sent in 3.000 sec
    # server (on SIGINT): sockperf: Total 896561 messages received and handled
    m = grab(r"Total of (\d+) messages sent in ([\d.]+) sec", out, "messages sent")
    sent, secs = int(m[1]), float(m[2])
    got = int(grab(r"Total (\d+) messages received", text, "server's received count")[1])
    return {"rx": got / secs, "tx": sent / secs, "loss": 100.0 * (sent - got) / sent if sent else 0.0}

# name, function, args, figure compared, unit, higher is better, target ratio
KINDS = [
    ("sockperf ping-pong 64 B",   sockperf_pp,     (64,),   "p50", "us (half RTT)", False, 1.02),
    ("sockperf ping-pong 1316 B", sockperf_pp,     (1316,), "p50", "us (half RTT)", False, 1.02),
    ("udpbench pingpong 64 B",    udpbench_pp,     (64,),   "p50", "us (RTT)",      False, 1.02),
    ("udpbench pingpong 1316 B",  udpbench_pp,     (1316,), "p50", "us (RTT)",      False, 1.02),
    ("udpbench stream 1316 B",    udpbench_stream, (),      "rx",  "datagrams/s received", True, 0.95),
    ("sockperf throughput 1316 B", sockperf_tp,    (),      "rx",  "datagrams/s received", True, 0.95),
]

def framing_check():
    """One short preloaded exchange with DGSHIM_LOG=info; prints the server's exit summary."""
    port = free_port()
    srv = Server([UDPBENCH, "server", str(port), "-b", HOST, "-R", str(RCVBUF)], port, True, "listening on", log=True)
    cerr = ""
    try:
        _, e1 = client([UDPBENCH, "pingpong", HOST, str(port), "-n", "2000"], True, 30, log=True)
        _, e2 = client([UDPBENCH, "stream", HOST, str(port), "-t", "1"], True, 30, log=True)
        cerr = e1 + e2
    finally:
        text = srv.stop()
    lines = SUMMARY.findall(text)
    if not lines:
        print("  WARNING: no 'dgshim[PID]: info: summary:' line on the server's stderr", flush=True)
        return False
    print("  server: " + lines[-1], flush=True)
    cl = SUMMARY.findall(cerr)
    if cl:
        print("  client: " + cl[-1], flush=True)
    f = dict(re.findall(r"(\w+)=(\d+)", lines[-1]))
    if int(f.get("rx_framed", 0)) == 0 or int(f.get("tx_framed", 0)) == 0:
        print("  WARNING: the server's traffic was not framed (tx_framed/rx_framed = 0)", flush=True)
        return False
    return True

def main():
    print("# bench-shim: %d alternating trials, medians; %s; shim %s" %
          (TRIALS, time.strftime("%Y-%m-%d %H:%M"), LIB if SHIM else "NOT BUILT (%s): native half only" % WHY),
          flush=True)
    ok = True
    if SHIM:
        print("framing check (DGSHIM_LOG=info, udpbench pingpong + 1 s stream, both ends preloaded):", flush=True)
        try:
            ok = framing_check() and ok
        except RunFailed as e:
            print("  FAILED: %s" % e, flush=True)
            ok = False
    sides = ["native", "preloaded"] if SHIM else ["native"]
    res = {(k[0], s): [] for k in KINDS for s in sides}
    broken = {}
    for t in range(TRIALS):
        order = sides if t % 2 == 0 else sides[::-1]
        for name, fn, args, key, unit, _, _ in KINDS:
            for side in order:
                if (name, side) in broken:
                    continue
                try:
                    res[(name, side)].append(dict(fn(side == "preloaded", *args), trial=t))
                except RunFailed as e:
                    broken[(name, side)] = str(e)
                    print("  %s, %s: FAILED (not retried): %s" % (name, side, e), flush=True)
                    ok = False
        row = []
        for name, _, _, key, _, _, _ in KINDS:
            v = ["%.5g" % res[(name, s)][-1][key] if res[(name, s)] and res[(name, s)][-1]["trial"] == t else "-"
                 for s in sides]
            row.append("%s %s" % (name.replace("sockperf ", "sp ").replace("udpbench ", "ub ")
                                  .replace("ping-pong ", "pp ").replace("pingpong ", "pp ")
                                  .replace("throughput ", "tp "), "/".join(v)))
        print("trial %d/%d (%s, %.0f s): %s" % (t + 1, TRIALS, "/".join(sides), time.monotonic() - T0, "; ".join(row)), flush=True)

    med = lambda name, side, f: statistics.median(r[f] for r in res[(name, side)]) if res[(name, side)] else None
    fmt = lambda x, f: "-" if x is None else ("%.0f" % x if f in ("rx", "tx") else "%.3f" % x if f == "loss" else "%.2f" % x)
    print("\n%-27s %-21s %12s %12s  %s" % ("measurement", "figure", "native", "preloaded", "preloaded/native"))
    lines = []
    for name, _, _, key, unit, higher, target in KINDS:
        figs = [key] + (["avg", "p99", "min"] if key == "p50" else ["tx", "loss"])
        labels = {"p50": "median " + unit, "avg": "avg", "p99": "p99", "min": "min",
                  "rx": unit, "tx": "datagrams/s sent", "loss": "loss %"}
        for f in figs:
            n, p = med(name, "native", f), (med(name, "preloaded", f) if SHIM else None)
            r = "%.2f" % (p / n) if (n and p is not None and f != "loss") else ""
            print("%-27s %-21s %12s %12s  %s" % (name if f == key else "", labels[f], fmt(n, f), fmt(p, f), r))
        n, p = med(name, "native", key), (med(name, "preloaded", key) if SHIM else None)
        cmp = "<=" if not higher else ">="
        if n and p is not None:
            ratio = p / n
            good = ratio <= target if not higher else ratio >= target
            nat = {r["trial"]: r[key] for r in res[(name, "native")]}
            pairs = [r[key] / nat[r["trial"]] for r in res[(name, "preloaded")] if nat.get(r["trial"])] or [ratio]
            lines.append("%s: %s preloaded vs %s native -> ratio %.2f (target %s %.2f) %s; per-trial %.2f..%.2f" %
                         (name, fmt(p, key), fmt(n, key), ratio, cmp, target, "ok" if good else "MISSED",
                          min(pairs), max(pairs)))
        else:
            lines.append("%s: %s native; preloaded %s -> no ratio (target %s %.2f)" %
                         (name, fmt(n, key), "FAILED (see above)" if (name, "preloaded") in broken else "not run", cmp, target))
    print()
    for l in lines:
        print(l)
    print("\n# %.0f s in all" % (time.monotonic() - T0))
    if not SHIM:
        print("shim not built (%s)" % WHY)
        return 1
    return 0 if ok else 1


def run(argv):
    setup(argv)
    return runner.run(main, cleanup)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
