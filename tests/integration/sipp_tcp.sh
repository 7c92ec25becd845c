#!/usr/bin/env bash
# sipp_tcp.sh BUILD_DIR BASE_PORT: SIPp UAC -> UAS over TCP on 127.0.0.1, 200 calls that are all
# up at the same time, with the UAC in '-t t1' (one TCP connection for all calls) and in '-t tn'
# (one TCP connection per call: 200 connections open at once); the UAS is always '-t t1' (it
# accepts every connection). Each mode runs natively first (so a failure can be told apart from
# an environment problem), then with UAC and UAS both preloaded with
# BUILD_DIR/shim/libdgshim.so. A run passes when
#   - the UAC (the judge) exits 0 (SIPp: every call succeeded) and its final statistics
#     (-trace_stat CSV) say SuccessfulCall=200, FailedCall=0, and its CurrentCall column
#     reached 200;
#   - the UAS received all 200 calls (IncomingCall=200) and every call it counts as failed
#     failed for "TCP connection closed" (FailedTcpClosed): see below; its exit code is 0 or 1;
#   - with the shim: both processes' exit summaries say their TCP connections were carried over
#     RC (dg_check_rc: rc_conns >= 1 with -t t1, >= 200 with -t tn; RC payload bytes > 0;
#     rc_plain = 0).
# Exit 0 pass, 1 fail (also when the shim is not built), 77 only if SIPp cannot be installed.
#
# The UAS's failed calls (measured, SIPp 3.6.1): the UAC closes a call's TCP connection as soon
# as the call is over (-t tn), or its only connection when it exits (-t t1); the UAS aborts the
# calls still in their final pause on that connection and counts them as FailedCall and
# FailedTcpClosed (natively: -t t1 1-4 of 200, -t tn 86-140 of 200, varying with timing). That is
# SIPp's TCP behaviour, not a transport fault, so the UAS is judged on IncomingCall and on
# FailedCall = FailedTcpClosed; the UAC sees every call complete.
#
# Concurrency: the UAC creates calls at -r 400 calls/s and holds each one -d 2000 ms, so all 200
# calls are up from ~0.5 s to ~2 s; SIPp samples CurrentCall every second (-fd 1) and the test
# requires its maximum to be 200 (with -t tn that is 200 TCP connections at once).
# Ports: UAS SIP BASE, UAC SIP BASE+1, media (-mp, SIPp binds mp and mp+2) BASE+2 (UAS) and
# BASE+3 (UAC), control ports (-cp, UDP) BASE+6 and BASE+7. A run takes ~2.7 s; the script ~12 s.
# Verified (SIPp 3.6.1): 10 runs of the script with a shim that fell back to plain TCP (so 40
# runs over plain TCP, 20 of them without any preload), 3 with both CPUs kept busy: the UAC
# always had 200/200 calls with 0 failed and a peak of 200; the UAS always 200 incoming, all of
# its failures TCP-closed (-t t1: 1-4, -t tn: 86-140).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dg_init sipp_tcp "$@"
base=$DG_PORT
t_start=$(date +%s.%N)

dg_need sipp sip-tester
dg_need python3 python3
dg_need ss iproute2

CALLS=200
RATE=400
HOLD_MS=2000
sdir=$DG_TMP/sipp
mkdir -p "$sdir"
# -max_socket 19800 is required (the default exceeds ulimit -n).
common=(-i 127.0.0.1 -max_socket 19800 -nostdin -trace_stat -fd 1 -trace_screen
	-timeout 60s -timeout_error)

