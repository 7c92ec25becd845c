# shellcheck shell=bash
# sipp_lib.sh: the SIPp UAC -> UAS pair runner shared by sipp_udp.sh and sipp_tcp.sh, the same
# for both transports but where a line says udp or tcp. Source it after lib.sh; after dg_init
# call sipp_init TRANSPORT CALLS RATE HOLD_MS, then sipp_native MODE... and sipp_run_pair.
#
# Hooks (tests/twohost runs the UAS on one host and the UAC on another): SIPP_UAS_PRE and
# SIPP_UAC_PRE, a command prefix for each side (e.g. ip netns exec NS); SIPP_UAS_ENV and
# SIPP_UAC_ENV, NAME=VALUE words for one side only (after the ENV both get); SIPP_UAS_IP and
# SIPP_UAC_IP, each side's address (default 127.0.0.1, set by sipp_init).
#
# Ports (from DG_PORT, "BASE"): UAS SIP BASE, UAC SIP BASE+1, media (-mp, SIPp binds mp and
# mp+2) BASE+2 (UAS) and BASE+3 (UAC), control ports (-cp, UDP) BASE+6 and BASE+7.

# sipp_init udp|tcp CALLS RATE HOLD_MS: needs SIPp, python3 and ss; sets SIPP_TRANSPORT,
# SIPP_CALLS (the UAC makes them, the UAS takes them: -m), SIPP_RATE (calls/s), SIPP_HOLD_MS
# (each call's pause before its BYE) and SIPP_DIR, where every run's logs and statistics stay.
sipp_init() {
	SIPP_TRANSPORT=$1
	SIPP_CALLS=$2
	SIPP_RATE=$3
	SIPP_HOLD_MS=$4
	case $SIPP_TRANSPORT in
	udp) SIPP_UAS_MODE=u1 ;; # the UAS: one socket for all calls
	tcp) SIPP_UAS_MODE=t1 ;; # the UAS: one listening socket, accepts every connection
	*) dg_fail "sipp_init: transport '$SIPP_TRANSPORT' is neither udp nor tcp" ;;
	esac
	dg_need sipp sip-tester
	dg_need python3 python3
	dg_need ss iproute2
	SIPP_DIR=$DG_TMP/sipp
	mkdir -p "$SIPP_DIR"
	# -max_socket 19800 is required (the default exceeds ulimit -n); over UDP SIPp then warns
	# that 19800 + open calls exceeds the open-file limit "to allow for media support": harmless
	# here.
	SIPP_UAS_PRE=() SIPP_UAC_PRE=() SIPP_UAS_ENV=() SIPP_UAC_ENV=()
	SIPP_UAS_IP=127.0.0.1 SIPP_UAC_IP=127.0.0.1
	SIPP_COMMON=(-max_socket 19800 -nostdin -trace_stat -fd 1 -trace_screen
		-timeout 60s -timeout_error)
}

# sipp_csv_check FILE LABEL ROLE: final statistics from a SIPp -trace_stat file; prints them and
# returns 1 unless
#   - (uac) SIPP_CALLS calls succeeded, none failed and SIPP_CALLS were up at once (the peak of
#     the CurrentCall column);
#   - (uas, udp) SIPP_CALLS calls succeeded and none failed;
#   - (uas, tcp) SIPP_CALLS calls came in and every failed one failed for "TCP connection
#     closed" (FailedTcpClosed: see sipp_tcp.sh).
# Over UDP every column read must be there; over TCP a missing count column reads 0.
sipp_csv_check() {
	python3 - "$1" "$2" "$SIPP_CALLS" "$3" "$SIPP_TRANSPORT" "$DG_NAME" <<'EOF'
import csv, sys
path, label, calls, role, transport, name = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                             sys.argv[4], sys.argv[5], sys.argv[6])
tcp = transport == "tcp"
try:
    rows = list(csv.DictReader(open(path), delimiter=';'))
except OSError as e:
    print(f"{name}: {label}: no statistics file: {e}"); sys.exit(1)
if not rows:
    print(f"{name}: {label}: empty statistics file"); sys.exit(1)
last = rows[-1]
if tcp:
    n = lambda k: int(last.get(k, 0) or 0)
else:
    n = lambda k: int(last[k])
ok_calls, failed, created = n("SuccessfulCall(C)"), n("FailedCall(C)"), n("TotalCallCreated")
retrans = int(last.get("Retransmissions(C)", 0) or 0)
peak = max(int(r["CurrentCall"]) for r in rows)
fields = [f"created={created}"]
if tcp:
    incoming, tcp_closed = n("IncomingCall(C)"), n("FailedTcpClosed(C)")
    fields.append(f"incoming={incoming}")
fields += [f"successful={ok_calls}", f"failed={failed}"]
if tcp:
    fields.append(f"failed_tcp_closed={tcp_closed}")
fields += [f"peak_concurrent={peak}", f"retransmissions={retrans}",
           f"elapsed={last['ElapsedTime(C)'][:8]}"]
print(f"{name}: {label}: " + " ".join(fields))
bad = []
if role == "uac" or not tcp:
    if ok_calls != calls or failed != 0:
        bad.append(f"expected {calls} successful and 0 failed calls")
if role == "uac":
    if peak < calls:
        bad.append(f"only {peak} calls were up at once, not {calls}")
