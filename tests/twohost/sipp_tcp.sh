#!/usr/bin/env bash
# sipp_tcp.sh BUILD_DIR BASE_PORT: tests/integration/sipp_tcp.sh between two hosts (netns.sh):
# the SIPp UAS (-t t1) on host a (10.77.0.1), the UAC on host b, 200 calls all up at once
# (400 calls/s, each held 2 s), with NO rules (discovery across hosts decides). The pair runner
# and the statistics checks are tests/integration/sipp_lib.sh's (UAC: 200 successful, 0 failed,
# peak 200; UAS: 200 incoming, its failures only TCP-closed ones). Cases, each shim case
# captured on the veth:
#   native-tn             nothing preloaded: the reference
#   shim-t1, shim-tn      both preloaded: both exit summaries say the connections were carried
#                         over RC (dg_check_rc: rc_conns >= 1 with -t t1, >= 200 with -t tn),
#                         and the capture shows that many MPA Requests and Replies
#   plain-uas             the UAC (-t tn) preloaded, the UAS unmodified: the UAC's 200
#                         connections plain (dg_check_rc_plain), no MPA byte on the wire
#   plain-uac             the UAS preloaded, the UAC (-t tn) unmodified: the same the other way
# Discovery: the UAC's first connect waits at most 10 ms for host a's answer (docs/shim.md); a
# run whose first connection went plain only for that (the UAC's rc_plain = 1) runs again, at
# most 3 times, and says so.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../integration/lib.sh
. "$here/../integration/lib.sh"
# shellcheck source=../integration/sipp_lib.sh
. "$here/../integration/sipp_lib.sh"
# shellcheck source=netns.sh
. "$here/netns.sh"
# shellcheck source=capture.sh
. "$here/capture.sh"
dg_init twohost_sipp_tcp "$@"
t_start=$(date +%s.%N)
sipp_init tcp 200 400 2000
dg_require_shim
cap_need
th_up
DG_SS=(ip netns exec "$TH_NS_A" ss)
DG_WAIT_IP=$TH_A_IP
SIPP_UAS_PRE=(ip netns exec "$TH_NS_A")
SIPP_UAC_PRE=(ip netns exec "$TH_NS_B")
SIPP_UAS_IP=$TH_A_IP
SIPP_UAC_IP=$TH_B_IP
sipp_native tn
dg_log "shim: ${DG_SHIM_ENV[*]}"
failed=()
# shim_case TAG MODE WHO: WHO both, uac or uas (who is preloaded)
shim_case() {
	local tag=$1 mode=$2 who=$3 role ok try min=1
	[ "$mode" = t1 ] || min=$SIPP_CALLS
	SIPP_UAS_ENV=() SIPP_UAC_ENV=()
	[ "$who" = uac ] || SIPP_UAS_ENV=("${DG_SHIM_ENV[@]}")
	[ "$who" = uas ] || SIPP_UAC_ENV=("${DG_SHIM_ENV[@]}")
	for try in 1 2 3; do
		ok=1
		cap_start "$tag"
		sipp_run_pair "$tag" "$mode" || ok=0
		cap_stop
		[ $ok -eq 1 ] || { failed+=("$tag: SIPp -t $mode calls failed (preloaded: $who)"); return; }
		if [ "$who" = both ] && [ "$try" -lt 3 ] && [ "$(dg_sum "$SIPP_DIR/$tag.uac.log" rc_plain)" -eq 1 ]; then
			dg_log "$tag: run $try: the UAC's first connection went plain (host a's discovery answer came after 10 ms?): again"
			continue
		fi
		break
	done
	case $who in
	both)
		for role in uas uac; do
			dg_check_rc "$tag ${role^^}" "$SIPP_DIR/$tag.$role.log" "$min" ||
				failed+=("$tag ${role^^}: not over RC")
		done
		cap_check "$tag" --want-mpa $((2 * min)) || failed+=("$tag: the capture shows no MPA exchange")
		;;
	uac | uas)
		local other=$TH_A_IP
		[ "$who" = uas ] && other=$TH_B_IP
		dg_check_rc_plain "$tag ${who^^} (peer unmodified)" "$SIPP_DIR/$tag.$who.log" ||
			failed+=("$tag ${who^^}: no plain fallback")
		cap_check "$tag" --plain-host "$other" --min-seen $((2 * SIPP_CALLS)) || failed+=("$tag: iWARP bytes reached the unmodified side")
		;;
	esac
}
shim_case shim-t1 t1 both
shim_case shim-tn tn both
shim_case plain-uas tn uac
shim_case plain-uac tn uas
if [ ${#failed[@]} -ne 0 ]; then
	dg_fail "$(IFS=';'; echo "${failed[*]}" | sed 's/;/; /g')"
fi
dg_log "PASS ($(dg_elapsed "$t_start") s)"
