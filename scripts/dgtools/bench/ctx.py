"""scripts/bench's run state: options, paths, the log, failed runs, cleanup, ports, the machine,
and dgperf runs. setup() fills the module's names once; every other module reads them as ctx.X."""
import argparse, datetime, json, os, platform, resource, shutil, signal, socket, statistics, subprocess, sys
import tempfile, time

from .. import runner

A = None             # the parsed options
SECTIONS = []
SAVED = None         # --from-json: the saved run
QUICK = False
MODE = "full"
ROOT = PERF = UDPBENCH = LIB = OUT = IMG = TMP = CMDLINE = None
STARTED = None
HOST = "127.0.0.1"
T0 = time.monotonic()
NOFILE = 0
PBASE = 22000
FAILED = []          # "section: what" for every measurement run that failed
NOTES = []           # lines the page shows under "Note" (e.g. sections kept by --merge)
ALL = ("verbs", "loss", "sock", "vlc", "sipp", "twohost", "cost", "soak")
live = []            # processes to kill on exit
restore = []         # (path, value) sysctls to put back


def setup(argv):
    """Parses argv (the options after scripts/bench); exits 2 on a bad option."""
    global A, SECTIONS, SAVED, QUICK, MODE, ROOT, PERF, UDPBENCH, LIB, OUT, IMG, TMP, T0, STARTED, CMDLINE
    global NOFILE, PBASE
    ap = argparse.ArgumentParser(prog="scripts/bench", add_help=False)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--only", default=",".join(ALL))
    ap.add_argument("--merge", action="store_true")   # keep OUT/img/results.json's other sections
    ap.add_argument("--trials", type=int)
    ap.add_argument("--from-json")   # rewrite the page and plots from a run's img/results.json
    try:
        A = ap.parse_args(argv)
    except SystemExit:
        sys.exit(2)
    SECTIONS = [s for s in A.only.split(",") if s]
    for s in SECTIONS:
        if s not in ALL:
            print("bench: unknown section %r (%s)" % (s, ", ".join(ALL)), file=sys.stderr)
            sys.exit(2)
    SAVED = json.load(open(A.from_json)) if A.from_json else None
    QUICK = A.quick if not SAVED else SAVED["mode"] == "quick"
    MODE = "quick" if QUICK else "full"
    ROOT = os.getcwd()
    PERF = os.path.join(ROOT, "build/apps/dgperf")
    UDPBENCH = os.path.join(ROOT, "build/apps/udpbench")
    LIB = os.path.join(ROOT, "build/shim/libdgshim.so")
    OUT = os.path.abspath(A.out)
    IMG = os.path.join(OUT, "img")
    os.makedirs(IMG, exist_ok=True)
    TMP = tempfile.mkdtemp(prefix="bench.")
    T0 = time.monotonic()
    STARTED = datetime.datetime.now(datetime.timezone.utc)
    CMDLINE = "./scripts/bench" + "".join(" " + a for a in argv)
    if SAVED:
        CMDLINE = SAVED["command"]
        STARTED = datetime.datetime.fromisoformat(SAVED["started"])
    runner.trap_term()
    NOFILE = raise_nofile()
    PBASE = int(os.environ.get("BENCH_PORT", "22000"))


def log(msg):
    print("[%5.0f s] %s" % (time.monotonic() - T0, msg), flush=True)


def cleanup():
    for p in live:
        try:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL) if getattr(p, "_pg", False) else p.kill()
                p.wait()
        except (ProcessLookupError, OSError):
            pass
    for path, val in restore:
        try:
            open(path, "w").write(val)
        except OSError:
            pass
    if TMP:
        shutil.rmtree(TMP, ignore_errors=True)


class RunFailed(Exception):
    pass


def failed(section, what):
    FAILED.append("%s: %s" % (section, what))
    log("FAILED: %s: %s" % (section, what))


