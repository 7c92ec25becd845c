#!/usr/bin/env bash
# rcpeer.sh BUILD_DIR BASE_PORT: a TCP peer that stops reading, or is SIGKILLed mid-message
# (issue "Hardening", item 6, the RC part), natively and then with both ends preloaded (the
# connection carried over RC on the soft provider; the survivors' exit summaries must say
# rc_conns=1). The programs are tests/integration/rcpeer.c; each case below fails the test.
#   stall     the reader accepts and reads nothing until told (SIGUSR1). The writer fills the
#             connection non-blocking until EAGAIN; poll and epoll must say not writable;
#             a send with SO_SNDTIMEO must return EAGAIN after its timeout; then one blocking
#             send of the rest of 64 MiB (more than 10x any buffer on the way) must block.
#             Measured over 3 s of the stall: both processes' CPU (at most 15 ticks, 5 % of
#             a core) and resident memory growth (at most 4 MiB each, from the writer's
#             after its connect and the reader's after its accept). Then the reader reads:
#             all 64 MiB exactly once and in order, then end of file.
#   killstop  the reader reads 1 MiB, stops, and is SIGKILLed while the writer is blocked in
#             a 16 MiB send: the writer's send must fail with EPIPE or ECONNRESET (SIGPIPE
#             ignored) within 5 s of the kill.
#   killpoll  the same with a non-blocking writer waiting in poll(POLLOUT): poll must wake and
#             the next send fail with EPIPE or ECONNRESET within 5 s.
#   killbusy  the same as killstop with the reader reading at full speed when killed (the writer mid-way
#             through a 16 MiB send).
#   killw     the writer is SIGKILLed mid-way through its sends: the reader must read at least
#             every byte of the sends that had returned, only bytes sent, in order, and then
#             end of file or ECONNRESET within 5 s of the kill (natively: end of file).
#   killwstall the writer is SIGKILLed while blocked by a stalled reader (64 KiB sends), which
#             then reads: the same checks as killw.
# Preloaded, the survivor's summary must also say how the connection ended: killstop,
# killpoll and killbusy rc_peer_gone + rc_reset >= 1 on the writer, killw rc_peer_gone >= 1 on the reader
# (docs/shim.md, "Counters").
# Environment: RCPEER_ONLY=REGEX runs only the cases whose KIND-CASE (native-stall...) matches;
# RCPEER_TWOHOST=1 the reader on host a, the writer on host b of the two-host bed
# (tests/twohost/netns.sh), the writer with a rules line naming host a (mode=rc).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
name=rcpeer
[ "${RCPEER_TWOHOST:-0}" = 1 ] && name=twohost_rcpeer
dg_init "$name" "$1" "$2"
dg_require_shim
prog=$DG_BUILD/tests/integration/rcpeer
[ -x "$prog" ] || dg_fail "$prog missing: build it first (ninja -C $DG_BUILD)"
host=127.0.0.1 on_r=() on_w=() w_extra=()
if [ "${RCPEER_TWOHOST:-0}" = 1 ]; then
	# shellcheck source=../twohost/netns.sh
	. "$here/../twohost/netns.sh"
	th_up
	host=$TH_A_IP
	on_r=(ip netns exec "$TH_NS_A") on_w=(ip netns exec "$TH_NS_B")
	# the writer names the reader's host in a rules line (mode=rc), as tcp_rc.sh's rc case:
	# discovery's answer can come after the connect's 10 ms wait on a loaded machine (the
	# connection then goes plain; exiteof.sh runs it again), and these cases are about the
	# carried connection, not about finding the peer
	w_extra=("DGSHIM_RULES=mode=rc addr=$TH_A_IP/32")
fi
port=$DG_PORT
failed=()
figures=()
KIND="" ENV=() PID_r="" PID_w="" JOB_r="" JOB_w=""
tick_hz=$(getconf CLK_TCK)

