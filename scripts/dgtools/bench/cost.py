"""scripts/bench section 7: what a program under the shim costs against the same program natively
(issue 14): descriptors and memory per socket (apps/costprobe), ping-pong latency on one and two
cores and UDP stream rates (sockperf, through section 3's helpers), SIPp's BYE -> 200 OK (section
5's figure when it ran, else a short run), redis-benchmark and memcslap, and a perf profile of the
shim side of one UDP and one TCP ping-pong. Every figure is a median over trials that alternate the
sides; targets are reported, never enforced."""
import os, re, shutil, signal, subprocess, time

from . import ctx
from .ctx import RunFailed, failed, log, med, next_port
from .procs import Bg, carried, fg, grab, shim_env, wait_listen
from .sock import sp_pingpong, sp_throughput
from .sipp import response_times, sipp_run

# key, label, target (ratio shim/native unless said), lower is better
# "extra" targets are differences shim - native per socket, not ratios.
TARGETS = [
    ("udp_fds", "descriptors per taken UDP socket", ("extra", 0.1), True),
    ("tcp_fds", "descriptors per carried TCP connection (connecting side)", ("extra", 0.1), True),
    ("tcp_acc_fds", "descriptors per carried TCP connection (accepting side)", ("extra", 0.1), True),
    ("udp_rss", "RSS per idle taken UDP socket [kB]", ("extra", 8.0), True),
    ("tcp_rss", "RSS per idle carried TCP connection, connecting side [kB]", ("extra", 16.0), True),
    ("tcp_acc_rss", "RSS per idle carried TCP connection, accepting side [kB]", ("extra", 16.0), True),
    ("idle_wakes", "wake-ups per second of the idle probe, all its threads (every socket open)", ("extra", 5.0), True),
    ("udp_lat1c", "UDP ping-pong 64 B, 1 core (sockperf), median half RTT [us]", ("ratio", 1.10), True),
    ("tcp_lat1c", "TCP ping-pong 64 B, 1 core (sockperf), median half RTT [us]", ("ratio", 1.10), True),
    ("udp_lat2c", "UDP ping-pong 64 B, 2 cores (sockperf), median half RTT [us]", ("ratio", 1.0), True),
    ("tcp_lat2c", "TCP ping-pong 64 B, 2 cores (sockperf), median half RTT [us]", ("ratio", 1.0), True),
    ("sipp_udp", "SIPp BYE -> 200 OK, UDP [us]", ("ratio", 1.2), True),
    ("sipp_tcp", "SIPp BYE -> 200 OK, TCP [us]", ("ratio", 1.2), True),
    ("udp_rate64", "UDP stream 64 B (sockperf), datagrams/s received", ("ratio", 0.95), False),
    ("udp_rate1316", "UDP stream 1316 B (sockperf), datagrams/s received", ("ratio", 0.95), False),
    ("udp_rate16k", "UDP stream 16 KiB (sockperf), datagrams/s received", ("ratio", 1.0), False),
    ("redis_set_p1", "redis-benchmark SET -P 1, requests/s", ("ratio", 0.95), False),
    ("redis_get_p1", "redis-benchmark GET -P 1, requests/s", ("ratio", 0.95), False),
    ("redis_set_p16", "redis-benchmark SET -P 16, requests/s", ("ratio", 0.95), False),
    ("redis_get_p16", "redis-benchmark GET -P 16, requests/s", ("ratio", 0.95), False),
    ("memc_set", "memcached, memcslap set (2 threads), requests/s", ("ratio", 0.95), False),
    ("memc_get", "memcached, memcslap get (2 threads), requests/s", ("ratio", 0.95), False),
]

