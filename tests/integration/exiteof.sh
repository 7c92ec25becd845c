#!/usr/bin/env bash
# exiteof.sh BUILD_DIR BASE_PORT [RUNS]: a writer sends 8 MiB on a TCP connection and then
# closes, shuts down, returns from main, calls exit(), _exit(), or is killed (SIGKILL); the
# reader must read exactly those bytes and then end of file, natively and with both ends
# preloaded (the connection carried over RC). RUNS (default 5) runs of each way, preloaded;
# one natively. The hardening issue's 100 runs: exiteof.sh BUILD 19960 100.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dg_init exiteof "$1" "$2"
runs=${3:-5}
dg_require_shim
for i in "${!DG_SHIM_ENV[@]}"; do # python's own leaks are not ours to judge
	[[ ${DG_SHIM_ENV[$i]} == ASAN_OPTIONS=* ]] && DG_SHIM_ENV[$i]+=":detect_leaks=0"
done
n=$((8 << 20))
port=$DG_PORT
failed=()
one() { # TAG HOW ENV...
	local tag=$1 how=$2 out=$DG_TMP/$1.out
	shift 2
	env "$@" python3 "$here/exiteof.py" read "$port" "$n" >"$out" 2>"$out.err" &
	local r=$! i
	for i in $(seq 100); do grep -qs listening "$out" && break; sleep 0.05; done
	env "$@" timeout 30 python3 "$here/exiteof.py" write "$port" "$n" "$how" 2>"$DG_TMP/$tag.werr"
	wait "$r"
	local rc=$?
	if [ "$rc" -ne 0 ]; then
		failed+=("$tag: $(tail -n 1 "$out")")
		dg_tail "$out.err" 8
	fi
	port=$((port == DG_PORT ? DG_PORT + 1 : DG_PORT)) # TIME_WAIT: alternate
}
for how in close shutdown return exit _exit kill; do
	one "native-$how" "$how" -u LD_PRELOAD
	for k in $(seq "$runs"); do
		one "shim-$how-$k" "$how" "${DG_SHIM_ENV[@]}"
	done
	dg_log "$how: native and $runs preloaded runs done"
done
if [ ${#failed[@]} -gt 0 ]; then
	for f in "${failed[@]}"; do dg_log "FAIL: $f"; done
	exit 1
fi
dg_log "PASS: every run read 8 MiB and then end of file"
