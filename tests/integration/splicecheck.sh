#!/usr/bin/env bash
# splicecheck.sh BUILD_DIR PORT: splice(2) into and out of a carried TCP connection (issue
# "Hardening": programs that move bytes past the libc calls the shim reads). A client splices
# 4 MiB into its socket (half from a pipe, half from a file at an offset), the server splices
# its socket into a pipe: the same bytes arrive (sha256), natively and with both ends preloaded
# and carried over RC (rc_conns on both). Without the shim's splice the spliced bytes would go
# raw into the iWARP stream and the reader's shim would end the connection.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dg_init splicecheck "$1" "$2"
dg_require_shim
for i in "${!DG_SHIM_ENV[@]}"; do # python's own leaks are not ours to judge
	[[ ${DG_SHIM_ENV[$i]} == ASAN_OPTIONS=* ]] && DG_SHIM_ENV[$i]+=":detect_leaks=0"
done
n=$((4 << 20))
port=$DG_PORT
run() { # TAG ENV...: one transfer; prints nothing, fails the test on a mismatch
	local tag=$1 out=$DG_TMP/$1
	shift
	env "$@" timeout 60 python3 "$here/splicecheck.py" serve "$port" "$n" >"$out.srv" 2>&1 &
	local p=$! i
	for i in $(seq 100); do grep -qs listening "$out.srv" && break; sleep 0.05; done
	env "$@" timeout 60 python3 "$here/splicecheck.py" send "$port" "$n" >"$out.cli" 2>&1
	local crc=$?
	wait "$p"
	local src=$?
	port=$((port + 1))
	local got sent
	got=$(grep -ao '^got .*' "$out.srv")
	sent=$(grep -ao '^sent .*' "$out.cli")
	if [ $crc -ne 0 ] || [ $src -ne 0 ] || [ "${got#got }" != "${sent#sent }" ]; then
		dg_log "$tag: client exit $crc ($sent), server exit $src ($got)"
		dg_tail "$out.cli" 6
		dg_tail "$out.srv" 6
		dg_fail "$tag: the spliced bytes did not arrive as sent"
	fi
	dg_log "$tag: $n bytes spliced in and out, sha256 equal"
}
run native -u LD_PRELOAD
run shim "${DG_SHIM_ENV[@]}"
dg_check_rc "client (preloaded)" "$DG_TMP/shim.cli" || dg_fail "the connection was not carried"
dg_check_rc "server (preloaded)" "$DG_TMP/shim.srv" || dg_fail "the connection was not carried"
dg_log "PASS"
