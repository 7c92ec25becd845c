# shellcheck shell=bash
# netns.sh: a two-host test bed on one machine. Two network namespaces ("hosts" a and b) joined
# by a veth pair, 10.77.0.1/24 on a and 10.77.0.2/24 on b, each with its own loopback; traffic
# stays inside namespaces this script made. Source it, then:
#
#   th_up [--mtu N] [--rate RATE]   make the hosts (MTU default 1500; RATE e.g. 10gbit shapes
#                                   both directions of the veth with tc tbf)
#   th_run a|b CMD...               run CMD on host a or b (inherits the environment)
#   th_bg a|b OUTFILE CMD...        the same in the background; pid in TH_LAST_PID, ended by
#                                   th_down
#   th_down                         end what th_bg started, delete both namespaces (th_up sets
#                                   it to run on EXIT, INT, TERM and HUP)
#
# TH_A_IP / TH_B_IP hold the addresses. Namespace names carry the shell's pid, so runs side by
# side do not meet. Where namespaces cannot be made here (no CAP_SYS_ADMIN, no veth), th_up
# exits 77 with the reason: the only case a two-host test may skip.

TH_A_IP=10.77.0.1
TH_B_IP=10.77.0.2
TH_NS_A=
TH_NS_B=
TH_PIDS=()
TH_LAST_PID=

th_ns() { [ "$1" = a ] && echo "$TH_NS_A" || echo "$TH_NS_B"; }

th_down() {
	local p
	for p in "${TH_PIDS[@]}"; do
		kill -TERM "$p" 2>/dev/null
	done
	for p in "${TH_PIDS[@]}"; do
		local i
		for i in $(seq 30); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$p" 2>/dev/null
	done
	TH_PIDS=()
	[ -n "$TH_NS_A" ] && ip netns del "$TH_NS_A" 2>/dev/null
	[ -n "$TH_NS_B" ] && ip netns del "$TH_NS_B" 2>/dev/null
	TH_NS_A= TH_NS_B=
	return 0
}

th_up() {
	local mtu=1500 rate=
	while [ $# -gt 0 ]; do
		case $1 in
		--mtu) mtu=$2; shift 2 ;;
		--rate) rate=$2; shift 2 ;;
		*) echo "th_up: unknown option $1" >&2; return 2 ;;
		esac
	done
	command -v ip >/dev/null || { echo "th_up: SKIP: no ip(8) (iproute2)"; exit 77; }
	TH_NS_A=dgth-$$-a
	TH_NS_B=dgth-$$-b
	# after the caller's own clean-up (lib.sh's dg_cleanup keeps the exit status)
	if declare -F dg_cleanup >/dev/null; then
		trap 'th_rc=$?; th_down; (exit $th_rc); dg_cleanup' EXIT
	else
		trap 'th_rc=$?; th_down; exit $th_rc' EXIT
	fi
	trap 'exit 1' INT TERM HUP
	if ! ip netns add "$TH_NS_A" 2>/tmp/th.$$ || ! ip netns add "$TH_NS_B" 2>>/tmp/th.$$; then
		echo "th_up: SKIP: network namespaces cannot be made here: $(cat /tmp/th.$$)"
		rm -f /tmp/th.$$
		TH_NS_A= TH_NS_B=
		exit 77
	fi
	rm -f /tmp/th.$$
	if ! ip link add veth-$$a netns "$TH_NS_A" type veth peer name veth-$$b netns "$TH_NS_B"; then
		echo "th_up: SKIP: no veth pair can be made here"
		th_down
		exit 77
	fi
	ip -n "$TH_NS_A" addr add "$TH_A_IP/24" dev veth-$$a
	ip -n "$TH_NS_B" addr add "$TH_B_IP/24" dev veth-$$b
	ip -n "$TH_NS_A" link set veth-$$a mtu "$mtu" up
	ip -n "$TH_NS_B" link set veth-$$b mtu "$mtu" up
	ip -n "$TH_NS_A" link set lo up
	ip -n "$TH_NS_B" link set lo up
	if [ -n "$rate" ]; then
		# tbf per direction: netem does not exist in this kernel; loss is the provider's
		tc -n "$TH_NS_A" qdisc add dev veth-$$a root tbf rate "$rate" burst 1mb latency 5ms || return 1
		tc -n "$TH_NS_B" qdisc add dev veth-$$b root tbf rate "$rate" burst 1mb latency 5ms || return 1
	fi
	return 0
}

th_run() {
	local h=$1
	shift
	ip netns exec "$(th_ns "$h")" "$@"
}

th_bg() {
	local h=$1 out=$2
	shift 2
	ip netns exec "$(th_ns "$h")" "$@" >"$out" 2>&1 &
	TH_LAST_PID=$!
	TH_PIDS+=("$TH_LAST_PID")
}
