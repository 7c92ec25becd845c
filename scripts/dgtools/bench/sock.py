"""scripts/bench section 3: the shim against native UDP and TCP with unmodified programs
(sockperf, iperf3)."""
import json, os, subprocess

from . import ctx
from .ctx import RunFailed, failed, log, med, next_port
from .procs import Bg, carried, fg, grab, shim_env, wait_listen

def sp_pingpong(pre, size, secs, tcp, cpus):
    """sockperf ping-pong, server and client pinned to CPUs cpus (unpinned, the figure flips between
    the one-core and the two-core regime on these machines)."""
    port = next_port()
    t = ["--tcp"] if tcp else []
    pin = lambda c: ["taskset", "-c", str(min(c, (os.cpu_count() or 1) - 1))]
    srv = Bg(pin(cpus[0]) + ["sockperf", "server", "-i", ctx.HOST, "-p", str(port)] + t, shim_env(pre), "sockperf-srv")
    wait_listen(port, "tcp" if tcp else "udp", srv)
    try:
        out, err = fg(pin(cpus[1]) + ["sockperf", "ping-pong", "-i", ctx.HOST, "-p", str(port), "-m", str(size),
                                      "-t", str(secs)] + t, shim_env(pre), secs + 30)
    finally:
        stext = srv.stop()
    if pre:
        carried("sockperf %s server" % ("TCP" if tcp else "UDP"), stext, "rc_conns" if tcp else "rx_framed")
    return {"p50": float(grab(r"percentile 50\.000 =\s*([\d.]+)", out, "median")[1]),
            "min": float(grab(r"<MIN> observation =\s*([\d.]+)", out, "min")[1]),
            "p99": float(grab(r"percentile 99\.000 =\s*([\d.]+)", out, "p99")[1])}

def sp_throughput(pre, size, secs):
    port = next_port()
    srv = Bg(["sockperf", "server", "-i", ctx.HOST, "-p", str(port), "--buffer-size", str(4 << 20)],
             shim_env(pre), "sockperf-srv")
    wait_listen(port, "udp", srv)
    try:
        out, err = fg(["sockperf", "throughput", "-i", ctx.HOST, "-p", str(port), "-m", str(size), "-t", str(secs)],
                      shim_env(pre), secs + 30)
    finally:
        stext = srv.stop()
    if pre:
        carried("sockperf UDP throughput server", stext, "rx_framed")
    m = grab(r"Total of (\d+) messages sent in ([\d.]+) sec", out, "messages sent")
    got = int(grab(r"Total (\d+) messages received", stext, "server's received count")[1])
    rate = got / float(m[2])
    return {"rate": rate, "MBps": rate * size / 1e6, "loss": 100.0 * (int(m[1]) - got) / max(1, int(m[1]))}

def iperf_tcp(pre, secs):
    port = next_port()
    srv = Bg(["iperf3", "-s", "-1", "-B", ctx.HOST, "-p", str(port)], shim_env(pre), "iperf3-srv")
    wait_listen(port, "tcp", srv)
    try:
        out, err = fg(["iperf3", "-c", ctx.HOST, "-p", str(port), "-t", str(secs), "-J"], shim_env(pre), secs + 30)
    finally:
        try:
            srv.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        stext = srv.stop()
    if pre:
        carried("iperf3 server", stext, "rc_conns")
    j = json.loads(out)
    return {"Gbps": j["end"]["sum_received"]["bits_per_second"] / 1e9}

SOCK = [  # key, label, function, args, figure, unit, higher is better
    ("udp_lat", "UDP ping-pong 64 B (sockperf, 2 cores), median half RTT", sp_pingpong, (64, None, False, (0, 1)), "p50", "us", False),
    ("udp_lat_min", "UDP ping-pong 64 B (sockperf, 2 cores), minimum", None, None, "min", "us", False),
    ("udp_lat1c", "UDP ping-pong 64 B (sockperf, 1 core), median half RTT", sp_pingpong, (64, None, False, (0, 0)), "p50", "us", False),
    ("udp_lat1316", "UDP ping-pong 1316 B (sockperf, 2 cores), median half RTT", sp_pingpong, (1316, None, False, (0, 1)), "p50", "us", False),
    ("udp_rate64", "UDP stream 64 B (sockperf throughput), datagrams/s received", sp_throughput, (64, None), "rate", "1/s", True),
    ("udp_rate1316", "UDP stream 1316 B (sockperf throughput), datagrams/s received", sp_throughput, (1316, None), "rate", "1/s", True),
    ("udp_tp16k", "UDP stream 16 KiB (sockperf throughput), MB/s received", sp_throughput, (16384, None), "MBps", "MB/s", True),
    ("tcp_lat", "TCP ping-pong 64 B (sockperf --tcp, 2 cores), median half RTT", sp_pingpong, (64, None, True, (0, 1)), "p50", "us", False),
    ("tcp_lat_min", "TCP ping-pong 64 B (sockperf --tcp, 2 cores), minimum", None, None, "min", "us", False),
    ("tcp_lat1c", "TCP ping-pong 64 B (sockperf --tcp, 1 core), median half RTT", sp_pingpong, (64, None, True, (0, 0)), "p50", "us", False),
    ("tcp_tp", "TCP stream (iperf3, 128 KiB writes), Gbit/s", iperf_tcp, (None,), "Gbps", "Gbit/s", True),
]

def sock():
    trials = ctx.A.trials or (1 if ctx.QUICK else 3)
    secs = 1 if ctx.QUICK else 3
    res = {k: {"native": [], "shim": []} for k, *_ in SOCK}
    for t in range(trials):
        for key, label, fn, args, fig, unit, _ in SOCK:
            if fn is None:
                continue
            a = tuple(secs if x is None else x for x in args)
            for side in (("native", "shim") if t % 2 == 0 else ("shim", "native")):
                try:
                    r = fn(side == "shim", *a)
                except RunFailed as e:
                    failed("sock", "%s, %s: %s" % (label, side, e))
                    continue
                res[key][side].append(r[fig])
                if key in ("udp_lat", "tcp_lat"):
                    res[key + "_min"][side].append(r["min"])
        log("sock: trial %d/%d done" % (t + 1, trials))
    return {"trials": trials, "secs": secs,
            "data": {k: {s: med(v[s]) for s in v} for k, v in res.items()},
            "all": res}
