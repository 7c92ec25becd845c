#!/usr/bin/env bash
# daemonclose.sh BUILD_DIR BASE_PORT: a daemon-like program (daemonclose.c) makes sockets, closes
# every descriptor from 3 up (close_range, closefrom, a close loop, a /proc/self/fd walk, dup2 of
# /dev/null over each) and goes on without exec: natively and preloaded it must still work, and
# preloaded its new sockets must be carried (the shim's own descriptors survived: issue
# "Hardening" item 5). Then RLIMIT_NOFILE 64: the program must open at least 3/4 of what it opens
# natively (the shim keeps to a quarter of the limit, item 7), every socket working, the first
# ones carried, and one info line saying why the rest stayed plain. RLIMIT_AS just above the
# program's size: datagrams still go, plain; a connect works or fails with ENOMEM and a log
# line. BASE_PORT is unused.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dg_init daemonclose "$@"
bin=$DG_BUILD/tests/integration/daemonclose
[ -x "$bin" ] || dg_fail "$bin does not exist: build it first (ninja -C $DG_BUILD)"
dg_require_shim
failed=()
for m in close_range closefrom loop procfd dup2; do
	timeout -k 5 60 "$bin" "$m" >"$DG_TMP/$m.native" 2>&1 || { failed+=("$m: native run failed"); dg_tail "$DG_TMP/$m.native" 5; }
	timeout -k 5 60 env "${DG_SHIM_ENV[@]}" DGSHIM_LOG=info "$bin" "$m" >"$DG_TMP/$m.shim" 2>"$DG_TMP/$m.err"
	r=$?
	if [ $r -ne 0 ] || ! grep -q "^ok $m" "$DG_TMP/$m.shim"; then
		failed+=("$m: preloaded run failed (exit $r)")
		dg_tail "$DG_TMP/$m.shim" 5
		dg_tail "$DG_TMP/$m.err" 20
		continue
	fi
	# the daemon's own summary (the first line of its pid; the server child is killed)
	dpid=$(sed -n "s/^ok $m pid \([0-9]*\)$/\1/p" "$DG_TMP/$m.shim")
	# a close or dup2 refused is said at info; close_range and closefrom close around ours
	# without an error to explain (debug)
	if [ "$m" != close_range ] && [ "$m" != closefrom ]; then
		grep -q "^dgshim\[$dpid\]: info: .*is the shim's own and stays open" "$DG_TMP/$m.err" ||
			failed+=("$m: no info line saying the shim's own descriptors stayed open")
	fi
	sum=$(grep "^dgshim\[$dpid\]: info: summary:" "$DG_TMP/$m.err")
	tf=$(sed -n 's/.* tx_framed=\([0-9]*\).*/\1/p' <<<"$sum") rc=$(sed -n 's/.* rc_conns=\([0-9]*\).*/\1/p' <<<"$sum")
	dg_log "$m: preloaded ok, daemon's tx_framed=${tf:-?} rc_conns=${rc:-?}"
	# 50 datagrams before, 200 after; one connection before, one after
	[ "${tf:-0}" -ge 250 ] || failed+=("$m: datagrams after closing everything not carried (tx_framed=${tf:-none}, want >= 250)")
	[ "${rc:-0}" -ge 2 ] || failed+=("$m: the connection after closing everything not carried (rc_conns=${rc:-none}, want 2)")
	if grep -Eq "abort|Assertion|libev|fatal" "$DG_TMP/$m.err"; then
		failed+=("$m: the shim complained")
		grep -E "abort|Assertion|libev|fatal" "$DG_TMP/$m.err" | head -n 3
	fi
