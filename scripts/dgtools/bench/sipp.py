"""scripts/bench section 5: SIPp response time and memory, UD (-t un) against RC (-t tn), and
the descriptor model that splits large call counts over several SIPp pairs."""
import csv, datetime, glob, os, re, resource, signal, statistics, subprocess, time

from . import ctx
from .ctx import RunFailed, failed, log, med, next_port
from .procs import Bg, carried, placed, shim_env, ssum, wait_listen

SOCK_CACHES = ("TCP", "TCPv6", "UDP", "UDPv6", "UNIX", "sock_inode_cache", "request_sock_TCP", "tw_sock_TCP")

def kmem():
    """Kernel memory held by sockets: slab objects of the socket caches + sockstat buffer pages."""
    slab = 0
    try:
        for l in open("/proc/slabinfo").readlines()[2:]:
            w = l.split()
            if w[0] in SOCK_CACHES:
                slab += int(w[1]) * int(w[3])
    except OSError:
        pass
    pages = 0
    for l in open("/proc/net/sockstat"):
        m = re.match(r"(TCP|UDP):.* mem (\d+)", l)
        if m:
            pages += int(m[2])
    return slab, pages * 4096

def rss(pid):
    """Resident set of a process and its threads, bytes (VmRSS)."""
    try:
        for l in open("/proc/%d/status" % pid):
            if l.startswith("VmRSS:"):
                return int(l.split()[1]) * 1024
    except OSError:
        pass
    return 0

def fds(pid):
    """Open descriptors of a process."""
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return 0

def sipp_stats(path):
    rows = list(csv.DictReader(open(path), delimiter=";"))
    last = rows[-1]
    n = lambda k: int(last.get(k, 0) or 0)
    # CurrentTime is "date<TAB>time<TAB>epoch": the timeline lets K pairs' calls be added up at one time
    line = [(float(r["CurrentTime"].split("\t")[-1]), int(r["CurrentCall"])) for r in rows]
    return {"ok": n("SuccessfulCall(C)"), "failed": n("FailedCall(C)"), "incoming": n("IncomingCall(C)"),
            "peak": max(int(r["CurrentCall"]) for r in rows), "retrans": n("Retransmissions(C)"), "line": line}

def sipp_why(text):
    """What went wrong in a SIPp log: its first error line and the shim's warnings, counted."""
    errs = [l.split(": ", 1)[-1].strip() for l in text.splitlines() if re.search(r"\d: .*(rror|nable|imed out)", l)
            and "dgshim[" not in l]
    warns = {}
    for m in re.finditer(r"dgshim\[\d+\]: warn: (.*)", text):
        k = re.sub(r"fd \d+", "fd N", m[1].strip())
        warns[k] = warns.get(k, 0) + 1
    out = ["SIPp: %s" % errs[0]] if errs else []
    out += ["%dx shim warning '%s'" % (v, k) for k, v in sorted(warns.items(), key=lambda x: -x[1])[:3]]
    return "; ".join(out) if out else text[-200:].strip()

def together(lines):
    """The most calls up at one time over several SIPp processes' 1 s timelines: at every sample time,
    the sum of each process's latest sample (a process not started yet counts 0)."""
    best = 0
    for t in sorted(x for l in lines for x, _ in l):
        best = max(best, sum(([c for x, c in l if x <= t] or [0])[-1] for l in lines))
    return best

