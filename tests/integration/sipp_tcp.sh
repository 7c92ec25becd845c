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
# shellcheck source=sipp_lib.sh
. "$here/sipp_lib.sh"
dg_init sipp_tcp "$@"
t_start=$(date +%s.%N)
# 200 calls at 400 calls/s, each held 2000 ms (see Concurrency above); the pair runner,
# sipp_run_pair, and the UAC/UAS statistics checks (sipp_csv_check) are in sipp_lib.sh.
sipp_init tcp 200 400 2000

sipp_native t1 tn
dg_require_shim
dg_log "shim: ${DG_SHIM_ENV[*]}"
failed=()
for mode in t1 tn; do
	tag=shim-$mode
	if ! sipp_run_pair "$tag" "$mode" "${DG_SHIM_ENV[@]}"; then
		failed+=("SIPp -t $mode with the shim: calls failed")
		continue
	fi
	min=1
	[ "$mode" = t1 ] || min=$SIPP_CALLS # one connection per call
	for role in uas uac; do
		dg_check_rc "$tag ${role^^}" "$SIPP_DIR/$tag.$role.log" "$min" ||
			failed+=("SIPp -t $mode ${role^^}: not over RC")
	done
done
if [ ${#failed[@]} -ne 0 ]; then
	dg_fail "$(IFS=';'; echo "${failed[*]}" | sed 's/;/; /g')"
fi
dg_log "PASS ($(dg_elapsed "$t_start") s)"
