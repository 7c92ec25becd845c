#!/usr/bin/env bash
# iwarp_toggle.sh BUILD_DIR BASE_PORT: apps/iwarp_toggle between two hosts (netns.sh): its echo
# end ("recv") on host a (10.77.0.1:BASE_PORT), its sender ("send") on host b switching its
# socket's IWARP_MODE off -> ud -> rd -> off ... every 4 datagrams, mid-stream (24 datagrams,
# two cycles; the echo end takes UD or RD as the sender's datagram needs). NO rules: discovery
# across hosts decides. Each datagram's path is the sender's IWARP_STATS before and after it;
# it arrived intact when its echo equals it. Cases, each captured on the veth:
#   both     both preloaded: every datagram intact; every "off" datagram plain; each ud and rd
#            phase ends framed (its first datagram may go plain: it asks the other host, whose
#            answer is read at the next send, docs/shim.md); the exit summaries and the capture
#            show framed datagrams both ways (>= the sender's framed count)
#   plain    the echo end unmodified: every datagram plain whatever the mode, intact, and the
#            capture has no framed datagram to host a
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../integration/lib.sh
. "$here/../integration/lib.sh"
# shellcheck source=netns.sh
. "$here/netns.sh"
# shellcheck source=capture.sh
. "$here/capture.sh"
dg_init twohost_iwarp_toggle "$@"
t_start=$(date +%s.%N)
bin=$DG_BUILD/apps/iwarp_toggle
[ -x "$bin" ] || dg_fail "$bin does not exist: build it first (ninja -C $DG_BUILD)"
dg_require_shim
cap_need
th_up
port=$DG_PORT
n=24
failed=()

# run_case TAG RECV_PRELOADED(0|1): the echo end on host a, the sender (preloaded) on host b.
run_case() {
	local tag=$1 rpid rrc src
	local rlog=$DG_TMP/$tag.recv.log slog=$DG_TMP/$tag.send.log
	local -a renv=(-u LD_PRELOAD)
	[ "$2" = 1 ] && renv=("${DG_SHIM_ENV[@]}")
	cap_start "$tag"
	th_bg a "$rlog" timeout -k 5 60 env "${renv[@]}" "$bin" "$port" "$n" recv "$TH_A_IP"
	rpid=$TH_LAST_PID
	for _ in $(seq 100); do th_run a ss -Huln | grep -q "$TH_A_IP:$port " && break; sleep 0.05; done
	th_run b timeout -k 5 60 env "${DG_SHIM_ENV[@]}" "$bin" "$port" "$n" send "$TH_A_IP" >"$slog" 2>&1
	src=$?
	wait "$rpid"
	rrc=$?
	cap_stop
	dg_log "$tag: echo end exit $rrc, sender exit $src: $(grep -a 'framed, .* plain, .* bad' "$slog")"
	grep -a '^ *[0-9]*  mode' "$slog" | awk '{ printf "%s%s/%s", (NR > 1 ? " " : ""), $3, $5 } END { print "" }' |
		fold -w 96 -s | sed "s/^/$DG_NAME: $tag: /"
	grep -a "echoed" "$rlog" | sed "s/^/$DG_NAME: $tag: /"
	[ "$rrc" -eq 0 ] || { dg_tail "$rlog"; return 1; }
	return 0
}

# Each phase starts 150 ms after the last: longer than the discovery lease (80 ms), so its first
# datagram asks host a again (docs/shim.md). On a loaded machine the answer can come after the
# phase's 4 datagrams: a run where only that happened (a ud/rd phase that ended plain) runs
# again, at most 3 times, and says so.
both_ok=0
for try in 1 2 3; do
	both_ok=0
	run_case both 1 || break
	both_ok=1
	[ "$try" -lt 3 ] && awk '/^ *[0-9]+  mode/ && $3 != "off" && $1 % 4 == 3 && $5 != "framed" { f = 1 }
		END { exit !f }' "$DG_TMP/both.send.log" || break
	dg_log "both: run $try: a ud/rd phase ended plain (a discovery answer later than its 4 datagrams): again"
done
if [ "$both_ok" -eq 1 ]; then
	slog=$DG_TMP/both.send.log
	# every datagram intact; off always plain; each ud/rd phase ends framed
	bad=$(awk '/^ *[0-9]+  mode/ {
		i = $1; m = $3; p = $5
		if ($0 !~ /arrived intact/) print "datagram " i " lost or corrupted"
		if (m == "off" && p != "plain") print "datagram " i " (off) went framed"
		if (m != "off" && i % 4 == 3 && p != "framed") print "datagram " i " (" m ", the last of its phase) went plain"
		n++ }
		END { if (n != '"$n"') print n + 0 " datagrams reported, want '"$n"'" }' "$slog")
	[ -z "$bad" ] || failed+=("both: $(echo "$bad" | paste -sd';')")
	grep -aq "^[0-9]* framed, [0-9]* plain, 0 bad" "$slog" || failed+=("both: the sender says datagrams were bad")
	fr=$(dg_sum "$slog" tx_framed)
	dg_log "both: sender tx_framed=$fr tx_plain=$(dg_sum "$slog" tx_plain), echo end tx_framed=$(dg_sum "$DG_TMP/both.recv.log" tx_framed) rx_framed=$(dg_sum "$DG_TMP/both.recv.log" rx_framed)"
	[ "$(dg_sum "$DG_TMP/both.recv.log" rx_framed)" -ge "$fr" ] && [ "$fr" -ge 8 ] ||
		failed+=("both: the exit summaries do not show the framed datagrams received")
	cap_check both --want-framed $((fr + $(dg_sum "$DG_TMP/both.recv.log" tx_framed))) ||
		failed+=("both: the capture shows fewer framed datagrams than the two ends sent")
else
	failed+=("both: the echo end failed")
fi
if run_case plain 0; then
	grep -aq "^0 framed, $n plain, 0 bad" "$DG_TMP/plain.send.log" ||
		failed+=("plain: want every datagram plain and intact with an unmodified echo end")
	cap_check plain --plain-host "$TH_A_IP" --min-seen "$n" || failed+=("plain: framed datagrams reached the unmodified echo end")
else
	failed+=("plain: the unmodified echo end failed")
fi
if [ ${#failed[@]} -ne 0 ]; then
	dg_fail "$(IFS=';'; echo "${failed[*]}" | sed 's/;/; /g')"
fi
dg_log "PASS ($(dg_elapsed "$t_start") s)"
