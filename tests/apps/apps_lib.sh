# shellcheck shell=bash
# apps_lib.sh: what the real-program conformance tests (tests/apps/*.sh) share. Each script runs
# one program natively and then with both ends preloaded, with the same checks, proves from the
# shim's exit summaries that the traffic was carried (TCP: over RC; UDP: framed, none plain), and
# prints performance ratios preloaded/native (printed, never asserted: the machines are noisy).
#
# Source it, then call apps_init NAME BUILD_DIR BASE_PORT. It sources ../integration/lib.sh
# (dg_* helpers: temp dir, background processes, port waits, summary parsing).
#
# A case that fails is recorded with apps_bad and the script goes on with the next case, so one
# run reports every failure of a program; apps_finish exits 1 when any was recorded.

APPS_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../integration/lib.sh
. "$APPS_HERE/../integration/lib.sh"

APPS_FAILED=()
APPS_T0=
APPS_APT_UPDATED=

# apps_init NAME BUILD_DIR BASE_PORT: dg_init + the shim must be built (a missing shim fails:
# the suite is about the shim). DG_SHIM_ENV (lib.sh) holds the NAME=VALUE words that preload a
# command (through env); DG_TMP is made reachable by the unprivileged users servers run as.
apps_init() {
	dg_init "$@"
	APPS_T0=$(date +%s.%N)
	dg_require_shim
	chmod 0755 "$DG_TMP"
	# A sanitizer build: the host programs' own leaks (memcached's, seen) are not ours to judge
	# and would end them with exit 134; the shim's leaks are judged by the unit and integration
	# suites, which run our own programs. Memory errors still abort.
	if [ -n "$DG_ASAN_RT" ]; then
		local i
		for i in "${!DG_SHIM_ENV[@]}"; do
			[[ ${DG_SHIM_ENV[$i]} == ASAN_OPTIONS=* ]] && DG_SHIM_ENV[$i]+=":detect_leaks=0"
		done
	fi
}

# apps_asan_starts CMD...: in a sanitizer build, CMD (a quick one: --version) must finish within
# 10 s with only the ASan runtime preloaded, without the shim; else the program cannot run
# preloaded in this build at all (curl 7.88 deadlocks at start in setlocale under libasan alone)
# and the test is skipped (exit 77), as the VLC tests do. Nothing to do in a normal build.
apps_asan_starts() {
	[ -n "$DG_ASAN_RT" ] || return 0
	local rc
	timeout -k 2 10 env ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0 LD_PRELOAD="$DG_ASAN_RT" "$@" \
		>/dev/null 2>&1 </dev/null
	rc=$?
	if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
		dg_log "SKIP: '$*' does not finish under the ASan runtime alone (without the shim): $1 cannot run preloaded in a sanitizer build"
		exit 77
	fi
}

# apps_need PROGRAM PACKAGE...: PROGRAM must be runnable. When it is missing, PACKAGE(s) are
# installed from Debian (root, apt-get, no recommends); if a package has no install candidate
# the program cannot exist here and the test is skipped (exit 77); an install that fails, or
# that does not bring PROGRAM, is a failure.
apps_need() {
	local prog=$1 pkg
	shift
	command -v "$prog" >/dev/null 2>&1 && return 0
	[ -x "$prog" ] && return 0
	for pkg in "$@"; do
		if ! apt-cache policy "$pkg" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
			[ -n "$APPS_APT_UPDATED" ] || { apt-get update -qq >/dev/null 2>&1; APPS_APT_UPDATED=1; }
			if ! apt-cache policy "$pkg" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
				dg_log "SKIP: $prog missing and package $pkg has no install candidate on this system"
				exit 77
			fi
		fi
	done
	[ "$(id -u)" = 0 ] || dg_fail "$prog missing: install $* (needs root)"
	dg_log "installing $* (for $prog)"
	[ -n "$APPS_APT_UPDATED" ] || { apt-get update -qq >/dev/null 2>&1; APPS_APT_UPDATED=1; }
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >"$DG_TMP/apt.log" 2>&1 ||
		{ dg_tail "$DG_TMP/apt.log"; dg_fail "apt-get install $* failed"; }
	command -v "$prog" >/dev/null 2>&1 || [ -x "$prog" ] || dg_fail "$prog still missing after installing $*"
}

