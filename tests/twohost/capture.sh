# shellcheck shell=bash
# capture.sh: a packet capture on the two-host test bed's veth (netns.sh), read by capcheck.py,
# the proof of what crossed the wire between the hosts. Source it after lib.sh and netns.sh
# (after th_up), then:
#
#   cap_start TAG          capture every IPv4 packet on host a's end of the veth into
#                          $DG_TMP/TAG.pcap (tcpdump, full packets, 32 MiB buffer); returns once
#                          tcpdump listens
#   cap_stop               end it (SIGINT: tcpdump writes what it holds); notes how many packets
#                          the kernel dropped before the capture saw them (CAP_DROPS)
#   cap_check TAG ARGS...  capcheck.py on TAG's capture (ARGS: --plain-host IP, --want-framed N,
#                          --want-mpa N); prints its summary line; returns 1 when a check failed,
#                          or when the capture dropped packets and a --plain-host is checked (the
#                          proof would have holes; a count of framed traffic is only a floor)
#
# One capture at a time, with tcpdump (scripts/install-deps installs it), or tshark's dumpcap
# where there is no tcpdump (or CAP_TOOL=dumpcap).
CAP_PID=
CAP_TAG=
CAP_DROPS=0
CAP_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

cap_use_tcpdump() { [ "${CAP_TOOL:-tcpdump}" = tcpdump ] && command -v tcpdump >/dev/null 2>&1; }

cap_need() {
	cap_use_tcpdump || dg_need dumpcap tshark
}

cap_start() {
	CAP_TAG=$1
	local f=$DG_TMP/$1.pcap
	rm -f "$f"
	if cap_use_tcpdump; then
		# -Z root: do not drop to the tcpdump user, who cannot write in DG_TMP
		th_bg a "$DG_TMP/$1.cap.log" tcpdump -i "veth-$$a" -n -s 70000 -B 131072 -U --immediate-mode -Z root -w "$f" ip
	else
		th_bg a "$DG_TMP/$1.cap.log" dumpcap -i "veth-$$a" -q -s 70000 -B 128 -P -f ip -w "$f"
	fi
	CAP_PID=$TH_LAST_PID
	for _ in $(seq 100); do
		grep -qs "listening on\|Capturing on" "$DG_TMP/$1.cap.log" && [ -s "$f" ] && return 0
		kill -0 "$CAP_PID" 2>/dev/null || break
		sleep 0.05
	done
	dg_tail "$DG_TMP/$1.cap.log"
	dg_fail "cap_start $1: the capture did not start"
}

cap_stop() {
	local log=$DG_TMP/$CAP_TAG.cap.log drops
	[ -n "$CAP_PID" ] || return 0
	sleep 0.2 # what is on the wire now reaches the capture
	kill -INT "$CAP_PID" 2>/dev/null
	for _ in $(seq 50); do kill -0 "$CAP_PID" 2>/dev/null || break; sleep 0.1; done
	CAP_PID=
	drops=$(sed -n 's/^\([0-9]*\) packets dropped by kernel.*/\1/p; s/.*Packets received\/dropped on interface.*: [0-9]*\/\([0-9]*\).*/\1/p' "$log" | head -n 1)
	CAP_DROPS=${drops:-0}
	[ "$CAP_DROPS" -eq 0 ] || dg_log "capture $CAP_TAG: the kernel dropped $CAP_DROPS packets before the capture saw them"
	return 0
}

cap_check() {
	local tag=$1
	shift
	python3 "$CAP_HERE/capcheck.py" "$DG_TMP/$tag.pcap" --label "$DG_NAME: $tag: capture" \
		--dropped "$CAP_DROPS" "$@"
}