# the groups of the "Where we stand" table: (row text, keys)
GROUPS = [
    ("Descriptors: at most 0.1 extra per taken UDP socket and per carried TCP connection (issue 14)",
     ("udp_fds", "tcp_fds", "tcp_acc_fds")),
    ("Memory: idle taken UDP socket at most 8 kB RSS, carried idle TCP connection at most 16 kB (issue 14)",
     ("udp_rss", "tcp_rss", "tcp_acc_rss")),
    ("Idle: a process holding taken sockets wakes at most 5 times a second more than natively (issue 14)",
     ("idle_wakes",)),
    ("One-core ping-pong (64 B) within 1.10x native, UDP and TCP (issue 14)", ("udp_lat1c", "tcp_lat1c")),
    ("Two-core ping-pong median not above native, UDP and TCP (issue 14)", ("udp_lat2c", "tcp_lat2c")),
    ("SIPp BYE -> 200 OK within 1.2x native, UDP and TCP (issue 14)", ("sipp_udp", "sipp_tcp")),
    ("UDP streams: 64 B and 1316 B at least 0.95x native datagrams/s, 16 KiB at least 1.0x (issue 14)",
     ("udp_rate64", "udp_rate1316", "udp_rate16k")),
    ("redis-benchmark (SET, GET, -P 1 and -P 16) and memcached at least 0.95x native requests/s (issue 14)",
     ("redis_set_p1", "redis_get_p1", "redis_set_p16", "redis_get_p16", "memc_set", "memc_get")),
]

PROBE = os.path.join("build", "apps", "costprobe")


def figure(d, key):
    """(native, shim, value compared with the target, met) for one key of the section's data;
    value and met are None when a side is missing."""
    kind, limit = next(t for k, _, t, _ in TARGETS if k == key)
    lower = next(lw for k, _, _, lw in TARGETS if k == key)
    n, s = d.get(key, {}).get("native"), d.get(key, {}).get("shim")
    if n is None or s is None:
        return n, s, None, None
    if kind == "extra":
        v = s - n
    else:
        if not n:
            return n, s, None, None
        v = s / n
    return n, s, v, (v <= limit) if lower else (v >= limit)


# ---------------------------------------------------------------- descriptors and memory
def probe(pre, nu, nt):
    """One costprobe run: its phases (fds, rss_kb, ms) and, preloaded, proof every socket was
    carried (its own getsockopt check and the exit summaries)."""
    port = next_port()
    out, err = fg([os.path.join(ctx.ROOT, PROBE), "-u", str(nu), "-t", str(nt), "-p", str(port)],
                  shim_env(pre), 180)
    ph = {}
    for m in re.finditer(r"^phase (\w+) fds=(\d+) rss_kb=(\d+) ms=(\d+)$", out, re.M):
        ph[m[1]] = {"fds": int(m[2]), "rss": int(m[3]), "ms": int(m[4])}
    for p in ("base", "udp1", "udp", "tcp1", "tcp", "peer_base", "peer_tcp"):
        if p not in ph:
            raise RunFailed("costprobe: no phase %s in its output: %s" % (p, out[-300:]))
    if pre:
        want = "carried udp=%d/%d tcp=%d/%d" % (nu + 1, nu + 1, nt + 1, nt + 1)
        if want not in out:
            raise RunFailed("costprobe: not every socket carried: %s" % grab(r"carried .*", out, "carried line")[0])
        carried("costprobe", err, "tx_framed", nu + 1)
        carried("costprobe", err, "rc_conns", 2 * (nt + 1))
    per = lambda a, b, k, n: (ph[b][k] - ph[a][k]) / n
    return {"udp_fds": per("udp1", "udp", "fds", nu), "tcp_fds": per("tcp1", "tcp", "fds", nt),
            "tcp_acc_fds": per("peer_base", "peer_tcp", "fds", nt + 1),
            "udp_rss": per("udp1", "udp", "rss", nu), "tcp_rss": per("tcp1", "tcp", "rss", nt),
            "tcp_acc_rss": per("peer_base", "peer_tcp", "rss", nt + 1),
            "idle_wakes": int(grab(r"(?m)^idle wakeups=(\d+) ms=1000$", out, "costprobe's idle line")[1]),
            "first_fds": ph["udp1"]["fds"] - ph["base"]["fds"], "first_rss": ph["udp1"]["rss"] - ph["base"]["rss"],
            "udp_ms": ph["udp"]["ms"] / nu, "tcp_ms": ph["tcp"]["ms"] / nt}