# wait_line FILE REGEX SECONDS: 0 once a line of FILE matches, 1 after SECONDS.
wait_line() {
	for _ in $(seq $(($3 * 20))); do
		grep -Eqs "$2" "$1" && return 0
		sleep 0.05
	done
	return 1
}
# word FILE KEY: the value of the last KEY=value word in FILE.
word() { grep -aEo "(^| )$2=[^ ]*" "$1" | tail -n 1 | sed 's/.*=//'; }
# wait_gone PID SECONDS: 0 once PID has exited, 1 after SECONDS.
wait_gone() {
	for _ in $(seq $(($2 * 20))); do
		kill -0 "$1" 2>/dev/null || return 0
		sleep 0.05
	done
	return 1
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo -1; }
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo -1; }
now() { date +%s.%N; }
# secs A B: B - A, two decimals
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
# start SIDE TAG MODE ARGS...: rcpeer on its host (SIDE r or w) in the background, output in
# $DG_TMP/TAG.SIDE; its own pid (it prints it) in PID_r or PID_w, the job's in JOB_r / JOB_w.
start() {
	local side=$1 tag=$2 out=$DG_TMP/$2.$1 pre
	shift 2
	local extra=()
	if [ "$side" = r ]; then pre=("${on_r[@]}"); else pre=("${on_w[@]}"); fi
	[ "$side" = w ] && [ "$KIND" != native ] && extra=("${w_extra[@]}")
	# in a subshell that does not exec it: the SIGKILLs below are then not reported by bash
	("${pre[@]}" env "${ENV[@]}" "${extra[@]}" "$prog" "$([ "$side" = r ] && echo read || echo write)" "$host" "$port" "$@" \
		>"$out" 2>"$out.err"; rc=$?; exit $rc) 2>/dev/null &
	local job=$!
	DG_PIDS+=("$job")
	wait_line "$out" '^pid=' 10 || { failed+=("$tag: rcpeer $side did not start"); return 1; }
	printf -v "PID_$side" '%s' "$(word "$out" pid)"
	printf -v "JOB_$side" '%s' "$job"
	if [ "$side" = r ] && ! wait_line "$out" '^listening' 10; then
		failed+=("$tag: the reader does not listen: $(tail -n 1 "$out")")
		return 1
	fi
}
# bad TAG WHY: records a failure (with the programs' last lines) and returns 1.
bad() {
	failed+=("$1: $2")
	dg_log "FAIL: $1: $2"
	local f
	for f in "$DG_TMP/$1".*; do dg_tail "$f" 6; done
	return 1
}
# reap TAG SECONDS: both programs have exited within SECONDS (else killed, a failure).
reap() {
	local p
	for p in "$JOB_r" "$JOB_w"; do
		if ! wait_gone "$p" "$2"; then
			kill -KILL "$PID_r" "$PID_w" 2>/dev/null
			dg_kill_tree "$JOB_r"
			dg_kill_tree "$JOB_w"
			bad "$1" "a program still runs $2 s after it should have ended (a hang)"
			return 1
		fi
	done
}
# ends TAG SIDE: how the preloaded SIDE's summary says its connections ended.
ends() {
	[ "$KIND" = native ] && return 0
	local f=$DG_TMP/$1.$2.err
	echo ", summary rc_conns=$(dg_sum "$f" rc_conns) rc_reset=$(dg_sum "$f" rc_reset) rc_peer_gone=$(dg_sum "$f" rc_peer_gone)"
}
# carried TAG SIDE: the preloaded SIDE's summary says the connection was carried over RC.
carried() {
	local f=$DG_TMP/$1.$2.err
	[ "$KIND" = native ] && return 0
	[ "$(dg_sum "$f" rc_conns)" = 1 ] || { bad "$1" "the $2 side's connection was not carried over RC: $(dg_summaries "$f")"; return 1; }
}

