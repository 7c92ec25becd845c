#!/usr/bin/env bash
# asyncio.sh BUILD_DIR BASE_PORT: Python asyncio echo servers and clients written for this test
# (asyncio_echo.py; datagram endpoints and streams on the default epoll event loop), both ends
# python: UDP on 127.0.0.1:BASE_PORT and TCP on BASE_PORT+1; natively, then with both ends
# preloaded. A run passes when
#   - UDP: 500 ping-pongs of random datagrams (1-1400 B) come back byte-exact, then a burst of
#     100 datagrams sent at once comes back whole (100 of 100), and both ends exit 0;
#   - TCP: 1000 ping-pongs of 64 B come back exact, then 32 MiB of random bytes streamed in
#     64 KiB writes (drained) come back byte for byte (sha256), and both ends exit 0;
#   - preloaded: UDP both ends' summaries show every datagram framed (tx/rx_framed > 0,
#     tx/rx_plain = 0); TCP both ends' show the connection carried over RC (rc_conns > 0,
#     rc_plain = 0).
# Prints the ratios preloaded/native of the ping-pong rates and of the TCP echo throughput.
# Exit 0 pass, 1 fail, 77 only if python3 cannot be installed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=apps_lib.sh
. "$here/apps_lib.sh"
apps_init asyncio "$@"
apps_need /usr/bin/python3 python3
py=$here/asyncio_echo.py
declare -A R

# pair TAG PROTO PORT CLIENT_ARG ENV...: asyncio server and client with ENV; fills R[TAG:NAME].
pair() {
	local tag=$1 proto=$2 p=$3 arg=$4 d spid rc
	shift 4
	d=$DG_TMP/$tag
	mkdir -p "$d"
	apps_check_port_free "$proto" "$p"
	dg_bg "$d/$proto-server.log" env "$@" timeout -k 5 90 /usr/bin/python3 "$py" "$proto-server" "$p"
	spid=$DG_LAST_PID
	if ! dg_wait_port "$proto" "$p" 15 "$spid"; then
		dg_tail "$d/$proto-server.log"
		apps_bad "$tag: asyncio $proto server did not bind $p"
		return
	fi
	if env "$@" timeout -k 5 90 /usr/bin/python3 "$py" "$proto-client" "$p" "$arg" >"$d/$proto-client.log" 2>&1; then
		while read -r _ k v; do R[$tag:$k]=$v; done < <(grep '^rate ' "$d/$proto-client.log")
		grep '^asyncio_echo' "$d/$proto-client.log" | sed "s/^/$DG_NAME: $tag: /"
	else
		dg_tail "$d/$proto-client.log" 10
		apps_bad "$tag: asyncio $proto client failed"
	fi
	if ! apps_wait_gone "$spid" 10; then
		apps_bad "$tag: asyncio $proto server still running 10 s after its client finished"
		dg_kill_tree "$spid"
	fi
	wait "$spid"
	rc=$?
	[ "$rc" -eq 0 ] || { dg_tail "$d/$proto-server.log" 10; apps_bad "$tag: asyncio $proto server exited $rc"; }
}

dg_log "shim: ${DG_SHIM_ENV[*]}"
port=$DG_PORT
for tag in native shim; do
	env_words=()
	[ "$tag" = shim ] && env_words=("${DG_SHIM_ENV[@]}")
	pair "$tag" udp "$port" 500 "${env_words[@]}"
	pair "$tag" tcp $((port + 1)) 32 "${env_words[@]}"
done
for f in udp-server udp-client tcp-server tcp-client; do apps_native_clean "$DG_TMP/native/$f.log"; done
d=$DG_TMP/shim
apps_check_udp "UDP server" "$d/udp-server.log" tx rx
apps_check_udp "UDP client" "$d/udp-client.log" tx rx
apps_check_rc "TCP server" "$d/tcp-server.log"
apps_check_rc "TCP client" "$d/tcp-client.log"
apps_ratio "UDP ping-pong" "/s" "${R[native:udp_pingpong_per_s]:--}" "${R[shim:udp_pingpong_per_s]:--}"
apps_ratio "TCP ping-pong" "/s" "${R[native:tcp_pingpong_per_s]:--}" "${R[shim:tcp_pingpong_per_s]:--}"
apps_ratio "TCP echo 32 MiB" MiB/s "${R[native:tcp_bulk_MiB_per_s]:--}" "${R[shim:tcp_bulk_MiB_per_s]:--}"
apps_finish
