"""scripts/bench sections 1 and 2: verbs latency and bandwidth against message size (UD, RD, RC
and the plain UDP/TCP baselines), and UD/RD under injected packet loss; dgperf runs."""
from . import ctx
from .ctx import RunFailed, dgperf, failed, log, med

SEG64K = ["--seg", "65507"]
VERBS_LAT = [  # key, label, dgperf args, style
    ("ud_send", "UD send/recv", ["-c", "UD", "-t", "send_lat"] + SEG64K, "C0-o"),
    ("ud_wr", "UD Write-Record", ["-c", "UD", "-t", "wr_lat"] + SEG64K, "C1-s"),
    ("rd_send", "RD send/recv", ["-c", "RD", "-t", "send_lat"] + SEG64K, "C4-^"),
    ("rc_send", "RC send/recv", ["-c", "RC", "-t", "send_lat"], "C3-o"),
    ("rc_write", "RC Write", ["-c", "RC", "-t", "write_lat"], "C2-s"),
    ("ud_send_mtu", "UD send/recv, 1472-B datagrams", ["-c", "UD", "-t", "send_lat"], "C0:."),
    ("ud_wr_mtu", "UD Write-Record, 1472-B datagrams", ["-c", "UD", "-t", "wr_lat"], "C1:."),
    ("raw_udp", "plain UDP (baseline)", ["--raw-udp", "-t", "send_lat"] + SEG64K, "k--"),
    ("raw_tcp", "plain TCP (baseline)", ["--raw-tcp", "-t", "send_lat"], "k:"),
]
VERBS_BW = [
    ("ud_send", "UD send/recv", ["-c", "UD", "-t", "send_bw"] + SEG64K, "C0-o"),
    ("ud_wr", "UD Write-Record", ["-c", "UD", "-t", "wr_bw"] + SEG64K, "C1-s"),
    ("rd_send", "RD send/recv", ["-c", "RD", "-t", "send_bw"] + SEG64K, "C4-^"),
    ("rc_send", "RC send/recv", ["-c", "RC", "-t", "send_bw"], "C3-o"),
    ("rc_write", "RC Write", ["-c", "RC", "-t", "write_bw"], "C2-s"),
    ("ud_send_mtu", "UD send/recv, 1472-B datagrams", ["-c", "UD", "-t", "send_bw"], "C0:."),
    ("ud_wr_mtu", "UD Write-Record, 1472-B datagrams", ["-c", "UD", "-t", "wr_bw"], "C1:."),
    ("raw_udp", "plain UDP (baseline)", ["--raw-udp", "-t", "send_bw"] + SEG64K, "k--"),
    ("raw_tcp", "plain TCP (baseline)", ["--raw-tcp", "-t", "send_bw"], "k:"),
]

def verbs():
    trials = ctx.A.trials or (1 if ctx.QUICK else 5)
    n_lat = ["-n", "300"] if ctx.QUICK else ["-n", "2000"]
    n_bw = ["-n", "1000"] if ctx.QUICK else ["-n", "10000"]
    res = {"lat": {k: {} for k, *_ in VERBS_LAT}, "bw": {k: {} for k, *_ in VERBS_BW},
           "trials": trials, "iters": {"lat": n_lat[1], "bw": n_bw[1]}}
    for t in range(trials):
        for kind, table, n in (("lat", VERBS_LAT, n_lat), ("bw", VERBS_BW, n_bw)):
            order = table if t % 2 == 0 else table[::-1]
            for key, label, args, _ in order:
                try:
                    rows = dgperf(args + ["-a"] + n)
                except RunFailed as e:
                    failed("verbs", str(e))
                    continue
                for r in rows:
                    v = r["t_typical_us"] if kind == "lat" else r["bw_MBps"]
                    res[kind][key].setdefault(str(r["size"]), []).append(v)
        log("verbs: trial %d/%d done" % (t + 1, trials))
    for kind in ("lat", "bw"):
        for key in res[kind]:
            res[kind][key] = {s: med(v) for s, v in res[kind][key].items()}
    return res

# ---------------------------------------------------------------- section 2: loss
LOSS_TESTS = [("ud_send", "UD send/recv", ["-c", "UD", "-t", "send_bw"]),
              ("ud_wr", "UD Write-Record", ["-c", "UD", "-t", "wr_bw"]),
              ("rd_send", "RD send/recv", ["-c", "RD", "-t", "send_bw"])]

def loss():
    if ctx.QUICK:
        losses, sizes, budget = [0, 1, 5], [1024, 65536, 1 << 20], 4 << 20
    else:
        losses, sizes, budget = [0, 0.1, 0.5, 1, 5], [64, 256, 1024, 4096, 16384, 65536, 262144,
                                                     1 << 20, 4 << 20], 24 << 20
    res = {"losses": losses, "sizes": sizes, "budget": budget, "data": {}}
    for key, label, args in LOSS_TESTS:
        for l in losses:
            for s in sizes:
                n = max(8, min(5000, budget // s))
                a = args + ["-s", str(s), "-n", str(n)] + (["--loss", str(l)] if l else [])
                try:
                    r = dgperf(a)[0]
                except RunFailed as e:
                    failed("loss", str(e))
                    continue
                sent = r["sent_msgs"] * s
                res["data"]["%s/%s/%d" % (key, l, s)] = {
                    "bw": r["bw_MBps"], "delivered": r["delivered_bytes"] / sent if sent else None,
                    "msgs": r["delivered_msgs"], "sent": r["sent_msgs"],
                    "dg_per_msg": r["tx_datagrams"] / r["sent_msgs"] if r.get("tx_datagrams") else None,
                    "wire": r["tx_wire_bytes"], "retx": r["rd_retransmits"],
                    "drops": r.get("peer_fault_drops"), "n": n}
        log("loss: %s done" % label)
    return res
