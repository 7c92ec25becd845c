#!/usr/bin/env bash
# udp_ud.sh BUILD_DIR BASE_PORT: UDP between two hosts (tests/twohost/netns.sh): udpbench's
# server on host a, its ping-pong client on host b (2000 round trips of 64 B and 1 000 of
# 8 KiB), each case checked by udpbench's own count and the exit summaries:
#   ud       both preloaded, a rules line naming the other host (mode=ud) on both: every
#            datagram framed both ways (tx_plain=0 on both)
#   rd       the same with mode=rd
#   norule   both preloaded, no rules: plain (discovery does not cross hosts yet)
#   native   the client unmodified against the preloaded server: plain, the client never
#            receives a framed datagram (udpbench checks every echo's bytes)
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../integration/lib.sh
. "$here/../integration/lib.sh"
# shellcheck source=netns.sh
. "$here/netns.sh"
dg_init twohost_udp "$@"
dg_require_shim
th_up
ub=$DG_BUILD/apps/udpbench
[ -x "$ub" ] || dg_fail "$ub does not exist"
port=$DG_PORT
failed=()
# run_case TAG MODE(framed|plain): S_ENV / C_ENV as in tcp_rc.sh; plain_ok: plain datagrams
# the server may send in a framed case
run_case() {
	local tag=$1 want=$2 d=$DG_TMP/$1 i
	mkdir -p "$d"
	th_bg a "$d/server.log" env "${S_ENV[@]}" "$ub" server "$port" -b "$TH_A_IP"
	local spid=$TH_LAST_PID
	for i in $(seq 50); do th_run a ss -Huln | grep -q ":$port " && break; sleep 0.1; done
	th_run b env "${C_ENV[@]}" timeout 60 "$ub" pingpong "$TH_A_IP" "$port" -n 2000 -s 64 >"$d/client.out" 2>"$d/client.log"
	local rc1=$?
	th_run b env "${C_ENV[@]}" timeout 60 "$ub" pingpong "$TH_A_IP" "$port" -n 1000 -s 8192 >>"$d/client.out" 2>>"$d/client.log"
	local rc2=$?
	kill -TERM "$spid" 2>/dev/null
	for i in $(seq 50); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
	dg_log "$tag: client exits $rc1 $rc2: $(grep -m1 -i 'rtt\|median' "$d/client.out" | head -c 160)"
	if [ "$rc1" -ne 0 ] || [ "$rc2" -ne 0 ]; then
		failed+=("$tag: udpbench pingpong failed")
		dg_tail "$d/client.out"
		dg_tail "$d/client.log"
	fi
	local ctf ctp stf stp
	ctf=$(dg_sum "$d/client.log" tx_framed) ctp=$(dg_sum "$d/client.log" tx_plain)
	stf=$(dg_sum "$d/server.log" tx_framed) stp=$(dg_sum "$d/server.log" tx_plain)
	dg_log "$tag: client tx_framed=$ctf tx_plain=$ctp, server tx_framed=$stf tx_plain=$stp"
	case $want in
	# RD: the server's last reply to a client that has exited is never acknowledged; after
	# the retries it is resent plain (docs/shim.md, "Discovery"): at most one per client run
	framed) [ "$ctf" -ge 3000 ] && [ "$ctp" -eq 0 ] && [ "$stf" -ge 3000 ] && [ "$stp" -le "$plain_ok" ] ||
		failed+=("$tag: want every datagram framed both ways") ;;
	plain) [ "$stf" -eq 0 ] && [ "$stp" -ge 3000 ] && [ "$ctf" -eq 0 ] ||
		failed+=("$tag: want every datagram plain") ;;
	esac
}
S_ENV=("${DG_SHIM_ENV[@]}" "DGSHIM_RULES=mode=ud addr=10.77.0.0/24")
C_ENV=("${DG_SHIM_ENV[@]}" "DGSHIM_RULES=mode=ud addr=10.77.0.0/24")
plain_ok=0
run_case ud framed
plain_ok=2
S_ENV=("${DG_SHIM_ENV[@]}" "DGSHIM_RULES=mode=rd addr=10.77.0.0/24")
C_ENV=("${DG_SHIM_ENV[@]}" "DGSHIM_RULES=mode=rd addr=10.77.0.0/24")
run_case rd framed
S_ENV=("${DG_SHIM_ENV[@]}")
C_ENV=("${DG_SHIM_ENV[@]}")
run_case norule plain
C_ENV=(-u LD_PRELOAD)
run_case native plain
if [ ${#failed[@]} -gt 0 ]; then
	for f in "${failed[@]}"; do dg_log "FAIL: $f"; done
	exit 1
fi
dg_log "PASS"
