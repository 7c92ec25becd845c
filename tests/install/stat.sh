#!/usr/bin/env bash
# stat.sh BUILD_DIR PORT: `dgshim stat` on live preloaded programs. A UDP server started through
# a link of another name and its stream client; a TCP server (listener + accepted connection)
# and its client, carried over RC. Checks the listing of all processes, per-socket and
# per-connection rows (protocol, state, mode, carrier, addresses, counters) in text and JSON,
# -i/-c with rates, a process exiting while it is watched, a stale counters file (and a dead
# process's swept at the next start), bad arguments.
set -uo pipefail
# A sanitized build: its runtime first in every preload; leak checks off, since the programs
# run here (python, coreutils, tshark) are not ours (the integration suite checks the shim's).
if [ -n "${DG_ASAN_RT:-}" ]; then
	export LD_PRELOAD=$DG_ASAN_RT ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
fi
build=$1 port=${2:-24200}
name=stat
L=$build/shim/dgshim
lib=$build/shim/libdgshim.so.0
py=/usr/bin/python3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dgshim-stat.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	rm -f "/dev/shm/dgshim.$sleeper"
	rm -rf "$tmp"
}
sleeper=0
trap cleanup EXIT
fail() { echo "$name: FAIL: $*"; exit 1; }
pre=${LD_PRELOAD:+$LD_PRELOAD:}$lib

ln -s "$(readlink -f "$build/apps/udpbench")" "$tmp/my-udp-server"
LD_PRELOAD=$pre "$tmp/my-udp-server" server "$port" -b 127.0.0.1 >"$tmp/us.out" 2>&1 &
us=$!; pids+=($us)
cat >"$tmp/tcpsrv.py" <<'PY'
import socket, sys
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen(4)
print("listening", flush=True)
c, _ = l.accept()
while True:
    d = c.recv(65536)
    if not d: break
    c.sendall(d[:16])
PY
cat >"$tmp/tcpcli.py" <<'PY'
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
end = time.time() + float(sys.argv[2])
while time.time() < end:
    c.sendall(b"x" * 4096); c.recv(16); time.sleep(0.002)
c.close()
PY
LD_PRELOAD=$pre $py "$tmp/tcpsrv.py" $((port + 1)) >"$tmp/ts.out" 2>&1 &
ts=$!; pids+=($ts)
for _ in $(seq 50); do grep -q listening "$tmp/us.out" && grep -q listening "$tmp/ts.out" && break; sleep 0.1; done
grep -q listening "$tmp/ts.out" || fail "servers did not start"
LD_PRELOAD=$pre "$build/apps/udpbench" stream 127.0.0.1 "$port" -s 256 -r 2000 -t 10 >"$tmp/uc.out" 2>&1 &
uc=$!; pids+=($uc)
LD_PRELOAD=$pre $py "$tmp/tcpcli.py" $((port + 1)) 10 >"$tmp/tc.out" 2>&1 &
tc=$!; pids+=($tc)
sleep 1.5

# every preloaded process: ours among them, named as they were run
"$L" stat >"$tmp/all.txt" 2>&1 || { cat "$tmp/all.txt"; fail "dgshim stat"; }
for p in $us $ts $uc $tc; do grep -q "^pid $p " "$tmp/all.txt" || { cat "$tmp/all.txt"; fail "pid $p not listed"; }; done
grep -q "^pid $us  my-udp-server " "$tmp/all.txt" || fail "the UDP server is not named my-udp-server: $(grep "^pid $us " "$tmp/all.txt")"
grep -q "^pid $ts  python3" "$tmp/all.txt" || fail "the TCP server's name"
echo "$name: dgshim stat lists all four, the server as my-udp-server (its executable is udpbench)"

"$L" stat --json $us $ts $uc $tc >"$tmp/one.json" || fail "dgshim stat --json"
$py - "$tmp/one.json" "$us" "$ts" "$uc" "$tc" "$port" <<'PY' || fail "JSON rows"
import json, sys
rep = json.loads(open(sys.argv[1]).read())
us, ts, uc, tc, port = map(int, sys.argv[2:])
P = {p["pid"]: p for p in rep["processes"]}
def one(pid, **want):
    rows = [s for s in P[pid]["sockets"] if all(s[k] == v for k, v in want.items())]
    assert len(rows) == 1, (pid, want, P[pid]["sockets"])
    return rows[0]
