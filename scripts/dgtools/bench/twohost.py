"""scripts/bench section 6: two hosts (issue "Two hosts"). Two network namespaces joined by a
veth pair shaped to 10 Gbit/s each way with tc tbf (the bed of tests/twohost/netns.sh, made
here): UD against RC latency, Write-Record against RC Write bandwidth at 1 KB, 64 KB and 512 KB
with the CPU each spends per GB moved (user + sys of both processes, from wait4), plain UDP and
TCP the same way; and the shim against native for unmodified programs across the link: udpbench
(UDP ping-pong), sockperf (TCP ping-pong), iperf3 (TCP stream), VLC (UDP and HTTP, section 4's
case) and SIPp (-t un and -t tn, section 5's runner), both ends preloaded and no rules (discovery
between hosts finds the peer)."""
import hashlib, json, os, re, subprocess, time

from . import ctx
from .ctx import RunFailed, failed, log, med
from .procs import shim_env, ssum
from .sipp import response_times, sipp_run
from .vlc import make_media, roomy_rmem, vlc_case, vlc_dir

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
    ("ud_send", "UD Send/Recv, 1472-B datagrams", ["-c", "UD", "-t", "send_bw"]),
    ("rd_send", "RD Send/Recv, 1472-B datagrams", ["-c", "RD", "-t", "send_bw"]),
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


def _ends(bed):
    """(prefix, IP) of host b (servers, senders) and host a (clients, receivers), as procs.placed takes them."""
    return (bed.cmd("b", []), B_IP), (bed.cmd("a", []), A_IP)


def _again(what, fn):
    """fn() once, and again (3 runs at most) when it failed only because the shim's exit summaries
    show traffic not carried: a discovery answer from the other host later than a sender's lease or
    a connect's 10 ms wait (docs/shim.md) leaves that traffic plain, as tests/twohost/ retry. Returns
    (fn's result, the reasons of the runs before). Raises RunFailed with every run's reason."""
    why = []
    for _ in range(3):
        try:
            return fn(), why
        except RunFailed as e:
            why.append(str(e))
            if "not carried" not in str(e):
                break
    raise RunFailed("%s: %s" % (what, " | then: ".join(why)))


def _vlc(bed, vdir, media, md5, proto, pre):
    """VLC across the link (vlc.vlc_case): the sender (HTTP: the server) on host b, the receiver on
    host a. Returns the figures kept; a dump that is not the media byte for byte is a RunFailed."""
    b, a = _ends(bed)
    size = os.path.getsize(media)
    r, why = _again("VLC %s %s" % (proto, "shim" if pre else "native"),
                    lambda: vlc_case(vdir, media, proto, pre, [2 << 20, size], {"send": b, "recv": a}))
    if r["md5"] != md5:
        raise RunFailed("VLC %s %s: the dump (%d of %d bytes, md5 %s) is not the media (md5 %s)" % (
            proto, "shim" if pre else "native", r["bytes"], size, r["md5"], md5))
    return {"t_2m": r["t"][str(2 << 20)], "t_all": r["t"][str(size)], "bytes": r["bytes"],
            "cpu_send": r["cpu"].get("send"), "cpu_recv": r["cpu"].get("recv"), "counters": r["counters"],
            "retried": why}


