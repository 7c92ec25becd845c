"""scripts/bench section 4: VLC, UDP over datagram-iWARP against HTTP over RC, and against
native UDP."""
import hashlib, os, shutil, signal, subprocess, time

from . import ctx
from .ctx import RunFailed, failed, log, med, next_port
from .procs import Bg, carried, listening, placed, reap, ssum, wait_listen

VLCOPTS = ["-I", "dummy", "--no-dbus", "--no-media-library", "--no-metadata-network-access", "--no-lua",
           "-A", "none", "--no-video", "--no-stats", "--verbose=1"]

def make_media(vdir, secs):
    raw = os.path.join(vdir, "raw.ts")   # the media's own directory: sections 4 and 6 each make one
    media = os.path.join(vdir, "media.ts")
    r = subprocess.run(["ffmpeg", "-y", "-hide_banner", "-loglevel", "error", "-nostdin",
                        "-f", "lavfi", "-i", "testsrc=size=640x480:rate=25", "-f", "lavfi",
                        "-i", "sine=frequency=440:sample_rate=48000", "-t", str(secs), "-map", "0:v", "-map", "1:a",
                        "-c:v", "mpeg2video", "-b:v", "6000k", "-minrate", "6000k", "-maxrate", "6000k", "-bufsize", "2000k",
                        "-c:a", "mp2", "-b:a", "128k", "-f", "mpegts", raw],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if r.returncode:
        raise RunFailed("ffmpeg: " + r.stderr[-300:])
    data = open(raw, "rb").read()
    unit = 770048   # lcm(188, 16384): demuxdump sends whole 16 KiB blocks (see vlc_udp.sh)
    null = bytes([0x47, 0x1F, 0xFF, 0x10]) + b"\xff" * 184
    size = -(-len(data) // unit) * unit
    open(media, "wb").write(data + null * ((size - len(data)) // 188))
    os.chmod(media, 0o644)
    return media

FEED = r'''
import os, sys, time, signal
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
data = open(sys.argv[1], "rb").read()
out = sys.stdout.buffer
out.write(data[:1880]); out.flush()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.005)
open(sys.argv[3], "w").write("%.6f" % time.monotonic())
out.write(data[1880:]); out.flush()
time.sleep(float(sys.argv[4]))
'''

def vlc_case(vdir, media, proto, pre, thresholds, where=None):
    """One VLC sender + one VLC receiver (UDP, or HTTP: VLC's http output and a VLC client).
    The feed gives the sender 1880 bytes (probe, less than a block: nothing is sent), waits until
    the receiver is ready, then writes the whole rest of the file at once (VLC reads it as fast as
    it can). Returns the seconds from that write until the receiver's dump held each threshold.
    where: None (both on this host, ctx.HOST), or {"send": END, "recv": END} with END = (command
    prefix, IP) of the host each runs on (procs.placed); the sender (HTTP: the server) targets
    (binds) its IPs and the result also has the dump's md5, both processes' CPU seconds (wait4)
    and both exit summaries' counters."""
    asnobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "env", "HOME=" + vdir + "/home"]
    port = next_port(2)
    tag = "%s-%s-%d" % (proto, "shim" if pre else "native", port)
    dump = os.path.join(vdir, tag + ".ts")
    go, t0f = os.path.join(vdir, tag + ".go"), os.path.join(vdir, tag + ".t0")
    rip = sip = ctx.HOST
    if where:
        rip, sip = where["recv"][1], where["send"][1]
    at = lambda who, cmd: placed(where[who] if where else None, pre, cmd)
    feedcmd = ["python3", "-c", FEED, media, go, t0f, "1.5"]
    if proto == "udp":
        recv = Bg(*at("recv", asnobody + ["/usr/bin/vlc"] + VLCOPTS + ["udp://@%s:%d" % (rip, port), "--demux=dump",
                  "--demuxdump-file=" + dump]), "vlc-recv", cwd=vdir)
        wait_listen(port, "udp", recv, 20, ns=bool(where))
        sender_out = ["--demuxdump-access=udp", "--demuxdump-file=%s:%d" % (rip, port), "--mtu=1316"]
    else:
        sender_out = ["--demuxdump-access=http", "--demuxdump-file=%s:%d/x.ts" % (sip, port)]
    feed = subprocess.Popen(feedcmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    ctx.live.append(feed)
    sf = open(os.path.join(ctx.TMP, tag + ".send.log"), "w")
    scmd, senv = at("send", asnobody + ["/usr/bin/vlc"] + VLCOPTS + ["-", "--demux=dump"] + sender_out + ["vlc://quit"])
    sp = subprocess.Popen(scmd, env=senv, stdin=feed.stdout, stdout=sf, stderr=subprocess.STDOUT, cwd=vdir)
    feed.stdout.close()
    ctx.live.append(sp)
    try:
        if proto == "http":
            end = time.monotonic() + 20
            while not listening(port, "tcp", sp.pid if where else None):
                if time.monotonic() > end or sp.poll() is not None:
                    raise RunFailed("VLC http server not listening")
                time.sleep(0.02)
            recv = Bg(*at("recv", asnobody + ["/usr/bin/vlc"] + VLCOPTS + ["--verbose=2", "http://%s:%d/x.ts" % (sip, port),
                      "--demux=dump", "--demuxdump-file=" + dump, "vlc://quit"]), "vlc-recv", cwd=vdir)
            end = time.monotonic() + 20
            while "incoming response" not in recv.text():
                if time.monotonic() > end or recv.p.poll() is not None:
                    raise RunFailed("VLC http client got no answer: " + recv.text()[-300:])
                time.sleep(0.01)
        else:
            time.sleep(0.3)
        open(go, "w").close()
        size = os.path.getsize(media)
        ts = {}
        deadline = time.monotonic() + 30
        last, last_change = -1, time.monotonic()
        while time.monotonic() < deadline:
            try:
                n = os.path.getsize(dump)
            except OSError:
                n = 0
            now = time.monotonic()
            for th in thresholds:
                if th not in ts and n >= th:
                    ts[th] = now
            if n != last:
                last, last_change = n, now
            if n >= size or (os.path.exists(t0f) and now - last_change > 1.0 and n > 0):
                break
            time.sleep(0.001)
        t0 = float(open(t0f).read())
        cpu = {}
        if where:
            cpu["send"] = reap(sp, 20)
            if sp.returncode is None:
                raise RunFailed("the VLC sender did not end within 20 s of the stream's end")
        else:
            sp.wait(timeout=20)
        ctx.live.remove(sp)
        sf.close()
        if where:
            if proto == "udp":
                recv.p.send_signal(signal.SIGTERM)
            cpu["recv"] = reap(recv.p, 10)
            rtext = recv.stop(signal.SIGTERM)
        elif proto == "udp":
            rtext = recv.stop(signal.SIGTERM)
        else:
            try:
                recv.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            rtext = recv.stop(signal.SIGTERM)
    finally:
        if sp.poll() is None:
            sp.kill(); sp.wait()
        if sp in ctx.live:
            ctx.live.remove(sp)
        if feed.poll() is None:
            feed.kill()
        feed.wait()
        ctx.live.remove(feed)
    stext = open(os.path.join(ctx.TMP, tag + ".send.log"), errors="replace").read()
    if pre:
        if proto == "udp":
            carried("VLC UDP sender", stext, "tx_framed")
            carried("VLC UDP receiver", rtext, "rx_framed")
        else:
            carried("VLC HTTP server", stext, "rc_conns")
            carried("VLC HTTP client", rtext, "rc_conns")
    got = os.path.getsize(dump) if os.path.exists(dump) else 0
    if proto == "http" and got < os.path.getsize(media):
        raise RunFailed("HTTP client received only %d of %d bytes (TCP loses nothing: VLC's live http output "
                        "dropped the client)" % (got, os.path.getsize(media)))
    out = {"t": {str(th): (ts[th] - t0) if th in ts else None for th in thresholds}, "bytes": got, "size": size}
    if where:
        out["md5"] = hashlib.md5(open(dump, "rb").read()).hexdigest() if got else None
        out["cpu"] = cpu
        out["counters"] = {who: {k: ssum(text, k) for k in ("tx_framed", "tx_plain", "rx_framed", "rc_conns", "rc_plain")}
                           for who, text in (("send", stext), ("recv", rtext))}
    return out

def vlc_dir(name):
    """A directory under ctx.TMP that VLC (run as nobody) can write, with a home; returns it."""
    vdir = os.path.join(ctx.TMP, name)
    os.makedirs(vdir + "/home")
    os.chmod(ctx.TMP, 0o755)
    shutil.chown(vdir, "nobody", "nogroup")
    shutil.chown(vdir + "/home", "nobody", "nogroup")
    return vdir

def roomy_rmem():
    """The receiving VLC does not size its socket buffer: give the default room for a burst (a
    host-wide setting, put back at the end)."""
    rd = "/proc/sys/net/core/rmem_default"
    old = open(rd).read().strip()
    if int(old) < (8 << 20):
        ctx.restore.append((rd, old))
        open(rd, "w").write(str(8 << 20))

def vlc():
    if os.getuid() != 0:
        raise RunFailed("VLC runs as nobody through setpriv: run the bench as root")
    trials = ctx.A.trials or (1 if ctx.QUICK else 5)
    vdir = vlc_dir("vlc")
    # 4 s (3.7 MiB): VLC's http output is a live stream with a bounded buffer; fed a larger file at
    # once (10 s, 8.1 MiB) it dropped its client after ~26 KB in 8 of 9 runs.
    media = make_media(vdir, 4)
    size = os.path.getsize(media)
    thresholds = [1 << 20, 2 << 20, size]
    roomy_rmem()
    cases = [("udp", False), ("udp", True), ("http", False), ("http", True)]
    res = {"%s-%s" % (p, "shim" if s else "native"): [] for p, s in cases}
    for t in range(trials):
        for proto, pre in (cases if t % 2 == 0 else cases[::-1]):
            key = "%s-%s" % (proto, "shim" if pre else "native")
            try:
                res[key].append(vlc_case(vdir, media, proto, pre, thresholds))
            except RunFailed as e:
                failed("vlc", "%s: %s" % (key, e))
        log("vlc: trial %d/%d done" % (t + 1, trials))
    out = {"trials": trials, "size": size, "thresholds": thresholds, "runs": res, "med": {}}
    for key, runs in res.items():
        out["med"][key] = {str(th): med([r["t"][str(th)] for r in runs]) for th in thresholds}
        out["med"][key]["complete"] = sum(1 for r in runs if r["bytes"] >= size)
        out["med"][key]["bytes"] = med([r["bytes"] for r in runs])
    return out
