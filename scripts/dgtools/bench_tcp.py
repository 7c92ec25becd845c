"""scripts/bench-tcp: the RC issue's targets against plain TCP in the same run on 127.0.0.1
(dgperf RC against --raw-tcp; iperf3 and sockperf TCP natively and preloaded on both ends); medians
of alternating trials and their ratio. Arguments: TRIALS LIB PORT0 (the shell entry point builds
and installs iperf3 and sockperf first)."""
import json, os, re, signal, statistics, subprocess, sys, time

DGPERF = "build/apps/dgperf"
HOST = "127.0.0.1"
port_n = [0]
live = []
LIB = PORT0 = None   # main()

class RunFailed(Exception):
    pass

def next_port():
    port_n[0] = (port_n[0] + 1) % 200
    return PORT0 + port_n[0]

def env(preload):
    e = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("DGSHIM_")}
    if preload:
        e["LD_PRELOAD"] = LIB
        e["DGSHIM_LOG"] = "info"   # the exit summary proves the connection was carried
    return e

def wait_listen(port, proc, name):
    pat = ":%04X " % port
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RunFailed("%s server exited at start (%d)" % (name, proc.returncode))
        for f in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(f) as fh:
                for line in fh.readlines()[1:]:
                    w = line.split()
                    if w[1].endswith(pat.strip()) and w[3] == "0A":
                        return
        time.sleep(0.02)
    raise RunFailed("%s server not listening on %d after 5 s" % (name, port))

def pair(name, srv_cmd, cli_cmd, preload, port, timeout=30):
    """Runs a server and a client; returns (client stdout, server stderr, client stderr)."""
    srv = subprocess.Popen(srv_cmd, env=env(preload), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    live.append(srv)
    try:
        wait_listen(port, srv, name)
        try:
            c = subprocess.run(cli_cmd, env=env(preload), stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RunFailed("%s client timed out after %d s" % (name, timeout))
        if c.returncode:
            raise RunFailed("%s client exited %d: %s" % (name, c.returncode, (c.stderr or c.stdout)[-400:]))
    finally:
        if srv.poll() is None:
            srv.send_signal(signal.SIGINT)
            try:
                srv.wait(timeout=3)
            except subprocess.TimeoutExpired:
                srv.kill()
        _, serr = srv.communicate()
        live.remove(srv)
    return c.stdout, serr, c.stderr

def carried(preload, *logs):
    """With the shim: both ends must report the connection carried over RC."""
    if not preload:
        return
    for log in logs:
        m = re.search(r"summary:.* rc_conns=(\d+) rc_plain=(\d+)", log)
        if not m or int(m[1]) < 1:
            raise RunFailed("a preloaded end did not carry its connection over RC:\n" + log[-400:])

def dgperf_lat(raw):
    port = next_port()
    args = (["--raw-tcp"] if raw else ["-c", "RC"]) + ["-t", "send_lat", "-s", "64", "-n", "20000", "--json", "-p", str(port)]
    out, _, _ = pair("dgperf", [DGPERF] + args, [DGPERF] + args + [HOST], False, port)
    for line in out.splitlines():
        if line.startswith("{"):
            j = json.loads(line)
            r = j["results"][0] if "results" in j else j
            return r.get("t_typical_us") or r.get("typical_us") or r["t_typical"]
    raise RunFailed("dgperf printed no JSON:\n" + out[-400:])

def iperf(preload):
    port = next_port()
    out, serr, cerr = pair("iperf3", ["iperf3", "-s", "-1", "-p", str(port), "-B", HOST],
                           ["iperf3", "-c", HOST, "-p", str(port), "-l", "64K", "-t", "4", "-J"], preload, port)
    carried(preload, serr, cerr)
    j = json.loads(out)
    return j["end"]["sum_received"]["bits_per_second"] / 1e9

def sockperf(preload, cpus):
    """cpus: (server CPU, client CPU). Pinned because the figure is bimodal otherwise: a
    wake-up on the other core of this VM costs ~10 us, on the same core ~1 us."""
    port = next_port()
    out, serr, cerr = pair("sockperf", ["taskset", "-c", str(cpus[0]), "sockperf", "server", "--tcp", "-i", HOST, "-p", str(port)],
                           ["taskset", "-c", str(cpus[1]), "sockperf", "ping-pong", "--tcp", "-i", HOST, "-p", str(port), "-m", "64", "-t", "3"],
                           preload, port)
    carried(preload, serr, cerr)
    m = re.search(r"percentile 50\.000 =\s*([\d.]+)", out)
    if not m:
        raise RunFailed("sockperf printed no median:\n" + out[-400:])
    return float(m[1])

ROWS = [
    ("RC send_lat 64 B, dgperf (us, typical)", lambda: dgperf_lat(True), lambda: dgperf_lat(False), "le", 1.3, "raw TCP"),
    ("stream throughput, iperf3 -l 64K (Gbit/s)", lambda: iperf(False), lambda: iperf(True), "ge", 0.70, "native"),
    ("sockperf TCP 64 B, one core (us, median half RTT)", lambda: sockperf(False, (0, 0)), lambda: sockperf(True, (0, 0)), None, None, "native"),
]


def main():
    global LIB, PORT0
    TRIALS, LIB, PORT0 = int(sys.argv[1]), os.path.abspath(sys.argv[2]), int(sys.argv[3])
    if os.cpu_count() and os.cpu_count() > 1:
        ROWS.append(("sockperf TCP 64 B, two cores (us, median half RTT)", lambda: sockperf(False, (0, 1)),
                     lambda: sockperf(True, (0, 1)), None, None, "native"))
    res = {r[0]: ([], []) for r in ROWS}
    failed = 0
    try:
        for t in range(TRIALS):
            for name, base, ours, _, _, _ in ROWS:
                order = [(0, base), (1, ours)] if t % 2 == 0 else [(1, ours), (0, base)]
                for i, fn in order:
                    try:
                        res[name][i].append(fn())
                    except RunFailed as e:
                        failed += 1
                        print("bench-tcp: %s: %s" % (name, e), file=sys.stderr, flush=True)
            print("bench-tcp: trial %d/%d done" % (t + 1, TRIALS), file=sys.stderr, flush=True)
    finally:
        for p in live:
            if p.poll() is None:
                p.kill()

    print("%-52s %12s %12s %8s  %s" % ("measurement (medians of %d trials)" % TRIALS, "baseline", "dgshim", "ratio", "target"))
    for name, _, _, cmp, target, basename in ROWS:
        b, o = res[name]
        if not b or not o:
            print("%-52s %12s %12s %8s  (runs failed)" % (name, "-", "-", "-"))
            continue
        mb, mo = statistics.median(b), statistics.median(o)
        ratio = mo / mb
        if cmp == "le":
            tgt = "<= %.2fx of %s: %s" % (target, basename, "met" if ratio <= target else "NOT met")
        elif cmp == "ge":
            tgt = ">= %.0f %% of %s: %s" % (target * 100, basename, "met" if ratio >= target else "NOT met")
        else:
            tgt = "(shown; vs %s)" % basename
        print("%-52s %12.2f %12.2f %7.2fx  %s" % (name, mb, mo, ratio, tgt))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
