#!/usr/bin/env bash
# sipp_udp.sh BUILD_DIR BASE_PORT: SIPp UAC -> UAS over UDP on 127.0.0.1, 1000 calls that are all
# up at the same time, with the UAC in '-t u1' (one socket for all calls) and in '-t un' (one
# socket per call); the UAS is always '-t u1'. Each mode runs natively first (so a failure can be
# told apart from an environment problem), then with UAC and UAS both preloaded with
# BUILD_DIR/shim/libdgshim.so. A run passes when
#   - the UAC exits 0 (SIPp: 0 = every call succeeded) and its final statistics (-trace_stat
#     CSV) say SuccessfulCall=1000, FailedCall=0, and its CurrentCall column reached 1000;
#   - the UAS exits 0 after its 1000 calls (-m 1000) with SuccessfulCall=1000, FailedCall=0;
#   - with the shim: both processes' exit summaries show rx_framed > 0 and >= 90 % of the
#     received datagrams framed (and tx likewise), crc_drops=0.
# Exit 0 pass, 1 fail (also when the shim is not built), 77 only if SIPp cannot be installed.
#
# Concurrency: the UAC creates calls at -r 500 calls/s and holds each one -d 5000 ms before its
# BYE, so call 1000 is created ~2 s in while call 1 ends ~5 s in: all 1000 calls are up from
# ~2 s to ~5 s. This is not assumed but measured: SIPp samples CurrentCall every second (-fd 1)
# into the CSV and the test requires its maximum to be 1000 (natively the samples at 2, 3 and 4 s
# read 1000). Even at a quarter of the rate (e.g. a loaded machine) the window stays open.
#
# Ports: UAS SIP BASE, UAC SIP BASE+1, RTP echo (-mp, SIPp binds mp and mp+2) BASE+2 (UAS) and
# BASE+3 (UAC), control ports (-cp) BASE+6 and BASE+7. The UAS's "timewait" of 4 s after the
# last BYE makes each run ~11 s; four runs ~45 s.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dg_init sipp_udp "$@"
base=$DG_PORT
t_start=$(date +%s.%N)

dg_need sipp sip-tester
dg_need python3 python3
dg_need ss iproute2

CALLS=1000
RATE=500
HOLD_MS=5000
sdir=$DG_TMP/sipp
mkdir -p "$sdir"
# -max_socket 19800 is required (the default exceeds ulimit -n); SIPp then warns that
# 19800 + open calls exceeds the open-file limit "to allow for media support": harmless here.
common=(-i 127.0.0.1 -max_socket 19800 -nostdin -trace_stat -fd 1 -trace_screen
	-timeout 60s -timeout_error)

# csv_check FILE LABEL NEED_PEAK: final SuccessfulCall/FailedCall/Retransmissions and the peak
# of CurrentCall from a SIPp -trace_stat file; prints them, returns 1 unless all calls succeeded
# (and, with NEED_PEAK=1, unless CALLS calls were up at once).
csv_check() {
	python3 - "$1" "$2" "$CALLS" "$3" "$DG_NAME" <<'EOF'
import csv, sys
path, label, calls, need_peak, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
try:
    rows = list(csv.DictReader(open(path), delimiter=';'))
except OSError as e:
    print(f"{name}: {label}: no statistics file: {e}"); sys.exit(1)
if not rows:
    print(f"{name}: {label}: empty statistics file"); sys.exit(1)
last = rows[-1]
ok_calls = int(last["SuccessfulCall(C)"]); failed = int(last["FailedCall(C)"])
created = int(last["TotalCallCreated"]); retrans = int(last.get("Retransmissions(C)", 0))
peak = max(int(r["CurrentCall"]) for r in rows)
print(f"{name}: {label}: created={created} successful={ok_calls} failed={failed} "
      f"peak_concurrent={peak} retransmissions={retrans} elapsed={last['ElapsedTime(C)'][:8]}")
bad = []
if ok_calls != calls or failed != 0:
    bad.append(f"expected {calls} successful and 0 failed calls")
if need_peak and peak < calls:
    bad.append(f"only {peak} calls were up at once, not {calls}")
for b in bad:
    print(f"{name}: {label}: {b}")
sys.exit(1 if bad else 0)
EOF
}

# sipp_errors LOG LABEL: SIPp's error messages (timestamped lines) and the shim's
# error/warning lines from a log, deduplicated.
sipp_errors() {
	local lines
	lines=$(grep -aE $'^[0-9]{4}-[0-9]{2}-[0-9]{2}\t|dgshim\[[0-9]+\]: (error|warn)' "$1" |
		cut -f3- | sort | uniq -c | sort -rn | head -n 15)
	[ -n "$lines" ] || return 0
	dg_log "--- $2 errors (count, message) from ${1#"$DG_TMP"/}"
	sed 's/^/    | /' <<<"$lines"
}

