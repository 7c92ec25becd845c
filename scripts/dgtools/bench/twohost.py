"""scripts/bench section 6: two hosts (issue "Two hosts"). Two network namespaces joined by a
veth pair shaped to 10 Gbit/s each way with tc tbf (the bed of tests/twohost/netns.sh, made
here): UD against RC latency, Write-Record against RC Write bandwidth at 1 KB, 64 KB and 512 KB
with the CPU each spends per GB moved (user + sys of both processes, from wait4), plain UDP and
TCP the same way; and the shim against native for unmodified programs across the link: udpbench
(UDP ping-pong), sockperf (TCP ping-pong) and iperf3 (TCP stream), both ends preloaded and no
rules (discovery between hosts finds the peer)."""
import json, os, re, subprocess, time

from . import ctx
from .ctx import RunFailed, failed, log, med
from .procs import shim_env, ssum

A_IP, B_IP = "10.78.0.1", "10.78.0.2"   # apart from the tests' 10.77.0.x
RATE = "10gbit"

LAT = [  # key, label, dgperf args
    ("ud", "UD send/recv", ["-c", "UD", "-t", "send_lat"]),
    ("ud_wr", "UD Write-Record", ["-c", "UD", "-t", "wr_lat"]),
    ("rc", "RC send/recv", ["-c", "RC", "-t", "send_lat"]),
    ("rc_write", "RC Write", ["-c", "RC", "-t", "write_lat"]),
    ("raw_udp", "plain UDP", ["--raw-udp", "-t", "send_lat"]),
    ("raw_tcp", "plain TCP", ["--raw-tcp", "-t", "send_lat"]),
]
BW = [  # key, label, dgperf args (leading NAME=VALUE items: environment of both ends)
    ("ud_wr", "UD Write-Record, 1472-B datagrams", ["-c", "UD", "-t", "wr_bw"]),
    ("ud_wr_nogso", "UD Write-Record, 1472-B datagrams, no UDP GSO/GRO",
     ["DGSHIM_UDP_GSO=off", "-c", "UD", "-t", "wr_bw"]),
    ("ud_wr64", "UD Write-Record, 64 KB datagrams", ["-c", "UD", "-t", "wr_bw", "--seg", "65507"]),
    ("rc_write", "RC Write", ["-c", "RC", "-t", "write_bw"]),
    ("raw_udp", "plain UDP, 1472-B datagrams", ["--raw-udp", "-t", "send_bw", "--seg", "1472"]),
    ("raw_tcp", "plain TCP", ["--raw-tcp", "-t", "send_bw"]),
]
BW_SIZES = [1024, 65536, 524288]


class Bed:
    """Hosts a and b: namespaces joined by a veth pair, A_IP and B_IP, MTU 1500, tbf RATE each way."""

    def __init__(self):
        pid = os.getpid()
        self.ns = {"a": "dgbench-%d-a" % pid, "b": "dgbench-%d-b" % pid}
        self.dev = {"a": "dgb%da" % (pid % 1000000), "b": "dgb%db" % (pid % 1000000)}

    def sh(self, *cmd):
        r = subprocess.run(list(cmd), capture_output=True, text=True)
        if r.returncode:
            raise RunFailed("%s: %s" % (" ".join(cmd), r.stderr.strip()))

    def up(self):
        for h in "ab":
            self.sh("ip", "netns", "add", self.ns[h])
        self.sh("ip", "link", "add", self.dev["a"], "netns", self.ns["a"], "type", "veth", "peer", "name",
                self.dev["b"], "netns", self.ns["b"])
        for h, ip in (("a", A_IP), ("b", B_IP)):
            n = ["ip", "-n", self.ns[h]]
            self.sh(*n, "addr", "add", ip + "/24", "dev", self.dev[h])
            self.sh(*n, "link", "set", self.dev[h], "mtu", "1500", "up")
            self.sh(*n, "link", "set", "lo", "up")
            self.sh("tc", "-n", self.ns[h], "qdisc", "add", "dev", self.dev[h], "root", "tbf", "rate", RATE,
                    "burst", "1mb", "latency", "5ms")

    def down(self):
        for h in "ab":
            subprocess.run(["ip", "netns", "del", self.ns[h]], capture_output=True)

    def cmd(self, host, argv):
        return ["ip", "netns", "exec", self.ns[host]] + list(argv)