def _sipp(bed, proto, pre, calls, rate, hold):
    """SIPp across the link (sipp.sipp_run with a message trace): the UAS (-t u1 / t1) on host b, the
    UAC (-t un / tn, one socket per call) on host a. Returns the figures kept."""
    b, a = _ends(bed)
    r, why = _again("SIPp %s %s" % (proto, "shim" if pre else "native"),
                    lambda: sipp_run(proto, pre, calls, rate, hold, trace=True, where={"uas": b, "uac": a}))
    if not r["msglog"]:
        raise RunFailed("SIPp %s: no -trace_msg log" % proto)
    rt = response_times(r["msglog"])
    if len(rt["bye_ok"]) < calls * 0.9:
        raise RunFailed("SIPp %s: only %d of %d calls' BYE response times in the message log" % (
            proto, len(rt["bye_ok"]), calls))
    return {"ok": r["uac"]["ok"], "failed": r["uac"]["failed"], "retrans": r["uac"]["retrans"],
            "bye_ok": med(rt["bye_ok"]), "counters": r["counters"],
            "retried": why}


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
    res = {"rate": RATE, "trials": trials, "lat": {}, "bw": {}, "cpu_gb": {}, "apps": {}, "progs": {}, "errors": [],
           "run": {"command": ctx.CMDLINE, "started": ctx.STARTED.strftime("%Y-%m-%d %H:%M"),
                   "git": ctx.machine()["git"], "load": open("/proc/loadavg").read().split()[:3]}}
    budget = (48 << 20) if ctx.QUICK else (256 << 20)
    try:
        progs = _progs_setup(res)
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
                        rows, _ = _dgperf(bed, args + ["--event", "-s", str(s), "-n", str(n)])
                    except RunFailed as e:
                        failed("twohost", str(e))
                        continue
                    r = rows[0]
                    moved = r.get("delivered_bytes") or r["bw_MBps"] * 1e6 * r.get("elapsed_s", 0)
                    res["bw"].setdefault(key, {}).setdefault(str(s), []).append(r["bw_MBps"])
                    # the phase's CPU as each dgperf measured it (START to the server's report),
                    # not the processes' whole lives (set-up, connection, exit)
                    phase_cpu = (r.get("cpu_client_s") or 0) + (r.get("cpu_server_s") or 0)
                    if moved and phase_cpu:
                        res["cpu_gb"].setdefault(key, {}).setdefault(str(s), []).append(phase_cpu / (moved / 1e9))
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
            _progs_trial(bed, res, progs, t)
            log("twohost: trial %d/%d done" % (t + 1, trials))
    finally:
        bed.down()
    res["lat"] = {k: med(v) for k, v in res["lat"].items()}
    for kind in ("bw", "cpu_gb"):
        res[kind] = {k: {s: med(v) for s, v in d.items()} for k, d in res[kind].items()}
    for app, d in res["apps"].items():
        d["native"], d["shim"] = med(d["native"]), med(d["shim"])
        d["carried"] = min(d["carried"]) if d["carried"] else 0
    _progs_med(res)
    return res


# VLC and SIPp across the link: key, label, kind, protocol
PROGS = [("vlc_udp", "VLC UDP", "vlc", "udp"), ("vlc_http", "VLC HTTP over TCP", "vlc", "http"),
         ("sipp_un", "SIPp -t un (UDP, one socket per call)", "sipp", "udp"),
         ("sipp_tn", "SIPp -t tn (TCP, one connection per call)", "sipp", "tcp")]


def _progs_setup(res):
    """The media for the VLC rows (section 4's 4-s MPEG-TS, 3.7 MiB, fed at once) and the SIPp load:
    quick 200 calls at 100/s held 0.5 s, full 1000 at 200/s held 1 s. Returns the plan."""
    sp = (200, 100, 500) if ctx.QUICK else (1000, 200, 1000)
    res["sipp_plan"] = {"calls": sp[0], "rate": sp[1], "hold_ms": sp[2]}
    plan = {"sipp": sp, "vdir": None}
    try:
        if os.getuid() != 0:
            raise RunFailed("VLC runs as nobody through setpriv: run the bench as root")
        plan["vdir"] = vlc_dir("twohost-vlc")
        plan["media"] = make_media(plan["vdir"], 4)
        plan["md5"] = hashlib.md5(open(plan["media"], "rb").read()).hexdigest()
        res["vlc_size"] = os.path.getsize(plan["media"])
        roomy_rmem()
    except (RunFailed, OSError) as e:
        plan["vdir"] = None
        res["errors"].append("VLC rows not run: %s" % e)
        failed("twohost", "VLC rows not run: %s" % e)
    return plan