# ---------------------------------------------------------------- real servers
def redis(pre, n1, n16):
    """redis-server and redis-benchmark (10 clients, SET and GET, -P 1 and -P 16), both preloaded
    or both native; requests/s per test."""
    port = next_port()
    d = os.path.join(ctx.TMP, "redis-%d" % port)
    os.makedirs(d)
    srv = Bg(["redis-server", "--port", str(port), "--bind", ctx.HOST, "--save", "", "--appendonly", "no",
              "--dir", d, "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning"],
             shim_env(pre), "redis-server")
    res, errs = {}, ""
    try:
        wait_listen(port, "tcp", srv)
        for p, n in ((1, n1), (16, n16)):
            out, err = fg(["redis-benchmark", "-h", ctx.HOST, "-p", str(port), "-c", "10", "-n", str(n), "-P", str(p),
                           "-t", "set,get", "--csv"], shim_env(pre), 120)
            errs += err
            for t in ("SET", "GET"):
                res["redis_%s_p%d" % (t.lower(), p)] = float(grab(r'(?m)^"%s","([\d.]+)"' % t, out, "redis %s rate" % t)[1])
    finally:
        stext = srv.stop(signal.SIGTERM, 10)
    if pre:
        carried("redis-server", stext, "rc_conns", 10)
        carried("redis-benchmark", errs, "rc_conns", 20)
    return res


def memcached(pre, per_thread):
    """memcached (2 threads) and memcslap (2 threads; set, then get, of 2 x per_thread keys),
    both preloaded or both native; requests/s of each."""
    port = next_port()
    user = ["-u", "nobody"] if os.geteuid() == 0 else []
    srv = Bg(["memcached"] + user + ["-m", "128", "-t", "2", "-l", ctx.HOST, "-p", str(port), "-U", "0"],
             shim_env(pre), "memcached")
    res, errs = {}, ""
    try:
        wait_listen(port, "tcp", srv)
        for t in ("set", "get"):
            out, err = fg(["memcslap", "-s", "%s:%d" % (ctx.HOST, port), "-c", "2", "-e", str(per_thread), "-t", t],
                          shim_env(pre), 120)
            errs += err
            m = grab(r"Time to %s\s+(\d+) keys by\s+\d+ threads:\s+([\d.]+) seconds" % t, out, "memcslap %s time" % t)
            res["memc_" + t] = int(m[1]) / max(1e-6, float(m[2]))
    finally:
        stext = srv.stop(signal.SIGTERM, 10)
    if pre:
        carried("memcached", stext, "rc_conns", 2)
        carried("memcslap", errs, "rc_conns", 2)
    return res


# ---------------------------------------------------------------- SIPp
def sipp_short(pre, proto, calls):
    """BYE -> 200 OK median (us) from one short SIPp run (section 5's sipp_run, message trace)."""
    r = sipp_run(proto, pre, calls, 50, 100, trace=True)
    if not r["msglog"]:
        raise RunFailed("SIPp: no -trace_msg log")
    rt = response_times(r["msglog"])["bye_ok"]
    if len(rt) < 0.9 * calls:
        raise RunFailed("SIPp: only %d calls' BYE response times" % len(rt))
    return 1e3 * med(rt)


# ---------------------------------------------------------------- profile
PERF_LINE = re.compile(r"^\s*([\d.]+)%\s+(\S+)\s+\[([.k])\]\s+(.+?)\s*$")