def raise_nofile():
    """SIPp at 10 000 calls with one socket per call: under the shim a taken UDP socket holds 2
    descriptors (the program's socket, the CQ's eventfd) before issue 14, none extra now; a carried
    TCP connection 3 (socket, the RC QP's private duplicate, the CQ's eventfd, which its CM events
    share) before, 2 now (the QP runs on the program's socket), measured by counting
    /proc/PID/fd; the bench measures them again (section 5) and splits the calls over as many SIPp
    pairs as the hard limit needs. Raises the soft limit as far as allowed; returns it."""
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (200000, 200000))
    except (ValueError, OSError):
        _hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (_hard, _hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ---------------------------------------------------------------- ports
_pi = [0]
def port_free(p):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        s = socket.socket(socket.AF_INET, kind)
        try:
            if kind == socket.SOCK_STREAM:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((HOST, p))
        except OSError:
            return False
        finally:
            s.close()
    return True

def next_port(span=1):
    """A port (and span-1 after it) free for TCP and UDP, cycling through PBASE..PBASE+399."""
    for _ in range(400):
        _pi[0] = (_pi[0] + span) % 400
        p = PBASE + _pi[0]
        if p + span <= PBASE + 400 and all(port_free(p + i) for i in range(span)):
            return p
    raise RunFailed("no free port in %d..%d" % (PBASE, PBASE + 399))

# ---------------------------------------------------------------- machine
def machine():
    cpu = "?"
    try:
        for l in open("/proc/cpuinfo"):
            if l.startswith("model name"):
                cpu = l.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    for l in open("/proc/meminfo"):
        if l.startswith("MemTotal"):
            mem = int(l.split()[1]) // 1024 // 1024
    deb = open("/etc/debian_version").read().strip() if os.path.exists("/etc/debian_version") else "?"
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    ver = lambda cmd: (subprocess.run(cmd, capture_output=True, text=True).stdout or "").strip().splitlines()
    vlc = ver(["dpkg-query", "-W", "-f", "${Version}", "vlc-bin"])
    sipp = ver(["dpkg-query", "-W", "-f", "${Version}", "sip-tester"])
    sp = ver(["dpkg-query", "-W", "-f", "${Version}", "sockperf"])
    ip3 = ver(["dpkg-query", "-W", "-f", "${Version}", "iperf3"])
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": mem, "kernel": platform.release(),
            "debian": deb, "git": git + ("+local changes" if dirty else ""),
            "vlc": vlc[0] if vlc else "?", "sipp": sipp[0] if sipp else "?",
            "sockperf": sp[0] if sp else "?", "iperf3": ip3[0] if ip3 else "?",
            "load": open("/proc/loadavg").read().split()[:3]}

# ---------------------------------------------------------------- dgperf
def dgperf(args, timeout=300):
    """One dgperf server + client pair on loopback; the client's --detail JSON rows."""
    port = next_port()
    p = ["-p", str(port), "--detail"] + args
    err = os.path.join(TMP, "dgperf-srv.err")
    with open(err, "w") as e:
        srv = subprocess.Popen([PERF] + p, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=e)
    live.append(srv)
    time.sleep(0.12)
    try:
        try:
            out = subprocess.run([PERF] + p + [HOST], stdin=subprocess.DEVNULL, capture_output=True,
                                 text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RunFailed("dgperf %s: client timed out after %d s" % (" ".join(args), timeout))
    finally:
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
        live.remove(srv)
    if out.returncode or srv.returncode:
        why = (out.stderr.strip().splitlines() or [""])[-1]
        serr = open(err).read().strip().splitlines()
        raise RunFailed("dgperf %s: client exit %d, server exit %s: %s %s" % (
            " ".join(args), out.returncode, srv.returncode, why, ("| server: " + serr[-1]) if serr else ""))
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    if not rows:
        raise RunFailed("dgperf %s: no rows" % " ".join(args))
    return rows

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
