#!/usr/bin/env bash
# selfconnect.sh BUILD_DIR PORT: a single-threaded program that connects to its own listener and
# only then accepts (Python: listen, create_connection, accept, exchange) finishes at once under
# the shim as natively: a connect to a listener of the same process is plain TCP (docs/shim.md
# "A listener of the same process"); before, connect waited for an MPA answer that needed the
# accept and timed out. A second process connecting to the same listener is still carried
# (rc_conns on both ends), so the rule is not "everything plain". That process is started with
# subprocess (vfork: the child's close_range before its exec runs in the parent's memory); it
# once made the parent forget its listener, and the connection went plain (docs/shim.md
# "vfork and posix_spawn"). PORT is unused.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dg_init selfconnect "$1" "$2"
dg_require_shim
for i in "${!DG_SHIM_ENV[@]}"; do # python's own leaks are not ours to judge
	[[ ${DG_SHIM_ENV[$i]} == ASAN_OPTIONS=* ]] && DG_SHIM_ENV[$i]+=":detect_leaks=0"
done
cat >"$DG_TMP/self.py" <<'PY'
import socket, subprocess, sys, time
t0 = time.monotonic()
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(8)
port = l.getsockname()[1]
c = socket.create_connection(("127.0.0.1", port), timeout=20)
a, _ = l.accept()
c.sendall(b"x" * 100000); got = b""
while len(got) < 100000:
    got += a.recv(65536)
a.sendall(b"pong"); assert c.recv(4) == b"pong"
self_s = time.monotonic() - t0
# another process: carried as between any two preloaded programs
p = subprocess.Popen([sys.executable, "-c",
    "import socket,sys; c=socket.create_connection(('127.0.0.1', %d), timeout=20); c.sendall(b'hello'); c.recv(2)" % port])
b, _ = l.accept(); assert b.recv(5) == b"hello"; b.sendall(b"ok")
assert p.wait(30) == 0
print("self %.3f s" % self_s, flush=True)
PY
failed=()
for mode in native shim; do
	if [ $mode = native ]; then
		timeout -k 5 60 python3 "$DG_TMP/self.py" >"$DG_TMP/$mode.out" 2>&1
	else
		timeout -k 5 60 env "${DG_SHIM_ENV[@]}" DGSHIM_LOG=info python3 "$DG_TMP/self.py" >"$DG_TMP/$mode.out" 2>"$DG_TMP/$mode.err"
	fi
	r=$?
	s=$(sed -n 's/^self \([0-9.]*\) s$/\1/p' "$DG_TMP/$mode.out")
	dg_log "$mode: exit $r, connect-accept-exchange in one thread: ${s:-?} s"
	[ $r -eq 0 ] && [ -n "$s" ] || { failed+=("$mode: failed (exit $r)"); dg_tail "$DG_TMP/$mode.out" 10; continue; }
	awk -v s="$s" 'BEGIN {exit !(s < 2.0)}' || failed+=("$mode: the self-connection took $s s (want < 2 s)")
done
if [ -s "$DG_TMP/shim.err" ]; then
	conns=$(dg_sum "$DG_TMP/shim.err" rc_conns)
	dg_log "shim: rc_conns=$conns over both processes (want 2: the other process's connection, both ends)"
	[ "${conns:-0}" -ge 2 ] || failed+=("shim: the second process's connection was not carried (rc_conns=${conns:-none})")
fi
if [ ${#failed[@]} -gt 0 ]; then
	for f in "${failed[@]}"; do dg_log "FAIL: $f"; done
	exit 1
fi
dg_log "PASS"
