#!/usr/bin/env bash
# iperf3.sh BUILD_DIR BASE_PORT: iperf3 server (-1: one test, then it exits normally) on
# 127.0.0.1:BASE_PORT and client, a 2 s TCP test and a 2 s UDP test (200 Mbit/s of
# 1400-byte datagrams); natively, then with server and client preloaded. A run passes when
#   - both ends exit 0 and the client's JSON report has a result: TCP, the server received at
#     least 95 % of the bytes the client sent (the rest was in flight at the end); UDP, datagrams arrived and at most 5 % were lost;
#   - preloaded: the TCP connections (the control connection, and TCP's data) were carried over
#     RC on both ends (rc_conns > 0, rc_plain = 0); in the UDP test the client's datagrams went
#     out framed (tx_framed > 0, tx_plain = 0) and the server's came in framed (rx_framed > 0,
#     rx_plain = 0).
# Prints the ratios preloaded/native of the TCP and UDP bitrates (received).
# Exit 0 pass, 1 fail, 77 only if iperf3 cannot be installed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=apps_lib.sh
. "$here/apps_lib.sh"
apps_init iperf3 "$@"
apps_need iperf3 iperf3
apps_need /usr/bin/python3 python3
port=$DG_PORT
declare -A R

# run_test TAG PROTO ENV...: fills R[TAG:PROTO] (received Mbit/s).
run_test() {
	local tag=$1 proto=$2 d spid rc src res args=()
	shift 2
	d=$DG_TMP/$tag
	mkdir -p "$d"
	[ "$proto" = udp ] && args=(-u -b 200M -l 1400)
	apps_check_port_free tcp "$port"
	dg_bg "$d/$proto-server.log" env "$@" timeout -k 5 60 iperf3 -s -1 -B 127.0.0.1 -p "$port"
	spid=$DG_LAST_PID
	dg_wait_tcp "$port" 10 "$spid" || { dg_tail "$d/$proto-server.log"; apps_bad "$tag: iperf3 server did not listen"; return; }
	env "$@" timeout -k 5 60 iperf3 -c 127.0.0.1 -p "$port" -t 2 -J "${args[@]}" >"$d/$proto-client.json" 2>"$d/$proto-client.log"
	src=$?
	apps_wait_gone "$spid" 10 || { apps_bad "$tag: iperf3 -s -1 still running after its test"; dg_kill_tree "$spid"; }
	wait "$spid"
	rc=$?
	[ "$src" -eq 0 ] || { dg_tail "$d/$proto-client.json" 8; dg_tail "$d/$proto-client.log" 8; apps_bad "$tag: iperf3 $proto client exited $src"; }
	[ "$rc" -eq 0 ] || { dg_tail "$d/$proto-server.log" 8; apps_bad "$tag: iperf3 $proto server exited $rc"; }
	# One line: "ok MBIT DETAIL" or "bad REASON".
	res=$(/usr/bin/python3 - "$proto" "$d/$proto-client.json" <<-'PY'
		import json, sys
		proto, path = sys.argv[1], sys.argv[2]
		try:
		    end = json.load(open(path))["end"]
		    if proto == "tcp":
		        sent, recv = end["sum_sent"]["bytes"], end["sum_received"]["bytes"]
		        # The client stops counting at the end of its time: what was in flight is not
		        # received; more than 5 % missing is a stall.
		        ok = sent > 0 and recv >= 0.95 * sent
		        print("%s %.1f sent %d bytes, server received %d" % ("ok" if ok else "bad", end["sum_received"]["bits_per_second"] / 1e6, sent, recv))
		    else:
		        s = end["sum"]
		        ok = s["packets"] > 0 and s["lost_percent"] <= 5
		        mbit = s["bits_per_second"] * (1 - s["lost_percent"] / 100) / 1e6
		        print("%s %.1f %d datagrams, %d lost (%.2f %%)" % ("ok" if ok else "bad", mbit, s["packets"], s["lost_packets"], s["lost_percent"]))
		except Exception as e:
		    print("bad - no result in the JSON report: %r" % e)
		PY
	)
	dg_log "$tag $proto: $res"
	if [ "${res%% *}" = ok ]; then
		R[$tag:$proto]=$(echo "$res" | cut -d' ' -f2)
	else
		apps_bad "$tag: iperf3 $proto: $res"
	fi
}

dg_log "shim: ${DG_SHIM_ENV[*]}"
for tag in native shim; do
	env_words=()
	[ "$tag" = shim ] && env_words=("${DG_SHIM_ENV[@]}")
	run_test "$tag" tcp "${env_words[@]}"
	run_test "$tag" udp "${env_words[@]}"
done
for f in tcp-server tcp-client udp-server udp-client; do apps_native_clean "$DG_TMP/native/$f.log"; done
d=$DG_TMP/shim
apps_check_rc "TCP server" "$d/tcp-server.log" 2
apps_check_rc "TCP client" "$d/tcp-client.log" 2
apps_check_rc "UDP server (control)" "$d/udp-server.log"
apps_check_rc "UDP client (control)" "$d/udp-client.log"
apps_check_udp "UDP client" "$d/udp-client.log" tx
apps_check_udp "UDP server" "$d/udp-server.log" rx
apps_ratio "TCP bitrate" Mbit/s "${R[native:tcp]:--}" "${R[shim:tcp]:--}"
apps_ratio "UDP 200M received" Mbit/s "${R[native:udp]:--}" "${R[shim:udp]:--}"
apps_finish