# csv_check FILE LABEL ROLE: final statistics from a SIPp -trace_stat file; prints them and
# returns 1 unless (uac) CALLS calls succeeded, none failed and CALLS were up at once, or (uas)
# CALLS calls came in and every failed one failed for "TCP connection closed".
csv_check() {
	python3 - "$1" "$2" "$CALLS" "$3" "$DG_NAME" <<'EOF'
import csv, sys
path, label, calls, role, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
try:
    rows = list(csv.DictReader(open(path), delimiter=';'))
except OSError as e:
    print(f"{name}: {label}: no statistics file: {e}"); sys.exit(1)
if not rows:
    print(f"{name}: {label}: empty statistics file"); sys.exit(1)
last = rows[-1]
n = lambda k: int(last.get(k, 0) or 0)
ok_calls, failed, created = n("SuccessfulCall(C)"), n("FailedCall(C)"), n("TotalCallCreated")
incoming, tcp_closed, retrans = n("IncomingCall(C)"), n("FailedTcpClosed(C)"), n("Retransmissions(C)")
peak = max(int(r["CurrentCall"]) for r in rows)
print(f"{name}: {label}: created={created} incoming={incoming} successful={ok_calls} failed={failed} "
      f"failed_tcp_closed={tcp_closed} peak_concurrent={peak} retransmissions={retrans} "
      f"elapsed={last['ElapsedTime(C)'][:8]}")
bad = []
if role == "uac":
    if ok_calls != calls or failed != 0:
        bad.append(f"expected {calls} successful and 0 failed calls")
    if peak < calls:
        bad.append(f"only {peak} calls were up at once, not {calls}")
else:
    if incoming != calls:
        bad.append(f"expected {calls} incoming calls")
    if failed != tcp_closed:
        bad.append(f"{failed - tcp_closed} call(s) failed for another reason than the UAC closing its TCP connection")
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
		sed -E 's/^[0-9]{4}-[^\t]*\t[^\t]*\t//; s/dgshim\[[0-9]+\]/dgshim[PID]/; s/fd [0-9]+/fd N/g' |
		sort | uniq -c | sort -rn | head -n 15)
	[ -n "$lines" ] || return 0
	dg_log "--- $2 errors (count, message) from ${1#"$DG_TMP"/}"
	sed 's/^/    | /' <<<"$lines"
}

# run_pair TAG MODE ENV...: UAS (-t t1) + UAC (-t MODE), ENV (NAME=VALUE words) given to both.
# Logs and statistics stay in $sdir/TAG.*; returns 1 on failure.
run_pair() {
	local tag=$1 mode=$2 upid cpid urc crc ok=1 t0
	shift 2
	local p="$sdir/$tag"
	if dg_wait_tcp "$base" 0; then
		dg_log "$tag: TCP port $base is already in use by another program"
		return 1
	fi
	t0=$(date +%s.%N)
	dg_bg "$p.uas.log" bash -c 'cd "$1" && shift && exec "$@"' _ "$sdir" \
		timeout -k 5 90 env "$@" sipp -sn uas -p "$base" -t t1 -m "$CALLS" \
		-mp $((base + 2)) -cp $((base + 6)) "${common[@]}" \
		-stf "$p.uas.csv" -screen_file "$p.uas.screen"
	upid=$DG_LAST_PID
	dg_wait_tcp "$base" 20 "$upid"
	case $? in
	1) dg_log "$tag: warning: UAS not listening on TCP port $base after 20 s" ;;
	2) dg_log "$tag: UAS exited before it listened" ;;
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
	wait "$upid" # normally ends by itself after its CALLS calls
	urc=$?
	dg_log "$tag: UAC -t $mode exit $crc, UAS -t t1 exit $urc, $(dg_elapsed "$t0") s"
	csv_check "$p.uac.csv" "$tag UAC" uac || ok=0
	csv_check "$p.uas.csv" "$tag UAS" uas || ok=0
	# UAS: 1 = some calls failed (the TCP-closed ones, checked above)
	[ "$crc" -eq 0 ] && { [ "$urc" -eq 0 ] || [ "$urc" -eq 1 ]; } || ok=0
	if [ $ok -ne 1 ]; then
		[ ! -s "$p.uac.screen" ] || dg_tail "$p.uac.screen" 40
		[ ! -s "$p.uas.screen" ] || dg_tail "$p.uas.screen" 20
		sipp_errors "$p.uac.log" UAC
		sipp_errors "$p.uas.log" UAS
		return 1
	fi
}

for mode in t1 tn; do
	run_pair "native-$mode" "$mode" ||
		dg_fail "native SIPp run (-t $mode, no shim) failed: environment problem, not the shim"
done
dg_log "native runs passed"

dg_require_shim
dg_log "shim: ${DG_SHIM_ENV[*]}"
failed=()
for mode in t1 tn; do
	tag=shim-$mode
	if ! run_pair "$tag" "$mode" "${DG_SHIM_ENV[@]}"; then
		failed+=("SIPp -t $mode with the shim: calls failed")
		continue
	fi
	min=1
	[ "$mode" = t1 ] || min=$CALLS # one connection per call
	for role in uas uac; do
		dg_check_rc "$tag ${role^^}" "$sdir/$tag.$role.log" "$min" ||
			failed+=("SIPp -t $mode ${role^^}: not over RC")
	done
done
if [ ${#failed[@]} -ne 0 ]; then
	dg_fail "$(IFS=';'; echo "${failed[*]}" | sed 's/;/; /g')"
fi
dg_log "PASS ($(dg_elapsed "$t_start") s)"
