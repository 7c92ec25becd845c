#!/usr/bin/env bash
# dgperf_smoke.sh DGPERF PORT: every dgperf test on UD, RD, RC (iWARP over TCP), plain UDP and
# plain TCP, a few iterations each, with --json; checks each row has the documented keys and sane
# values (a nonzero figure). Also checks that bad options are refused with exit 2.
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
# option errors: exit 2 with a message naming the option
for bad in "-t nope" "-s 0" "-s 17M" "--loss 101" "-c XX" "-n -3" "--raw-tcp --raw-udp" "-c RC --loss 1" \
	"--raw-tcp --seg 9000"; do
	# shellcheck disable=SC2086
	msg=$("$perf" $bad 127.0.0.1 2>&1 >/dev/null); rc=$?
	if [ $rc -ne 2 ] || [ -z "$msg" ]; then echo "FAIL: '$bad' gave exit $rc: $msg"; fail=1; else echo "refused '$bad': $msg"; fi
done
exit $fail
