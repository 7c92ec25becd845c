#!/usr/bin/env bash
# dgperf_smoke.sh DGPERF PORT: every dgperf test on UD, RD, RC (iWARP over TCP), plain UDP and
# plain TCP, a few iterations each, with --json; checks each row has the documented keys and sane
# values (a nonzero figure). Then the bandwidth tests with --event --detail: everything delivered,
# each side's CPU time reported, and a server that waits for nothing does not spin (its CPU over a
# 200 ms drain far below the busy-polling server's). Also checks that bad options are refused
# with exit 2.
# Runs use ports PORT+1 .. PORT+30 in turn (a run ends before the next starts on its port;
# SMOKE_PORTS=N: N ports instead of 30).
# SMOKE_TRANSPORTS="UD RD RC raw raw-tcp" (the default) picks the transports.
set -u
perf=$1 base=$2
fail=0
runs=0
check_json() { # label, transport; json lines on stdin
	python3 -c '
import json, sys
want = {"raw": "raw-udp"}.get(sys.argv[1], sys.argv[1])
keys = {"test","transport","size","iters","t_min_us","t_typical_us","t_avg_us","p99_us","bw_MBps","msg_rate_Mpps","valid_fraction"}
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
assert rows, "no JSON rows"
for r in rows:
    assert set(r) == keys, f"keys {sorted(r)}"
    assert r["transport"] == want, r
    lat = r["test"].endswith("_lat")
    if lat:
        assert r["t_typical_us"] and r["t_typical_us"] > 0 and r["bw_MBps"] is None, r
    else:
        assert r["bw_MBps"] and r["bw_MBps"] > 0 and r["t_min_us"] is None, r
    if r["test"].startswith("wr_"):
        assert r["valid_fraction"] is not None and 0 < r["valid_fraction"] <= 1, r
    else:
        assert r["valid_fraction"] is None, r
print("ok", len(rows), "rows")
' "$2" || { echo "FAIL: $1"; fail=1; }
}
for tr in ${SMOKE_TRANSPORTS:-UD RD RC raw raw-tcp}; do
	for t in send_lat send_bw wr_lat wr_bw write_lat write_bw read_lat read_bw; do
		args=(-t "$t" -s 4K -n 50 --json)
		case $tr in
		raw) args+=(--raw-udp) ;;
		raw-tcp) args+=(--raw-tcp) ;;
		*) args+=(-c "$tr") ;;
		esac
		runs=$((runs + 1))
		port=$((base + 1 + runs % ${SMOKE_PORTS:-30}))
		timeout 60 "$perf" "${args[@]}" -p "$port" >/dev/null 2>&1 &
		spid=$!
		sleep 0.2
		out=$(timeout 60 "$perf" "${args[@]}" -p "$port" 127.0.0.1)
		rc=$?
		wait $spid; src=$?
		echo "$tr $t: client $rc server $src"
		if [ $rc -ne 0 ] || [ $src -ne 0 ]; then fail=1; continue; fi
		echo "$out" | check_json "$tr $t" "$tr"
	done
done
# pair PORT ARGS...: server and client of one run; the client's JSON rows on stdout
pair() {
	local port=$1
	shift
	timeout 60 "$perf" "$@" -p "$port" >/dev/null 2>&1 &
	local spid=$!
	sleep 0.2
	timeout 60 "$perf" "$@" -p "$port" 127.0.0.1
	local rc=$?
	wait $spid || rc=1
	return $rc
}
# --event: the waits block; a reliable transport still delivers every byte (UD and plain UDP
# may lose what a slower receiver's socket had no room for, with or without --event)
for a in "-c UD -t wr_bw -s 64K" "-c UD -t send_bw -s 4K" "-c UD -t write_bw -s 64K" "-c RD -t send_bw -s 4K" \
	"-c RC -t write_bw -s 64K" "-c RC -t send_bw -s 4K" "-c RC -t read_bw -s 64K" "--raw-udp -t send_bw -s 4K" \
	"--raw-tcp -t send_bw -s 64K"; do
	runs=$((runs + 1))
	# shellcheck disable=SC2086
	out=$(pair $((base + 1 + runs % ${SMOKE_PORTS:-30})) $a -n 200 --event --detail) || {
		echo "FAIL: --event $a: exit status"; fail=1; continue; }
	echo "$out" | python3 -c '
import json, sys
r = [json.loads(l) for l in sys.stdin if l.startswith("{")][0]
assert r["bw_MBps"] > 0, r
if r["transport"] in ("RD", "raw-tcp") or (r["transport"] == "RC" and r["test"] == "send_bw"):
    assert r["delivered_bytes"] == 200 * r["size"], r  # reliable: every byte
assert 0 < r["cpu_client_s"] < 30 and 0 < r["cpu_server_s"] < 30, r
print("ok --event", r["transport"], r["test"], "%.0f MB/s, CPU %.3f + %.3f s" % (r["bw_MBps"], r["cpu_client_s"], r["cpu_server_s"]))
' || { echo "FAIL: --event $a"; fail=1; }
done
# a server that has nothing to receive (every datagram dropped) waits out its 200 ms drain:
# asleep with --event, spinning without
for a in "-c UD -t send_bw" "-c UD -t wr_bw" "--raw-udp -t send_bw"; do
	for ev in "" --event; do
		runs=$((runs + 1))
		# shellcheck disable=SC2086
		out=$(pair $((base + 1 + runs % ${SMOKE_PORTS:-30})) $a -s 1K -n 50 --loss 100 --detail $ev) || {
			echo "FAIL: $ev $a --loss 100: exit status"; fail=1; continue; }
		echo "$out" | python3 -c '
import json, sys
r = [json.loads(l) for l in sys.stdin if l.startswith("{")][0]
ev, c = sys.argv[1] == "--event", r["cpu_server_s"]
assert r["delivered_bytes"] == 0 and r["elapsed_s"] >= 0.19, r
assert (c < 0.08) if ev else (c > 0.03), "server CPU %.3f s over a 200 ms drain with%s --event" % (c, "" if ev else "out")
print("ok", r["transport"], r["test"], "--loss 100", sys.argv[1] or "busy", "server CPU %.3f s" % c)
' "$ev" || { echo "FAIL: $ev $a --loss 100"; fail=1; }
	done
done
# option errors: exit 2 with a message naming the option
for bad in "-t nope" "-s 0" "-s 17M" "--loss 101" "-c XX" "-n -3" "--raw-tcp --raw-udp" "-c RC --loss 1" \
	"--raw-tcp --seg 9000" "-t send_lat --event"; do
	# shellcheck disable=SC2086
	msg=$("$perf" $bad 127.0.0.1 2>&1 >/dev/null); rc=$?
	if [ $rc -ne 2 ] || [ -z "$msg" ]; then echo "FAIL: '$bad' gave exit $rc: $msg"; fail=1; else echo "refused '$bad': $msg"; fi
done
exit $fail
