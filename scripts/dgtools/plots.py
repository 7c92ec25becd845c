"""Plots for the benches: matplotlib (Debian's python3-matplotlib, which scripts/bench installs)
on the Agg backend. The shared helpers, and the figures of scripts/bench's results page."""
import os

from .bench.sock import SOCK
from .bench.verbs import LOSS_TESTS, VERBS_BW, VERBS_LAT


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display), imported only when a bench draws."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def saver(plt, img, made):
    """save(fig, name): writes fig as img/name (tight layout, 90 dpi), closes it, appends name to made."""
    def save(fig, name):
        path = os.path.join(img, name)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        made.append(name)
    return save


def note(ax, text, bottom=False):
    """A small boxed note in a corner of ax (top left, or bottom left)."""
    ax.text(0.01, 0.01 if bottom else 0.99, text, transform=ax.transAxes, va="bottom" if bottom else "top",
            ha="left", fontsize=7,
            bbox=dict(boxstyle="round", fc="lightyellow", ec="0.6"))


def bench(R, img, mode):
    """scripts/bench's figures for the results R, as PNG files in img; returns the names made."""
    plt = pyplot()
    made = []
    save = saver(plt, img, made)
    if "verbs" in R:
        V = R["verbs"]
        for kind, table, ylabel, name, paper in (
                ("lat", VERBS_LAT, "half round trip, median [us]", "verbs_latency.png",
                 "paper 000 Fig. 5: UD send/recv and Write-Record 27-28 us (<128 B), RC ~33 us;\n"
                 "UD 18.1 % (send) / 24.4 % (Write-Record vs RC Write) lower up to 2 KB"),
                ("bw", VERBS_BW, "bandwidth delivered [MB/s]", "verbs_bandwidth.png",
                 "paper 000 Fig. 6: 1 KB UD send +193 %, Write-Record +188.8 % over RC;\n"
                 "256 KB UD send +33.4 %; 512 KB Write-Record +256 % over RC Write")):
            fig, ax = plt.subplots(figsize=(8, 5))
            for key, label, _, style in table:
                d = V[kind].get(key, {})
                xs = sorted(int(s) for s in d if d[s] is not None)
                if xs:
                    ax.plot(xs, [d[str(x)] for x in xs], style, label=label, markersize=3, linewidth=1.2)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("message size [bytes]")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, loc="lower right" if kind == "lat" else "upper left",
                      bbox_to_anchor=None if kind == "lat" else (0, 0.85))
            note(ax, paper)
            ax.set_title("Verbs %s, soft provider on loopback (%s mode)" % ("latency" if kind == "lat" else "bandwidth", mode), fontsize=9)
            save(fig, name)
    if "verbs" in R:
        V = R["verbs"]
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.3))
        for kind, a, num, den, lab, col in (("lat", ax, "ud_send", "rc_send", "UD send/recv vs RC send/recv", "C0"),
                                            ("lat", ax, "ud_wr", "rc_write", "UD Write-Record vs RC Write", "C1"),
                                            ("bw", ax2, "ud_send", "rc_send", "UD send/recv / RC send/recv", "C0"),
                                            ("bw", ax2, "ud_wr", "rc_write", "UD Write-Record / RC Write", "C1")):
            n, d = V[kind].get(num, {}), V[kind].get(den, {})
            xs = sorted(int(x) for x in n if n[x] and d.get(x))
            if kind == "lat":
                a.plot(xs, [100 * (d[str(x)] - n[str(x)]) / d[str(x)] for x in xs], "-o", color=col, markersize=3,
                       label="ours: " + lab)
            else:
                a.plot(xs, [n[str(x)] / d[str(x)] for x in xs], "-o", color=col, markersize=3, label="ours: " + lab)
        ax.plot([1, 2048], [18.1, 18.1], "--", color="C0", linewidth=2, label="paper: send/recv 18.1 % (up to 2 KB)")
        ax.plot([1, 2048], [24.4, 24.4], "--", color="C1", linewidth=2, label="paper: Write-Record 24.4 % (up to 2 KB)")
        ax.plot([1, 128], [25, 25], ":", color="k", label="issue 6 target: >= 25 % (<= 128 B)")
        ax.axhline(0, color="0.5", linewidth=0.8)
        ax.set_ylabel("UD latency lower than RC by [%]")
        ax2.plot([1024], [2.93], "*", color="C0", markersize=12, label="paper: send 2.93x at 1 KB")
        ax2.plot([262144], [1.334], "P", color="C0", markersize=10, label="paper: send 1.33x at 256 KB")
        ax2.plot([1024], [2.888], "*", color="C1", markersize=12, label="paper: Write-Record 2.89x at 1 KB")
        ax2.plot([524288], [3.56], "P", color="C1", markersize=10, label="paper: Write-Record 3.56x at 512 KB")
        ax2.plot([524288], [2.5], "_", color="k", markersize=20, markeredgewidth=2, label="issue 6 target: >= 2.5x at 512 KB")
        ax2.axhline(1, color="0.5", linewidth=0.8)
        ax2.set_yscale("log")
        ax2.set_ylabel("UD bandwidth / RC bandwidth")
        for a in (ax, ax2):
            a.set_xscale("log", base=2)
            a.set_xlabel("message size [bytes]")
            a.grid(True, which="both", alpha=0.3)
            a.legend(fontsize=6)
        fig.suptitle("UD against RC: ours (medians, %s mode) and the paper's stated figures (paper 000 Figs. 5-6)" % mode,
                     fontsize=9)
        save(fig, "verbs_ratio.png")
    if "loss" in R:
        L = R["loss"]
        for key, label, _ in LOSS_TESTS:
            fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
            for i, l in enumerate(L["losses"]):
                pts = [(s, L["data"].get("%s/%s/%d" % (key, l, s))) for s in L["sizes"]]
                pts = [(s, d) for s, d in pts if d]
                if not pts:
                    continue
                ax.plot([s for s, _ in pts], [d["bw"] for _, d in pts], "-o", color="C%d" % i, markersize=3,
                        label="%g %% loss" % l)
                if key == "rd_send":
                    ax2.plot([s for s, _ in pts], [d["wire"] / max(1, d["delivered"] * d["sent"] * s) if d["wire"] else None
                             for s, d in pts], "-o", color="C%d" % i, markersize=3, label="%g %%" % l)
                else:
                    ax2.plot([s for s, _ in pts], [100 * d["delivered"] for _, d in pts], "-o", color="C%d" % i,
                             markersize=3, label="%g %% measured" % l)
                    if l:  # model: a message of k datagrams survives with (1-p)^k; a record keeps ~(1-p)
                        q = 1 - l / 100
                        model = [100 * (q ** (d["dg_per_msg"] or 1) if key == "ud_send" else q) for s, d in pts]
                        ax2.plot([s for s, _ in pts], model, ":", color="C%d" % i, linewidth=1)
            for a in (ax, ax2):
                a.set_xscale("log", base=2)
                a.set_xlabel("message size [bytes]")
                a.grid(True, which="both", alpha=0.3)
            ax.set_yscale("log")
            ax.set_ylabel("goodput (payload delivered) [MB/s]")
            ax.legend(fontsize=7)
            if key == "rd_send":
                ax2.set_ylabel("wire bytes sent / payload bytes delivered")
                ax2.set_title("RD: every byte delivered; the cost is retransmission", fontsize=8)
            else:
                ax2.set_ylabel("payload delivered [% of sent]")
                ax2.set_ylim(0, 105)
                ax2.set_title("dotted: model, a message of k datagrams needs all k" if key == "ud_send"
                              else "dotted: model, a record keeps every datagram that arrived", fontsize=8)
            fig.suptitle("%s under packet loss (1472-B datagrams, loss injected at the receiving QP; %s mode)" % (label, mode), fontsize=9)
            note(ax, {"ud_send": "paper 000 Fig. 7: loss hurts large send/recv\nmessages even at 0.1 %",
                      "ud_wr": "paper 000 Fig. 8: partial placement keeps\nbandwidth at low loss; ~5 % breaks\nlarge messages (last segment lost)",
                      "rd_send": "paper 000: RD is future work there\n(no figure)"}[key], bottom=True)
            save(fig, "loss_%s.png" % key)
    if "sock" in R:
        S = R["sock"]["data"]
        fig, ax = plt.subplots(figsize=(9, 4.5))
        keys = [k for k, *_ in SOCK]
        ratios = []
        for k, label, fn, args, fig_, unit, higher in SOCK:
            n, s = S[k]["native"], S[k]["shim"]
            ratios.append((label, (s / n) if n and s else 0, higher))
        ax.barh(range(len(ratios)), [(r or 1e-3) - 1 for _, r, _ in ratios], left=1,
                color=["0.6" if abs(r - 1) < 0.03 else "C2" if (r >= 1) == h else "C3" for _, r, h in ratios])
        ax.set_xscale("log")
        ax.invert_yaxis()
        ax.set_yticks(range(len(ratios)))
        ax.set_yticklabels([l for l, _, _ in ratios], fontsize=7)
        ax.axvline(1, color="k", linewidth=0.8)
        ax.set_xlabel("shim / native, same run, log scale: green shim better, red worse, grey within 3 %")
        for i, (_, r, _) in enumerate(ratios):
            ax.text(r, i, " %.2f" % r, va="center", fontsize=7)
        ax.text(0.99, 0.01, "paper 000 VI.B: socket interface\n~2 % over native UDP (VLC prebuffering)",
                transform=ax.transAxes, va="bottom", ha="right", fontsize=7,
                bbox=dict(boxstyle="round", fc="lightyellow", ec="0.6"))
        ax.set_title("Unmodified programs, both ends preloaded vs native (%s mode)" % mode, fontsize=9)
        save(fig, "socket_overhead.png")
    if "vlc" in R:
        Vv = R["vlc"]
        fig, ax = plt.subplots(figsize=(8, 4.2))
        order = ["udp-native", "udp-shim", "http-native", "http-shim"]
        labels = {"udp-native": "UDP, native", "udp-shim": "UDP over datagram-iWARP (UD)",
                  "http-native": "HTTP over native TCP", "http-shim": "HTTP over iWARP RC"}
        ths = Vv["thresholds"]
        w = 0.2
        for j, key in enumerate(order):
            vals = [1e3 * (Vv["med"][key][str(th)] or 0) for th in ths]
            ax.bar([i + (j - 1.5) * w for i in range(len(ths))], vals, w, label=labels[key])
        ax.set_xticks(range(len(ths)))
        ax.set_xticklabels(["%.1f MiB" % (th / 1048576) if th != Vv["size"] else "whole file\n%.1f MiB" % (th / 1048576) for th in ths])
        ax.set_ylabel("time until the receiver holds N bytes [ms] (median)")
        ax.legend(fontsize=7, loc="upper left")
        ax.set_title("VLC: time to N bytes at the receiver (prebuffering proxy, %s mode)\npaper 000 Fig. 9: UD "
                     "prebuffering 74.1 %% shorter than HTTP/RC; the socket interface ~2 %% over native UDP" % mode,
                     fontsize=9)
        save(fig, "vlc.png")
    if "sipp" in R:
        Sp = R["sipp"]
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1, 2]})
        keys = ["udp-shim", "tcp-shim", "udp-native", "tcp-native"]
        labels = ["UD (shim)", "RC (shim)", "UDP native", "TCP native"]
        rkeys = keys + ["udp-shim-thread", "tcp-shim-thread"]
        rlabels = labels + ["UD (shim,\nPROGRESS=thread)", "RC (shim,\nPROGRESS=thread)"]
        for j, m in enumerate(["bye_ok", "first"]):
            vals = [(Sp["rt"].get(k, {}).get(m, {}).get("median") or 0) * 1e3 for k in rkeys]
            ax.bar([i + (j - 0.5) * 0.4 for i in range(len(rkeys))], vals, 0.4,
                   label={"first": "INVITE -> 180 (UDP only, see text)", "bye_ok": "BYE -> 200 OK"}[m])
        ax.set_xticks(range(len(rkeys)))
        ax.set_xticklabels(rlabels, fontsize=7, rotation=30, ha="right")
        ax.set_ylabel("response time at the UAC, median [us]")
        ax.legend(fontsize=7)
        ax.set_title("SIPp response time, light load (%s mode)\npaper 000 Fig. 10: UD 43.1 %% lower than RC" % mode,
                     fontsize=9)
        groups = sorted({int(k.rsplit("-", 1)[1]) for k in Sp["mem"]})
        xl, xs, x = [], [], 0.0
        for calls in groups:
            for k, lab in zip(keys, labels):
                d = Sp["mem"].get("%s-%d" % (k, calls))
                xs.append(x)
                kp = (d or {}).get("pairs", 1)
                xl.append("%s %d%s" % ({"UD (shim)": "UD shim", "RC (shim)": "RC shim", "UDP native": "UDP",
                                         "TCP native": "TCP"}[lab], calls, " (%d pairs)" % kp if kp > 1 else ""))
                if d:
                    b = 0
                    for part, col, pl in (("uac_rss", "C0", "UAC RSS"), ("uas_rss", "C1", "UAS RSS"),
                                          ("slab", "C2", "socket slab"), ("buf", "C3", "socket buffers")):
                        ax2.bar(x, d[part] / 1e6, 0.7, bottom=b, color=col, label=pl if x == 0 else None)
                        b += d[part] / 1e6
                else:
                    ax2.text(x, 0, "failed\nor not\nrun", ha="center", va="bottom", fontsize=6)
                x += 1
            x += 0.6
        ax2.set_xticks(xs)
        ax2.set_xticklabels(xl, fontsize=7, rotation=60, ha="right")
        ax2.set_ylabel("peak memory [MB]")
        # the top of the tallest stack was clipped with margins() alone (stacked bars)
        ax2.set_ylim(0, 1.08 * max([sum(d[x] for x in ("uac_rss", "uas_rss", "slab", "buf")) / 1e6
                                    for d in Sp["mem"].values()] or [1]))
        ax2.legend(fontsize=7)
        split = any(d.get("pairs", 1) > 1 for d in Sp["mem"].values())
        ax2.set_title("SIPp memory at N concurrent calls (one socket per call%s); paper 000 Fig. 11:\n"
                      "UD 24.1 %% less memory than RC at 10 000 clients (28.1 %% predicted)" % (
                          "; K pairs: all 2K processes summed" if split else ""), fontsize=9)
        save(fig, "sipp.png")
    if "twohost" in R:
        from .bench import twohost
        twohost.plots(R["twohost"], save, plt)
    if "cost" in R:
        from .bench import cost
        cost.plots(R["cost"], save, plt)
    return made
