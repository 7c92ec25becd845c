#!/usr/bin/env bash
# rd_loss.sh BUILD_DIR BASE_PORT: an RD transfer between two hosts (netns.sh) under injected
# loss, with sockapi's rd-loss roles (tests/integration/sockapi.c): the receiver on host a
# (10.77.0.1:BASE_PORT), the sender on host b, both preloaded with DGSHIM_MODE=rd and 5 % loss
# injected in both sides' sends (DGSHIM_FAULT_TX=loss=5: data and acknowledgements), NO rules
# (discovery across hosts decides). Passes when 2 000 datagrams of 8 B - 6 000 B arrive each
# once, in order, byte-exact, the sender retransmitted, and a capture on the veth shows the
# framed datagrams crossing. An RD datagram to another host waits for the sender's discovery
# answer (at most 200 ms, shim/data.c) instead of going plain meanwhile: plain datagrams have no
# RD reliability. At most 100 (5 %) may still go plain (SOCKAPI_RD_PLAIN_OK; they too must
# arrive exact and in order).
#
# In meson as twohost_rd_loss (discovery) and twohost_rd_loss_rules (RD_LOSS_RULES=1: a rules
# line names the other host). Under load, by hand:
#   RD_LOSS_HOGS=3 tests/twohost/rd_loss.sh build 23675
# (three busy loops during the run; RD_LOSS_LOG=debug for the shim's debug log, RD_LOSS_FAULT=
# for no injected loss, DG_KEEP_TMP=1 to keep the capture). Before the wait, under that load the
# sender ran at full speed while its question was out and sent ~280 datagrams plain; the
# starved receiver's kernel dropped some, the receiver read one out of order and failed (1 of 1
# runs); with the wait 3 of 3 pass (2000 datagrams, ~4 550 framed on the wire with the
# retransmissions).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../integration/lib.sh
. "$here/../integration/lib.sh"
# shellcheck source=netns.sh
. "$here/netns.sh"
# shellcheck source=capture.sh
. "$here/capture.sh"
dg_init twohost_rd_loss "$@"
t_start=$(date +%s.%N)
bin=$DG_BUILD/tests/integration/sockapi
[ -x "$bin" ] || dg_fail "$bin does not exist: build it first (ninja -C $DG_BUILD)"
dg_require_shim
cap_need
th_up
port=$DG_PORT
n=2000
env=("${DG_SHIM_ENV[@]}" SOCKAPI_EXPECT=preload DGSHIM_MODE=rd SOCKAPI_RD_PLAIN_OK=100 "DGSHIM_FAULT_TX=${RD_LOSS_FAULT-loss=5}")
for i in "${!env[@]}"; do
	[[ ${env[$i]} == ASAN_OPTIONS=* ]] && env[$i]+=":verify_asan_link_order=0"
done
[ -z "${RD_LOSS_LOG:-}" ] || env+=("DGSHIM_LOG=$RD_LOSS_LOG")
# RD_LOSS_RULES=1 (meson's twohost_rd_loss_rules): a rules line names the other host (mode=rd),
# so no discovery: framed from the first datagram, nothing may go plain
[ -z "${RD_LOSS_RULES:-}" ] || env+=("DGSHIM_RULES=mode=rd addr=10.77.0.0/24" SOCKAPI_RD_PLAIN_OK=0)
for _ in $(seq "${RD_LOSS_HOGS:-0}"); do
	dg_bg /dev/null timeout 60 sh -c 'while :; do :; done'
done
rlog=$DG_TMP/recv.log slog=$DG_TMP/send.log
cap_start rd-loss
th_bg a "$rlog" timeout -k 5 60 env "${env[@]}" SOCKAPI_SELF="$TH_A_IP" SOCKAPI_PEER="$TH_B_IP" \
	"$bin" rd-loss-recv "$port" "$n"
rpid=$TH_LAST_PID
for _ in $(seq 100); do th_run a ss -Huln | grep -q "$TH_A_IP:$port " && break; sleep 0.05; done
th_run b timeout -k 5 60 env "${env[@]}" SOCKAPI_SELF="$TH_B_IP" SOCKAPI_PEER="$TH_A_IP" \
	"$bin" rd-loss-send "$port" "$n" >"$slog" 2>&1
src=$?
wait "$rpid"
rrc=$?
cap_stop
dg_log "receiver exit $rrc, sender exit $src"
grep -ah "^sockapi: rd-loss" "$rlog" "$slog" | cut -c1-300 | sed "s/^/$DG_NAME: /"
if [ "$rrc" -ne 0 ] || [ "$src" -ne 0 ]; then
	dg_tail "$rlog" 15
	dg_tail "$slog" 15
	dg_fail "RD under loss between the hosts was not exact and in order"
fi
cap_check rd-loss --want-framed "$n" || dg_fail "the capture shows too few framed datagrams"
dg_log "PASS ($(dg_elapsed "$t_start") s)"