case_stall() {
	local tag=$KIND-stall
	start r "$tag" stall || return 1
	start w "$tag" stall || return 1
	wait_line "$DG_TMP/$tag.w" '^(blocking|FAIL)' 15 || { bad "$tag" "the writer did not reach its blocking send"; return 1; }
	grep -q '^FAIL' "$DG_TMP/$tag.w" && { bad "$tag" "$(grep '^FAIL' "$DG_TMP/$tag.w")"; return 1; }
	sleep 0.5
	local cw0 cr0 cw1 cr1 rw rr
	cw0=$(ticks "$PID_w") cr0=$(ticks "$PID_r")
	sleep 3
	cw1=$(ticks "$PID_w") cr1=$(ticks "$PID_r") rw=$(rss "$PID_w") rr=$(rss "$PID_r")
	grep -q '^sent' "$DG_TMP/$tag.w" && { bad "$tag" "the writer's blocking send returned while nobody read"; return 1; }
	kill -0 "$PID_w" 2>/dev/null || { bad "$tag" "the writer ended during the stall"; return 1; }
	local rw0 rr0 gw gr
	rw0=$(word "$DG_TMP/$tag.w" rss0) rr0=$(word "$DG_TMP/$tag.r" rss)
	gw=$((rw - rw0)) gr=$((rr - rr0))
	kill -USR1 "$PID_r"
	reap "$tag" 20 || return 1
	local buffered sndt
	buffered=$(word "$DG_TMP/$tag.w" buffered) sndt=$(word "$DG_TMP/$tag.w" sndtimeo_secs)
	figures+=("$tag: buffered before EAGAIN $buffered B (refills $(word "$DG_TMP/$tag.w" refills)), SO_SNDTIMEO 0.4 s -> EAGAIN after ${sndt} s, over 3 s stalled: writer CPU $((cw1 - cw0)) ticks RSS +${gw} kB, reader CPU $((cr1 - cr0)) ticks RSS +${gr} kB (tick = 1/$tick_hz s)")
	dg_log "${figures[-1]}"
	grep -q '^sent bytes=67108864$' "$DG_TMP/$tag.w" || { bad "$tag" "the writer did not send its 64 MiB"; return 1; }
	grep -q '^read bytes=67108864 end=EOF' "$DG_TMP/$tag.r" || { bad "$tag" "the reader did not read 64 MiB and then end of file: $(tail -n 1 "$DG_TMP/$tag.r")"; return 1; }
	[ $((cw1 - cw0)) -le 15 ] || { bad "$tag" "the blocked writer used $((cw1 - cw0)) ticks of CPU in 3 s"; return 1; }
	[ $((cr1 - cr0)) -le 15 ] || { bad "$tag" "the stalled reader used $((cr1 - cr0)) ticks of CPU in 3 s"; return 1; }
	# the bound is 4 MiB; under ThreadSanitizer's shadow memory 16 MiB
	local mb=4096
	[ -z "$DG_TSAN_RT" ] || mb=16384
	[ "$gw" -le $mb ] || { bad "$tag" "the writer's resident memory grew by $gw kB"; return 1; }
	[ "$gr" -le $mb ] || { bad "$tag" "the reader's resident memory grew by $gr kB"; return 1; }
	carried "$tag" w || return 1
	carried "$tag" r || return 1
}

# case_killr TAG WRITER_MODE READER_MODE...: the reader is killed while the writer sends.
case_killr() {
	local tag=$KIND-$1 wmode=$2
	shift 2
	start r "$tag" "$@" || return 1
	start w "$tag" "$wmode" || return 1
	if [ "$1" = stop ]; then
		wait_line "$DG_TMP/$tag.r" '^stopped' 15 || { bad "$tag" "the reader did not read its first MiB"; return 1; }
		sleep 1 # the writer blocks: its window is full
	else
		wait_line "$DG_TMP/$tag.w" '^writing' 15 || { bad "$tag" "the writer's first 16 MiB did not go"; return 1; }
	fi
	kill -0 "$PID_w" 2>/dev/null || { bad "$tag" "the writer ended before the kill"; return 1; }
	local t0
	t0=$(now)
	kill -KILL "$PID_r"
	reap "$tag" 10 || return 1
	wait "$JOB_w"
	local rc=$? t1
	t1=$(word "$DG_TMP/$tag.w" t)
	figures+=("$tag: writer told $(word "$DG_TMP/$tag.w" end) $(secs "$t0" "${t1:-$t0}") s after the reader's SIGKILL, $(word "$DG_TMP/$tag.w" bytes) B sent$(ends "$tag" w)")
	dg_log "${figures[-1]}"
	[ "$rc" = 0 ] || { bad "$tag" "the writer's send did not fail with EPIPE or ECONNRESET: $(tail -n 1 "$DG_TMP/$tag.w")"; return 1; }
	awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(b - a < 5) }' || { bad "$tag" "the writer was told $(secs "$t0" "$t1") s after the kill"; return 1; }
	carried "$tag" w || return 1
	if [ "$KIND" != native ]; then
		local f=$DG_TMP/$tag.w.err
		[ $(($(dg_sum "$f" rc_peer_gone) + $(dg_sum "$f" rc_reset))) -ge 1 ] ||
			{ bad "$tag" "the writer's summary does not count the connection's end: $(dg_summaries "$f")"; return 1; }
	fi
}