elif tcp:
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
# error/warning lines from a log, deduplicated (over TCP with the shim's pids and the fd
# numbers folded: one connection per call).
sipp_errors() {
	local lines fold='s/^[0-9]{4}-[^\t]*\t[^\t]*\t//'
	[ "$SIPP_TRANSPORT" = udp ] || fold+='; s/dgshim\[[0-9]+\]/dgshim[PID]/; s/fd [0-9]+/fd N/g'
	lines=$(grep -aE $'^[0-9]{4}-[0-9]{2}-[0-9]{2}\t|dgshim\[[0-9]+\]: (error|warn)' "$1" |
		sed -E "$fold" | sort | uniq -c | sort -rn | head -n 15)
	[ -n "$lines" ] || return 0
	dg_log "--- $2 errors (count, message) from ${1#"$DG_TMP"/}"
	sed 's/^/    | /' <<<"$lines"
}

# sipp_run_pair TAG MODE ENV...: UAS (-t u1 over UDP, -t t1 over TCP) + UAC (-t MODE), ENV
# (NAME=VALUE words) given to both. Logs and statistics stay in $SIPP_DIR/TAG.*; returns 1 on
# failure: a SIPp exit code (the UAC 0; the UAS 0, over TCP also 1: its TCP-closed calls) or
# statistics (sipp_csv_check) not as required.
sipp_run_pair() {
	local tag=$1 mode=$2 base=$DG_PORT upid cpid urc crc ok=1 t0
	shift 2
	local p="$SIPP_DIR/$tag" t=$SIPP_TRANSPORT
	if [ "$t" = udp ]; then
		if dg_wait_udp "$base" 0 || dg_wait_udp $((base + 1)) 0; then
			dg_log "$tag: UDP port $base or $((base + 1)) is already in use by another program"
			return 1
		fi
	elif dg_wait_tcp "$base" 0; then
		dg_log "$tag: TCP port $base is already in use by another program"
		return 1
	fi
	t0=$(date +%s.%N)
	dg_bg "$p.uas.log" "${SIPP_UAS_PRE[@]}" bash -c 'cd "$1" && shift && exec "$@"' _ "$SIPP_DIR" \
		timeout -k 5 90 env "$@" "${SIPP_UAS_ENV[@]}" sipp -sn uas -i "$SIPP_UAS_IP" -p "$base" \
		-t "$SIPP_UAS_MODE" -m "$SIPP_CALLS" \
		-mp $((base + 2)) -cp $((base + 6)) "${SIPP_COMMON[@]}" \
		-stf "$p.uas.csv" -screen_file "$p.uas.screen"
	upid=$DG_LAST_PID
	dg_wait_port "$t" "$base" 20 "$upid"
	case $?:$t in
	1:udp) dg_log "$tag: warning: UAS socket on port $base not seen after 20 s" ;;
	2:udp) dg_log "$tag: UAS exited before its socket was seen" ;;
	1:tcp) dg_log "$tag: warning: UAS not listening on TCP port $base after 20 s" ;;
	2:tcp) dg_log "$tag: UAS exited before it listened" ;;
	esac
	dg_bg "$p.uac.log" "${SIPP_UAC_PRE[@]}" bash -c 'cd "$1" && shift && exec "$@"' _ "$SIPP_DIR" \
		timeout -k 5 90 env "$@" "${SIPP_UAC_ENV[@]}" sipp -sn uac "$SIPP_UAS_IP:$base" \
		-i "$SIPP_UAC_IP" -p $((base + 1)) -t "$mode" \
		-m "$SIPP_CALLS" -l "$SIPP_CALLS" -r "$SIPP_RATE" -d "$SIPP_HOLD_MS" \
		-mp $((base + 3)) -cp $((base + 7)) "${SIPP_COMMON[@]}" \
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
	wait "$upid" # normally ends by itself after its SIPP_CALLS calls (UDP: +4 s timewait)
	urc=$?
	dg_log "$tag: UAC -t $mode exit $crc, UAS -t $SIPP_UAS_MODE exit $urc, $(dg_elapsed "$t0") s"
	sipp_csv_check "$p.uac.csv" "$tag UAC" uac || ok=0
	sipp_csv_check "$p.uas.csv" "$tag UAS" uas || ok=0
	# UAS over TCP: 1 = some calls failed (the TCP-closed ones, checked above)
	[ "$crc" -eq 0 ] && { [ "$urc" -eq 0 ] || { [ "$t" = tcp ] && [ "$urc" -eq 1 ]; }; } || ok=0
	if [ $ok -ne 1 ]; then
		[ ! -s "$p.uac.screen" ] || dg_tail "$p.uac.screen" 40
		[ ! -s "$p.uas.screen" ] || dg_tail "$p.uas.screen" 20
		sipp_errors "$p.uac.log" UAC
		sipp_errors "$p.uas.log" UAS
		return 1
	fi
}

# sipp_native MODE...: sipp_run_pair without the shim, the UAC in each -t MODE in turn; the
# first failed run fails the test (an environment problem, not the shim).
sipp_native() {
	local mode
	for mode in "$@"; do
		sipp_run_pair "native-$mode" "$mode" ||
			dg_fail "native SIPp run (-t $mode, no shim) failed: environment problem, not the shim"
	done
	dg_log "native runs passed"
}
