#!/usr/bin/env bash
# tcp_interop.sh BUILD_DIR BASE_PORT: tests/integration/tcp_interop.sh between two hosts
# (netns.sh): tcpcheck's server on host a (10.77.0.1:BASE_PORT), its client on host b, with NO
# rules (discovery across hosts decides: docs/shim.md "Discovery across hosts"). Each run
# exchanges 2 MiB duplex + 6 MiB each way, every byte verified by tcpcheck, and is captured on
# the veth (capture.sh, capcheck.py):
#   native      nothing preloaded: the reference (must pass, else the test bed is broken), and
#               the kernel's connect sequences
#   both        both preloaded, blocking connect: dg_check_rc on both; the capture shows the
#               MPA Request and Reply (>= 2 directions beginning with an MPA key)
#   both-nb     the same with a non-blocking connect and the poll reader (sequence as native)
#   both-fo     the same with VLC's sendmsg(MSG_FASTOPEN) connect (sequence as native or as a
#               kernel without TCP Fast Open)
#   cli-plain   preloaded client -> unmodified server: dg_check_rc_plain on the client; the
#               capture has no MPA byte on any connection with host a
#   srv-plain   unmodified client -> preloaded server: dg_check_rc_plain on the server; no MPA
#               byte on any connection with host b
# An unmodified side's tcpcheck also names an MPA key at the start of its stream; the capture
# proves the wire itself carried none to or from it, and that it does see them when carried.
# Discovery: a connect waits at most 10 ms for host a's answer; a later answer makes that one
# connection plain (docs/shim.md). A "both" run that went plain for that reason is run again
# (at most 3 times) and said so; any other failure fails at once.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../integration/lib.sh
. "$here/../integration/lib.sh"
# shellcheck source=netns.sh
. "$here/netns.sh"
# shellcheck source=capture.sh
. "$here/capture.sh"
dg_init twohost_tcp_interop "$@"
t_start=$(date +%s.%N)
tcpcheck=$DG_BUILD/tests/integration/tcpcheck
[ -x "$tcpcheck" ] || dg_fail "$tcpcheck does not exist: build it first (ninja -C $DG_BUILD)"
dg_require_shim
cap_need
th_up
port=$DG_PORT
tdir=$DG_TMP/tcp
mkdir -p "$tdir"
seed=0

field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p" | head -n 1; }

# run_case TAG STYLE WHO READER END: server on a, client on b (WHO native, both, client,
# server: who is preloaded), captured into $DG_TMP/TAG.pcap. CLI_LINE, SRV_LINE: the result
# lines. Returns 1 when either side failed.
run_case() {
	local tag=$1 style=$2 who=$3 reader=$4 end=$5 spid src crc i
	local -a senv=(-u LD_PRELOAD) cenv=(-u LD_PRELOAD)
	case $who in
	both) senv=("${DG_SHIM_ENV[@]}") cenv=("${DG_SHIM_ENV[@]}") ;;
	client) cenv=("${DG_SHIM_ENV[@]}") ;;
	server) senv=("${DG_SHIM_ENV[@]}") ;;
	esac
	local slog=$tdir/$tag.srv.log clog=$tdir/$tag.cli.log
	seed=$((seed + 1))
	cap_start "$tag"
	th_bg a "$slog" timeout -k 5 90 env "${senv[@]}" "$tcpcheck" server "$port" --host "$TH_A_IP" \
		--seed "$seed" --accept4 --end "$end" --timeout 60
	spid=$TH_LAST_PID
	for i in $(seq 100); do th_run a ss -Hltn | grep -q "$TH_A_IP:$port " && break; sleep 0.05; done
	th_run b timeout -k 5 90 env "${cenv[@]}" "$tcpcheck" client "$port" --host "$TH_A_IP" \
		--seed "$seed" --connect "$style" --reader "$reader" --timeout 60 >"$clog" 2>&1
	crc=$?
	wait "$spid"
	src=$?
	cap_stop
	SRV_LINE=$(grep -a '^tcpcheck: server ' "$slog" | tail -n 1)
	CLI_LINE=$(grep -a '^tcpcheck: client ' "$clog" | tail -n 1)
	dg_log "$tag (connect $style, reader $reader, end $end; preloaded: $who): client exit $crc, server exit $src"
	sed "s/^/$DG_NAME:   /" <<<"$SRV_LINE"
	sed "s/^/$DG_NAME:   /" <<<"$CLI_LINE"
	if [ "$crc" -ne 0 ] || [ "$src" -ne 0 ] || [[ $SRV_LINE != "tcpcheck: server OK "* ]] ||
		[[ $CLI_LINE != "tcpcheck: client OK "* ]]; then
		dg_tail "$slog" 10
		dg_tail "$clog" 10
		return 1
	fi
	if [ "$(field "$CLI_LINE" local)" != "$(field "$SRV_LINE" peer)" ] ||
		[ "$(field "$SRV_LINE" local)" != "$(field "$CLI_LINE" peer)" ]; then
		dg_log "$tag: addresses do not match"
		return 1
	fi
}

