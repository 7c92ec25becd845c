"""scripts/bench: background and foreground programs, with or without the shim preloaded, and
the shim's exit summaries in their output."""
import os, re, signal, subprocess, time

from . import ctx
from .ctx import RunFailed

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SUMMARY = re.compile(r"dgshim\[\d+\]: info: summary:(.*)")

def shim_env(preload, extra=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("DGSHIM_") and k != "LD_PRELOAD"}
    if preload:
        e.update({"LD_PRELOAD": ctx.LIB, "DGSHIM_LOG": "info", "DGSHIM_CONF": "/dev/null"})
    if extra:
        e.update(extra)
    return e

def placed(end, preload, cmd, extra=None):
    """cmd and its environment for one end of a two-host run: end is (command prefix, e.g. ip netns
    exec NS, and IP) or None (this host). With a prefix the shim's variables go after it through
    env(1), so the prefix program itself is not preloaded. Returns (argv, environment)."""
    if not end or not end[0]:
        return list(cmd), shim_env(preload, extra)
    clean = shim_env(False)
    add = ["%s=%s" % kv for kv in sorted(shim_env(preload, extra).items()) if kv not in clean.items()]
    return list(end[0]) + (["env"] + add if add else []) + list(cmd), clean

def reap(p, timeout):
    """Waits up to timeout s for the Popen p and reaps it with wait4 (p.returncode set). Returns the
    CPU seconds it used (user + sys), or None when it did not end in time (left running) or was
    reaped before (poll, wait: no usage left to read)."""
    end = time.monotonic() + timeout
    while True:
        if p.returncode is not None:
            return None
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            return ru.ru_utime + ru.ru_stime
        if time.monotonic() > end:
            return None
        time.sleep(0.01)

def summaries(text):
    """The shim's exit summaries in a log, as dicts of counters."""
    return [dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", m)) for m in SUMMARY.findall(ANSI.sub("", text))]

def ssum(text, key):
    return sum(s.get(key, 0) for s in summaries(text))

_bgn = [0]
class Bg:
    """A background program with its output in a file; stop() sends SIGINT (then SIGKILL)."""
    def __init__(self, cmd, env, name, cwd=None):
        _bgn[0] += 1
        self.path = os.path.join(ctx.TMP, "%s.%d.log" % (name, _bgn[0]))
        self.f = open(self.path, "w")
        self.p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=self.f,
                                  stderr=subprocess.STDOUT, cwd=cwd)
        ctx.live.append(self.p)
        self.name = name

    def text(self):
        if not self.f.closed:
            self.f.flush()
        return ANSI.sub("", open(self.path, errors="replace").read())

    def stop(self, sig=signal.SIGINT, wait=5):
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        if self.p in ctx.live:
            ctx.live.remove(self.p)
        self.f.close()
        return self.text()

def listening(port, proto, pid=None):
    """Whether a socket listens on port (TCP) or is bound to it (UDP), in this network namespace or
    in the one of process pid."""
    pat = ":%04X " % port
    d = "/proc/%d/net/" % pid if pid else "/proc/net/"
    files = (d + "tcp", d + "tcp6") if proto == "tcp" else (d + "udp", d + "udp6")
    for f in files:
        try:
            for line in open(f).readlines()[1:]:
                w = line.split()
                if (w[1] + " ").endswith(pat) and (proto == "udp" or w[3] == "0A"):
                    return True
        except OSError:
            pass
    return False

def wait_listen(port, proto, proc, secs=10, ns=False):
    """Waits for proc (a Bg) to listen on port; ns: look in proc's own network namespace."""
    end = time.monotonic() + secs
    while time.monotonic() < end:
        if listening(port, proto, proc.p.pid if ns else None):
            return
        if proc.p.poll() is not None:
            raise RunFailed("%s exited at start (%d): %s" % (proc.name, proc.p.returncode, proc.text()[-300:].strip()))
        time.sleep(0.02)
    raise RunFailed("%s not listening on %s port %d after %d s" % (proc.name, proto.upper(), port, secs))

def fg(cmd, env, timeout):
    try:
        r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RunFailed("%s timed out after %d s" % (" ".join(cmd[:3]), timeout))
    if r.returncode:
        raise RunFailed("%s exited %d: %s" % (" ".join(cmd), r.returncode, (r.stderr or r.stdout).strip()[-300:]))
    return ANSI.sub("", r.stdout), ANSI.sub("", r.stderr)

def grab(pat, text, what):
    m = re.search(pat, text)
    if not m:
        raise RunFailed("no %s in output: %s" % (what, text[-300:].strip()))
    return m

def carried(label, text, key, need=1):
    """The shim's exit summaries must show the traffic went over iWARP (key = tx_framed/rc_conns)."""
    v = ssum(text, key)
    if not summaries(text):
        raise RunFailed("%s: no shim exit summary (shim not loaded?)" % label)
    if v < need:
        raise RunFailed("%s: %s=%d: traffic not carried over iWARP (summaries: %s)" % (
            label, key, v, "; ".join(SUMMARY.findall(ANSI.sub("", text)))[:300]))
    return v