s = one(us, proto="udp", carrier="ud", mode="auto", local=f"127.0.0.1:{port}")
assert s["rx_framed"] > 100 and s["rx_plain"] == 0, s
c = one(uc, proto="udp", carrier="ud")
assert c["tx_framed"] > 100 and c["tx_framed_bytes"] >= 256 * (c["tx_framed"] - 2), c
l = one(ts, proto="tcp", state="listen", carrier="-", mode="auto", local=f"127.0.0.1:{port+1}")
a = one(ts, proto="tcp", state="conn", carrier="rc", local=f"127.0.0.1:{port+1}")
assert a["rx_framed_bytes"] > 4096 and a["remote"].startswith("127.0.0.1:"), a
k = one(tc, proto="tcp", state="conn", carrier="rc", remote=f"127.0.0.1:{port+1}")
assert k["tx_framed_bytes"] > 4096 and k["local"] == a["remote"], (k, a)
assert P[us]["provider"] == "soft" and not P[us]["gone"]
print("stat: rows: udp ud %d rx framed; tcp listen; tcp conn rc %d B in at the server, %s <-> %s"
      % (s["rx_framed"], a["rx_framed_bytes"], k["local"], a["local"]))
PY

# repeated, with rates
"$L" stat -i 0.3 -c 3 --json $uc $tc >"$tmp/rep.json" || fail "dgshim stat -i 0.3 -c 3"
$py - "$tmp/rep.json" "$uc" <<'PY' || fail "rates"
import json, sys
reps = [json.loads(l) for l in open(sys.argv[1])]
assert len(reps) == 3, len(reps)
assert "rates" not in reps[0]["processes"][0]["sockets"][0]
for r in reps[1:]:
    assert 0.2 < r["interval"] < 1.0, r["interval"]
    u = [p for p in r["processes"] if p["pid"] == int(sys.argv[2])][0]["sockets"][0]
    # paced at 2000 datagrams/s
    assert 1000 < u["rates"]["tx_per_s"] < 3000, u["rates"]
    assert abs(u["rates"]["tx_bytes_per_s"] / u["rates"]["tx_per_s"] - 256) < 1, u["rates"]
print("stat: -i 0.3 -c 3: 3 reports, the client's rate %.0f datagrams/s (paced at 2000)" % u["rates"]["tx_per_s"])
PY
"$L" stat -i 0.3 -c 2 $uc | grep -q 'tx/s' || fail "text report with rates has no tx/s column"

# watched while it exits: the report says so and stat ends by itself, exit 0
timeout 20 "$L" stat -i 0.2 $uc >"$tmp/watch.out" 2>"$tmp/watch.err"
rc=$?
[ $rc = 0 ] || { cat "$tmp/watch.err"; fail "stat -i on an exiting process: exit $rc"; }
grep -q "process $uc has exited" "$tmp/watch.err" || grep -q "(exited; its last counters)" "$tmp/watch.out" ||
	{ cat "$tmp/watch.err"; fail "no word of the exit"; }
grep -q "^pid $uc " "$tmp/watch.out" || fail "no report before the exit"
echo "$name: stat -i 0.2 on a client that exits: $(wc -l <"$tmp/watch.out") lines, then '$(head -1 "$tmp/watch.err")', exit 0"

# a stale file (its writer was killed, the pid now belongs to a process without the shim)
sleep 30 & sleeper=$!; pids+=($sleeper)
cp "/dev/shm/dgshim.$us" "/dev/shm/dgshim.$sleeper" || fail "no counters file of the UDP server"
"$L" stat >"$tmp/all2.txt" 2>&1
if grep -q "^pid $sleeper " "$tmp/all2.txt"; then fail "a stale counters file is listed"; fi
"$L" stat "$sleeper" | grep -q "^pid $sleeper .*(exited; its last counters)" || fail "a stale file named by its pid is not shown as exited"
# the file of a process that is gone (killed, or a server that changed its user and could not
# remove it) is removed by the next preloaded process's start; a live pid's stays
true & dead=$!; wait $dead
cp "/dev/shm/dgshim.$us" "/dev/shm/dgshim.$dead" || fail "no counters file of the UDP server"
LD_PRELOAD=$pre $py -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()' ||
	fail "a preloaded python that opens a socket"
[ ! -e "/dev/shm/dgshim.$dead" ] || { rm -f "/dev/shm/dgshim.$dead"; fail "a dead process's counters file was not swept"; }
[ -e "/dev/shm/dgshim.$sleeper" ] || fail "a live pid's counters file was swept"

# arguments
"$L" stat -i 0 >/dev/null 2>&1; [ $? = 2 ] || fail "-i 0 is not exit 2"
"$L" stat abc >/dev/null 2>&1; [ $? = 2 ] || fail "a PID 'abc' is not exit 2"
"$L" stat 999999999 2>"$tmp/e"; [ $? = 1 ] && grep -q 'no such process' "$tmp/e" || fail "no such pid: $(cat "$tmp/e")"
"$L" stat --help | grep -q usage || fail "--help"
echo "$name: stale file ignored, a dead process's swept; bad arguments exit 2, a missing process 1"
echo "$name: PASS"
