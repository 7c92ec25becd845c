#!/usr/bin/env bash
# socat.sh BUILD_DIR BASE_PORT: socat as a TCP file copier and as a forking UDP relay, natively
# and then with every process preloaded.
#   - TCP copy: socat -u TCP-LISTEN:BASE_PORT OPEN:out (receiver) <- socat -u OPEN:file
#     TCP:127.0.0.1:BASE_PORT (sender), 64 MiB of random bytes: the copy's sha256 must equal the
#     file's, both socats exit 0; preloaded, both summaries show the connection carried over RC.
#   - UDP fork relay: socat -T 1 UDP-RECVFROM:BASE_PORT+1,fork UDP-SENDTO:127.0.0.1:BASE_PORT+2:
#     for each datagram the parent peeks (MSG_PEEK) and forks a child that reads the datagram
#     and relays it. udp_peer.py sends 100 numbered datagrams 10 ms apart; the receiver must get
#     all 100, each once and unchanged (natively it does), and preloaded the same count as
#     natively; preloaded, the sender's summary shows every datagram framed (tx_framed > 0,
#     tx_plain = 0), the receiver's rx_framed > 0, rx_plain = 0, and the relay's children
#     received and sent framed.
# Prints the ratio preloaded/native of the TCP copy's throughput.
# Exit 0 pass, 1 fail, 77 only if socat cannot be installed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=apps_lib.sh
. "$here/apps_lib.sh"
apps_init socat "$@"
apps_need socat socat
apps_need /usr/bin/python3 python3
peer=$here/udp_peer.py
tport=$DG_PORT uport=$((DG_PORT + 1)) rport=$((DG_PORT + 2))
ndg=100
head -c 64M /dev/urandom >"$DG_TMP/file.bin"
fsha=$(apps_sha "$DG_TMP/file.bin")
declare -A R

# tcp_copy TAG ENV...
tcp_copy() {
	local tag=$1 d rpid rc src t0
	shift
	d=$DG_TMP/$tag
	mkdir -p "$d"
	apps_check_port_free tcp "$tport"
	dg_bg "$d/tcp-recv.log" env "$@" timeout -k 5 60 socat -u "TCP-LISTEN:$tport,bind=127.0.0.1,reuseaddr" \
		"OPEN:$d/copy.bin,creat,trunc"
	rpid=$DG_LAST_PID
	if ! dg_wait_tcp "$tport" 10 "$rpid"; then
		dg_tail "$d/tcp-recv.log"
		apps_bad "$tag: socat TCP-LISTEN did not listen"
		return
	fi
	t0=$(date +%s.%N)
	env "$@" timeout -k 5 60 socat -u "OPEN:$DG_TMP/file.bin" "TCP:127.0.0.1:$tport" >"$d/tcp-send.log" 2>&1
	src=$?
	wait "$rpid"
	rc=$?
	R[$tag:tcp]=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", 64 / (b - a) }')
	[ "$src" -eq 0 ] || { dg_tail "$d/tcp-send.log" 10; apps_bad "$tag: socat TCP sender exited $src"; }
	[ "$rc" -eq 0 ] || { dg_tail "$d/tcp-recv.log" 10; apps_bad "$tag: socat TCP receiver exited $rc"; }
	if [ "$(apps_sha "$d/copy.bin" 2>/dev/null)" != "$fsha" ]; then
		apps_bad "$tag: TCP copy differs ($(stat -c %s "$d/copy.bin" 2>/dev/null || echo no) bytes of 67108864)"
	fi
	dg_log "$tag: TCP copy of 64 MiB: ${R[$tag:tcp]} MiB/s"
}

# udp_relay TAG ENV...: sets R[TAG:udp] to the number of datagrams relayed.
udp_relay() {
	local tag=$1 d spid rpid rc
	shift
	d=$DG_TMP/$tag
	apps_check_port_free udp "$uport"
	apps_check_port_free udp "$rport"
	dg_bg "$d/udp-recv.log" env "$@" /usr/bin/python3 "$peer" recv "$rport" "$ndg" 5
	rpid=$DG_LAST_PID
	dg_wait_udp "$rport" 10 "$rpid" || { dg_tail "$d/udp-recv.log"; apps_bad "$tag: receiver did not bind"; return; }
	dg_bg "$d/udp-relay.log" env "$@" socat -T 1 "UDP-RECVFROM:$uport,bind=127.0.0.1,fork" "UDP-SENDTO:127.0.0.1:$rport"
	spid=$DG_LAST_PID
	dg_wait_udp "$uport" 10 "$spid" || { dg_tail "$d/udp-relay.log"; apps_bad "$tag: relay did not bind"; return; }
	env "$@" /usr/bin/python3 "$peer" send "$uport" "$ndg" 10 >"$d/udp-send.log" 2>&1 ||
		apps_bad "$tag: UDP sender failed"
	wait "$rpid"
	rc=$?
	R[$tag:udp]=$(sed -n 's/^received \([0-9]*\) of.*/\1/p' "$d/udp-recv.log")
	dg_log "$tag: UDP fork relay: $(grep '^received' "$d/udp-recv.log")"
	# The children end after 1 s without traffic (-T 1); SIGTERM makes the parent exit normally.
	sleep 1.5
	kill -TERM "$spid"
	apps_wait_gone "$spid" 5 || dg_kill_tree "$spid"
	[ "$rc" -eq 0 ] || apps_bad "$tag: UDP fork relay: $(grep '^received' "$d/udp-recv.log" || echo 'receiver failed')"
}

dg_log "64 MiB file sha256 $fsha; shim: ${DG_SHIM_ENV[*]}"
tcp_copy native
udp_relay native
for f in tcp-recv tcp-send udp-recv udp-relay udp-send; do apps_native_clean "$DG_TMP/native/$f.log"; done
tcp_copy shim "${DG_SHIM_ENV[@]}"
udp_relay shim "${DG_SHIM_ENV[@]}"
[ "${R[shim:udp]:-x}" = "${R[native:udp]:-y}" ] ||
	apps_bad "UDP fork relay: ${R[shim:udp]:-?} datagrams relayed preloaded, ${R[native:udp]:-?} natively"
d=$DG_TMP/shim
apps_check_rc "TCP receiver" "$d/tcp-recv.log"
apps_check_rc "TCP sender" "$d/tcp-send.log"
apps_check_udp "UDP sender" "$d/udp-send.log" tx
apps_check_udp "UDP receiver" "$d/udp-recv.log" rx
apps_check_udp "UDP relay" "$d/udp-relay.log" rx tx
apps_ratio "TCP copy 64 MiB" MiB/s "${R[native:tcp]:--}" "${R[shim:tcp]:--}"
apps_ratio "UDP fork relay (count)" datagrams "${R[native:udp]:--}" "${R[shim:udp]:--}"
apps_finish