def _progs_trial(bed, res, plan, t):
    """One trial of the VLC and SIPp rows, native and shim in alternating order."""
    sides = (("native", False), ("shim", True))
    for key, label, kind, proto in PROGS:
        if kind == "vlc" and not plan["vdir"]:
            continue
        for name, pre in (sides if t % 2 == 0 else sides[::-1]):
            try:
                if kind == "vlc":
                    r = _vlc(bed, plan["vdir"], plan["media"], plan["md5"], proto, pre)
                else:
                    r = _sipp(bed, proto, pre, *plan["sipp"])
            except (RunFailed, OSError, ValueError, KeyError, IndexError) as e:
                msg = "%s %s: %s" % (label, name, e)
                res["errors"].append(msg)
                failed("twohost", msg)
                continue
            for why in r.pop("retried"):
                res["errors"].append("%s %s: run again after: %s" % (label, name, why))
            res["progs"].setdefault(key, {"native": [], "shim": []})[name].append(r)


def _progs_med(res):
    """Per row and side: medians of the figures over the trials, the runs that worked, the counters
    added over the runs."""
    for key, d in res["progs"].items():
        for side, runs in list(d.items()):
            m = {"runs": len(runs)}
            for f in ("t_2m", "t_all", "cpu_send", "cpu_recv", "bye_ok", "bytes"):
                if runs and f in runs[0]:
                    m[f] = med([r[f] for r in runs])
            for f in ("ok", "failed", "retrans"):
                if runs and f in runs[0]:
                    m[f] = sum(r[f] for r in runs)
            m["counters"] = {}
            for r in runs:
                for who, c in r["counters"].items():
                    for k, v in c.items():
                        m["counters"].setdefault(who, {}).setdefault(k, 0)
                        m["counters"][who][k] += v
            d[side] = m


def item5(T):
    """Issue 14 item 5 across the link: (target, ours, met) for the summary, or None."""
    s = str(BW_SIZES[-1])
    bw = {k: T["bw"].get(k, {}).get(s) for k in ("ud_wr", "rc_write")}  # medians already
    cg = {k: T["cpu_gb"].get(k, {}).get(s) for k in ("ud_wr", "rc_write")}
    if not all(bw.values()) or not all(cg.values()):
        return None
    rb, rc = bw["ud_wr"] / bw["rc_write"], cg["ud_wr"] / cg["rc_write"]
    return ("UD Write-Record 512 KB in MTU-sized datagrams across the 10 Gbit/s link: at least 0.95x RC "
            "Write's bandwidth at no more CPU per GB (issue 14 item 5; stretch: half)",
            "%.2fx the bandwidth (%.0f vs %.0f MB/s) at %.2fx the CPU per GB (%.2f vs %.2f s)"
            % (rb, bw["ud_wr"], bw["rc_write"], rc, cg["ud_wr"], cg["rc_write"]),
            rb >= 0.95 and rc <= 1.0)


def page_section(T, w, fmt, made):
    """The "Two hosts" part of results.md, written through w (one line per call)."""
    w("## 6. Two hosts: a 10 Gbit/s link between two network namespaces (issue \"Two hosts\")")
    w("")
    w("Two network namespaces joined by a veth pair, each direction shaped to %s with `tc tbf` "
      "(burst 1 MB, latency 5 ms), MTU 1500: every datagram crosses both hosts' IP stacks and the "
      "shaper, as between two machines on one switch; both run on this machine's two cores. "
      "The bandwidth runs use `dgperf --event` (completions and socket readiness are waited for, "
      "not busy-polled; perftest's -e), so the CPU figure is the work of moving the bytes: the CPU "
      "time of both processes, every thread, from the phase's start to the server's report "
      "(dgperf's `cpu_client_s` + `cpu_server_s`), per GB delivered. The latency rows busy-poll. "
      "Medians of %d trial(s)." % (T["rate"], T["trials"]))
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
    _progs_page(T, w, fmt)
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


