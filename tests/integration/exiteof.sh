#!/usr/bin/env bash
# exiteof.sh BUILD_DIR BASE_PORT [RUNS]: a writer sends 8 MiB on a TCP connection and then
# closes, shuts down, returns from main, calls exit(), _exit(), or is killed (SIGKILL); the
# reader must read exactly those bytes and then end of file, natively and with both ends
# preloaded (the connection carried over RC: the reader's exit summary must say rc_conns=1,
# rc_plain=0). RUNS (default 5) runs of each way, preloaded; one natively.
# Environment:
#   EXITEOF_TWOHOST=1  the reader on host a, the writer on host b of the two-host bed
#                      (tests/twohost/netns.sh), found by discovery with no rules
#   EXITEOF_HOGS=N     N busy loops (CPU contention) during the runs
# The hardening issue's 100 runs: exiteof.sh BUILD 19960 100, with and without EXITEOF_HOGS=2,
# and EXITEOF_TWOHOST=1 (docs/results.md records them).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
name=exiteof
[ "${EXITEOF_TWOHOST:-0}" = 1 ] && name=twohost_exiteof
dg_init "$name" "$1" "$2"
runs=${3:-5}
dg_require_shim
for i in "${!DG_SHIM_ENV[@]}"; do # python's own leaks are not ours to judge
	[[ ${DG_SHIM_ENV[$i]} == ASAN_OPTIONS=* ]] && DG_SHIM_ENV[$i]+=":detect_leaks=0"
done
if [ "${EXITEOF_HOGS:-0}" -gt 0 ] && [ -n "${DG_TSAN_RT:-}" ]; then
	# ThreadSanitizer makes every process several times slower; with two busy loops beside
	# them on two cores the runs outlast the test's limit (900 s in ./scripts/tsan) before they
	# could say anything about threads that the uncontended exiteof does not
	dg_log "SKIP: a ThreadSanitizer build under two busy loops: too slow to finish (the uncontended exiteof runs here)"
	exit 77
fi
on_r=() on_w=()
export EXITEOF_HOST=127.0.0.1
if [ "${EXITEOF_TWOHOST:-0}" = 1 ]; then
	# shellcheck source=../twohost/netns.sh
	. "$here/../twohost/netns.sh"
	th_up
	EXITEOF_HOST=$TH_A_IP
	on_r=(ip netns exec "$TH_NS_A") on_w=(ip netns exec "$TH_NS_B")
fi
for _ in $(seq "${EXITEOF_HOGS:-0}"); do
	dg_bg /dev/null sh -c 'while :; do :; done'
done
n=$((8 << 20))
port=$DG_PORT
failed=()
retried=0
# one TAG HOW ENV...: one run; returns 2 when a preloaded run's connection went plain (a
# discovery answer later than the connect's wait, two hosts only), 1 on a failure.
one() {
	local tag=$1 how=$2 out=$DG_TMP/$1.out
	shift 2
	"${on_r[@]}" env "$@" python3 "$here/exiteof.py" read "$port" "$n" >"$out" 2>"$out.err" &
	local r=$! i
	for i in $(seq 100); do grep -qs listening "$out" && break; sleep 0.05; done
	"${on_w[@]}" env "$@" timeout 30 python3 "$here/exiteof.py" write "$port" "$n" "$how" 2>"$DG_TMP/$tag.werr"
	wait "$r"
	local rc=$?
	port=$((port == DG_PORT ? DG_PORT + 1 : DG_PORT)) # TIME_WAIT: alternate
	if [ "$rc" -ne 0 ]; then
		failed+=("$tag: $(tail -n 1 "$out")")
		dg_tail "$out.err" 8
		return 1
	fi
	[[ $tag == native-* ]] && return 0
	if [ "${EXITEOF_TWOHOST:-0}" = 1 ] && [ "$(dg_sum "$out.err" rc_conns)" = 0 ] &&
		[ "$(dg_sum "$out.err" rc_plain)" = 1 ]; then
		return 2
	fi
	if ! dg_check_rc "$tag reader" "$out.err" >/dev/null; then
		failed+=("$tag: the reader's connection was not carried over RC: $(dg_summaries "$out.err" | tail -n 1)")
		return 1
	fi
	return 0
}
for how in close shutdown return exit _exit kill; do
	one "native-$how" "$how" -u LD_PRELOAD
	for k in $(seq "$runs"); do
		# a plain run (first contact between two new processes on two hosts, the answer later
		# than the connect's 10 ms on a loaded machine) tests nothing here: run it again
		for try in 1 2 3 4 5; do
			one "shim-$how-$k" "$how" "${DG_SHIM_ENV[@]}"
			[ $? = 2 ] || break
			retried=$((retried + 1))
			dg_log "shim-$how-$k went plain (discovery answer after the connect's wait): run again ($try)"
			[ "$try" = 5 ] && failed+=("shim-$how-$k: plain five times in a row")
		done
	done
	dg_log "$how: native and $runs preloaded runs done"
done
if [ ${#failed[@]} -gt 0 ]; then
	for f in "${failed[@]}"; do dg_log "FAIL: $f"; done
	exit 1
fi
dg_log "PASS: every run read 8 MiB and then end of file, every preloaded run carried over RC ($retried runs again for a late discovery answer)"