case_killw() {
	local tag=$KIND-killw
	start r "$tag" all || return 1
	start w "$tag" until || return 1
	wait_line "$DG_TMP/$tag.w" '^writing' 15 || { bad "$tag" "the writer's first 16 MiB did not go"; return 1; }
	sleep 0.3
	local t0
	t0=$(now)
	kill -KILL "$PID_w"
	reap "$tag" 10 || return 1
	wait "$JOB_r"
	local rc=$? t1 got least
	t1=$(word "$DG_TMP/$tag.r" t) got=$(word "$DG_TMP/$tag.r" bytes) least=$(word "$DG_TMP/$tag.w" bursts)
	figures+=("$tag: reader read $got B (sends returned: $least B) then $(word "$DG_TMP/$tag.r" end) $(secs "$t0" "${t1:-$t0}") s after the writer's SIGKILL$(ends "$tag" r)")
	dg_log "${figures[-1]}"
	[ "$rc" = 0 ] || { bad "$tag" "the reader did not read sent bytes and then an end: $(tail -n 1 "$DG_TMP/$tag.r")"; return 1; }
	[ "$got" -ge "$least" ] || { bad "$tag" "the reader got $got bytes, the writer's returned sends had $least"; return 1; }
	awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(b - a < 5) }' || { bad "$tag" "the reader was told $(secs "$t0" "$t1") s after the kill"; return 1; }
	if [ "$KIND" = native ]; then
		[ "$(word "$DG_TMP/$tag.r" end)" = EOF ] || dg_log "note: natively the reader's end was $(word "$DG_TMP/$tag.r" end)"
		return 0
	fi
	carried "$tag" r || return 1
	local f=$DG_TMP/$tag.r.err
	[ "$(dg_sum "$f" rc_peer_gone)" -ge 1 ] ||
		{ bad "$tag" "the reader's summary does not count the writer's end: $(dg_summaries "$f")"; return 1; }
}

# The writer is SIGKILLed while blocked (its reader stalled, 64 KiB sends), then the reader
# reads: at least the bytes of every send that returned, only bytes sent, then an end.
case_killwstall() {
	local tag=$KIND-killwstall
	start r "$tag" stall || return 1
	start w "$tag" until 65536 || return 1
	wait_line "$DG_TMP/$tag.r" '^stalled' 15 || { bad "$tag" "the reader did not accept"; return 1; }
	wait_line "$DG_TMP/$tag.w" '^writing' 15 || { bad "$tag" "no send returned"; return 1; }
	sleep 1 # the writer blocks: the reader's window is full
	local least t0
	kill -KILL "$PID_w"
	t0=$(now)
	least=$(word "$DG_TMP/$tag.w" bursts)
	sleep 0.5
	kill -USR1 "$PID_r"
	reap "$tag" 10 || return 1
	wait "$JOB_r"
	local rc=$? t1 got
	t1=$(word "$DG_TMP/$tag.r" t) got=$(word "$DG_TMP/$tag.r" bytes)
	figures+=("$tag: reader read $got B (sends returned: $least B) then $(word "$DG_TMP/$tag.r" end) $(secs "$t0" "${t1:-$t0}") s after the writer's SIGKILL (0.5 s of it stalled)$(ends "$tag" r)")
	dg_log "${figures[-1]}"
	[ "$rc" = 0 ] || { bad "$tag" "the reader did not read sent bytes and then an end: $(tail -n 1 "$DG_TMP/$tag.r")"; return 1; }
	[ "$got" -ge "$least" ] || { bad "$tag" "the reader got $got bytes, the writer's returned sends had $least"; return 1; }
	awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(b - a < 5) }' || { bad "$tag" "the reader was told $(secs "$t0" "$t1") s after the kill"; return 1; }
	carried "$tag" r || return 1
}

# run KIND CASE ARGS...: one case natively (KIND native) or preloaded (shim).
run() {
	KIND=$1
	shift
	if [ "$KIND" = native ]; then ENV=(-u LD_PRELOAD); else ENV=("${DG_SHIM_ENV[@]}"); fi
	local what=${1#case_}
	[ "$1" = case_killr ] && what=$2
	[[ $KIND-$what =~ ${RCPEER_ONLY:-.} ]] || return 0
	"$@"
	port=$((port == DG_PORT ? DG_PORT + 1 : DG_PORT)) # TIME_WAIT: alternate
}
for kind in native shim; do
	run "$kind" case_stall
	run "$kind" case_killr killstop until stop $((1 << 20))
	run "$kind" case_killr killpoll untilpoll stop $((1 << 20))
	run "$kind" case_killr killbusy until all
	run "$kind" case_killw
	run "$kind" case_killwstall
done
if [ ${#failed[@]} -gt 0 ]; then
	for f in "${failed[@]}"; do dg_log "FAIL: $f"; done
	exit 1
fi
dg_log "PASS: stalled writer blocked (EAGAIN, not writable, SO_SNDTIMEO) with bounded memory and CPU, every byte once after; killed peers told within 5 s, natively and preloaded"
