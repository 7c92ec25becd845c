"""scripts/test's last line, "test: N passed, N failed, N skipped", from the two meson test logs
(testlog.json, one JSON object per test; a missing log counts as one failure) and the extra
results file (one "OK|FAIL|SKIP name" line per check outside meson).
Arguments: TESTLOG TESTLOG_ASAN EXTRA."""
import json, sys


def count(testlogs, extra):
    """(passed, failed, skipped) over the extra results file and the meson test logs."""
    p = f = s = 0
    for line in open(extra):
        r = line.split()[0]
        if r == "OK": p += 1
        elif r == "SKIP": s += 1
        else: f += 1
    for path in testlogs:
        try:
            for line in open(path):
                r = json.loads(line).get("result")
                if r in ("OK", "EXPECTEDFAIL"): p += 1
                elif r == "SKIP": s += 1
                else: f += 1
        except FileNotFoundError:
            f += 1
    return p, f, s


if __name__ == "__main__":
    p, f, s = count(sys.argv[1:3], sys.argv[3])
    print(f"test: {p} passed, {f} failed, {s} skipped")
