#!/usr/bin/env bash
# tcp_interop.sh BUILD_DIR BASE_PORT: TCP stream sockets through the shim, with tcpcheck
# (BUILD_DIR/tests/integration/tcpcheck, an ordinary BSD-sockets program; see tcpcheck.c): a
# server on 127.0.0.1:BASE_PORT and a client exchange deterministic byte patterns both ways
# (2 MiB duplex, 6 MiB client->server ended by shutdown(SHUT_WR), 6 MiB server->client ended by a
# close() with data still queued), random write sizes, every byte verified, short reads,
# MSG_PEEK, MSG_WAITALL, readv/recvmsg, EOF exactly after the data. Cases (each side preloaded
# with BUILD_DIR/shim/libdgshim.so or not):
#   native-*   nothing preloaded, one run per connect style (and each reader and end): the
#              reference (must pass: else the environment, not the shim, is broken), and the
#              kernel's answers to the connect calls (seq=...), which every shim case with that
#              style must reproduce exactly;
#   a          both preloaded, blocking connect            -> dg_check_rc on both
#   a-poll1-3  the same (three runs), the client reading phase B as an event-driven program (non-blocking,
#              poll before each read: --reader poll) and the server ending with
#              shutdown(SHUT_WR) + close() (--end shutdown, Python's socketserver)
#   b, b-poll  preloaded client -> unmodified server        -> dg_check_rc_plain on the client
#   c, c-poll  unmodified client -> preloaded server        -> dg_check_rc_plain on the server
#   d-nb       both preloaded, non-blocking connect (poll reader) -> same seq as native,
#              dg_check_rc
#   d-fo       both preloaded, VLC's sendmsg(MSG_FASTOPEN)  -> seq as native or as a kernel
#              without TCP Fast Open (below), dg_check_rc
#   d-nb-plain preloaded client (non-blocking, poll reader) -> unmodified server -> same seq,
#              dg_check_rc_plain
#   d-fo-plain preloaded client (fastopen) -> unmodified server     -> seq as for d-fo,
#              dg_check_rc_plain
#   e-*        both preloaded, a program choosing with setsockopt(SOL_IWARP, IWARP_MODE) (read
#              back with getsockopt): e-rc both sockets RC -> dg_check_rc; e-off-client the
#              client's socket OFF, e-off-server the listener OFF -> plain TCP on both sides
#              (dg_check_rc_plain on both: neither side ever sends or expects an MPA frame)
#   f-*        both preloaded, a rules line (DGSHIM_RULES) on one side: f-rules-client
#              'mode=off proto=tcp port=P' on the client, f-rules-server 'mode=off proto=tcp
#              role=receiver' on the server -> plain on both sides
# Every case also requires both sides' "OK" line (all bytes verified, EOFs where they belong)
# and that each side's getsockname equals the other's getpeername. An unmodified side's byte
# check proves it never saw an iWARP byte: an MPA frame would corrupt the pattern, and tcpcheck
# names it when its stream starts with "MPA ID Req Frame" / "MPA ID Rep Frame".
# Native connect calls on Linux (6.x, measured): non-blocking connect -> EINPROGRESS, poll
# POLLOUT, SO_ERROR 0, a second connect -> 0 (the socket was still "connecting" for the socket
# layer), a third -> EISCONN; sendmsg(MSG_FASTOPEN) without a cookie -> EINPROGRESS, then
# connect -> 0 (exactly what strace shows VLC 3.0.24's HTTP client getting). The script takes
# them from the native runs rather than hard-coding them. The fastopen style (tcpcheck follows
# VLC's vlc_tls_ConnectWrite/vlc_tls_Connect, so it fails where VLC would) also accepts what a
# kernel without TCP Fast Open answers, measured in a network namespace with
# net.ipv4.tcp_fastopen=0: sendmsg -> EOPNOTSUPP, connect -> EINPROGRESS, poll POLLOUT,
# SO_ERROR 0 (the shim may choose to act as such a kernel; VLC handles both).
# Exit 0 pass, 1 fail (also when the shim or tcpcheck is not built).
# Verified natively: 60 runs with the slow reader (20 per connect style, 6 of each with both CPUs
# busy): all bytes verified, and every server had 2.6-4 MB still queued in its kernel send queue
# when it closed (outq_at_close, SIOCOUTQ: the client reads phase B late and slowly); 20 runs
# with the poll reader (10 per end): all bytes verified. A run takes 0.2-0.7 s; the script
# 7-11 s (ASan build included).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dg_init tcp_interop "$@"
port=$DG_PORT
t_start=$(date +%s.%N)
dg_need ss iproute2
tcpcheck=$DG_BUILD/tests/integration/tcpcheck
[ -x "$tcpcheck" ] || dg_fail "$tcpcheck does not exist: build it first (ninja -C $DG_BUILD)"
dg_require_shim
tdir=$DG_TMP/tcp
mkdir -p "$tdir"
seed=0

