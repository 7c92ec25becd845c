#!/usr/bin/env bash
# fdreuse.sh BUILD_DIR BASE_PORT: descriptors the shim did not take behave as natively through
# reuse of their numbers, syscall() takes the shim's path, and sockets shared across fork read
# each datagram once (issue "Real programs", items 1-3). Each case of fdreuse.c runs natively
# and then preloaded; both must pass their own checks and print the same transcript (lines
# starting with '#' are per-run figures, not compared). Preloaded, the exit summaries must show
# the datagrams framed: syscall()'s sendmmsg and sendto went through the shim (tx_plain=0).
# BASE_PORT is unused (the program binds ephemeral loopback ports).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dg_init fdreuse "$@"
bin=$DG_BUILD/tests/integration/fdreuse
[ -x "$bin" ] || dg_fail "$bin does not exist: build it first (ninja -C $DG_BUILD)"
dg_require_shim
failed=()
for c in epoll syscall peekfork share; do
	timeout -k 5 60 "$bin" "$c" >"$DG_TMP/$c.native" 2>"$DG_TMP/$c.native.err"
	rn=$?
	timeout -k 5 60 env "${DG_SHIM_ENV[@]}" "$bin" "$c" >"$DG_TMP/$c.shim" 2>"$DG_TMP/$c.shim.err"
	rs=$?
	dg_log "$c: native exit $rn, preloaded exit $rs"
	[ $rn -eq 0 ] || { failed+=("$c: native run failed (a wrong expectation)"); dg_tail "$DG_TMP/$c.native" 40; }
	[ $rs -eq 0 ] || { failed+=("$c: preloaded run failed"); dg_tail "$DG_TMP/$c.shim" 40; dg_tail "$DG_TMP/$c.shim.err" 20; }
	if ! diff <(grep -v '^#' "$DG_TMP/$c.native") <(grep -v '^#' "$DG_TMP/$c.shim") >"$DG_TMP/$c.diff"; then
		failed+=("$c: the preloaded transcript differs from the native one")
		sed "s/^/$DG_NAME: $c: /" "$DG_TMP/$c.diff" | head -40
	fi
	grep -h '^#' "$DG_TMP/$c.native" "$DG_TMP/$c.shim" | sed "s/^/$DG_NAME: $c: /"
	n=$(dg_summaries "$DG_TMP/$c.shim.err" | wc -l)
	[ "$n" -ge 1 ] || failed+=("$c: no exit summary from the preloaded run")
	case $c in
	syscall)
		# 5 by sendmmsg and 1 by sendto, all through syscall(): framed, none plain
		tf=$(dg_sum "$DG_TMP/$c.shim.err" tx_framed)
		tp=$(dg_sum "$DG_TMP/$c.shim.err" tx_plain)
		dg_log "syscall: tx_framed=$tf tx_plain=$tp"
		[ "$tf" -eq 6 ] && [ "$tp" -eq 0 ] || failed+=("syscall: want tx_framed=6 tx_plain=0, got $tf/$tp")
		;;
	peekfork | share)
		# children leave with _exit (no summary): the parent's received datagrams
		tf=$(dg_sum "$DG_TMP/$c.shim.err" rx_framed)
		dg_log "$c: rx_framed=$tf"
		[ "$tf" -gt 0 ] || failed+=("$c: nothing framed: the case did not exercise the shim")
		;;
	esac
done
if [ ${#failed[@]} -gt 0 ]; then
	for f in "${failed[@]}"; do dg_log "FAIL: $f"; done
	exit 1
fi
dg_log "PASS"