def profile(tcp, secs):
    """perf record -g of a preloaded sockperf ping-pong (64 B, server and client on CPU 0, both
    profiled); the top symbols by self time and the shares per object, or {"error": why} when perf
    is missing or cannot record here."""
    if not shutil.which("perf"):
        return {"error": "perf is not installed (Debian package linux-perf)"}
    port = next_port()
    t = ["--tcp"] if tcp else []
    data = os.path.join(ctx.TMP, "perf-%s.data" % ("tcp" if tcp else "udp"))
    srv = Bg(["taskset", "-c", "0", "sockperf", "server", "-i", ctx.HOST, "-p", str(port)] + t, shim_env(True), "sockperf-srv")
    cli, stext = None, ""
    try:
        wait_listen(port, "tcp" if tcp else "udp", srv)
        cli = Bg(["taskset", "-c", "0", "sockperf", "ping-pong", "-i", ctx.HOST, "-p", str(port), "-m", "64",
                  "-t", str(secs + 2)] + t, shim_env(True), "sockperf-cli")
        time.sleep(0.5)
        r = subprocess.run(["perf", "record", "-g", "-q", "-o", data, "-p", "%d,%d" % (srv.p.pid, cli.p.pid),
                            "--", "sleep", str(secs)], capture_output=True, text=True, timeout=secs + 60)
        if r.returncode or not os.path.exists(data):
            return {"error": "perf record failed (exit %d): %s" % (r.returncode, (r.stderr.strip().splitlines() or [""])[-1][:200])}
        cli.p.wait(timeout=secs + 30)
    finally:
        if cli:
            cli.stop()
        stext = srv.stop()
    carried("profiled sockperf %s server" % ("TCP" if tcp else "UDP"), stext, "rc_conns" if tcp else "rx_framed")
    rep = lambda sort: subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "-g", "none",
                                       "--sort", sort], capture_output=True, text=True, timeout=120).stdout
    syms = []
    for l in rep("dso,sym").splitlines():
        m = PERF_LINE.match(l)
        if m:
            syms.append({"pct": float(m[1]), "dso": m[2], "sym": m[4]})
    dsos = []
    for l in rep("dso").splitlines():
        m = re.match(r"^\s*([\d.]+)%\s+(\S+)\s*$", l)
        if m:
            dsos.append({"pct": float(m[1]), "dso": m[2]})
    if not syms:
        return {"error": "perf report found no samples"}
    return {"top": syms[:12], "dsos": dsos[:8]}


def syscalls(pre, tcp, secs):
    """System calls per message of a sockperf ping-pong client (64 B, both ends on CPU 0), counted by
    perf stat (raw_syscalls:sys_enter) over the client's whole run, start-up included; None with the
    reason when perf cannot count here."""
    port = next_port()
    t = ["--tcp"] if tcp else []
    out = os.path.join(ctx.TMP, "syscalls-%d.txt" % port)
    srv = Bg(["taskset", "-c", "0", "sockperf", "server", "-i", ctx.HOST, "-p", str(port)] + t, shim_env(pre), "sockperf-srv")
    try:
        wait_listen(port, "tcp" if tcp else "udp", srv)
        # perf itself runs natively; only the client under it gets the shim's variables
        env = shim_env(False)
        pe = ["%s=%s" % (k, v) for k, v in shim_env(pre).items() if env.get(k) != v]
        so, se = fg(["perf", "stat", "-x", ",", "-o", out, "-e", "raw_syscalls:sys_enter", "--", "taskset", "-c", "0",
                     "env"] + pe + ["sockperf", "ping-pong", "-i", ctx.HOST, "-p", str(port), "-m", "64", "-t", str(secs)] + t,
                    env, secs + 60)
    finally:
        stext = srv.stop()
    if pre:
        carried("sockperf %s server" % ("TCP" if tcp else "UDP"), stext, "rc_conns" if tcp else "rx_framed")
    n = re.search(r"^(\d+),[^,]*,raw_syscalls:sys_enter", open(out).read(), re.M)
    if not n:
        raise RunFailed("perf stat counted no system calls: %s" % open(out).read()[-200:])
    msgs = int(grab(r"SentMessages=(\d+)", so + se, "sockperf's SentMessages")[1])
    return int(n[1]) / max(1, msgs)


