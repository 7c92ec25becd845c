#!/usr/bin/env bash
# qperf.sh BUILD_DIR BASE_PORT: qperf's server on 127.0.0.1:BASE_PORT (control connection;
# data on BASE_PORT+1) and its client running tcp_lat, tcp_bw, udp_lat and udp_bw for 1 s each;
# natively, then with server and client preloaded. qperf's server forks a child per client
# after accept (the child serves the accepted control connection and opens the data sockets).
# A run passes when the client exits 0 and reports a latency for tcp_lat and udp_lat and a
# bandwidth for tcp_bw and udp_bw (udp_bw: recv_bw > 0); preloaded, the client's and the
# server's summaries (summed over its processes) show the TCP connections carried over RC
# (rc_conns >= 2: control and tcp data; rc_plain = 0) and the UDP tests' datagrams framed
# (tx_framed > 0, tx_plain = 0, and received the same way).
# Prints the ratios preloaded/native of each latency and bandwidth.
# Exit 0 pass, 1 fail, 77 only if qperf cannot be installed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=apps_lib.sh
. "$here/apps_lib.sh"
apps_init qperf "$@"
apps_need qperf qperf
port=$DG_PORT
declare -A R

# run_case TAG ENV...: fills R[TAG:tcp_lat] (µs), R[TAG:tcp_bw] (MB/s), ...
run_case() {
	local tag=$1 d spid rc t
	shift
	d=$DG_TMP/$tag
	mkdir -p "$d"
	apps_check_port_free tcp "$port"
	dg_bg "$d/server.log" env "$@" qperf -lp "$port"
	spid=$DG_LAST_PID
	dg_wait_tcp "$port" 10 "$spid" || { dg_tail "$d/server.log"; apps_bad "$tag: qperf server did not listen"; return; }
	env "$@" timeout -k 5 60 qperf -lp "$port" -ip $((port + 1)) -t 1 127.0.0.1 tcp_lat tcp_bw udp_lat udp_bw \
		>"$d/client.log" 2>&1
	rc=$?
	# Values in µs and MB/s; udp_bw's is the receiver's (what arrived).
	while read -r t v; do R[$tag:$t]=$v; done < <(awk '
		/^[a-z_]+:$/ { test = substr($1, 1, length($1) - 1) }
		$1 == "latency" || $1 == "bw" || $1 == "recv_bw" {
			v = $3; u = $4
			if (u == "ns") v /= 1000; else if (u == "ms") v *= 1000; else if (u == "sec") v *= 1e6
			if (u == "GB/sec") v *= 1000; else if (u == "KB/sec") v /= 1000; else if (u == "bytes/sec") v /= 1e6
			print test, v
		}' "$d/client.log")
	[ "$rc" -eq 0 ] || { dg_tail "$d/client.log" 15; apps_bad "$tag: qperf client exited $rc"; }
	for t in tcp_lat tcp_bw udp_lat udp_bw; do
		awk -v v="${R[$tag:$t]:-0}" 'BEGIN { exit !(v > 0) }' || apps_bad "$tag: qperf reported no $t"
	done
	# The server forks per client; the child exits when its client is done. The parent waits for
	# more clients: SIGTERM ends it (its own summary may be lost, the child's is written).
	sleep 0.3
	kill -TERM "$spid"
	apps_wait_gone "$spid" 5 || dg_kill_tree "$spid"
	dg_log "$tag: tcp_lat ${R[$tag:tcp_lat]:--} us, tcp_bw ${R[$tag:tcp_bw]:--} MB/s, udp_lat ${R[$tag:udp_lat]:--} us, udp_bw ${R[$tag:udp_bw]:--} MB/s"
}

dg_log "shim: ${DG_SHIM_ENV[*]}"
run_case native
apps_native_clean "$DG_TMP/native/server.log"
apps_native_clean "$DG_TMP/native/client.log"
run_case shim "${DG_SHIM_ENV[@]}"
d=$DG_TMP/shim
apps_check_rc "client" "$d/client.log" 2
apps_check_udp "client" "$d/client.log" tx rx
apps_check_rc "server" "$d/server.log" 2
apps_check_udp "server" "$d/server.log" tx rx
apps_ratio "tcp_lat" us "${R[native:tcp_lat]:--}" "${R[shim:tcp_lat]:--}"
apps_ratio "tcp_bw" MB/s "${R[native:tcp_bw]:--}" "${R[shim:tcp_bw]:--}"
apps_ratio "udp_lat" us "${R[native:udp_lat]:--}" "${R[shim:udp_lat]:--}"
apps_ratio "udp_bw (received)" MB/s "${R[native:udp_bw]:--}" "${R[shim:udp_bw]:--}"
apps_finish
