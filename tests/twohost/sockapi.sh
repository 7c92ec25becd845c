#!/usr/bin/env bash
# sockapi.sh BUILD_DIR BASE_PORT: the peer-facing cases of tests/integration/sockapi.sh between
# two hosts (netns.sh), with sockapi's own two-process roles (SOCKAPI_SELF / SOCKAPI_PEER give
# each side its address): the receiver on host a (10.77.0.1:BASE_PORT), the sender on host b
# (BASE_PORT+1). NO rules: discovery across hosts decides. Each run is captured on the veth.
#   interop-native  nothing preloaded: 70 datagrams of 0 B - 65 000 B (IP fragments on the
#                   veth) echoed back, every byte and source address checked: the reference
#   interop-recv    the receiver preloaded, the sender unmodified: sockapi checks the
#                   preloaded side sent and received only plain datagrams (tx_plain = rx_plain
#                   = 70, nothing framed); the capture has no framed datagram to host b
#   interop-send    the sender preloaded, the receiver unmodified: the same the other way
# The RD transfer under injected loss between the hosts is rd_loss.sh (out of meson: it fails on
# a loaded machine, see there).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../integration/lib.sh
. "$here/../integration/lib.sh"
# shellcheck source=netns.sh
. "$here/netns.sh"
# shellcheck source=capture.sh
. "$here/capture.sh"
dg_init twohost_sockapi "$@"
t_start=$(date +%s.%N)
bin=$DG_BUILD/tests/integration/sockapi
[ -x "$bin" ] || dg_fail "$bin does not exist: build it first (ninja -C $DG_BUILD)"
dg_require_shim
cap_need
th_up
port=$DG_PORT
# sockapi links ASan itself in a sanitizer build: the link-order check is only about order
asan="ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
# shellcheck disable=SC2034 # native, shim and shimrd are used through namerefs (pair)
native=(-u LD_PRELOAD "$asan" SOCKAPI_EXPECT=native)
shim=("${DG_SHIM_ENV[@]}" SOCKAPI_EXPECT=preload)
for i in "${!shim[@]}"; do
	[[ ${shim[$i]} == ASAN_OPTIONS=* ]] && shim[$i]+=":verify_asan_link_order=0"
done
failed=()

# pair TAG RROLE SROLE N RENV SENV [SENDER_WORDS...]: the receiver role on host a with the words
# of the array named RENV, the sender role on host b with SENV's (and SENDER_WORDS); captured.
pair() {
	local tag=$1 rrole=$2 srole=$3 n=$4 rpid rrc src
	local -n renv=$5 senv=$6
	shift 6
	local rlog=$DG_TMP/$tag.recv.log slog=$DG_TMP/$tag.send.log
	cap_start "$tag"
	th_bg a "$rlog" timeout -k 5 60 env "${renv[@]}" SOCKAPI_SELF="$TH_A_IP" SOCKAPI_PEER="$TH_B_IP" \
		"$bin" "$rrole" "$port" "$n"
	rpid=$TH_LAST_PID
	for _ in $(seq 100); do th_run a ss -Huln | grep -q "$TH_A_IP:$port " && break; sleep 0.05; done
	th_run b timeout -k 5 60 env "${senv[@]}" "$@" SOCKAPI_SELF="$TH_B_IP" SOCKAPI_PEER="$TH_A_IP" \
		"$bin" "$srole" "$port" "$n" >"$slog" 2>&1
	src=$?
	wait "$rpid"
	rrc=$?
	cap_stop
	dg_log "$tag: receiver exit $rrc, sender exit $src"
	grep -ah "^sockapi: rd-loss" "$rlog" "$slog" | sed "s/^/$DG_NAME: $tag: /"
	if [ "$rrc" -ne 0 ] || [ "$src" -ne 0 ]; then
		dg_tail "$rlog" 15
		dg_tail "$slog" 15
		return 1
	fi
}

pair interop-native interop-recv interop-send 70 native native ||
	dg_fail "interop-native: sockapi between the hosts without the shim failed: the test bed, not the shim"
cap_check interop-native --plain-host "$TH_A_IP" --plain-host "$TH_B_IP" || dg_fail "interop-native: framed datagrams without the shim?"
if pair interop-recv interop-recv interop-send 70 shim native; then
	cap_check interop-recv --plain-host "$TH_B_IP" --min-seen 70 || failed+=("interop-recv: framed datagrams reached the unmodified sender")
else
	failed+=("interop-recv: the preloaded receiver and the unmodified sender did not exchange plain datagrams exactly")
fi
if pair interop-send interop-recv interop-send 70 native shim; then
	cap_check interop-send --plain-host "$TH_A_IP" --min-seen 70 || failed+=("interop-send: framed datagrams reached the unmodified receiver")
else
	failed+=("interop-send: the preloaded sender and the unmodified receiver did not exchange plain datagrams exactly")
fi
if [ ${#failed[@]} -ne 0 ]; then
	dg_fail "$(IFS=';'; echo "${failed[*]}" | sed 's/;/; /g')"
fi
dg_log "PASS ($(dg_elapsed "$t_start") s)"