# run_pair TAG MODE ENV...: UAS (-t u1) + UAC (-t MODE), ENV (NAME=VALUE words) given to both.
# Logs and statistics stay in $sdir/TAG.*; returns 1 on failure.
run_pair() {
	local tag=$1 mode=$2 upid cpid urc crc ok=1 t0
	shift 2
	local p="$sdir/$tag"
	if dg_wait_udp "$base" 0 || dg_wait_udp $((base + 1)) 0; then
		dg_log "$tag: UDP port $base or $((base + 1)) is already in use by another program"
		return 1
	fi
	t0=$(date +%s.%N)
	dg_bg "$p.uas.log" bash -c 'cd "$1" && shift && exec "$@"' _ "$sdir" \
		timeout -k 5 90 env "$@" sipp -sn uas -p "$base" -t u1 -m "$CALLS" \
		-mp $((base + 2)) -cp $((base + 6)) "${common[@]}" \
		-stf "$p.uas.csv" -screen_file "$p.uas.screen"
	upid=$DG_LAST_PID
	dg_wait_udp "$base" 20 "$upid"
	case $? in
	1) dg_log "$tag: warning: UAS socket on port $base not seen after 20 s" ;;
	2) dg_log "$tag: UAS exited before its socket was seen" ;;
	esac
	dg_bg "$p.uac.log" bash -c 'cd "$1" && shift && exec "$@"' _ "$sdir" \
		timeout -k 5 90 env "$@" sipp -sn uac "127.0.0.1:$base" -p $((base + 1)) -t "$mode" \
		-m "$CALLS" -l "$CALLS" -r "$RATE" -d "$HOLD_MS" \
		-mp $((base + 3)) -cp $((base + 7)) "${common[@]}" \
		-stf "$p.uac.csv" -screen_file "$p.uac.screen"
	cpid=$DG_LAST_PID
	# If one side dies early, stop the other at once instead of waiting for its -timeout
	# (SIGINT: SIPp ends gracefully and still writes its statistics and the shim summary).
	while kill -0 "$cpid" 2>/dev/null && kill -0 "$upid" 2>/dev/null; do sleep 0.2; done
	if kill -0 "$cpid" 2>/dev/null; then
		sleep 2 # a UAS that failed: let the UAC notice on its own first
		kill -0 "$cpid" 2>/dev/null && dg_log "$tag: UAS ended early: stopping the UAC" && kill -INT "$cpid"
	fi
	wait "$cpid"
	crc=$?
	if kill -0 "$upid" 2>/dev/null && [ "$crc" -ne 0 ]; then
		dg_log "$tag: UAC failed: stopping the UAS"
		kill -INT "$upid"
	fi
	wait "$upid" # normally ends by itself after its CALLS calls (+4 s timewait)
	urc=$?
	dg_log "$tag: UAC -t $mode exit $crc, UAS -t u1 exit $urc, $(dg_elapsed "$t0") s"
	csv_check "$p.uac.csv" "$tag UAC" 1 || ok=0
	csv_check "$p.uas.csv" "$tag UAS" 0 || ok=0
	[ "$crc" -eq 0 ] && [ "$urc" -eq 0 ] || ok=0
	if [ $ok -ne 1 ]; then
		[ ! -s "$p.uac.screen" ] || dg_tail "$p.uac.screen" 40
		[ ! -s "$p.uas.screen" ] || dg_tail "$p.uas.screen" 20
		sipp_errors "$p.uac.log" UAC
		sipp_errors "$p.uas.log" UAS
		return 1
	fi
}

for mode in u1 un; do
	run_pair "native-$mode" "$mode" ||
		dg_fail "native SIPp run (-t $mode, no shim) failed: environment problem, not the shim"
done
dg_log "native runs passed"

dg_require_shim
dg_log "shim: ${DG_SHIM_ENV[*]}"
for mode in u1 un; do
	tag=shim-$mode
	run_pair "$tag" "$mode" "${DG_SHIM_ENV[@]}" || dg_fail "SIPp -t $mode with the shim failed"
	ok=1
	for role in uas uac; do
		dg_check_framed "$tag ${role^^} rx" "$sdir/$tag.$role.log" rx || ok=0
		# tx too (summary already printed above): only its verdict line
		out=$(dg_check_framed "$tag ${role^^} tx" "$sdir/$tag.$role.log" tx) || ok=0
		tail -n 1 <<<"$out"
	done
	[ $ok -eq 1 ] || dg_fail "SIPp -t $mode: traffic not carried framed"
done
dg_log "PASS ($(dg_elapsed "$t_start") s)"