# ---------------------------------------------------------------- the section
def cost(R=None):
    R = R or {}
    q = ctx.QUICK
    trials = ctx.A.trials or (1 if q else 3)
    secs = 1 if q else 3
    nsock = 500 if q else 1000
    res = {k: {"native": [], "shim": []} for k, *_ in TARGETS}
    extra = {k: {"native": [], "shim": []} for k in ("first_fds", "first_rss", "udp_ms", "tcp_ms")}
    if not os.path.exists(os.path.join(ctx.ROOT, PROBE)):
        failed("cost", "%s not built" % PROBE)
    # (what, function returning {key: value}) for one side
    runs = [
        ("costprobe", lambda pre: probe(pre, nsock, nsock)),
        ("ping-pong", lambda pre: {"udp_lat1c": sp_pingpong(pre, 64, secs, False, (0, 0))["p50"],
                                   "tcp_lat1c": sp_pingpong(pre, 64, secs, True, (0, 0))["p50"],
                                   "udp_lat2c": sp_pingpong(pre, 64, secs, False, (0, 1))["p50"],
                                   "tcp_lat2c": sp_pingpong(pre, 64, secs, True, (0, 1))["p50"]}),
        ("UDP streams", lambda pre: {"udp_rate64": sp_throughput(pre, 64, secs)["rate"],
                                     "udp_rate1316": sp_throughput(pre, 1316, secs)["rate"],
                                     "udp_rate16k": sp_throughput(pre, 16384, secs)["rate"]}),
        # sized for about a second natively (redis -P 1 ~90 000/s, -P 16 ~1.4 M/s, memcslap ~70 000/s)
        ("redis", lambda pre: redis(pre, 50000 if q else 200000, 400000 if q else 2000000)),
        ("memcached", lambda pre: memcached(pre, 20000 if q else 50000)),
    ]
    Sp = (R.get("sipp") or {}).get("rt") or {}
    sipp_from = "section 5 (this run)"
    if not all(Sp.get(k, {}).get("bye_ok", {}).get("median") for k in ("udp-shim", "tcp-shim", "udp-native", "tcp-native")):
        sipp_from = "a short run here (%d calls per case)" % (60 if q else 200)
        runs.append(("SIPp", lambda pre: {"sipp_udp": sipp_short(pre, "udp", 60 if q else 200),
                                          "sipp_tcp": sipp_short(pre, "tcp", 60 if q else 200)}))
    else:
        for k, proto, side in (("sipp_udp", "udp", "shim"), ("sipp_udp", "udp", "native"),
                               ("sipp_tcp", "tcp", "shim"), ("sipp_tcp", "tcp", "native")):
            res[k][side].append(1e3 * Sp["%s-%s" % (proto, side)]["bye_ok"]["median"])
    for t in range(trials):
        for what, fn in runs:
            for side in (("native", "shim") if t % 2 == 0 else ("shim", "native")):
                try:
                    got = fn(side == "shim")
                except (RunFailed, OSError, subprocess.SubprocessError) as e:
                    failed("cost", "%s, %s: %s" % (what, side, e))
                    continue
                for k, v in got.items():
                    (res if k in res else extra)[k][side].append(v)
        log("cost: trial %d/%d done" % (t + 1, trials))
    prof = {}
    for tcp in (False, True):
        proto = "tcp" if tcp else "udp"
        try:
            prof[proto] = profile(tcp, 2 if q else 5)
        except (RunFailed, OSError, subprocess.SubprocessError) as e:
            prof[proto] = {"error": str(e)}
        if shutil.which("perf") and not prof[proto].get("error"):
            for side in ("native", "shim"):
                try:
                    prof[proto]["syscalls_" + side] = syscalls(side == "shim", tcp, secs)
                except (RunFailed, OSError, subprocess.SubprocessError) as e:   # perf's limits: said, not failed
                    prof[proto]["syscalls_error"] = "%s: %s" % (side, e)
    data = {k: {s: med(v[s]) for s in v} for k, v in res.items()}
    out = {"trials": trials, "secs": secs, "nsock": nsock, "sipp_from": sipp_from, "data": data, "all": res,
           "extra": {k: {s: med(v[s]) for s in v} for k, v in extra.items()}, "profile": prof}
    for k, label, _, _ in TARGETS:
        n, s, v, ok = figure(data, k)
        log("cost: %-58s native %s shim %s -> %s %s" % (label[:58], n, s, v, "" if ok is None else "met" if ok else "MISSED"))
    return out


