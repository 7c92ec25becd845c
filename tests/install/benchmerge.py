"""benchmerge.py: scripts/bench --merge keeps, for each section it did not measure, the run that
measured it (results.json "origins"): the page names each earlier run with its own sections, a
kept section's failures stay and a re-measured one's go, and a note about a section measured
again goes while the others stay. Run with PYTHONPATH=<source>/scripts; exit 0 pass, 1 fail."""
import json, os, shutil, sys, tempfile

from dgtools.bench import ctx
from dgtools.bench import __main__ as bench


def origin(cmd, started, git):
    return {"command": cmd, "mode": "full", "started": started, "git": git, "cpu": "cpu", "kernel": "k"}


def main():
    out = tempfile.mkdtemp(prefix="benchmerge.")
    img = os.path.join(out, "img")
    os.makedirs(img)
    o_verbs = origin("./scripts/bench", "2026-11-25T17:22", "aaaa111")
    o_sipp = origin("./scripts/bench --only sipp --merge", "2026-11-28T16:27", "bbbb222")
    # the last run measured only cost; verbs and sipp came from the runs above, twohost from a
    # run that kept no origins (an older results.json): the last run's own data names it
    last = {"command": "./scripts/bench --only cost --merge", "mode": "full", "started": "2026-11-28T16:16",
            "machine": {"git": "cccc333", "cpu": "cpu", "kernel": "k"},
            "results": {"verbs": {"v": 1}, "sipp": {"s": 1}, "twohost": {"t": 1}, "cost": {"c": 1}},
            "failed": ["sipp: one run failed", "cost: a cost run failed"],
            "notes": ["section 6 (cost) is from a separate run (old words)",
                      "section 8 (soak) is from a separate run (kept words)",
                      "sections verbs, sipp, twohost are from an earlier run (stale)",
                      "this run (`x`) measured only cost."],
            "origins": {"verbs": o_verbs, "sipp": o_sipp, "cost": origin("c", "2026-11-28T16:16", "cccc333")}}
    json.dump(last, open(os.path.join(img, "results.json"), "w"))
    ctx.IMG, ctx.NOTES, ctx.FAILED = img, [], []
    ctx.CMDLINE, ctx.SECTIONS = "./scripts/bench --only cost --merge", ["cost"]
    now = origin(ctx.CMDLINE, "2026-11-28T17:00", "dddd444")
    R, origins = {"cost": {"c": 2}}, {"cost": now}
    try:
        bench.merge(R, origins)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    bad = []
    want = lambda ok, what: ok or bad.append(what)
    want(R["cost"] == {"c": 2} and R["verbs"] == {"v": 1} and R["sipp"] == {"s": 1}, "results merged wrong: %r" % R)
    want(origins.get("verbs") == o_verbs and origins.get("sipp") == o_sipp, "kept origins lost: %r" % origins)
    want(origins.get("twohost", {}).get("git") == "cccc333", "a section without an origin: the last run's")
    want(origins.get("cost") == now, "the section measured now must keep this run's origin")
    want(ctx.FAILED == ["sipp: one run failed"], "failures: %r" % ctx.FAILED)
    notes = ctx.NOTES
    want(not any("old words" in n for n in notes), "the note about cost (measured again) stayed")
    want(any("kept words" in n for n in notes), "the note about soak went")
    want(not any("(stale)" in n for n in notes), "the last run's 'sections ...' note stayed")
    want(any(n.startswith("section verbs is from an earlier run (`./scripts/bench`, full mode, 2026-11-25 17:22 UTC, "
                          "commit `aaaa111`") for n in notes), "verbs not named with its own run: %r" % notes)
    want(any(n.startswith("section sipp is from an earlier run (`./scripts/bench --only sipp --merge`") and
             "bbbb222" in n for n in notes), "sipp not named with its own run")
    want(any(n.startswith("section twohost is from an earlier run (`./scripts/bench --only cost --merge`") and
             "cccc333" in n for n in notes), "twohost not named with the last run")
    want(sum(n.startswith("this run ") for n in notes) == 1, "one 'this run' note")
    for b in bad:
        print("benchmerge: FAIL: " + b)
    print("benchmerge: %s" % ("PASS" if not bad else "%d check(s) failed" % len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
