#!/usr/bin/env bash
# streamapi.sh BUILD_DIR BASE_PORT: the stream socket calls of issue 4 that the byte-exact
# transfers of tcp_interop.sh do not cover (shutdown on both ends, EPIPE with and without
# SIGPIPE, SO_LINGER {1,0} and {1,N}, TCP_NODELAY, MSG_DONTWAIT, FIONREAD, SO_RCVTIMEO and
# SO_SNDTIMEO, connect again (0, EISCONN, EALREADY), SO_ERROR of a refused connect, POLLIN,
# POLLHUP and POLLRDHUP in poll and epoll, names, accept4 flags), with
# BUILD_DIR/tests/integration/streamapi (one process that forks a server; see streamapi.c):
#   native   nothing preloaded, ports BASE_PORT..+3: every expectation is the kernel's (a check
#            failing here is a wrong expectation, not a shim bug)
#   shim     both ends preloaded (DG_SHIM_ENV: the shim with DGSHIM_LOG=info and
#            DGSHIM_CONF=/dev/null, the ASan runtime first in a sanitizer build), ports
#            BASE_PORT+4..+7: the same checks, each connection carried (IWARP_TAKEN), and the
#            exit summaries must show it, as dg_check_rc does but summed over the client and the
#            server it forks: rc_conns >= 55 (28 connections, counted on both ends, less the
#            server end the forked child of the fork case carries and counts), RC payload
#            both ways, and rc_plain exactly 2 (the two connects to a port nobody listens on,
#            which the shim leaves to the OS: the kernel refuses them)
# "KNOWN name: ..." lines are differences the shim documents (docs/shim.md, "Limits"); they
# are listed, not failed. Exit 0 pass, 1 fail.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dg_init streamapi "$@"
bin=$DG_BUILD/tests/integration/streamapi
[ -x "$bin" ] || dg_fail "$bin does not exist: build it first (ninja -C $DG_BUILD)"
dg_require_shim
failed=()

# run TAG PORT ENV...: one streamapi run; its output in $DG_TMP/TAG.log, shown on failure.
run() {
	local tag=$1 p=$2 rc t0 log=$DG_TMP/$1.log
	shift 2
	t0=$(date +%s.%N)
	timeout -k 5 120 env "$@" "$bin" "$p" >"$log" 2>&1
	rc=$?
	local nok nfail nknown
	nok=$(grep -c '^ok ' "$log")
	nfail=$(grep -c '^FAIL' "$log")
	nknown=$(grep -c '^KNOWN ' "$log")
	dg_log "$tag: exit $rc, $nok ok, $nfail failed, $nknown known differences ($(dg_elapsed "$t0") s)"
	grep -a '^KNOWN ' "$log" | sed "s/^/$DG_NAME: $tag: /"
	if [ "$rc" -ne 0 ] || [ "$nfail" -ne 0 ] || [ "$nok" -eq 0 ]; then
		grep -a '^FAIL' "$log" | sed "s/^/$DG_NAME: $tag: /"
		[ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && dg_log "$tag: killed after 120 s"
		dg_tail "$log" 40
		return 1
	fi
}

run native "$DG_PORT" -u LD_PRELOAD STREAMAPI_EXPECT=native ||
	failed+=("native: an expectation is not the kernel's (fix the test)")
run shim $((DG_PORT + 4)) "${DG_SHIM_ENV[@]}" STREAMAPI_EXPECT=preload ||
	failed+=("shim: the shim differs from the kernel")
# Both processes (client and forked server) write a summary into the one log; between them
# they carried every connection but the refused ones.
if ! dg_rc_summary "shim" "$DG_TMP/shim.log"; then
	failed+=("shim: no exit summary")
elif [ "$(dg_summaries "$DG_TMP/shim.log" | wc -l)" -ne 2 ]; then
	failed+=("shim: $(dg_summaries "$DG_TMP/shim.log" | wc -l) exit summaries, want 2 (client and server)")
else
	conns=$(dg_sum "$DG_TMP/shim.log" rc_conns)
	plain=$(dg_sum "$DG_TMP/shim.log" rc_plain)
	tx=$(dg_sum "$DG_TMP/shim.log" rc_tx_bytes)
	rx=$(dg_sum "$DG_TMP/shim.log" rc_rx_bytes)
	# 28 connections counted on both ends, less the one the forked child answers and carries
	# (the child leaves with _exit: no summary)
	if [ "$conns" -lt 55 ] || [ "$tx" -le 0 ] || [ "$rx" -le 0 ] || [ "$plain" -ne 2 ]; then
		failed+=("shim: rc_conns=$conns (want >= 55: 28 connections on both ends, one server end in a child) rc_plain=$plain (want 2: the refused connects) rc_tx_bytes=$tx rc_rx_bytes=$rx")
	else
		dg_log "shim: rc_conns=$conns rc_plain=$plain (the refused connects) rc_tx_bytes=$tx rc_rx_bytes=$rx: OK"
	fi
fi
if [ ${#failed[@]} -ne 0 ]; then
	dg_fail "$(IFS=';'; echo "${failed[*]}" | sed 's/;/; /g')"
fi
dg_log "PASS"
