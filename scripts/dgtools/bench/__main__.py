"""scripts/bench: python3 -m dgtools.bench [options] (the shell entry point scripts/bench installs
what it measures and builds first; its header describes the options)."""
import json, os, re, sys, time

from . import ctx
from .ctx import RunFailed, cleanup, failed, log, machine
from .verbs import verbs, loss
from .sock import sock
from .vlc import vlc
from .sipp import sipp
from .twohost import twohost
from .cost import cost
from .soak import soak
from .page import page
from .. import plots, runner

def main():
    if ctx.SAVED:
        R, M = ctx.SAVED["results"], ctx.SAVED["machine"]
        ctx.FAILED.extend(ctx.SAVED["failed"])
        made = plots.bench(R, ctx.IMG, ctx.MODE)
        open(os.path.join(ctx.OUT, "results.md"), "w").write(page(R, M, made, ctx.SAVED["elapsed_s"]))
        log("rewrote %s and %d plot(s) from %s" % (os.path.join(ctx.OUT, "results.md"), len(made), ctx.A.from_json))
        return 0
    M = machine()
    log("bench (%s mode), sections %s, output %s" % (ctx.MODE, ",".join(ctx.SECTIONS), ctx.OUT))
    R = {}
    for sec, fn in (("verbs", verbs), ("loss", loss), ("sock", sock), ("vlc", vlc), ("sipp", sipp), ("twohost", twohost),
                    ("cost", lambda: cost(R)), ("soak", soak)):
        if sec not in ctx.SECTIONS:
            continue
        t = time.monotonic()
        try:
            R[sec] = fn()
        except RunFailed as e:
            failed(sec, str(e))
        log("%s: %.0f s" % (sec, time.monotonic() - t))
    elapsed = time.monotonic() - ctx.T0
    own = len(ctx.FAILED)   # this run's; merge adds the kept sections' (they stay on the page)
    origins = {s: origin_of(ctx.CMDLINE, ctx.MODE, ctx.STARTED.isoformat(), M) for s in R}
    if ctx.A.merge:
        merge(R, origins)
    made = []
    try:
        made = plots.bench(R, ctx.IMG, ctx.MODE)
    except Exception as e:   # a plot must not hide the measurements
        failed("plots", "%s: %s" % (type(e).__name__, e))
    json.dump({"machine": M, "mode": ctx.MODE, "command": ctx.CMDLINE, "started": ctx.STARTED.isoformat(),
               "elapsed_s": elapsed, "failed": ctx.FAILED, "results": R, "notes": ctx.NOTES,
               "origins": origins},
              open(os.path.join(ctx.IMG, "results.json"), "w"), indent=1, default=str)
    open(os.path.join(ctx.OUT, "results.md"), "w").write(page(R, M, made, elapsed))
    log("wrote %s and %d plot(s) in %s (%.1f min)" % (os.path.join(ctx.OUT, "results.md"), len(made), ctx.IMG, elapsed / 60))
    if len(ctx.FAILED) > own:
        log("%d failed run(s) of the earlier run's sections, kept on the page (not this run's):" % (len(ctx.FAILED) - own))
        for f in ctx.FAILED[own:]:
            print("  " + f, flush=True)
    if own:
        log("%d measurement run(s) FAILED:" % own)
        for f in ctx.FAILED[:own]:
            print("  " + f, flush=True)
        return 1
    return 0


def origin_of(command, mode, started, m):
    """Which run measured a section: what the page says of a section kept from an earlier run."""
    return {"command": command, "mode": mode, "started": started, "git": m["git"], "cpu": m["cpu"],
            "kernel": m["kernel"]}


def origin_notes(origins, kept):
    """One note per earlier run that measured kept sections, oldest first."""
    runs = {}
    for s in kept:
        o = origins[s]
        runs.setdefault((o["started"], o["command"], o["git"]), (o, []))[1].append(s)
    return ["%s %s from an earlier run (`%s`, %s mode, %s UTC, commit `%s`, on %s, Linux %s)." % (
                "sections" if len(secs) > 1 else "section", ", ".join(secs) + (" are" if len(secs) > 1 else " is"),
                o["command"], o["mode"], o["started"][:16].replace("T", " "), o["git"], o["cpu"],
                o["kernel"]) for _, (o, secs) in sorted(runs.items())]


def merge(R, origins):
    """--merge: the sections of OUT/img/results.json this run did not measure join R (with their
    failures and the run each came from: origins), and the page says which run measured them.
    A note of the earlier page about a section this run measured again ("section N (name) ...")
    goes."""
    path = os.path.join(ctx.IMG, "results.json")
    if not os.path.exists(path):
        return
    old = json.load(open(path))
    kept = [s for s in old["results"] if s not in R]
    whole = origin_of(old["command"], old["mode"], old["started"], old["machine"])
    for s in kept:
        R[s] = old["results"][s]
        origins[s] = old.get("origins", {}).get(s) or whole
    ctx.FAILED.extend(f for f in old.get("failed", []) if f.split(":", 1)[0] in kept)
    for n in old.get("notes", []):
        m = re.match(r"section \d+ \((\w+)\)", n)
        if not n.startswith("sections ") and not n.startswith("this run ") and \
                not re.match(r"section \w+ is from an earlier run", n) and \
                not (m and m.group(1) in R and m.group(1) not in kept):
            ctx.NOTES.append(n)
    if kept:
        ctx.NOTES.extend(origin_notes(origins, kept))
        ctx.NOTES.append("this run (`%s`, commit `%s`, on the machine above) measured only %s." % (
            ctx.CMDLINE, machine()["git"], ", ".join(ctx.SECTIONS)))


def run(argv):
    ctx.setup(argv)
    return runner.run(main, cleanup)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