# ---------------------------------------------------------------- page and plot
def verdict(v, ok, kind):
    if v is None:
        return "-", "-"
    return ("%+.2f" % v if kind == "extra" else "%.2fx" % v), ("yes" if ok else "**no**")


def page_section(C, w, fmt, made, summary):
    """Section 7 of results.md through w; appends the "Where we stand" rows to summary."""
    d = C["data"]
    w("## 7. Cost per socket and per message (issue 14)")
    w("")
    w("What a program pays for running under the shim, against the same program natively, measured "
      "side by side in the same run: %d trial(s) alternating the sides, medians. **Descriptors and memory**: "
      "`build/apps/costprobe` opens %d UDP sockets bound to 127.0.0.1, each sending one datagram to a peer "
      "process, and %d TCP connections to the peer's listener, each sending one byte the peer reads; it counts "
      "its own /proc/self/fd and VmRSS before and after (the first socket of each kind, which also pays the "
      "process's set-up, is left out of the slope) and the peer does the same for the connections it accepted. "
      "Preloaded, every socket is checked carried (IWARP_STATS tx_framed / IWARP_TAKEN on each, and the exit "
      "summaries). RSS counts user-space pages only (the kernel's socket memory is the same both ways). "
      "**Idle**: then, every socket still open, the probe sleeps a second and counts the context switches of "
      "all its threads (natively 1, its own sleep; the shim's provider thread adds its wake-ups). "
      "**Latency**: sockperf ping-pong 64 B for %d s, both ends pinned to CPU 0 (one core) or to CPUs 0 and 1; "
      "SIPp's BYE -> 200 OK from %s. **Rate**: sockperf throughput for %d s, datagrams/s the server counted. "
      "**Servers**: redis-server with redis-benchmark (10 clients, SET and GET, -P 1 and -P 16) and memcached "
      "(2 threads) with memcslap (2 threads, set then get), server and client both preloaded or both native. "
      "Targets are issue 14's; they are reported, never enforced." % (
          C["trials"], C["nsock"], C["nsock"], C["secs"], C["sipp_from"], C["secs"]))
    w("")
    if "cost.png" in made:
        w("![cost](img/cost.png)")
        w("")
    w("| measurement | native | shim | shim - native per socket, or shim/native | target | met? |")
    w("|---|---|---|---|---|---|")
    for k, label, (kind, limit), lower in TARGETS:
        n, s, v, ok = figure(d, k)
        p = 2 if k.endswith("fds") or "rss" in k or "lat" in k else 0
        if k.startswith("sipp"):
            p = 1
        vt, met = verdict(v, ok, kind)
        w("| %s | %s | %s | %s | %s %s%s | %s |" % (label, fmt(n, "", p), fmt(s, "", p), vt,
                                                   "<=" if lower else ">=", "+" if kind == "extra" else "",
                                                   ("%g" % limit) + ("x" if kind == "ratio" else ""), met))
    w("")
    X = C.get("extra") or {}
    g = lambda k, side: (X.get(k) or {}).get(side)
    w("The first socket of a process costs more under the shim: the first taken UDP socket added %s "
      "descriptors and %s kB (natively %s and %s kB): the provider, its progress thread, the discovery "
      "service and the registry. Opening a socket and sending its first datagram took %s ms per UDP socket "
      "(natively %s), connecting and sending one byte %s ms per TCP connection (natively %s)." % (
          fmt(g("first_fds", "shim"), "", 0), fmt(g("first_rss", "shim"), "", 0), fmt(g("first_fds", "native"), "", 0),
          fmt(g("first_rss", "native"), "", 0), fmt(g("udp_ms", "shim"), "", 3), fmt(g("udp_ms", "native"), "", 3),
          fmt(g("tcp_ms", "shim"), "", 3), fmt(g("tcp_ms", "native"), "", 3)))
    w("")
    _, su, _, oku = figure(d, "udp_fds")
    _, st, _, okt = figure(d, "tcp_fds")
    if oku is False or okt is False:
        w("**Descriptors: we miss the target%s.** A taken UDP socket holds %s descriptors where natively it "
          "is one: its UD queue pair reads the program's own descriptor and, on the soft provider, its "
          "completion queue makes no eventfd (every completion it has is made in the program's own calls, "
          "so a wait watches the socket alone; the registry is one name per process). A carried TCP "
          "connection holds %s: its RC queue pair runs on the program's own descriptor too, but its "
          "completion queue has an eventfd (which its connection events share) once the connection is waited "
          "on by poll, epoll, a connect or an accept, since the provider's thread moves a connection's data "
          "while the program is elsewhere (a connection only ever read by blocking receives waits in the "
          "kernel's own recv and makes none). Each is a kernel object the socket keeps while it lives; SIPp "
          "-t tn at 10 000 calls had to be split over several processes for it (section 5)." % (
              " for " + " and ".join(x for x, ok in (("UDP", oku), ("TCP", okt)) if ok is False),
              fmt(su, "", 2), fmt(st, "", 2)))
        w("")
    n, s, v, ok = figure(d, "udp_rss")
    if ok is False:
        w("**Memory: we miss the target.** An idle taken UDP socket costs %s kB of resident memory more than "
          "natively, a carried TCP connection %s kB at the connecting end and %s kB at the accepting end, "
          "having moved one datagram or one byte each: what the shim allocates and touches per socket (a UDP "
          "socket's registered send and receive slots, a connection's receive and send rings as far as its "
          "bytes reached, the queue pair's and completion queue's state). This section measures the total "
          "only, not its parts." % (fmt(v, "", 1), fmt(figure(d, "tcp_rss")[2], "", 1),
                                   fmt(figure(d, "tcp_acc_rss")[2], "", 1)))
        w("")
    w("### Where the remaining time goes")
    w("")
    w("`perf record -g` of a preloaded sockperf ping-pong (64 B, server and client both on CPU 0, both "
      "processes sampled) and `perf report --no-children`: the symbols with the most self time, and the "
      "share of each object.")
    w("")
    share = lambda P, name: sum(x["pct"] for x in P.get("dsos", []) if name in x["dso"])
    PR = C.get("profile") or {}
    if all(PR.get(p, {}).get("dsos") for p in ("udp", "tcp")):
        w("The shim's own code (libdgshim) holds %.1f %% of the samples with UDP and %.1f %% with TCP, the "
          "kernel %.1f %% and %.1f %%: on one core most of a round trip is the kernel's (the system calls, and "
          "the switch between the two processes, `finish_task_switch`), so what the shim adds shows as more "
          "system calls per message (below: natively a blocking receive and a send; under the shim also the "
          "waits in poll on the socket and the completion queue's descriptor) rather than as its own code." % (
              share(PR["udp"], "libdgshim"), share(PR["tcp"], "libdgshim"), share(PR["udp"], "kernel"),
              share(PR["tcp"], "kernel")))
        w("")
    for proto in ("udp", "tcp"):
        P = (C.get("profile") or {}).get(proto) or {}
        if P.get("error"):
            w("- %s: no profile: %s." % (proto.upper(), P["error"]))
            continue
        if not P:
            continue
        w("**%s** (objects: %s). System calls per message at the client (perf stat, one-core ping-pong): "
          "native %s, shim %s." % (proto.upper(), ", ".join("%s %.1f %%" % (x["dso"], x["pct"]) for x in P["dsos"][:6]),
                                   fmt(P.get("syscalls_native"), "", 2), fmt(P.get("syscalls_shim"), "", 2)))
        if P.get("syscalls_error"):
            w("")
            w("(System calls not counted: %s.)" % P["syscalls_error"][:300])
        w("")
        w("| self | object | symbol |")
        w("|---|---|---|")
        for x in P["top"][:10]:
            w("| %.1f %% | %s | `%s` |" % (x["pct"], x["dso"], x["sym"].replace("|", "\\|")))
        w("")
    for text, keys in GROUPS:
        parts, oks = [], []
        for k in keys:
            n, s, v, ok = figure(d, k)
            kind = next(t for kk, _, t, _ in TARGETS if kk == k)[0]
            short = k.replace("_p1", " -P1").replace("_p16", " -P16").replace("redis_", "redis ").replace(
                "memc_", "memcached ").replace("_", " ")
            parts.append("%s %s" % (short, verdict(v, ok, kind)[0]))
            oks.append(ok)
        summary.append((text, ", ".join(parts) + " (section 7)",
                        "not measured" if all(o is None for o in oks) else
                        "**no**" if False in oks else "not all measured" if None in oks else True))


