#!/usr/bin/env bash
# hostile.sh BUILD_DIR PORT: a hostile peer floods a preloaded UDP server (udpbench, its socket
# on a UD queue pair) for 8 s with valid-looking framed datagrams (correct CRC) that name random
# STags, offsets, MSNs and lengths, Read Requests for random memory, Terminates, random and
# replayed RD datagrams (tests/integration/hostile.c; issue "Hardening", item 6). Meanwhile a
# preloaded client's ping-pong with the server must go on, framed and byte-exact. Afterwards:
# the server is alive and answers, its resident memory grew by less than 32 MiB, its exit
# summary counts the refused datagrams (rejected > 0) and no CRC drop (the flood's CRCs are
# right: nothing was refused for the wrong reason). In the ASan build a write outside a
# registered region would end the server. The server's CPU time during the flood is printed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dg_init hostile "$1" "$2"
dg_require_shim
hostile=$DG_BUILD/tests/integration/hostile
udpbench=$DG_BUILD/apps/udpbench
[ -x "$hostile" ] && [ -x "$udpbench" ] || dg_fail "build hostile and udpbench first"
port=$DG_PORT secs=8
slog=$DG_TMP/server.log
dg_bg "$slog" env "${DG_SHIM_ENV[@]}" "$udpbench" server "$port" -b 127.0.0.1
spid=$DG_LAST_PID
dg_wait_udp "$port" 10 "$spid" || { dg_tail "$slog"; dg_fail "the server did not bind"; }
ping() { # TAG N: a preloaded ping-pong; fails the test when it does not complete
	env "${DG_SHIM_ENV[@]}" timeout 60 "$udpbench" pingpong 127.0.0.1 "$port" -n "$2" -w 10 \
		>"$DG_TMP/$1.log" 2>&1 || { dg_tail "$DG_TMP/$1.log"; dg_tail "$slog"; dg_fail "$1: ping-pong failed"; }
	[ "$(dg_sum "$DG_TMP/$1.log" tx_framed)" -ge "$2" ] ||
		{ dg_summaries "$DG_TMP/$1.log"; dg_fail "$1: the ping-pong was not framed"; }
}
ping before 200
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$spid/status"; }
cpu() { awk '{print $14 + $15}' "/proc/$spid/stat"; }
rss0=$(rss) cpu0=$(cpu)
dg_bg "$DG_TMP/hostile.log" "$hostile" 127.0.0.1 "$port" "$secs" 7
hpid=$DG_LAST_PID
ping during 2000
wait "$hpid" || { dg_tail "$DG_TMP/hostile.log"; dg_fail "the hostile sender failed"; }
kill -0 "$spid" 2>/dev/null || { dg_tail "$slog"; dg_fail "the server died under the flood"; }
rss1=$(rss) cpu1=$(cpu)
ping after 200
kill -INT "$spid"
wait "$spid"
dg_log "$(cat "$DG_TMP/hostile.log")"
dg_log "server: RSS ${rss0} -> ${rss1} kB, CPU $(((cpu1 - cpu0) * 10)) ms during the ${secs} s flood"
dg_log "server summary: $(dg_summaries "$slog" | sed 's/.*summary: //')"
rej=$(dg_sum "$slog" rejected) crc=$(dg_sum "$slog" crc_drops)
[ "$rej" -gt 0 ] || dg_fail "the server's summary counts no rejected datagram (rejected=$rej)"
[ "$crc" = 0 ] || dg_fail "the server dropped $crc datagrams for a bad CRC: the flood's CRCs are right"
[ $((rss1 - rss0)) -lt 32768 ] || dg_fail "the server's memory grew by $((rss1 - rss0)) kB under the flood"
dg_log "PASS: the server lived, answered during and after the flood, refused $rej datagrams"
