#!/usr/bin/env bash
# uringcheck.sh BUILD_DIR PORT: a program that moves its bytes through io_uring (liburing)
# instead of the libc calls the shim reads (issue "Hardening"). An echo client sends and
# receives through io_uring requests: natively the echo works; preloaded, with its TCP
# connection carried over RC, io_uring_submit refuses the request (EOPNOTSUPP) with one error
# line naming the descriptor, never a silently corrupted stream; preloaded with the program's
# sockets kept plain by a rules line (the documented way to run such a program) it works; and a
# receive on a UDP socket the shim took is refused the same way.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dg_init uringcheck "$1" "$2"
dg_require_shim
for i in "${!DG_SHIM_ENV[@]}"; do # python's own leaks are not ours to judge
	[[ ${DG_SHIM_ENV[$i]} == ASAN_OPTIONS=* ]] && DG_SHIM_ENV[$i]+=":detect_leaks=0"
done
uc=$DG_BUILD/tests/integration/uringcheck
[ -x "$uc" ] || dg_fail "$uc was not built (liburing-dev missing? ./scripts/install-deps installs it)"
echo_py=$here/../apps/asyncio_echo.py
port=$DG_PORT
# case TAG PROTO WANT ENV...: one echo; WANT is OK or REFUSED
case_() {
	local tag=$1 proto=$2 want=$3 out=$DG_TMP/$1
	shift 3
	dg_bg "$out.srv" env "$@" python3 "$echo_py" "$proto-server" "$port"
	local srv=$DG_LAST_PID
	dg_wait_port "$proto" "$port" 10 "$srv" || dg_fail "$tag: the echo server did not start: $(tail -n 3 "$out.srv")"
	env "$@" timeout 20 "$uc" "$proto" "$port" >"$out.cli" 2>&1
	local rc=$?
	kill "$srv" 2>/dev/null
	wait "$srv" 2>/dev/null
	port=$((port + 1))
	local line
	line=$(grep -a '^uringcheck: ' "$out.cli" | tail -n 1)
	case $want in
	OK) [ $rc -eq 0 ] && [[ $line == "uringcheck: OK echo"* ]] ||
		{ dg_tail "$out.cli" 6; dg_fail "$tag: expected the echo to work: exit $rc, $line"; } ;;
	REFUSED)
		[ $rc -eq 3 ] && [[ $line == "uringcheck: REFUSED Operation not supported" ]] ||
			{ dg_tail "$out.cli" 6; dg_fail "$tag: expected io_uring_submit to refuse: exit $rc, $line"; }
		grep -aq 'error: io_uring: request [0-9]* on fd [0-9]*, a socket the shim carries: refused' "$out.cli" ||
			{ dg_tail "$out.cli" 6; dg_fail "$tag: no error line names the refused request"; } ;;
	esac
	dg_log "$tag: $line"
}
case_ native-tcp tcp OK -u LD_PRELOAD
case_ shim-tcp tcp REFUSED "${DG_SHIM_ENV[@]}"
conns=$(dg_sum "$DG_TMP/shim-tcp.cli" rc_conns)
[ "$conns" -ge 1 ] || dg_fail "shim-tcp: rc_conns=$conns: the refused connection was not a carried one"
dg_log "shim-tcp: rc_conns=$conns (carried; nothing went over it)"
case_ shim-tcp-plain tcp OK "${DG_SHIM_ENV[@]}" "DGSHIM_RULES=mode=off program=uringcheck"
case_ native-udp udp OK -u LD_PRELOAD
case_ shim-udp udp REFUSED "${DG_SHIM_ENV[@]}"
dg_log "PASS"