def _run_pair(bed, server, client, pre, timeout=120, server_exits=True):
    """server on host b, client on host a (argv lists), preloaded with the shim when pre. Returns
    (client output, server output, CPU seconds of both: user + sys from wait4). A server that
    does not end by itself (server_exits False) is ended with SIGINT once the client is done.
    Raises RunFailed."""
    clean = shim_env(False)
    shim = ["env"] + ["%s=%s" % kv for kv in sorted(shim_env(True).items()) if kv not in clean.items()] if pre else []
    err = os.path.join(ctx.TMP, "twohost-srv.log")
    with open(err, "w") as e:
        srv = subprocess.Popen(bed.cmd("b", shim + server), env=clean, stdin=subprocess.DEVNULL, stdout=e,
                               stderr=e)
    ctx.live.append(srv)
    time.sleep(0.3)
    out = os.path.join(ctx.TMP, "twohost-cli.log")
    with open(out, "w") as o:
        cli = subprocess.Popen(bed.cmd("a", shim + client), env=clean, stdin=subprocess.DEVNULL, stdout=o,
                               stderr=subprocess.STDOUT)
    ctx.live.append(cli)
    t_end = time.monotonic() + timeout
    cpu, codes = 0.0, {}
    for name, p in (("client", cli), ("server", srv)):
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                p.returncode = os.waitstatus_to_exitcode(status)
                codes[name] = p.returncode
                cpu += ru.ru_utime + ru.ru_stime
                break
            if time.monotonic() > t_end:
                p.kill()
                p.wait()
                codes[name] = "timeout"
                break
            time.sleep(0.02)
        if name == "client":
            if not server_exits and srv.poll() is None:
                srv.send_signal(2)
            t_end = min(t_end, time.monotonic() + 15)
        ctx.live.remove(p)
    text, stext = open(out).read(), open(err).read()
    if codes.get("client") != 0:
        raise RunFailed("%s: client exit %s: %s | server: %s" % (
            os.path.basename(client[0]), codes.get("client"), (text.strip().splitlines() or [""])[-1],
            (stext.strip().splitlines() or [""])[-1]))
    return text, stext, cpu


def _dgperf(bed, args):
    port = str(ctx.next_port())
    env = [a for a in args if a.startswith("DGSHIM_")]
    args = [a for a in args if not a.startswith("DGSHIM_")]
    base = (["env"] + env if env else []) + [ctx.PERF, "-p", port, "--detail"] + args
    text, _, cpu = _run_pair(bed, base, base + [B_IP], False)
    rows = [json.loads(l) for l in text.splitlines() if l.startswith("{")]
    if not rows:
        raise RunFailed("dgperf %s: no rows" % " ".join(args))
    return rows, cpu


def _udpbench(bed, pre, n):
    port = str(ctx.next_port())
    text, stext, _ = _run_pair(bed, [ctx.UDPBENCH, "server", port],
                               [ctx.UDPBENCH, "pingpong", B_IP, port, "-n", str(n), "--json"], pre,
                               server_exits=False)
    row = json.loads([l for l in text.splitlines() if l.startswith("{")][0])
    return row["median_us"], ssum(text, "tx_framed")


def _sockperf(bed, pre, secs):
    port = str(ctx.next_port())
    srv = ["sockperf", "sr", "--tcp", "-i", B_IP, "-p", port]
    cli = ["sockperf", "pp", "--tcp", "-i", B_IP, "-p", port, "-m", "64", "-t", str(secs)]
    text, _, _ = _run_pair(bed, srv, cli, pre, timeout=secs + 20, server_exits=False)
    m = re.search(r"<MEDIAN> observation =\s*([0-9.]+)", text) or re.search(r"avg-latency=([0-9.]+)", text)
    if not m:
        raise RunFailed("sockperf: no latency in its output")
    return float(m.group(1)), ssum(text, "rc_conns")


