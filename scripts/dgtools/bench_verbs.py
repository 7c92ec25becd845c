"""scripts/bench-verbs: the soft-RNIC issue's targets, dgperf against plain UDP and plain TCP
in the same run, medians of alternating trials; one line per target. Arguments: TRIALS; the
environment: DGPERF, BENCH_PORT, BENCH_PORTS (see the shell entry point)."""
import json, os, statistics, subprocess, sys, time

TRIALS = PERF = BASE = SPAN = runs = None   # main()


class Failed(Exception):
    def __init__(self, args, code, err):
        super().__init__(f"dgperf {' '.join(args)} failed (exit {code}): {err}")
        self.code = code

def run(args):
    """One server+client run; returns the client's JSON rows."""
    runs[0] += 1
    port = BASE + runs[0] % SPAN
    p = ["-p", str(port), "--json"] + args
    srv = subprocess.Popen([PERF] + p, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    try:
        out = subprocess.run([PERF] + p + ["127.0.0.1"], capture_output=True, text=True, timeout=300)
    finally:
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
    if out.returncode:
        raise Failed(args, out.returncode, out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "")
    return [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]

def med(args, key):
    return statistics.median(run(args)[0][key] for _ in range(TRIALS))

def alt(a_args, b_args, key):
    a, b = [], []
    for _ in range(TRIALS):
        a.append(run(a_args)[0][key])
        b.append(run(b_args)[0][key])
    return statistics.median(a), statistics.median(b)


def main():
    global TRIALS, PERF, BASE, SPAN, runs
    TRIALS = int(sys.argv[1])
    PERF = os.environ["DGPERF"]
    BASE = int(os.environ.get("BENCH_PORT", "18900"))
    SPAN = int(os.environ.get("BENCH_PORTS", "100"))
    runs = [0]
    print(f"# dgperf targets, {TRIALS} alternating trials each, medians; {time.strftime('%Y-%m-%d %H:%M')}")
    lat = {k: [] for k in ("raw", "conn", "ud")}
    for _ in range(TRIALS):
        lat["raw"].append(run(["--raw-udp", "-t", "send_lat", "-s", "64", "-n", "20000"])[0]["t_typical_us"])
        lat["conn"].append(run(["--raw-connected", "-t", "send_lat", "-s", "64", "-n", "20000"])[0]["t_typical_us"])
        lat["ud"].append(run(["-c", "UD", "-t", "send_lat", "-s", "64", "-n", "20000"])[0]["t_typical_us"])
    raw, conn, ud_lat = (statistics.median(lat[k]) for k in ("raw", "conn", "ud"))
    print(f"UD send_lat 64 B: {ud_lat:.2f} us vs raw UDP (sendto) {raw:.2f} us -> {ud_lat/raw:.2f}x (target <= 1.3x); "
          f"vs connected UDP {conn:.2f} us -> {ud_lat/conn:.2f}x")
    for size in ["512K", "1M", "2M", "4M"]:
        raw, ud = alt(["--raw-udp", "-t", "wr_bw", "-s", size],
                      ["-c", "UD", "-t", "wr_bw", "-s", size], "bw_MBps")
        print(f"UD wr_bw {size}: {ud:.0f} MB/s vs raw UDP {raw:.0f} MB/s -> {100*ud/raw:.0f}% (target >= 80%)")
    vf = med(["-c", "UD", "-t", "wr_bw", "-s", "1M", "--loss", "1"], "valid_fraction")
    print(f"UD wr_bw 1 MiB, 1% loss, MTU segments: {100*vf:.2f}% of bytes valid (target >= 98%)")
    base, lossy = alt(["-c", "RD", "-t", "send_bw", "-s", "64K"],
                      ["-c", "RD", "-t", "send_bw", "-s", "64K", "--loss", "1"], "bw_MBps")
    print(f"RD send_bw 64 KiB: {lossy:.0f} MB/s at 1% loss vs {base:.0f} MB/s lossless -> {100*lossy/base:.0f}% (target >= 50%)")
    five = med(["-c", "RD", "-t", "send_bw", "-s", "64K", "--loss", "5"], "bw_MBps")
    print(f"RD send_bw 64 KiB at 5% loss: {five:.0f} MB/s, every message delivered (dgperf fails otherwise)")

    # RC (standard iWARP over TCP) against plain TCP, and paper 000's datagram-vs-connection
    # comparisons. A provider without RC prints why and skips these rows.
    try:
        run(["-c", "RC", "-t", "send_lat", "-s", "64", "-n", "100"])
    except Failed as e:
        print(f"RC rows skipped: {e}")
        sys.exit(0)
    rc_lat, tcp_lat = alt(["-c", "RC", "-t", "send_lat", "-s", "64", "-n", "20000"],
                          ["--raw-tcp", "-t", "send_lat", "-s", "64", "-n", "20000"], "t_typical_us")
    print(f"RC send_lat 64 B: {rc_lat:.2f} us vs plain TCP ping-pong {tcp_lat:.2f} us -> {rc_lat/tcp_lat:.2f}x (target <= 1.3x)")
    rc_bw, tcp_bw = alt(["-c", "RC", "-t", "send_bw", "-s", "64K", "-n", "20000"],
                        ["--raw-tcp", "-t", "send_bw", "-s", "64K", "-n", "20000"], "bw_MBps")
    print(f"RC send_bw 64 KiB: {rc_bw:.0f} MB/s vs plain TCP stream {tcp_bw:.0f} MB/s -> {100*rc_bw/tcp_bw:.0f}%")
    ud, rc = alt(["-c", "UD", "-t", "send_lat", "-s", "64", "-n", "20000"],
                 ["-c", "RC", "-t", "send_lat", "-s", "64", "-n", "20000"], "t_typical_us")
    print(f"paper 000: UD send_lat 64 B {ud:.2f} us vs RC send_lat {rc:.2f} us -> UD {100*(rc-ud)/rc:+.1f}% faster "
          f"(paper: 18.1% for messages up to 2 KB)")
    ud, rc = alt(["-c", "UD", "-t", "wr_lat", "-s", "64", "-n", "20000"],
                 ["-c", "RC", "-t", "write_lat", "-s", "64", "-n", "20000"], "t_typical_us")
    print(f"paper 000: UD wr_lat 64 B {ud:.2f} us vs RC write_lat {rc:.2f} us -> UD {100*(rc-ud)/rc:+.1f}% faster "
          f"(paper: 24.4%)")
    ud, rc = alt(["-c", "UD", "-t", "wr_bw", "-s", "512K"],
                 ["-c", "RC", "-t", "write_bw", "-s", "512K"], "bw_MBps")
    print(f"paper 000: UD wr_bw 512 KiB {ud:.0f} MB/s vs RC write_bw {rc:.0f} MB/s -> {ud/rc:.2f}x "
          f"(paper: a 256% advantage)")


if __name__ == "__main__":
    main()
