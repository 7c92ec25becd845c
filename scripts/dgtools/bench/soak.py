"""scripts/bench section "soak": ./scripts/soak for 5 minutes (quick: 45 s), its verdict and
figures in section 8 of results.md (issue "Hardening", item 8)."""
import json, os, subprocess, sys

from . import ctx
from .ctx import failed, log

DGSTRESS = "build/tests/integration/dgstress"


def soak():
    secs = 45 if ctx.QUICK else 300
    out = os.path.join(ctx.TMP, "soak.json")
    port = ctx.next_port(60)
    cmd = [sys.executable, "-m", "dgtools.soak", "--seconds", str(secs), "--json", out, "--port", str(port),
           "--lib", ctx.LIB, "--dgstress", os.path.join(ctx.ROOT, DGSTRESS)]
    env = dict(os.environ, PYTHONPATH=os.path.join(ctx.ROOT, "scripts"))
    log("soak: %d s from port %d" % (secs, port))
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=secs + 300)
    for line in p.stdout.splitlines()[-12:]:
        log("  " + line[:300])
    if not os.path.exists(out):
        failed("soak", "no result (exit %d): %s" % (p.returncode, (p.stdout + p.stderr).strip()[-300:]))
        return None
    res = json.load(open(out))
    res["exit"] = p.returncode
    res["command"] = "./scripts/soak --seconds %d" % secs
    if p.returncode != 0:
        failed("soak", "; ".join(res.get("failures", [])[:3])[:500] or "exit %d" % p.returncode)
    return res


def n(v):
    return "{:,}".format(int(v)).replace(",", " ")


def page_section(S, w, fmt, summary):
    """Section 8 of results.md through w; appends the "Where we stand" row to summary."""
    w("## 8. Soak: UD, RD and RC under loss, reordering and duplication (issue \"Hardening\")")
    w("")
    w("`%s` (the long form is `./scripts/soak --minutes 60`): long-lived preloaded echo servers, one per "
      "service (UD, RD, TCP carried over RC), serve short-lived preloaded clients that start, check every "
      "byte echoed back and stop, %d at a time per service; one client in ten is killed with SIGKILL "
      "mid-run instead. Every soft QP has `DGSHIM_FAULT_RX=%s` (1 %% loss, 1 %% reordered by 3, 1 %% "
      "duplicated); dgstress RD and UD pairs run beside them under the same faults. The run is cut into "
      "rounds; at the end of each, nothing new starts and the servers' memory and descriptors are sampled at "
      "rest. Pass: every client and pair checked out (RD and RC: every byte exactly once and in order; UD: "
      "nothing corrupt), the traffic was framed / carried (exit summaries), and at rest the servers' "
      "descriptors stayed within one and their memory within max(4 MiB, 10 %%) of the first round's." % (
          S["command"], 2, S["fault"]))
    w("")
    w("| service | client runs | failed | sent (UD, RD: datagrams; RC: bytes) | echoed | lost (UD) |")
    w("|---|---|---|---|---|---|")
    for k in ("ud", "rd", "rc"):
        c = S["clients"].get(k)
        if c:
            w("| %s | %d | %d | %s | %s | %s |" % (k.upper(), c["runs"], c["failed"], n(c["sent"]), n(c["echoed"]),
                                                  n(c["lost"]) if k == "ud" else "-"))
    w("")
    w("%d clients killed mid-run; dgstress pairs: RD %d, UD %d." % (S["killed"], S["dgstress"]["RD"], S["dgstress"]["UD"]))
    w("")
    R = S.get("rounds") or []
    if R:
        w("| server | rounds | RSS at rest, first -> last (kB) | descriptors, first -> last |")
        w("|---|---|---|---|")
        for k in ("ud", "rd", "rc"):
            if k in R[0]:
                w("| %s | %d | %d -> %d | %d -> %d |" % (k.upper(), len(R), R[0][k][0], R[-1][k][0], R[0][k][1], R[-1][k][1]))
        w("")
    c = S.get("counters", {}).get("rd", {})
    if c.get("server_rx_framed"):
        w("RD retransmissions: the server %s for %s datagrams it sent, the clients %s for %s (1 %% loss plus "
          "reordering and duplication at each receiver)." % (n(c.get("server_retransmits", 0)), n(c["server_tx_framed"]),
                                                              n(c.get("retransmits", 0)), n(c.get("tx_framed", 0))))
        w("")
    w("Result: **%s**%s" % ("passed" if S["passed"] else "FAILED",
                            "" if S["passed"] else ": " + "; ".join(S["failures"][:5])))
    w("")
    summary.append(("Soak (%s): every byte checked under 1 %% loss/reorder/dup, memory and descriptors flat" % (
        S["command"].split(" ", 1)[1]), "passed" if S["passed"] else "failed", S["passed"]))