def _iperf3(bed, pre, secs):
    port = str(ctx.next_port())
    text, _, _ = _run_pair(bed, ["iperf3", "-s", "-1", "-p", port],
                           ["iperf3", "-c", B_IP, "-p", port, "-t", str(secs), "-J"], pre, timeout=secs + 30)
    j = json.loads(text[text.index("{"):text.rindex("}") + 1])
    return j["end"]["sum_received"]["bits_per_second"] / 8e6, ssum(text, "rc_conns")


def twohost():
    if os.geteuid() != 0:
        raise RunFailed("network namespaces need root")
    trials = ctx.A.trials or (1 if ctx.QUICK else 3)
    bed = Bed()
    try:
        bed.up()
    except RunFailed as e:
        bed.down()
        raise RunFailed("no two-host bed here: %s" % e)
    res = {"rate": RATE, "trials": trials, "lat": {}, "bw": {}, "cpu_gb": {}, "apps": {},
           "run": {"command": ctx.CMDLINE, "started": ctx.STARTED.strftime("%Y-%m-%d %H:%M"),
                   "git": ctx.machine()["git"], "load": open("/proc/loadavg").read().split()[:3]}}
    budget = (48 << 20) if ctx.QUICK else (256 << 20)
    try:
        for t in range(trials):
            for key, label, args in (LAT if t % 2 == 0 else LAT[::-1]):
                try:
                    rows, _ = _dgperf(bed, args + ["-s", "64", "-n", "300" if ctx.QUICK else "2000"])
                    res["lat"].setdefault(key, []).append(rows[0]["t_typical_us"])
                except RunFailed as e:
                    failed("twohost", str(e))
            for key, label, args in (BW if t % 2 == 0 else BW[::-1]):
                for s in BW_SIZES:
                    n = max(64, budget // s)
                    try:
                        rows, cpu = _dgperf(bed, args + ["-s", str(s), "-n", str(n)])
                    except RunFailed as e:
                        failed("twohost", str(e))
                        continue
                    r = rows[0]
                    moved = r.get("delivered_bytes") or r["bw_MBps"] * 1e6 * r.get("elapsed_s", 0)
                    res["bw"].setdefault(key, {}).setdefault(str(s), []).append(r["bw_MBps"])
                    if moved:
                        res["cpu_gb"].setdefault(key, {}).setdefault(str(s), []).append(cpu / (moved / 1e9))
            secs = 2 if ctx.QUICK else 5
            for side in (("native", False), ("shim", True)) if t % 2 == 0 else (("shim", True), ("native", False)):
                name, pre = side
                for app, fn, args in (("udpbench", _udpbench, (2000 if ctx.QUICK else 10000,)),
                                      ("sockperf_tcp", _sockperf, (secs,)),
                                      ("iperf3", _iperf3, (secs,))):
                    try:
                        v, carried = fn(bed, pre, *args)
                    except (RunFailed, ValueError, KeyError, IndexError) as e:
                        failed("twohost", "%s %s: %s" % (app, name, e))
                        continue
                    d = res["apps"].setdefault(app, {"native": [], "shim": [], "carried": []})
                    d[name].append(v)
                    if pre:
                        d["carried"].append(carried)
            log("twohost: trial %d/%d done" % (t + 1, trials))
    finally:
        bed.down()
    res["lat"] = {k: med(v) for k, v in res["lat"].items()}
    for kind in ("bw", "cpu_gb"):
        res[kind] = {k: {s: med(v) for s, v in d.items()} for k, d in res[kind].items()}
    for app, d in res["apps"].items():
        d["native"], d["shim"] = med(d["native"]), med(d["shim"])
        d["carried"] = min(d["carried"]) if d["carried"] else 0
    return res


def page_section(T, w, fmt, made):
    """The "Two hosts" part of results.md, written through w (one line per call)."""
    w("## 6. Two hosts: a 10 Gbit/s link between two network namespaces (issue \"Two hosts\")")
    w("")
    w("Two network namespaces joined by a veth pair, each direction shaped to %s with `tc tbf` "
      "(burst 1 MB, latency 5 ms), MTU 1500: every datagram crosses both hosts' IP stacks and the "
      "shaper, as between two machines on one switch; both run on this machine's two cores. "
      "dgperf busy-polls, so its CPU figures are the time both processes ran per GB moved (user + "
      "sys from wait4), i.e. what moving a GB costs with polling completions. Medians of %d trial(s)."
      % (T["rate"], T["trials"]))
    run = T.get("run")
    if run:
        w("")
        w("Measured by `%s` on %s UTC at commit `%s` (load average %s)." % (
            run["command"], run["started"], run["git"], " ".join(run["load"])))
    w("")
    w("| 64-byte ping-pong (dgperf, half round trip) | us |")
    w("|---|---:|")
    for key, label, _ in LAT:
        w("| %s | %s |" % (label, fmt(T["lat"].get(key))))
    w("")
    w("| bandwidth [MB/s] / CPU [s per GB] | " + " | ".join("%d KB" % (s // 1024) for s in BW_SIZES) + " |")
    w("|---|" + "---:|" * len(BW_SIZES))
    for key, label, _ in BW:
        cells = []
        for s in BW_SIZES:
            bw = T["bw"].get(key, {}).get(str(s))
            cg = T["cpu_gb"].get(key, {}).get(str(s))
            cells.append("%s / %s" % (fmt(bw, "", 0), fmt(cg)))
        w("| %s | %s |" % (label, " | ".join(cells)))
    w("")
    A = T["apps"]
    w("| unmodified program across the link | native | both ends preloaded | ratio | carried | target |")
    w("|---|---:|---:|---:|---|---|")
    rows = (("udpbench", "udpbench UDP ping-pong 64 B, median RTT [us]", "tx_framed", "<= 1.10x", False),
            ("sockperf_tcp", "sockperf TCP ping-pong 64 B, latency [us]", "rc_conns", "<= 1.15x", False),
            ("iperf3", "iperf3 TCP stream [MB/s]", "rc_conns", ">= 1.0x of native", True))
    for key, label, ck, target, higher in rows:
        d = A.get(key)
        if not d:
            w("| %s | - | - | - | - | %s |" % (label, target))
            continue
        ratio = d["shim"] / d["native"] if d["shim"] and d["native"] else None
        w("| %s | %s | %s | %s | %s=%s | %s |" % (label, fmt(d["native"]), fmt(d["shim"]),
                                               fmt(ratio, "x"), ck, d["carried"], target))
    w("")
    for name in ("twohost_bw.png", "twohost_cpu.png"):
        if name in made:
            w("![%s](img/%s)" % (name, name))
            w("")


def plots(T, save, plt):
    """The two figures of section 6: bandwidth and CPU per GB against message size."""
    for kind, ylabel, name in (("bw", "bandwidth [MB/s]", "twohost_bw.png"),
                               ("cpu_gb", "CPU of both processes [s per GB moved]", "twohost_cpu.png")):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        width = 0.8 / len(BW)
        for i, (key, label, _) in enumerate(BW):
            ys = [T[kind].get(key, {}).get(str(s)) or 0 for s in BW_SIZES]
            ax.bar([j + i * width for j in range(len(BW_SIZES))], ys, width, label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(BW_SIZES))])
        ax.set_xticklabels(["%d KB" % (s // 1024) for s in BW_SIZES])
        ax.set_ylabel(ylabel)
        ax.set_title("two hosts, %s tbf veth" % T["rate"])
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
        save(fig, name)
