#!/usr/bin/env bash
# bulk.sh BUILD_DIR BASE_PORT: bulk UD between two hosts (netns.sh) on a veth shaped to 10 Gbit/s
# with tc tbf each way, as the bench's section 6 runs it: dgperf (verbs level, the soft
# provider's own sockets) streams 512 KB Write-Records in MTU-sized datagrams, sent as UDP GSO
# trains, from host a to host b, and 64 KB Sends. A UD sender has no congestion control: the
# room of its socket's send buffer (skbs stay charged to it while a qdisc holds them) is the only
# back-pressure it gets from the first hop. Passes when host a's tbf dropped nothing (with the
# provider's send buffer at 8 MiB the sender out-queued tbf's 7.25 MB limit, which dropped whole
# trains: ~25 % of the datagrams of a 512 KB stream), every record arrived whole, and the
# --event --detail rows carry both sides' CPU time.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../integration/lib.sh
. "$here/../integration/lib.sh"
# shellcheck source=netns.sh
. "$here/netns.sh"
dg_init twohost_bulk "$@"
perf=$DG_BUILD/apps/dgperf
[ -x "$perf" ] || dg_fail "$perf does not exist"
san=$(ldd "$perf" 2>/dev/null | grep -Eo 'lib[at]san' | head -1) # a sanitizer build (build-asan)
command -v tc >/dev/null || dg_fail "no tc(8) (iproute2)"
th_up --rate 10gbit
dev=$(th_run a ip -o link show type veth | awk -F': ' '{print $2}' | cut -d@ -f1)
[ -n "$dev" ] || dg_fail "no veth on host a"
tbf_drops() { th_run a tc -s qdisc show dev "$dev" | awk '/dropped/ {gsub(",", ""); print $7; exit}'; }
port=$DG_PORT
fail=0
for args in "-c UD -t wr_bw -s 512K -n 600" "-c UD -t send_bw -s 64K -n 3000"; do
	port=$((port + 1))
	before=$(tbf_drops)
	# shellcheck disable=SC2086
	th_bg b "$DG_TMP/srv.$port" "$perf" -p "$port" --event --detail $args
	sleep 0.3
	# shellcheck disable=SC2086
	out=$(th_run a timeout 120 "$perf" -p "$port" --event --detail $args "$TH_B_IP" 2>"$DG_TMP/cli.$port") || {
		dg_log "client: $(tail -3 "$DG_TMP/cli.$port")"; dg_log "server: $(tail -3 "$DG_TMP/srv.$port")"
		dg_fail "dgperf $args across the hosts failed"; }
	after=$(tbf_drops)
	[[ $before =~ ^[0-9]+$ && $after =~ ^[0-9]+$ ]] || dg_fail "cannot read tbf's drop counter ($before, $after)"
	echo "$out" | python3 -c '
import json, sys
r = [json.loads(l) for l in sys.stdin if l.startswith("{")][0]
drops = int(sys.argv[1])
whole = r["delivered_bytes"] / (r["sent_msgs"] * r["size"])
print("%s %s %d B: %.0f MB/s, %.1f %% of the bytes delivered, tbf dropped %d packets, CPU %.3f + %.3f s"
      % (r["transport"], r["test"], r["size"], r["bw_MBps"], 100 * whole, drops, r["cpu_client_s"], r["cpu_server_s"]))
assert drops == 0, "the first hop (tbf) dropped %d packets: the sender out-queued it" % drops
assert r["cpu_client_s"] > 0 and r["cpu_server_s"] > 0, r
# the receiver may still fall behind on a loaded machine (UD: its socket drops), rarely; a
# sanitizer build receives at a fraction of the speed (ASan on a 2-core machine: 56-82 %
# arrived at 600 MB/s, with tbf dropping nothing), so there it must only make progress
need = 0.95 if sys.argv[2] == "" else 0.25
assert whole >= need, "only %.1f %% of the bytes arrived (want %.0f %%)" % (100 * whole, 100 * need)
' "$((after - before))" "$san" || fail=1
done
[ $fail -eq 0 ] || dg_fail "bulk UD across a shaped link lost datagrams"
dg_log "PASS"