declare -A native_seq
for n in "block slow close" "nonblock poll close" "fastopen slow shutdown"; do
	read -r style reader end <<<"$n"
	run_case "native-$style" "$style" native "$reader" "$end" ||
		dg_fail "native tcpcheck run between the hosts (connect $style) failed: the test bed, not the shim"
	native_seq[$style]=$(field "$CLI_LINE" seq)
	# the capture must see the transfer (and no MPA key: nobody speaks it)
	cap_check "native-$style" --plain-host "$TH_A_IP" --plain-host "$TH_B_IP" ||
		dg_fail "native-$style: the capture is not as expected without the shim"
done

failed=()
no_tfo_seq=sendmsg_fastopen:EOPNOTSUPP,connect:EINPROGRESS,poll:OUT,so_error:0
same_seq() {
	local got
	got=$(field "$CLI_LINE" seq)
	if [ "$2" = block ] || [ "$got" = "${native_seq[$2]}" ] ||
		{ [ "$2" = fastopen ] && [ "$got" = "$no_tfo_seq" ]; }; then
		return 0
	fi
	dg_log "$1: connect sequence seq=$got, the kernel's is seq=${native_seq[$2]}"
	return 1
}
# shim_case TAG STYLE WHO READER END
shim_case() {
	local tag=$1 style=$2 who=$3 try
	for try in 1 2 3; do
		if ! run_case "$@"; then
			failed+=("$tag: transfer failed")
			return
		fi
		# a first connection that went plain only because discovery answered after 10 ms
		if [ "$who" = both ] && [ "$(dg_sum "$tdir/$tag.cli.log" rc_conns)" -eq 0 ] &&
			[ "$try" -lt 3 ]; then
			dg_log "$tag: run $try went plain (host a's discovery answer came after 10 ms?): again"
			continue
		fi
		break
	done
	same_seq "$tag" "$style" || failed+=("$tag: connect sequence differs from the kernel's")
	case $who in
	both)
		dg_check_rc "$tag server" "$tdir/$tag.srv.log" || failed+=("$tag server: not over RC")
		dg_check_rc "$tag client" "$tdir/$tag.cli.log" || failed+=("$tag client: not over RC")
		cap_check "$tag" --want-mpa 2 || failed+=("$tag: the capture shows no MPA exchange")
		;;
	client)
		dg_check_rc_plain "$tag client (server unmodified)" "$tdir/$tag.cli.log" ||
			failed+=("$tag client: no plain fallback")
		cap_check "$tag" --plain-host "$TH_A_IP" --min-seen 2 || failed+=("$tag: iWARP bytes on the wire to the unmodified server")
		;;
	server)
		dg_check_rc_plain "$tag server (client unmodified)" "$tdir/$tag.srv.log" ||
			failed+=("$tag server: no plain fallback")
		cap_check "$tag" --plain-host "$TH_B_IP" --min-seen 2 || failed+=("$tag: iWARP bytes on the wire to the unmodified client")
		;;
	esac
}
shim_case both block both slow close
shim_case both-nb nonblock both poll close
shim_case both-fo fastopen both slow shutdown
shim_case cli-plain block client slow close
shim_case srv-plain block server poll shutdown
if [ ${#failed[@]} -ne 0 ]; then
	dg_fail "$(IFS=';'; echo "${failed[*]}" | sed 's/;/; /g')"
fi
dg_log "PASS ($(dg_elapsed "$t_start") s)"
