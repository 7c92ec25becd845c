#!/usr/bin/env bash
# latereq.sh BUILD_DIR PORT: a carried connection whose client sends its MPA Request seconds
# after the server accepted (latereq.py: the client's shim runs DGSHIM_PROGRESS=app and sleeps
# in between). The server's calls must not wait for the Request (a non-blocking recv EAGAIN,
# FIONREAD 0, poll nothing, each at once), its epoll_wait and its blocking recv must end with
# the client's bytes, both connections carried, none reset. Before (issue 14), the server's
# first call waited 5 s for the Request, then read the connection as reset.
# The same script runs natively first: its expectations are the kernel's.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dg_init latereq "$1" "$2"
dg_require_shim
for i in "${!DG_SHIM_ENV[@]}"; do # python's own leaks are not ours to judge
	[[ ${DG_SHIM_ENV[$i]} == ASAN_OPTIONS=* ]] && DG_SHIM_ENV[$i]+=":detect_leaks=0"
done
delay=6 # longer than the 5 s the server's shim used to wait
port=$DG_PORT
run() { # TAG ENV...: one run (server and client with ENV, the filler never preloaded)
	local tag=$1 d=$DG_TMP/$1
	shift
	mkdir -p "$d"
	env "$@" timeout 120 python3 "$here/latereq.py" serve "$port" "$d" >"$d/srv" 2>&1 &
	local p=$! i
	for i in $(seq 200); do grep -qs listening "$d/srv" && break; sleep 0.05; done
	timeout 120 python3 "$here/latereq.py" fill "$port" "$d" >"$d/fill" 2>&1 &
	local f=$!
	env "$@" DGSHIM_PROGRESS=app timeout 120 python3 "$here/latereq.py" connect "$port" "$d" $delay >"$d/cli" 2>&1
	local crc=$?
	wait "$p"
	local src=$?
	wait "$f"
	port=$((port + 1))
	grep -h '^FAIL' "$d/srv" "$d/cli" | sed "s/^/$DG_NAME: $tag: /"
	if [ $crc -ne 0 ] || [ $src -ne 0 ] || [ "$(grep -c '^ok ' "$d/srv")" -ne 13 ] ||
		[ "$(grep -c '^ok ' "$d/cli")" -ne 6 ]; then
		dg_log "$tag: client exit $crc, server exit $src"
		dg_tail "$d/cli" 12
		dg_tail "$d/srv" 20
		dg_tail "$d/fill" 5
		return 1
	fi
}
run native || dg_fail "native: the test's expectations are not the kernel's"
dg_log "native: both connections as expected"
run shim "${DG_SHIM_ENV[@]}" || dg_fail "shim: the server's calls waited for the client's MPA Request, or the connection broke"
srv=$DG_TMP/shim/srv cli=$DG_TMP/shim/cli
sc=$(dg_sum "$srv" rc_conns) cc=$(dg_sum "$cli" rc_conns)
sr=$(dg_sum "$srv" rc_reset) cr=$(dg_sum "$cli" rc_reset)
dg_log "shim: server rc_conns=$sc rc_reset=$sr; client rc_conns=$cc rc_reset=$cr"
[ "$sc" -eq 2 ] && [ "$cc" -eq 2 ] || dg_fail "want both connections carried on both ends"
[ "$sr" -eq 0 ] && [ "$cr" -eq 0 ] || dg_fail "a connection was reset"
grep -q "iWARP accept failed" "$srv" && dg_fail "the server gave up: $(grep -m1 'iWARP accept failed' "$srv")"
dg_log "PASS: the server's calls did not wait for a Request $delay s late; both connections carried"
