"""scripts/bench-zcopy: where zero-copy starts to pay, the shim's copy path against its zero-copy
path for UD sends by datagram size (udpbench stream, both ends preloaded); medians of alternating
trials and the crossover. Arguments: TRIALS "SIZE SIZE ..." (the shell entry point builds first).
On the soft provider every UD send goes from the program's buffer (DGV_SEND_INLINE, counted in
tx_zcopy) whatever the threshold, so there the script says so and compares nothing; the
threshold chooses between the paths on a device (DGSHIM_PROVIDER=ibverbs, in the VM)."""
import json, os, re, signal, socket, statistics, subprocess, sys, tempfile, time

LIB = os.path.abspath("build/shim/libdgshim.so")
UB = os.path.abspath("build/apps/udpbench")
HOST, SECS = "127.0.0.1", 2
MODES = {"copy": "1048576", "zcopy": "1"}
SUMMARY = re.compile(r"summary:.*")

def env(mode):
    e = dict(os.environ)
    e.update(LD_PRELOAD=LIB, DGSHIM_MODE="ud", DGSHIM_LOG="info", DGSHIM_CONF="/dev/null",
             DGSHIM_ZCOPY_THRESHOLD=MODES[mode])
    return e

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]

def run(mode, size):
    port = free_port()
    with tempfile.TemporaryFile("w+") as so:
        srv = subprocess.Popen([UB, "server", str(port), "-b", HOST, "-R", str(4 << 20)], env=env(mode),
                               stdout=so, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            t = time.monotonic()
            while time.monotonic() - t < 5:
                so.seek(0)
                if "listening on" in so.read():
                    break
                time.sleep(0.02)
            with tempfile.TemporaryFile("w+") as co, tempfile.TemporaryFile("w+") as ce:
                cl = subprocess.Popen([UB, "stream", HOST, str(port), "-s", str(size), "-t", str(SECS), "--json"],
                                      env=env(mode), stdout=co, stderr=ce, stdin=subprocess.DEVNULL)
                _, status, ru = os.wait4(cl.pid, 0)
                cl.returncode = os.waitstatus_to_exitcode(status)
                co.seek(0), ce.seek(0)
                out, err = co.read(), ce.read()
        finally:
            srv.send_signal(signal.SIGINT)
            try:
                srv.wait(timeout=5)
            except subprocess.TimeoutExpired:
                srv.kill()
    if cl.returncode:
        raise SystemExit("bench-zcopy: %s %d B failed (%d): %s" % (mode, size, cl.returncode, err[-300:]))
    j = json.loads(re.search(r"\{.*\}", out).group(0))
    m = SUMMARY.search(err)
    zc = int(re.search(r"tx_zcopy=(\d+)", m.group(0)).group(1)) if m else -1
    # the sender's CPU (user + system) per MB sent: what the copy costs shows here even when
    # the receiver sets the pace
    cpu = (ru.ru_utime + ru.ru_stime) * 1e6 / max(1.0, j["sent"] * size / 1e6)
    return j["recv_MBps"], j["loss_pct"], zc, cpu


def main():
    TRIALS, SIZES = int(sys.argv[1]), [int(x) for x in sys.argv[2].split()]
    print("# bench-zcopy: %d alternating trials, medians, udpbench stream %d s, UD, %s" %
          (TRIALS, SECS, time.strftime("%Y-%m-%d %H:%M")), flush=True)
    res = {(m, s): [] for m in MODES for s in SIZES}
    zcount = {}
    for t in range(TRIALS):
        order = list(MODES) if t % 2 == 0 else list(MODES)[::-1]
        for s in SIZES:
            for m in order:
                mb, loss, zc, cpu = run(m, s)
                res[(m, s)].append((mb, loss, cpu))
                zcount[(m, s)] = zc
        print("trial %d/%d done" % (t + 1, TRIALS), flush=True)
    print("\n%8s %11s %11s %6s %15s %6s %11s %13s" % ("size", "copy MB/s", "zcopy MB/s", "ratio",
          "sender us/MB c/z", "ratio", "loss c/z %", "tx_zcopy c/z"))
    cross = None
    for s in SIZES:
        med = lambda m, i: statistics.median(x[i] for x in res[(m, s)])
        c, z = med("copy", 0), med("zcopy", 0)
        cc, cz = med("copy", 2), med("zcopy", 2)
        ratio = z / c if c else 0
        cpu_ratio = cz / cc if cc else 0
        print("%8d %11.1f %11.1f %6.2f %7.0f/%-7.0f %6.2f %5.2f/%-5.2f %6d/%d" % (s, c, z, ratio, cc, cz, cpu_ratio,
              med("copy", 1), med("zcopy", 1), zcount[("copy", s)], zcount[("zcopy", s)]))
        # zero-copy "ahead": at least as fast and cheaper in sender CPU, from here on
        if ratio >= 0.98 and cpu_ratio < 0.98:
            cross = cross or s
        else:
            cross = None
    if all(zcount[("copy", s)] > 0 for s in SIZES):
        print("\nthe provider sent every datagram from the program's buffer in both modes (the soft "
              "provider's inline sends): no copy path to compare against here")
        sys.exit(0)
    bad = [s for s in SIZES if zcount[("zcopy", s)] <= 0 or zcount[("copy", s)] != 0]
    if bad:
        print("WARNING: the path did not run as configured at sizes %s (tx_zcopy counts)" % bad)
    print("\ncrossover: %s" % ("zero-copy ahead from %d B on" % cross if cross else "zero-copy never stays ahead at these sizes"))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
