"""scripts/bench: python3 -m dgtools.bench [options] (the shell entry point scripts/bench installs
what it measures and builds first; its header describes the options)."""
import json, os, sys, time

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
    if ctx.A.merge:
        merge(R)
    made = []
    try:
        made = plots.bench(R, ctx.IMG, ctx.MODE)
    except Exception as e:   # a plot must not hide the measurements
        failed("plots", "%s: %s" % (type(e).__name__, e))
    json.dump({"machine": M, "mode": ctx.MODE, "command": ctx.CMDLINE, "started": ctx.STARTED.isoformat(),
               "elapsed_s": elapsed, "failed": ctx.FAILED, "results": R, "notes": ctx.NOTES},
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


def merge(R):
    """--merge: the sections of OUT/img/results.json this run did not measure join R (with their
    failures), and the page says which run measured them."""
    path = os.path.join(ctx.IMG, "results.json")
    if not os.path.exists(path):
        return
    old = json.load(open(path))
    kept = [s for s in old["results"] if s not in R]
    for s in kept:
        R[s] = old["results"][s]
    ctx.FAILED.extend(f for f in old.get("failed", []) if f.split(":", 1)[0] in kept)
    ctx.NOTES.extend(n for n in old.get("notes", []) if not n.startswith("sections "))
    if kept:
        ctx.NOTES.append("sections %s are from an earlier run (`%s`, %s mode, %s UTC, commit `%s`, on %s, "
                         "Linux %s); this run (`%s`, commit `%s`, on the machine above) measured only %s." % (
                             ", ".join(kept), old["command"], old["mode"], old["started"][:16].replace("T", " "),
                             old["machine"]["git"], old["machine"]["cpu"], old["machine"]["kernel"], ctx.CMDLINE,
                             machine()["git"], ", ".join(ctx.SECTIONS)))


def run(argv):
    ctx.setup(argv)
    return runner.run(main, cleanup)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
