#!/usr/bin/env bash
# noroom.sh BUILD_DIR PORT: a server whose shim runs out of its descriptor budget (a quarter of
# RLIMIT_NOFILE; here 64) while N clients that all asked for iWARP wait (issue "Hardening" item
# 7). The connections it has room for are carried; each one it has none for is answered with an
# MPA Reject saying "stay plain" and both programs go on with plain TCP on the connection they
# made: every byte echoed, the server's banner (sent right behind the Reply) intact, no reset.
# Before, the client of each connection without room read ECONNRESET.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dg_init noroom "$1" "$2"
dg_require_shim
dg_need prlimit util-linux
for i in "${!DG_SHIM_ENV[@]}"; do # python's own leaks are not ours to judge
	[[ ${DG_SHIM_ENV[$i]} == ASAN_OPTIONS=* ]] && DG_SHIM_ENV[$i]+=":detect_leaks=0"
done
n=24
port=$DG_PORT
run() { # TAG ENV...: one run; sets $ok
	local tag=$1 out=$DG_TMP/$1
	shift
	rm -f "$out.flag"
	env "$@" timeout 90 prlimit --nofile=64:64 python3 "$here/noroom.py" serve "$port" $n "$out.flag" >"$out.srv" 2>&1 &
	local p=$! i
	for i in $(seq 200); do grep -qs listening "$out.srv" && break; sleep 0.05; done
	env "$@" timeout 90 python3 "$here/noroom.py" connect "$port" $n "$out.flag" >"$out.cli" 2>&1
	local crc=$?
	wait "$p"
	local src=$?
	port=$((port + 1))
	ok=1
	if [ $crc -ne 0 ] || [ $src -ne 0 ] || ! grep -q "^echoed $n " "$out.cli" || ! grep -q "^served $n " "$out.srv"; then
		dg_log "$tag: client exit $crc, server exit $src"
		dg_tail "$out.cli" 8
		dg_tail "$out.srv" 8
		ok=0
	fi
}
run native
[ $ok = 1 ] || dg_fail "native: the test program itself failed"
dg_log "native: $n connections, every byte echoed"
run shim "${DG_SHIM_ENV[@]}" DGSHIM_LOG=info
[ $ok = 1 ] || dg_fail "shim: a connection the server had no room for did not go on as plain TCP"
srv=$DG_TMP/shim.srv cli=$DG_TMP/shim.cli
sc=$(dg_sum "$srv" rc_conns) sr=$(dg_sum "$srv" rc_no_room) cr=$(dg_sum "$cli" rc_no_room)
cc=$(dg_sum "$cli" rc_conns) sres=$(dg_sum "$srv" rc_reset)
dg_log "shim: server rc_conns=$sc rc_no_room=$sr rc_reset=$sres; client rc_conns=$cc rc_no_room=$cr"
[ "$sc" -ge 1 ] || dg_fail "the server carried no connection (the test needs some carried and some without room)"
[ "$sr" -ge 1 ] || dg_fail "the server never ran out of room (rc_no_room=0): the test did not reach the case"
[ "$cr" -eq "$sr" ] || dg_fail "the server said \"stay plain\" $sr times, the clients heard it $cr times"
[ $((sc + sr)) -le $n ] && [ "$cc" -eq "$sc" ] || dg_fail "carried counts differ: server $sc, client $cc"
grep -q "plain TCP, the client told so" "$srv" || dg_fail "no log line on the server naming why a connection went plain"
grep -q "iWARP accept failed" "$srv" && dg_fail "the server still reset a connection: $(grep -m1 'iWARP accept failed' "$srv")"
dg_log "PASS: $sc carried, $sr plain for want of room (MPA Reject \"stay plain\"), every byte and the banners intact"