# field LINE KEY: the value of KEY=... in a tcpcheck result line.
field() {
	tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p" | head -n 1
}

# run_case TAG STYLE WHO READER END: one server + one client; STYLE block|nonblock|fastopen (the
# client's connect); WHO native, both, client or server (who is preloaded); READER slow|poll (how
# the client reads phase B); END close|shutdown (how the server ends phase B). Logs in
# $tdir/TAG.{srv,cli}.log; the result lines in CLI_LINE and SRV_LINE. Returns 1 when either side
# failed.
run_case() {
	local tag=$1 style=$2 who=$3 reader=$4 end=$5 spid cpid src crc sline cline ok=1 t0
	local -a senv=() cenv=()
	case $who in
	both) senv=("${DG_SHIM_ENV[@]}") cenv=("${DG_SHIM_ENV[@]}") ;;
	both-plain) senv=("${DG_SHIM_ENV[@]}") cenv=("${DG_SHIM_ENV[@]}") ;;
	client) cenv=("${DG_SHIM_ENV[@]}") ;;
	server) senv=("${DG_SHIM_ENV[@]}") ;;
	esac
	[ -n "${SRV_RULES:-}" ] && senv+=("DGSHIM_RULES=$SRV_RULES")
	[ -n "${CLI_RULES:-}" ] && cenv+=("DGSHIM_RULES=$CLI_RULES")
	local slog=$tdir/$tag.srv.log clog=$tdir/$tag.cli.log
	seed=$((seed + 1))
	CLI_LINE=
	SRV_LINE=
	if dg_wait_tcp "$port" 0; then
		dg_log "$tag: TCP port $port is already in use by another program"
		return 1
	fi
	t0=$(date +%s.%N)
	dg_bg "$slog" timeout -k 5 90 env "${senv[@]}" "$tcpcheck" server "$port" --seed "$seed" --accept4 \
		--end "$end" --timeout 60 ${SRV_MODE:+--iwarp-mode "$SRV_MODE"}
	spid=$DG_LAST_PID
	dg_wait_tcp "$port" 20 "$spid"
	case $? in
	1) dg_log "$tag: server not listening after 20 s" && return 1 ;;
	2) dg_log "$tag: server exited before listening" && dg_tail "$slog" && return 1 ;;
	esac
	dg_bg "$clog" timeout -k 5 90 env "${cenv[@]}" "$tcpcheck" client "$port" --seed "$seed" \
		--connect "$style" --reader "$reader" --timeout 60 ${CLI_MODE:+--iwarp-mode "$CLI_MODE"}
	cpid=$DG_LAST_PID
	wait "$cpid"
	crc=$?
	wait "$spid"
	src=$?
	sline=$(grep -a '^tcpcheck: server ' "$slog" | tail -n 1)
	cline=$(grep -a '^tcpcheck: client ' "$clog" | tail -n 1)
	CLI_LINE=$cline
	SRV_LINE=$sline
	dg_log "$tag (connect $style, reader $reader, server ends with $end; preloaded: $who): client exit $crc, server exit $src, $(dg_elapsed "$t0") s"
	sed "s/^/$DG_NAME:   /" <<<"$sline"
	sed "s/^/$DG_NAME:   /" <<<"$cline"
	if [ "$crc" -ne 0 ] || [ "$src" -ne 0 ] || [[ $sline != "tcpcheck: server OK "* ]] ||
		[[ $cline != "tcpcheck: client OK "* ]]; then
		dg_tail "$slog" 10
		dg_tail "$clog" 10
		return 1
	fi
	if [ "$(field "$cline" local)" != "$(field "$sline" peer)" ] ||
		[ "$(field "$sline" local)" != "$(field "$cline" peer)" ]; then
		dg_log "$tag: addresses do not match: client local=$(field "$cline" local) peer=$(field "$cline" peer), server local=$(field "$sline" local) peer=$(field "$sline" peer)"
		ok=0
	fi
	[ $ok -eq 1 ]
}