# apps_bad MESSAGE: records a failed check (reported by apps_finish) and logs it now.
apps_bad() {
	APPS_FAILED+=("$*")
	dg_log "FAIL: $*"
}

# apps_finish: exit 1 listing every recorded failure, else PASS.
apps_finish() {
	if [ ${#APPS_FAILED[@]} -ne 0 ]; then
		dg_log "${#APPS_FAILED[@]} failed check(s):"
		local m
		for m in "${APPS_FAILED[@]}"; do printf '%s:   - %s\n' "$DG_NAME" "$m"; done
		dg_fail "$DG_NAME ($(dg_elapsed "$APPS_T0") s)"
	fi
	dg_log "PASS ($(dg_elapsed "$APPS_T0") s)"
	exit 0
}

# apps_ratio LABEL UNIT NATIVE PRELOADED: prints one line "ratio: LABEL native N UNIT preloaded
# P UNIT preloaded/native R". A value that could not be measured is given as '-' (no ratio).
apps_ratio() {
	local label=$1 unit=$2 n=$3 p=$4
	if [[ $n =~ ^[0-9.]+$ ]] && [[ $p =~ ^[0-9.]+$ ]] && awk -v n="$n" 'BEGIN { exit !(n > 0) }'; then
		awk -v l="$label" -v u="$unit" -v n="$n" -v p="$p" -v t="$DG_NAME" \
			'BEGIN { printf "%s: ratio: %-28s native %s %s, preloaded %s %s, preloaded/native %.2f\n", t, l, n, u, p, u, p / n }'
	else
		printf '%s: ratio: %-28s native %s %s, preloaded %s %s, preloaded/native -\n' "$DG_NAME" "$label" "$n" "$unit" "$p" "$unit"
	fi
}

# apps_check_rc LABEL FILE [MIN]: the process(es) logging to FILE carried their TCP connections
# over iWARP RC: rc_conns >= MIN (default 1, summed over the processes: a forking server writes
# a summary per process), RC payload bytes > 0 and rc_plain = 0 (between preloaded programs no
# connection may fall back to plain TCP). Records a failure.
apps_check_rc() {
	local label=$1 f=$2 min=${3:-1} conns plain bytes
	if [ "$(dg_summaries "$f" | wc -l)" -eq 0 ]; then
		grep -a 'dgshim\[[0-9]*\]' "$f" 2>/dev/null | tail -n 5 | cut -c1-300 | sed 's/^/    | /'
		apps_bad "$label: no 'dgshim[PID]: info: summary:' line in ${f#"$DG_TMP"/} (shim not loaded, no socket taken, or the process killed)"
		return 1
	fi
	apps_show_summaries "$label" "$f"
	conns=$(apps_sum "$f" rc_conns)
	plain=$(apps_sum "$f" rc_plain)
	bytes=$(($(apps_sum "$f" rc_tx_bytes) + $(apps_sum "$f" rc_rx_bytes)))
	if [ "$conns" -lt "$min" ] || [ "$bytes" -le 0 ] || [ "$plain" -ne 0 ]; then
		apps_bad "$label: rc_conns=$conns (expected >= $min) rc_plain=$plain rc bytes=$bytes: TCP not carried over RC"
		return 1
	fi
	dg_log "$label: rc_conns=$conns rc_plain=0 rc bytes=$bytes: OK"
}

# apps_sum FILE KEY: sum of KEY=N over the summary lines of FILE (0 when none), printed as an
# integer also above 2^31 (lib.sh's dg_sum lets mawk print such a sum as 3.65e+09).
apps_sum() {
	dg_summaries "$1" | awk -v k="$2" '
		{ for (i = 1; i <= NF; i++) { n = split($i, kv, "="); if (n == 2 && kv[1] == k) s += kv[2] } }
		END { printf "%.0f\n", s }'
}

# apps_show_summaries LABEL FILE: the first 3 summary lines of FILE (a forking server writes one
# per process) and how many more there are.
apps_show_summaries() {
	local n
	dg_summaries "$2" | head -n 3 | cut -c1-400 | sed "s/^/$DG_NAME: $1: /"
	n=$(dg_summaries "$2" | wc -l)
	[ "$n" -le 3 ] || dg_log "$1: ... and $((n - 3)) more summary lines"
}

# apps_check_udp LABEL FILE DIR...: the process(es) logging to FILE wrote a summary and, for each
# DIR (tx, rx), carried datagrams framed: DIR_framed > 0 and DIR_plain = 0 (between two
# preloaded programs on this host every datagram is framed); crc_drops = 0. Records a failure.
apps_check_udp() {
	local label=$1 f=$2 dir framed plain bad=0
	shift 2
	if [ "$(dg_summaries "$f" | wc -l)" -eq 0 ]; then
		dg_tail "$f" 10
		apps_bad "$label: no 'dgshim[PID]: info: summary:' line in ${f#"$DG_TMP"/} (shim not loaded, or the process killed)"
		return 1
	fi
	apps_show_summaries "$label" "$f"
	for dir in "$@"; do
		framed=$(apps_sum "$f" "${dir}_framed")
		plain=$(apps_sum "$f" "${dir}_plain")
		if [ "$framed" -le 0 ] || [ "$plain" -ne 0 ]; then
			apps_bad "$label: ${dir}_framed=$framed ${dir}_plain=$plain: UDP not all carried as datagram-iWARP"
			bad=1
		fi
	done
	if [ "$(apps_sum "$f" crc_drops)" -ne 0 ]; then
		apps_bad "$label: crc_drops=$(apps_sum "$f" crc_drops) on loopback"
		bad=1
	fi
	[ $bad -eq 0 ] && dg_log "$label: UDP framed ($*): OK"
	return $bad
}

# apps_native_clean FILE: a native run must show no shim at all (no dgshim line): the
# environment given to native runs really is native.
apps_native_clean() {
	if grep -aq 'dgshim\[' "$1" 2>/dev/null; then
		apps_bad "native run logged by the shim in ${1#"$DG_TMP"/}: LD_PRELOAD leaked into the native run"
	fi
}

# apps_sha FILE: sha256 of FILE (the hex digest only).
apps_sha() { sha256sum <"$1" | cut -d' ' -f1; }

# apps_wait_gone PID SECONDS: waits for PID (a child of this shell) to exit; returns 1 when it is
# still there after SECONDS.
apps_wait_gone() {
	local pid=$1 secs=$2 i
	for i in $(seq $((secs * 10))); do
		kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 0; }
		sleep 0.1
	done
	return 1
}

# apps_server_end TAG WHAT PID LOG AFTER: waits up to 10 s for the server PID (a child of this
# shell) to exit after AFTER (what should end it, for the message); one still running is killed
# and recorded, an exit status other than 0 is recorded with the tail of its LOG.
apps_server_end() {
	local tag=$1 what=$2 pid=$3 log=$4 after=$5 rc
	if ! apps_wait_gone "$pid" 10; then
		apps_bad "$tag: $what still running 10 s after $after"
		dg_kill_tree "$pid"
	fi
	wait "$pid" 2>/dev/null
	rc=$?
	[ "$rc" -eq 0 ] || { dg_tail "$log" 10; apps_bad "$tag: $what exited $rc"; }
}

# apps_check_port_free tcp|udp PORT: fails the script when another program already holds PORT
# (a leftover of an earlier run would otherwise answer in our place).
apps_check_port_free() {
	if dg_wait_port "$1" "$2" 0; then
		dg_fail "$1 port $2 is already in use by another program"
	fi
}

# apps_echo WHAT PREFIX UDP TCP CMD...: the echo test of asyncio.sh and node.sh. CMD is an echo
# program written for the test, run as CMD {udp,tcp}-server PORT and CMD {udp,tcp}-client PORT
# ARG (the client prints "rate NAME VALUE" lines and lines starting with PREFIX, shown). UDP on
# DG_PORT (ARG 500: round trips), TCP on DG_PORT+1 (ARG 32: MiB echoed), natively and then with
# both ends preloaded; then the checks (native runs clean, UDP framed, TCP over RC), the ratios
# (labelled with UDP and TCP, the protocols' names in WHAT's API) and apps_finish. WHAT names
# the program in failures.
declare -A APPS_ECHO_R=()
APPS_ECHO_WHAT=''
APPS_ECHO_PREFIX=''
APPS_ECHO_CMD=()
apps_echo() {
	local udp=$3 tcp=$4 tag port env_words d f
	APPS_ECHO_WHAT=$1 APPS_ECHO_PREFIX=$2
	shift 4
	APPS_ECHO_CMD=("$@")
	dg_log "shim: ${DG_SHIM_ENV[*]}"
	port=$DG_PORT
	for tag in native shim; do
		env_words=()
		[ "$tag" = shim ] && env_words=("${DG_SHIM_ENV[@]}")
		apps_echo_pair "$tag" udp "$port" 500 "${env_words[@]}"
		apps_echo_pair "$tag" tcp $((port + 1)) 32 "${env_words[@]}"
	done
	for f in udp-server udp-client tcp-server tcp-client; do apps_native_clean "$DG_TMP/native/$f.log"; done
	d=$DG_TMP/shim
	apps_check_udp "$udp server" "$d/udp-server.log" tx rx
	apps_check_udp "$udp client" "$d/udp-client.log" tx rx
	apps_check_rc "$tcp server" "$d/tcp-server.log"
	apps_check_rc "$tcp client" "$d/tcp-client.log"
	apps_ratio "$udp ping-pong" "/s" "${APPS_ECHO_R[native:udp_pingpong_per_s]:--}" "${APPS_ECHO_R[shim:udp_pingpong_per_s]:--}"
	apps_ratio "$tcp ping-pong" "/s" "${APPS_ECHO_R[native:tcp_pingpong_per_s]:--}" "${APPS_ECHO_R[shim:tcp_pingpong_per_s]:--}"
	apps_ratio "$tcp echo 32 MiB" MiB/s "${APPS_ECHO_R[native:tcp_bulk_MiB_per_s]:--}" "${APPS_ECHO_R[shim:tcp_bulk_MiB_per_s]:--}"
	apps_finish
}

# apps_echo_pair TAG PROTO PORT CLIENT_ARG ENV...: apps_echo's server and client with ENV; fills
# APPS_ECHO_R[TAG:NAME] from the client's rate lines.
apps_echo_pair() {
	local tag=$1 proto=$2 p=$3 arg=$4 what=$APPS_ECHO_WHAT d spid _ k v
	shift 4
	d=$DG_TMP/$tag
	mkdir -p "$d"
	apps_check_port_free "$proto" "$p"
	dg_bg "$d/$proto-server.log" env "$@" timeout -k 5 90 "${APPS_ECHO_CMD[@]}" "$proto-server" "$p"
	spid=$DG_LAST_PID
	if ! dg_wait_port "$proto" "$p" 15 "$spid"; then
		dg_tail "$d/$proto-server.log"
		apps_bad "$tag: $what $proto server did not bind $p"
		return
	fi
	if env "$@" timeout -k 5 90 "${APPS_ECHO_CMD[@]}" "$proto-client" "$p" "$arg" >"$d/$proto-client.log" 2>&1; then
		while read -r _ k v; do APPS_ECHO_R[$tag:$k]=$v; done < <(grep '^rate ' "$d/$proto-client.log")
		grep "^$APPS_ECHO_PREFIX" "$d/$proto-client.log" | sed "s/^/$DG_NAME: $tag: /"
	else
		dg_tail "$d/$proto-client.log" 10
		apps_bad "$tag: $what $proto client failed"
	fi
	apps_server_end "$tag" "$what $proto server" "$spid" "$d/$proto-server.log" "its client finished"
}