def _progs_page(T, w, fmt):
    """The VLC and SIPp rows of section 6 (absent from runs before they existed)."""
    P = T.get("progs")
    if P is None:
        return
    sp = T.get("sipp_plan", {})
    w("")
    w("VLC and SIPp across the link, both ends preloaded against both native in the same trials, no "
      "rules. VLC: section 4's case (4-s MPEG-TS, %s bytes, written to the sender at once), the sender "
      "(HTTP: VLC's http output) on host b, the receiving VLC on host a dumping what it gets; every dump "
      "must be the media byte for byte (md5), else the run is a failure below. CPU: user + sys of the "
      "sending and the receiving VLC (wait4). SIPp: section 5's runner, the UAS on host b, the UAC on "
      "host a, %s calls at %s calls/s held %s ms, with a message trace; every call must succeed. The "
      "kernel's socket memory is not sampled across hosts (one slab for both; section 5 measures "
      "memory). Carried: the shim's exit summaries added over the trials (sender/UAC first)."
      % (fmt(T.get("vlc_size"), "", 0), sp.get("calls", "?"), sp.get("rate", "?"), sp.get("hold_ms", "?")))
    w("")
    w("| program across the link | figure | native | both ends preloaded | ratio | carried (shim) |")
    w("|---|---|---:|---:|---:|---|")
    n = T.get("trials", 0)
    for key, label, kind, proto in PROGS:
        d = P.get(key) or {}
        nat, shim = d.get("native") or {}, d.get("shim") or {}
        c = shim.get("counters") or {}
        ck = {"udp": ("tx_framed", "tx_plain", "rx_framed"), "tcp": ("rc_conns", "rc_plain")}[
            "udp" if proto == "udp" else "tcp"]
        ends = (("sender", "send", ck[:2]), ("receiver", "recv", ck[2:])) if kind == "vlc" and proto == "udp" else \
            (("sender", "send", ck), ("receiver", "recv", ck)) if kind == "vlc" else (("UAC", "uac", ck), ("UAS", "uas", ck))
        carried = "; ".join("%s %s" % (name, " ".join("%s=%d" % (k, c[who].get(k, 0)) for k in keys))
                            for name, who, keys in ends if who in c) or "-"
        if kind == "vlc":
            rows = [("runs whose dump is the media (md5)", "runs", "%d of %d"),
                    ("time to 2 MiB [s]", "t_2m", None), ("time to all bytes [s]", "t_all", None),
                    ("CPU of the sending VLC [s]", "cpu_send", None), ("CPU of the receiving VLC [s]", "cpu_recv", None)]
        else:
            rows = [("runs with every call successful", "runs", "%d of %d"),
                    ("calls successful / failed, over those runs", "okfail", None),
                    ("BYE -> 200 OK, median [ms]", "bye_ok", None),
                    ("retransmissions, over those runs", "retrans", None)]
        for i, (lab, f, form) in enumerate(rows):
            if form:
                # fewer runs than trials: a failure, listed under the table
                cells = [(form if x.get(f, 0) == n else "**" + form + "**") % (x.get(f, 0), n) for x in (nat, shim)]
                ratio = ""
            elif f == "okfail":
                cells = ["%d / %d" % (x["ok"], x["failed"]) if "ok" in x else "-" for x in (nat, shim)]
                ratio = ""
            else:
                a, b = nat.get(f), shim.get(f)
                cells = [fmt(a, "", 0), fmt(b, "", 0)] if f == "retrans" else [fmt(a), fmt(b)]
                ratio = fmt(b / a, "x") if a and b and f != "retrans" else ""
            w("| %s | %s | %s | %s | %s | %s |" % (label if i == 0 else "", lab, cells[0], cells[1], ratio,
                                                  carried if i == 0 else ""))
    errs = T.get("errors") or []
    if errs:
        w("")
        w("Failed or repeated runs of this section (a failure leaves its run out of the medians):")
        w("")
        for e in errs:
            w("- %s" % e.replace("|", "/"))
