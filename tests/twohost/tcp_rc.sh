#!/usr/bin/env bash
# tcp_rc.sh BUILD_DIR BASE_PORT: TCP between two hosts (network namespaces joined by veth,
# tests/twohost/netns.sh). Python's HTTP server on host a, a urllib client on host b fetching a
# 4 MiB file (sha256 checked) and a small page:
#   rc        both preloaded, the client with a rules line naming the other host (mode=rc):
#             carried over RC (both summaries rc_conns >= 1); the server recognises the MPA
#             Request in-band (no registry reaches across hosts)
#   plainc    the client unmodified: plain TCP, the server's summary rc_plain >= 1
#   auto      both preloaded, no rules: the client asks host a's discovery port, carried over RC
#   nosrv     the server unmodified, the client preloaded without rules: plain TCP (nobody
#             answers on host a's discovery port)
# In every case the server's program never sees an iWARP byte (its log is checked for the MPA
# key, which http.server would echo in a 400 line).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../integration/lib.sh
. "$here/../integration/lib.sh"
# shellcheck source=netns.sh
. "$here/netns.sh"
dg_init twohost_tcp "$@"
dg_require_shim
# a sanitizer build: python's and bash's own leaks are not ours to judge (exit 134); the shim's
# are judged by the unit and integration suites on our own programs
for i in "${!DG_SHIM_ENV[@]}"; do
	[[ ${DG_SHIM_ENV[$i]} == ASAN_OPTIONS=* ]] && DG_SHIM_ENV[$i]+=":detect_leaks=0"
done
th_up
port=$DG_PORT
www=$DG_TMP/www
mkdir -p "$www"
head -c 4M /dev/urandom >"$www/big.bin"
echo "hello from host a" >"$www/index.html"
want=$(sha256sum "$www/big.bin" | cut -d' ' -f1)
cat >"$DG_TMP/fetch.py" <<'PY'
import hashlib, sys, urllib.request
base = sys.argv[1]
big = urllib.request.urlopen(base + "/big.bin", timeout=20).read()
small = urllib.request.urlopen(base + "/index.html", timeout=20).read()
print(hashlib.sha256(big).hexdigest(), len(big), small.decode().strip())
PY
# http.server that leaves normally on SIGTERM (a background job ignores SIGINT), so its exit
# summary is written
cat >"$DG_TMP/serve.py" <<'PY'
import functools, http.server, signal, sys
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[3])
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), h).serve_forever()
PY
failed=()
# run_case TAG WANT: one fetch with the server's environment in S_ENV and the client's in
# C_ENV (arrays of NAME=VALUE); WANT rc, plain-unmod or plain for the connections
run_case() {
	local tag=$1 want_mode=$2 d=$DG_TMP/$1
	mkdir -p "$d"
	th_bg a "$d/server.log" env "${S_ENV[@]}" python3 -u "$DG_TMP/serve.py" "$TH_A_IP" "$port" "$www"
	local spid=$TH_LAST_PID i
	for i in $(seq 50); do th_run a ss -Hltn | grep -q ":$port " && break; sleep 0.1; done
	th_run b env "${C_ENV[@]}" timeout 60 python3 "$DG_TMP/fetch.py" "http://$TH_A_IP:$port" >"$d/client.out" 2>"$d/client.log"
	local rc=$?
	kill -TERM "$spid" 2>/dev/null
	for i in $(seq 50); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
	local got
	got=$(cat "$d/client.out")
	dg_log "$tag: client exit $rc: $got"
	if [ "$rc" -ne 0 ] || [ "$got" != "$want 4194304 hello from host a" ]; then
		failed+=("$tag: the fetch failed or differs")
		dg_tail "$d/client.log"
		dg_tail "$d/server.log"
	fi
	if grep -aq "MPA ID" "$d/server.log"; then
		failed+=("$tag: the server's program received iWARP bytes")
		grep -a "MPA ID" "$d/server.log" | head -3
	fi
	local sc sp cc cp
	sc=$(dg_sum "$d/server.log" rc_conns) sp=$(dg_sum "$d/server.log" rc_plain)
	cc=$(dg_sum "$d/client.log" rc_conns) cp=$(dg_sum "$d/client.log" rc_plain)
	dg_log "$tag: server rc_conns=$sc rc_plain=$sp, client rc_conns=$cc rc_plain=$cp"
	case $want_mode in
	rc) [ "$sc" -ge 1 ] && [ "$cc" -ge 1 ] && [ "$sp" -eq 0 ] && [ "$cp" -eq 0 ] ||
		failed+=("$tag: want every connection carried over RC") ;;
	plain-unmod) [ "$sc" -eq 0 ] && [ "$sp" -ge 1 ] || failed+=("$tag: want plain TCP on the server") ;;
	plain) [ "$sc" -eq 0 ] && [ "$cc" -eq 0 ] && [ "$sp" -ge 1 ] && [ "$cp" -ge 1 ] ||
		failed+=("$tag: want plain TCP on both") ;;
	plain-client) [ "$cc" -eq 0 ] && [ "$cp" -ge 1 ] || failed+=("$tag: want plain TCP on the client") ;;
	# discovery: the first connect waits at most 10 ms for host a's answer; on a loaded
	# machine it may come later and that one connection goes plain (said here), never more
	auto) [ "$sc" -ge 1 ] && [ "$cc" -ge 1 ] && [ "$cp" -le 1 ] && [ "$sp" -eq "$cp" ] ||
		failed+=("$tag: want the connections carried over RC after discovery")
		[ "$cp" -eq 0 ] || dg_log "$tag: the first connection went plain (the answer came after 10 ms)" ;;
	esac
}
S_ENV=("${DG_SHIM_ENV[@]}")
C_ENV=("${DG_SHIM_ENV[@]}" "DGSHIM_RULES=mode=rc addr=10.77.0.0/24")
run_case rc rc
C_ENV=(-u LD_PRELOAD)
run_case plainc plain-unmod
C_ENV=("${DG_SHIM_ENV[@]}")
run_case auto auto
S_ENV=(-u LD_PRELOAD)
run_case nosrv plain-client
if [ ${#failed[@]} -gt 0 ]; then
	for f in "${failed[@]}"; do dg_log "FAIL: $f"; done
	exit 1
fi
dg_log "PASS"