def plots(C, save, plt):
    """Section 7's figure: shim/native of the rate and latency figures against their targets
    (left), descriptors and memory per socket (right)."""
    d = C["data"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [3, 2]})
    rows = [(label, figure(d, k), limit, lower) for k, label, (kind, limit), lower in TARGETS if kind == "ratio"]
    ys = range(len(rows))
    vals = [(f[2] or 1e-3) for _, f, _, _ in rows]
    ax.barh(ys, [v - 1 for v in vals], left=1,
            color=["0.6" if f[3] is None else "C2" if f[3] else "C3" for _, f, _, _ in rows])
    for i, (_, f, limit, lower) in enumerate(rows):
        ax.plot([limit, limit], [i - 0.4, i + 0.4], color="k", linewidth=2)
        if f[2] is not None:
            ax.text(f[2], i, " %.2f" % f[2], va="center", fontsize=7)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_yticks(list(ys))
    ax.set_yticklabels([l for l, _, _, _ in rows], fontsize=7)
    ax.axvline(1, color="0.3", linewidth=0.8)
    ax.set_xlabel("shim / native (log): green target met, red missed; black tick: issue 14's target")
    ax.set_title("Latency (lower is better) and rates (higher is better)", fontsize=9)
    cats = [("udp", "UDP socket"), ("tcp", "TCP conn.\n(connecting)"), ("tcp_acc", "TCP conn.\n(accepting)")]
    x = range(len(cats))
    ax3 = ax2.twinx()
    for j, side in enumerate(("native", "shim")):
        ax2.bar([i - 0.3 + 0.15 * j for i in x], [d[c + "_fds"][side] or 0 for c, _ in cats], 0.15,
                color="C0", alpha=0.5 + 0.5 * j, label="descriptors, %s" % side)
        ax3.bar([i + 0.05 + 0.15 * j for i in x], [d[c + "_rss"][side] or 0 for c, _ in cats], 0.15,
                color="C1", alpha=0.5 + 0.5 * j, label="RSS kB, %s" % side)
    for i, (c, _) in enumerate(cats):
        n = d[c + "_fds"]["native"]
        if n is not None:
            ax2.plot([i - 0.32, i - 0.0], [n + 0.1] * 2, "k-", linewidth=1.5)
        n = d[c + "_rss"]["native"]
        if n is not None:
            ax3.plot([i + 0.03, i + 0.35], [n + (8 if c == "udp" else 16)] * 2, "k--", linewidth=1.5)
    ax2.set_xticks(list(x))
    ax2.set_xticklabels([l for _, l in cats], fontsize=8)
    ax2.set_ylabel("descriptors per socket (blue)")
    ax3.set_ylabel("RSS per socket [kB] (orange)")
    h1, l1 = ax2.get_legend_handles_labels()
    h2, l2 = ax3.get_legend_handles_labels()
    ax2.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    ax2.set_title("Per socket (slope over %d);\nblack: target (native + 0.1; + 8 or 16 kB)" % C["nsock"], fontsize=9)
    fig.suptitle("Cost of the shim against native (issue 14), same run, medians", fontsize=10)
    save(fig, "cost.png")