# --- native references: each connect style, reader and end used below
declare -A native_seq
for n in "block slow close" "nonblock poll close" "fastopen slow shutdown" "block poll shutdown"; do
	read -r style reader end <<<"$n"
	run_case "native-$style-$reader" "$style" native "$reader" "$end" ||
		dg_fail "native tcpcheck run (connect $style, reader $reader, end $end; no shim) failed: environment problem, not the shim"
	native_seq[$style]=$(field "$CLI_LINE" seq)
	[ "$reader" = poll ] || [ "$(field "$SRV_LINE" outq_at_close)" -gt 0 ] 2>/dev/null ||
		dg_log "native-$style: warning: the server had no data queued at its close (outq_at_close=$(field "$SRV_LINE" outq_at_close)): close with queued data not exercised"
done
dg_log "native runs passed; the kernel's connect sequences: block ${native_seq[block]}; nonblock ${native_seq[nonblock]}; fastopen ${native_seq[fastopen]}"

# --- through the shim: every failure is collected, the verdict comes at the end
dg_log "shim: ${DG_SHIM_ENV[*]}"
failed=()
# same_seq TAG STYLE: the client's connect sequence in CLI_LINE equals the native one (for
# fastopen, or the one of a kernel without TCP Fast Open).
no_tfo_seq=sendmsg_fastopen:EOPNOTSUPP,connect:EINPROGRESS,poll:OUT,so_error:0
same_seq() {
	local got
	got=$(field "$CLI_LINE" seq)
	if [ "$2" = fastopen ] && [ "$got" = "$no_tfo_seq" ]; then
		dg_log "$1: connect sequence as a kernel without TCP Fast Open: $got"
		return 0
	fi
	if [ "$got" != "${native_seq[$2]}" ]; then
		dg_log "$1: connect sequence seq=$got, the kernel's (native) is seq=${native_seq[$2]}"
		return 1
	fi
	dg_log "$1: connect sequence as native: $got"
}
# shim_case TAG STYLE WHO READER END: run_case, then the assertions for WHO.
shim_case() {
	local tag=$1 style=$2 who=$3 why
	if ! run_case "$@"; then
		why=$(printf '%s\n%s\n' "$CLI_LINE" "$SRV_LINE" | grep -aom1 'FAIL: .*' | cut -c7-120)
		failed+=("$tag: transfer failed${why:+ ($why)}")
		return
	fi
	[ "$style" = block ] || same_seq "$tag" "$style" || failed+=("$tag: connect sequence differs from the kernel's")
	case $who in
	both-plain)
		dg_check_rc_plain "$tag server (mode off on one side)" "$tdir/$tag.srv.log" ||
			failed+=("$tag server: not plain")
		dg_check_rc_plain "$tag client (mode off on one side)" "$tdir/$tag.cli.log" ||
			failed+=("$tag client: not plain")
		;;
	both)
		dg_check_rc "$tag server" "$tdir/$tag.srv.log" || failed+=("$tag server: not over RC")
		dg_check_rc "$tag client" "$tdir/$tag.cli.log" || failed+=("$tag client: not over RC")
		;;
	client)
		dg_check_rc_plain "$tag client (server unmodified)" "$tdir/$tag.cli.log" ||
			failed+=("$tag client: no plain fallback")
		;;
	server)
		dg_check_rc_plain "$tag server (client unmodified)" "$tdir/$tag.srv.log" ||
			failed+=("$tag server: no plain fallback")
		;;
	esac
}
shim_case a block both slow close
# three times: a reader that sees EOF early was seen in ~3 of 4 runs (while the stream shim was
# being written), so one run could pass by luck
for i in 1 2 3; do shim_case "a-poll$i" block both poll shutdown; done
shim_case b block client slow close
shim_case b-poll block client poll shutdown
shim_case c block server slow close
shim_case c-poll block server poll shutdown
shim_case d-nb nonblock both poll close
shim_case d-fo fastopen both slow shutdown
shim_case d-nb-plain nonblock client poll close
shim_case d-fo-plain fastopen client slow shutdown
SRV_MODE=rc CLI_MODE=rc shim_case e-rc block both slow close
SRV_MODE= CLI_MODE=off shim_case e-off-client block both-plain slow close
SRV_MODE=off CLI_MODE= shim_case e-off-server block both-plain slow close
CLI_RULES="mode=off proto=tcp port=$port" shim_case f-rules-client block both-plain slow close
SRV_RULES="mode=off proto=tcp role=receiver" shim_case f-rules-server block both-plain slow close
if [ ${#failed[@]} -ne 0 ]; then
	dg_fail "TCP with the shim: $(IFS=';'; echo "${failed[*]}" | sed 's/;/; /g')"
fi
dg_log "PASS ($(dg_elapsed "$t_start") s)"