done
# RLIMIT_NOFILE 64. UD: a taken UDP socket costs the shim no descriptor of its own (its CQ makes
# no eventfd, docs/shim.md "Why a UDP socket needs no eventfd"), so the program opens as many as
# natively less the shim's per-process ones, every one carried. RD: each socket's CQ needs an
# eventfd, which the shim takes only within a quarter of the limit; past it sockets stay with the
# OS, an info line says why, and the program still opens and uses about as many.
timeout -k 5 60 "$bin" nofile >"$DG_TMP/nofile.native" 2>&1 || failed+=("nofile: native run failed")
read -r _ _ nn _ un < <(grep '^nofile' "$DG_TMP/nofile.native") || true
for mode in ud rd; do
	timeout -k 5 60 env "${DG_SHIM_ENV[@]}" DGSHIM_LOG=info DGSHIM_MODE=$mode "$bin" nofile >"$DG_TMP/nofile.$mode" 2>"$DG_TMP/nofile.$mode.err" ||
		failed+=("nofile $mode: preloaded run failed")
	ns='' us=''
	read -r _ _ ns _ us < <(grep '^nofile' "$DG_TMP/nofile.$mode") || true
	# the measuring process: the summary that counts its sockets (the echo server child has 2)
	tf=$( [ -n "$ns" ] && sed -n "s/^dgshim\[[0-9]*\]: info: summary: sockets=$ns tx_framed=\([0-9]*\).*/\1/p" "$DG_TMP/nofile.$mode.err" | head -n1)
	dg_log "nofile $mode (RLIMIT_NOFILE 64): natively ${nn:-?} UDP sockets opened, ${un:-?} used; preloaded ${ns:-?} opened, ${us:-?} used, tx_framed=${tf:-?}"
	if [ -z "${nn:-}" ] || [ -z "${ns:-}" ]; then
		failed+=("nofile $mode: no figures")
		continue
	fi
	[ "$us" -eq "$ns" ] || failed+=("nofile $mode: $((ns - us)) of $ns sockets did not carry a datagram")
	if [ $mode = ud ]; then
		# the shim's per-process descriptors only (thread, registry, discovery): 7 here
		[ "$ns" -ge $((nn - 10)) ] || failed+=("nofile ud: preloaded the program opened $ns sockets, natively $nn (want >= $((nn - 10)): a UDP socket costs the shim no descriptor)")
		# two datagrams each, all framed
		[ "${tf:-0}" -ge $((2 * ns)) ] || failed+=("nofile ud: not every socket carried (tx_framed=${tf:-none}, want >= $((2 * ns)))")
		grep -q "stays with the OS: the shim holds" "$DG_TMP/nofile.$mode.err" && failed+=("nofile ud: a UDP socket stayed with the OS for the descriptor budget")
	else
		# a quarter of 64 is the shim's when it takes a socket; the discovery sockets it may
		# make later (two) are not counted against that budget
		[ "$ns" -ge $((nn - 18)) ] || failed+=("nofile rd: preloaded the program opened $ns sockets, natively $nn (want >= $((nn - 18)): the shim keeps to about a quarter of 64)")
		grep -q "stays with the OS: the shim holds" "$DG_TMP/nofile.$mode.err" || failed+=("nofile rd: no info line saying why sockets stayed with the OS")
		[ "${tf:-0}" -ge 2 ] || failed+=("nofile rd: no socket carried (tx_framed=${tf:-none})")
	fi
done
# RLIMIT_AS just above the program's size: the shim's memory cannot be had; the program's
# datagrams still go (plain), a connect works or says ENOMEM (a warn line) - never a crash
timeout -k 5 60 "$bin" aslimit >"$DG_TMP/as.native" 2>&1 || failed+=("aslimit: native run failed")
timeout -k 5 60 env "${DG_SHIM_ENV[@]}" DGSHIM_LOG=warn "$bin" aslimit >"$DG_TMP/as.shim" 2>"$DG_TMP/as.err"
r=$?
dg_log "aslimit: native: $(cat "$DG_TMP/as.native"); preloaded (exit $r): $(grep '^aslimit' "$DG_TMP/as.shim")"
grep -q "^aslimit used 4 of 4 tcp ok" "$DG_TMP/as.native" || failed+=("aslimit: the native run did not work")
if [ -n "$DG_ASAN_RT" ]; then
	dg_log "aslimit: sanitizer build: the limit is not meaningful under ASan's shadow memory: preloaded result not checked"
else
	[ $r -eq 0 ] || failed+=("aslimit: preloaded run exit $r")
	grep -Eq "^aslimit used 4 of 4 tcp (ok|ENOMEM)$" "$DG_TMP/as.shim" || failed+=("aslimit: preloaded: $(cat "$DG_TMP/as.shim")")
	grep -q "Cannot allocate memory" "$DG_TMP/as.err" || failed+=("aslimit: no log line naming the failed allocation")
fi
if [ ${#failed[@]} -gt 0 ]; then
	for f in "${failed[@]}"; do dg_log "FAIL: $f"; done
	exit 1
fi
dg_log "PASS"