def shares(calls, pairs):
    """calls split over pairs as evenly as whole calls allow (10 000 over 3: 3 334, 3 333, 3 333)."""
    return [calls // pairs + (1 if i < calls % pairs else 0) for i in range(pairs)]

def sipp_run(proto, pre, calls, rate, hold_ms, trace=False, extra=None, pairs=1, where=None):
    """K = pairs independent SIPp pairs at once, each a UAS (-t u1 / t1) and a UAC (-t un / tn, one
    socket per call) on its own ports with its share of the calls at rate/K (the total rate stays
    rate). Samples all 2K processes' RSS and the kernel's socket memory every 100 ms (their open
    descriptors every 500 ms); returns the peak sum, the calls' statistics added over the pairs and
    each pair's own figures. Every UAC must report all its calls successful, and under the shim
    every pair's summaries must show its traffic carried. where: None (both on this host,
    ctx.HOST), or {"uas": END, "uac": END} with END = (command prefix, IP) of the host each runs on
    (procs.placed): then the kernel's socket memory is not sampled (the slab caches are one for both
    hosts, /proc/net/sockstat is per host: section 5 measures memory) and the result also has both
    ends' exit summary counters added over the pairs."""
    env = shim_env(pre, extra)
    at = lambda who, cmd: placed(where[who], pre, cmd, extra) if where else (cmd, env)
    ip = lambda who: where[who][1] if where else ctx.HOST
    bind = lambda who: ["-i", where[who][1]] if where else []
    uas_t, uac_t = ("u1", "un") if proto == "udp" else ("t1", "tn")
    P = []
    for i, c in enumerate(shares(calls, pairs)):
        base = next_port(8)
        sdir = os.path.join(ctx.TMP, "sipp-%d" % base)
        os.makedirs(sdir)
        P.append({"i": i, "calls": c, "base": base, "sdir": sdir, "uas": None, "uac": None,
                  "common": ([] if where else ["-i", ctx.HOST]) + ["-max_socket", str(min(ctx.NOFILE - 1000, max(19800, c * 5))), "-nostdin",
                             "-trace_stat", "-fd", "1", "-timeout", "120s", "-timeout_error"]})
    tag = lambda p: "" if pairs == 1 else " (pair %d/%d, %d calls)" % (p["i"] + 1, pairs, p["calls"])
    kmem_of = kmem if not where else (lambda: (0, 0))
    slab0, buf0 = kmem_of()
    peak = {"total": 0}
    try:
        for p in P:
            p["uas"] = Bg(*at("uas", ["sipp", "-sn", "uas"] + bind("uas") + ["-p", str(p["base"]), "-t", uas_t, "-m",
                                      str(p["calls"]), "-mp", str(p["base"] + 2), "-cp", str(p["base"] + 6), "-stf",
                                      p["sdir"] + "/uas.csv"] + p["common"]), "sipp-uas", cwd=p["sdir"])
        for p in P:
            wait_listen(p["base"], "udp" if proto == "udp" else "tcp", p["uas"], 20, ns=bool(where))
        for p in P:
            p["uac"] = Bg(*at("uac", ["sipp", "-sn", "uac", "%s:%d" % (ip("uas"), p["base"])] + bind("uac") + ["-p",
                                      str(p["base"] + 1), "-t", uac_t, "-m", str(p["calls"]), "-l", str(p["calls"]),
                                      "-r", "%.6g" % (rate / pairs), "-d", str(hold_ms), "-mp", str(p["base"] + 3),
                                      "-cp", str(p["base"] + 7), "-stf", p["sdir"] + "/uac.csv"]
                              + (["-trace_msg"] if trace else []) + p["common"]), "sipp-uac", cwd=p["sdir"])
            p["uac_fds"] = p["uas_fds"] = 0
        end = time.monotonic() + 240
        k = 0
        while any(p["uac"].p.poll() is None for p in P) and time.monotonic() < end:
            if any(p["uas"].p.poll() is not None and p["uac"].p.poll() is None for p in P):
                time.sleep(2)
                break
            a = sum(rss(p["uac"].p.pid) for p in P)
            b = sum(rss(p["uas"].p.pid) for p in P)
            slab, buf = kmem_of()
            tot = a + b + max(0, slab - slab0) + max(0, buf - buf0)
            if tot > peak["total"]:
                peak = {"total": tot, "uac_rss": a, "uas_rss": b, "slab": max(0, slab - slab0),
                        "buf": max(0, buf - buf0), "t": time.monotonic()}
            if k % 5 == 0:
                for p in P:
                    p["uac_fds"] = max(p["uac_fds"], fds(p["uac"].p.pid))
                    p["uas_fds"] = max(p["uas_fds"], fds(p["uas"].p.pid))
            k += 1
            time.sleep(0.1)
        for p in P:
            if p["uac"].p.poll() is None:
                p["uac"].stop(signal.SIGINT, 10)
        for p in P:
            try:
                p["uac"].p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            p["utext"] = p["uac"].stop(signal.SIGINT, 10)
        for p in P:
            try:
                p["uas"].p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            p["stext"] = p["uas"].stop(signal.SIGINT, 10)
    finally:
        for p in P:
            for who in ("uac", "uas"):
                if p[who]:
                    p[who].stop(signal.SIGKILL, 5)
    for p in P:
        try:
            p["c"], p["s"] = sipp_stats(p["sdir"] + "/uac.csv"), sipp_stats(p["sdir"] + "/uas.csv")
        except (OSError, IndexError, KeyError, ValueError) as e:
            raise RunFailed("SIPp statistics missing%s (%s); UAC: %s" % (tag(p), e, p["utext"][-300:].strip()))
        c = p["c"]
        if c["ok"] != p["calls"] or c["failed"]:
            raise RunFailed("UAC%s: %d of %d calls successful, %d failed (exit %d): %s" % (
                tag(p), c["ok"], p["calls"], c["failed"], p["uac"].p.returncode, sipp_why(p["utext"])))
        if pre:
            key = "rx_framed" if proto == "udp" else "rc_conns"
            carried("SIPp UAC" + tag(p), p["utext"], key, 1 if proto == "udp" else p["calls"])
            carried("SIPp UAS" + tag(p), p["stext"], key, 1 if proto == "udp" else p["calls"])
    add = lambda who, k: sum(p[who][k] for p in P)
    c = {k: add("c", k) for k in ("ok", "failed", "incoming", "retrans")}
    s = {k: add("s", k) for k in ("ok", "failed", "incoming", "retrans")}
    c["peak"] = together([p["c"]["line"] for p in P])
    s["peak"] = together([p["s"]["line"] for p in P])
    msgs = None
    if trace:
        msgs = glob.glob(P[0]["sdir"] + "/uac_*_messages.log")
        msgs = msgs[0] if msgs else None
    out = {"peak": peak, "uac": c, "uas": s, "msglog": msgs,
           "pairs": [{"calls": p["calls"], "peak_calls": p["c"]["peak"], "uac_fds": p["uac_fds"],
                      "uas_fds": p["uas_fds"]} for p in P]}
    if where:
        out["counters"] = {who: {k: sum(ssum(p[t], k) for p in P) for k in
                                 ("tx_framed", "tx_plain", "rx_framed", "rc_conns", "rc_plain")}
                           for who, t in (("uac", "utext"), ("uas", "stext"))}
    return out

MSG = re.compile(r"^-{40,} (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\n(UDP|TCP) message (sent|received)[^\n]*\n", re.M)

def response_times(path):
    """Per call from a SIPp -trace_msg log (microsecond timestamps, taken by the UAC):
    INVITE sent -> first response (180), INVITE -> 200 OK (SIPp's rtd), BYE -> its 200 OK."""
    text = open(path, errors="replace").read()
    starts = [m for m in MSG.finditer(text)]
    calls = {}
    for i, m in enumerate(starts):
        body = text[m.end():starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        t = datetime.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S.%f").timestamp()
        cid = re.search(r"^Call-ID:\s*(\S+)", body, re.M)
        cseq = re.search(r"^CSeq:\s*\d+\s+(\w+)", body, re.M)
        first = body.strip().splitlines()[0] if body.strip() else ""
        if not cid or not cseq:
            continue
        c = calls.setdefault(cid[1], {})
        if m[3] == "sent" and first.startswith("INVITE"):
            c.setdefault("inv", t)
        elif m[3] == "sent" and first.startswith("BYE"):
            c.setdefault("bye", t)
        elif m[3] == "received" and first.startswith("SIP/2.0"):
            if cseq[1] == "INVITE":
                c.setdefault("r1", t)
                if " 200 " in first + " ":
                    c.setdefault("ok", t)
            elif cseq[1] == "BYE":
                c.setdefault("byeok", t)
    f = lambda a, b: [1e3 * (c[b] - c[a]) for c in calls.values() if a in c and b in c]
    return {"first": f("inv", "r1"), "invite_ok": f("inv", "ok"), "bye_ok": f("bye", "byeok")}

def sipp():
    trials = ctx.A.trials or (1 if ctx.QUICK else 3)
    res = {"rt": {}, "mem": {}, "trials": trials}
    # response time under light load: 20 calls/s, a few at once, message trace with timestamps
    rt_calls = 100 if ctx.QUICK else 300
    for t in range(trials):
        # the shim's default progress (auto), and with DGSHIM_PROGRESS=thread (the provider's thread
        # processes arrivals at once instead of the program's next call into the shim)
        for proto, pre, th in [("udp", True, False), ("tcp", True, False), ("udp", False, False), ("tcp", False, False),
                               ("udp", True, True), ("tcp", True, True)][:: 1 if t % 2 == 0 else -1]:
            key = "%s-%s%s" % (proto, "shim" if pre else "native", "-thread" if th else "")
            try:
                r = sipp_run(proto, pre, rt_calls, 50, 100, trace=True,
                             extra={"DGSHIM_PROGRESS": "thread"} if th else None)
                if not r["msglog"]:
                    raise RunFailed("no -trace_msg log")
                rt = response_times(r["msglog"])
                if len(rt["bye_ok"]) < rt_calls * 0.9:
                    raise RunFailed("only %d calls' BYE response times in the message log" % len(rt["bye_ok"]))
                for k, v in rt.items():
                    res["rt"].setdefault(key, {}).setdefault(k, []).extend(v)
            except RunFailed as e:
                failed("sipp", "response time %s: %s" % (key, e))
        log("sipp: response-time trial %d/%d done" % (t + 1, trials))
    for key, d in res["rt"].items():
        res["rt"][key] = {k: {"median": med(v), "mean": statistics.mean(v) if v else None, "n": len(v)}
                          for k, v in d.items()}
    # memory at N concurrent calls: -r R -d HOLD so that all N calls are up at once for a while
    plans = [(1000, 500, 4000)] if ctx.QUICK else [(500, 500, 3000), (1000, 500, 4000), (2000, 500, 6000),
                                                (10000, 500, 22000)]
    if os.environ.get("BENCH_SIPP_PLANS"):   # development: "CALLS:RATE:HOLD_MS,..."
        plans = [tuple(int(x) for x in p.split(":")) for p in os.environ["BENCH_SIPP_PLANS"].split(",")]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    res.update({"nofile": hard, "pairs": {}, "fd_points": {}, "fd_model": {}, "skipped": {}})
    for calls, rate, hold in plans:
        ks = sipp_pairs(res, calls, hard)
        if not ks:
            continue
        res["pairs"][str(calls)] = ks
        for proto, k in sorted(ks.items()):
            if k > 1:
                log("sipp: %d %s calls as %d pairs of %s calls (descriptor limit %d)" % (
                    calls, proto.upper(), k, "/".join(str(x) for x in shares(calls, k)), hard))
        for proto, pre in [("udp", False), ("tcp", False), ("udp", True), ("tcp", True)]:
            key = "%s-%s-%d" % (proto, "shim" if pre else "native", calls)
            k = ks[proto]
            try:
                r = sipp_run(proto, pre, calls, rate, hold, pairs=k)
                res["mem"][key] = dict(r["peak"], peak_calls=r["uac"]["peak"], retrans=r["uac"]["retrans"],
                                       pairs=k, per_pair=r["pairs"])
                log("sipp: %s: peak %.1f MB (%d calls up), descriptors per process up to %d (UAC), %d (UAS)" % (
                    key, r["peak"]["total"] / 1e6, r["uac"]["peak"], max(x["uac_fds"] for x in r["pairs"]),
                    max(x["uas_fds"] for x in r["pairs"])))
                fd_point(res, key.rsplit("-", 1)[0], r["pairs"])
            except RunFailed as e:
                failed("sipp", "memory %s: %s" % (key, e))
    return res

# SIPp's descriptors. A process's need at c calls is modelled as fixed + per_call x c, per case and
# side, fitted through the peak descriptor counts measured at the two largest call counts run so far
# (in full mode the 1000- and 2000-call runs come before 10 000). One call is one socket at the UAC
# (and, with TCP, one connection at the UAS), so per_call is the descriptors one socket costs.
SIPP_CASES = ("udp-native", "tcp-native", "udp-shim", "tcp-shim")
FD_MARGIN = (1000, 0.10)        # headroom over the model: at least 1000 descriptors, or 10 %
FD_BOUND = 8                    # before any measurement: no case has needed more per call (4-5 measured)

def fd_point(res, case, per_pair):
    """Records a run's peak descriptors per process against the calls its pair had up at once."""
    pts = res["fd_points"].setdefault(case, {})
    for x in per_pair:
        if x["peak_calls"] >= 0.95 * x["calls"]:
            old = pts.get(str(x["calls"]), [0, 0])
            pts[str(x["calls"])] = [max(old[0], x["uac_fds"]), max(old[1], x["uas_fds"])]

def fd_fit(res, case):
    pts = sorted((int(n), v) for n, v in res["fd_points"].get(case, {}).items())
    if len(pts) < 2:
        return None
    (n1, f1), (n2, f2) = pts[-2], pts[-1]
    fit = {}
    for j, who in enumerate(("uac", "uas")):
        per = max(0.0, (f2[j] - f1[j]) / (n2 - n1))
        fit[who] = {"per_call": per, "fixed": max(0.0, f2[j] - per * n2)}
    fit["from"] = [n1, n2]
    return fit

def fd_need(fit, who, c):
    m = fit[who]["fixed"] + fit[who]["per_call"] * c
    return m + max(FD_MARGIN[0], FD_MARGIN[1] * m)

def pairs_of(saved, calls, proto):
    """K a plan ran with for proto (a saved run's value: {"udp": K, "tcp": K}, or one K for all)."""
    v = saved.get("pairs", {}).get(str(calls), 1)
    return v.get(proto, 1) if isinstance(v, dict) else v

def sipp_pairs(res, calls, hard):
    """K per transport for a plan ({"udp": K, "tcp": K}): the smallest number of SIPp pairs with
    calls/K each such that every process of that transport's cases, native and shim, fits the hard
    descriptor limit, and the shim's own descriptors a quarter of it (the most the shim takes; a
    connection past it stays plain), native and shim of one transport always with the same K, so the shim's
    ratio to native is fair). Plans that fit even at FD_BOUND per call run as one pair; larger ones
    need the measured model (a short probe measures it when no earlier plan did). None: not run."""
    if calls * FD_BOUND + FD_MARGIN[0] <= hard:
        return {"udp": 1, "tcp": 1}
    fits = {c: fd_fit(res, c) for c in SIPP_CASES}
    if not all(fits.values()):
        sipp_fd_probe(res, [c for c in SIPP_CASES if not fits[c]])
        fits = {c: fd_fit(res, c) for c in SIPP_CASES}
    if not all(fits.values()):
        res["skipped"][str(calls)] = "no descriptor model (the probe runs failed): not run"
        failed("sipp", "memory %d calls: %s" % (calls, res["skipped"][str(calls)]))
        return None
    res["fd_model"] = fits
    ks = {}
    for proto in ("udp", "tcp"):
        cases = [c for c in SIPP_CASES if c.startswith(proto + "-")]
        # the shim's own descriptors (per call: shim minus native) must also stay within the
        # quarter of the limit it allows itself (docs/shim.md "The shim's own descriptors"): past
        # it, sockets and connections stay with the OS, and the run is not carried
        own = lambda who, c: max(0.0, fits[proto + "-shim"][who]["per_call"] - fits[proto + "-native"][who]["per_call"]) * c
        for k in range(1, 65):
            c = -(-calls // k)
            if all(fd_need(fits[case], who, c) <= hard for case in cases for who in ("uac", "uas")) and \
                    all(own(who, c) + FD_MARGIN[0] / 10 <= hard // 4 for who in ("uac", "uas")):
                ks[proto] = k
                break
        else:
            res["skipped"][str(calls)] = "more than 64 SIPp pairs needed for %s at the descriptor limit %d: not run" % (
                proto.upper(), hard)
            failed("sipp", "memory %d calls: %s" % (calls, res["skipped"][str(calls)]))
            return None
    return ks

def sipp_fd_probe(res, cases):
    """Measures the descriptor model with two short runs per case (up to 300 and 600 calls all up at
    once, as many as fit the limit at FD_BOUND per call)."""
    top = max(20, min(600, (res["nofile"] - FD_MARGIN[0]) // FD_BOUND))
    for case in cases:
        proto, mode = case.split("-")
        for calls in (top // 2, top):
            try:
                r = sipp_run(proto, mode == "shim", calls, 500, 2500)
                fd_point(res, case, r["pairs"])
            except RunFailed as e:
                failed("sipp", "descriptor probe %s-%d: %s" % (case, calls, e))
        log("sipp: descriptor probe %s: %s" % (case, fd_fit(res, case)))
