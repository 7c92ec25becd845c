# shellcheck shell=bash
# lib.sh: helpers shared by the application integration tests (vlc_udp.sh, vlc_http.sh,
# sipp_udp.sh, sipp_tcp.sh, tcp_interop.sh). Source it, then call dg_init NAME BUILD_DIR BASE_PORT.
# What only the SIPp tests share is in sipp_lib.sh, what only the VLC tests share in vlc_lib.sh.
#
# Conventions: exit 0 pass, 1 fail, 77 skip (only when a program cannot be installed at all).
# Everything temporary lives in one mktemp -d directory removed on exit; every background
# process started through dg_bg is ended (SIGTERM, then SIGKILL) on exit.

DG_NAME=integration
DG_TMP=
DG_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DG_PIDS=()
DG_LAST_PID=
DG_SHIM=
# Hooks for tests that run a side elsewhere (tests/twohost: in a network namespace): the command
# dg_wait_port runs to list sockets, and the address it accepts besides 127.0.0.1 and the
# wildcards.
DG_SS=(ss)
DG_WAIT_IP=127.0.0.1

dg_log() { printf '%s: %s\n' "$DG_NAME" "$*"; }
dg_fail() { printf '%s: FAIL: %s\n' "$DG_NAME" "$*"; exit 1; }

# dg_tail FILE [LINES]: last lines of a log, indented, for failure reports.
dg_tail() {
	local f=$1 n=${2:-25}
	if [ -s "$f" ]; then
		printf '%s: --- last %d lines of %s\n' "$DG_NAME" "$n" "${f#"$DG_TMP"/}"
		tail -n "$n" "$f" | cut -c1-300 | sed 's/^/    | /'
	else
		printf '%s: --- %s is empty or missing\n' "$DG_NAME" "${f#"$DG_TMP"/}"
	fi
}

# dg_need PROGRAM PACKAGE: the program must be installed. If the package has no install
# candidate at all the test cannot run here (exit 77); otherwise a missing program is a failure.
dg_need() {
	local prog=$1 pkg=$2
	command -v "$prog" >/dev/null 2>&1 && return 0
	if command -v apt-cache >/dev/null 2>&1 &&
		! apt-cache policy "$pkg" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
		dg_log "SKIP: $prog missing and package $pkg is not installable on this system"
		exit 77
	fi
	dg_fail "$prog not found: install it with 'apt-get install --no-install-recommends $pkg'"
}

# dg_tree PID: PID and all its descendants (by parent id), deepest last.
dg_tree() {
	local c
	echo "$1"
	for c in $(pgrep -P "$1" 2>/dev/null); do dg_tree "$c"; done
}

dg_kill_tree() { # pid: SIGTERM the process tree, after 3 s SIGKILL what is left of it
	local pid=$1 i tree
	kill -0 "$pid" 2>/dev/null || return 0
	tree=$(dg_tree "$pid")
	# shellcheck disable=SC2086
	kill -TERM $tree 2>/dev/null
	for i in $(seq 30); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	tree=$(for i in $tree; do kill -0 "$i" 2>/dev/null && echo "$i"; done)
	# shellcheck disable=SC2086
	[ -z "$tree" ] || kill -KILL $tree 2>/dev/null
}

# dg_elapsed T0: seconds since T0 (a `date +%s.%N` value), one decimal.
dg_elapsed() {
	awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'
}

dg_cleanup() {
	local rc=$? pid
	trap - EXIT INT TERM HUP
	for pid in "${DG_PIDS[@]}"; do dg_kill_tree "$pid"; done
	wait 2>/dev/null
	if [ -n "$DG_TMP" ] && [ -d "$DG_TMP" ]; then
		if [ -n "${DG_KEEP_TMP:-}" ]; then
			dg_log "keeping $DG_TMP (DG_KEEP_TMP set)"
		else
			rm -rf "$DG_TMP"
		fi
	fi
	exit "$rc"
}

# dg_init NAME BUILD_DIR BASE_PORT: checks arguments, creates DG_TMP, installs the traps, sets
# DG_BUILD, DG_PORT and DG_SHIM (the library path; it may not exist yet: see dg_require_shim).
dg_init() {
	DG_NAME=$1
	if [ $# -ne 3 ] || ! [[ $3 =~ ^[0-9]+$ ]] || [ "$3" -lt 1024 ] || [ "$3" -gt 65000 ]; then
		echo "usage: $DG_NAME.sh BUILD_DIR BASE_PORT" >&2
		exit 1
	fi
	[ -d "$2" ] || dg_fail "build dir $2 does not exist"
	DG_BUILD=$(cd "$2" && pwd)
	DG_PORT=$3
	DG_SHIM=$DG_BUILD/shim/libdgshim.so
	# Clean environment: native runs must be native, and the machine's or caller's shim
	# settings must not change what is tested. DGSHIM_MODE may be set to test another mode.
	DG_MODE=${DGSHIM_MODE:-auto}
	unset LD_PRELOAD "${!DGSHIM_@}"
	trap dg_cleanup EXIT
	trap 'dg_log "interrupted"; exit 1' INT TERM HUP
	DG_TMP=$(mktemp -d "${TMPDIR:-/tmp}/dg-$DG_NAME.XXXXXX") || dg_fail "mktemp -d failed"
}

# dg_require_shim: fail (exit 1) when the shim has not been built. Sets DG_SHIM_ENV, the
# NAME=VALUE words to put in front of a preloaded command (through env), and DG_SHIM_USED, the
# library path actually preloaded (a copy readable by nobody if the build tree is not), and
# DG_ASAN_RT, the ASan runtime the library needs preloaded first (empty in a normal build; a
# TSan build's runtime is preloaded too, after the library, in DG_SHIM_ENV's LD_PRELOAD, and
# named in DG_TSAN_RT). Memory bounds mean nothing under either's shadow memory.
dg_require_shim() {
	[ -f "$DG_SHIM" ] || dg_fail "$DG_SHIM does not exist: build the shim first (./scripts/build)"
	DG_SHIM_USED=$DG_SHIM
	if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1 &&
		! setpriv --reuid=nobody --regid=nogroup --clear-groups test -r "$DG_SHIM"; then
		# The build tree is not readable by nobody (VLC runs as nobody): preload a copy.
		mkdir -p "$DG_TMP/lib"
		cp "$DG_SHIM" "$DG_TMP/lib/libdgshim.so"
		chmod 0755 "$DG_TMP" "$DG_TMP/lib"
		chmod 0644 "$DG_TMP/lib/libdgshim.so"
		DG_SHIM_USED=$DG_TMP/lib/libdgshim.so
		dg_log "shim not readable by nobody in the build tree; preloading a copy"
	fi
	local preload=$DG_SHIM_USED asan
	# A sanitizer build (build-asan) needs the ASan runtime first in the preload list.
	asan=$(ldd "$DG_SHIM_USED" 2>/dev/null | awk '/libasan\.so/ {print $3; exit}')
	DG_ASAN_RT=$asan
	DG_SHIM_ENV=()
	if [ -n "$asan" ]; then
		preload="$asan:$preload"
		DG_SHIM_ENV+=("ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:verify_asan_link_order=0}")
		# Leaks of the host programs themselves are not ours to judge; each known one is
		# named (a leak with our library in its stack would still be reported).
		cp "$DG_HERE/host-leaks.supp" "$DG_TMP/host-leaks.supp"
		chmod 0755 "$DG_TMP"
		chmod 0644 "$DG_TMP/host-leaks.supp"
		DG_SHIM_ENV+=("LSAN_OPTIONS=suppressions=$DG_TMP/host-leaks.supp")
	fi
	# A ThreadSanitizer build (build-tsan) needs the TSan runtime preloaded too (loaded only as
	# the library's dependency it would come after libc, and its interceptors would not take),
	# but AFTER the shim, unlike ASan's: TSan ignores every interceptor called from inside one
	# of its blocking interceptors (poll, connect, accept...), so a shim running beneath them
	# would have its own locks unseen and every access it makes reported as a race. With the
	# shim first, TSan sits where libc is, as for a TSan-built program (docs/tsan.md).
	local tsan
	tsan=$(ldd "$DG_SHIM_USED" 2>/dev/null | awk '/libtsan\.so/ {print $3; exit}')
	[ -z "$tsan" ] || preload="$preload:$tsan"
	DG_TSAN_RT=$tsan
	DG_SHIM_ENV+=("LD_PRELOAD=$preload" "DGSHIM_LOG=info" "DGSHIM_MODE=$DG_MODE" "DGSHIM_CONF=/dev/null")
}

# dg_bg OUTFILE CMD...: runs CMD in the background with stdout+stderr to OUTFILE; its pid is
# in DG_LAST_PID and is ended on exit if still running.
dg_bg() {
	local out=$1
	shift
	"$@" >"$out" 2>&1 &
	DG_LAST_PID=$!
	DG_PIDS+=("$DG_LAST_PID")
}

# dg_wait_port udp|tcp PORT SECONDS [PID]: waits until a UDP socket is bound to (udp), or a TCP
# socket listens on (tcp), 127.0.0.1:PORT, DG_WAIT_IP:PORT (or *:PORT), as DG_SS lists them.
# Returns 1 on timeout, 2 as soon as PID (the process expected to bind or listen) has exited.
# SECONDS 0: one look, no wait.
dg_wait_port() {
	local proto=$1 port=$2 secs=$3 pid=${4:-} i flags
	case $proto in
	udp) flags=-Huln ;;
	tcp) flags=-Hltn ;;
	*) dg_fail "dg_wait_port: protocol '$proto' is neither udp nor tcp" ;;
	esac
	for i in $(seq 0 $((secs * 10))); do
		"${DG_SS[@]}" "$flags" 2>/dev/null | awk '{print $4}' |
			grep -Eq "^(127\.0\.0\.1|${DG_WAIT_IP//./\\.}|0\.0\.0\.0|\*|\[::\]):$port\$" && return 0
		[ -z "$pid" ] || kill -0 "$pid" 2>/dev/null || return 2
		[ "$i" -lt $((secs * 10)) ] && sleep 0.1
	done
	return 1
}

# dg_wait_udp PORT SECONDS [PID]: dg_wait_port udp (a UDP socket bound to PORT).
dg_wait_udp() { dg_wait_port udp "$@"; }

# dg_diff_report A B: where two files first differ, for a failure message.
dg_diff_report() {
	cmp "$1" "$2" 2>&1 | head -n 1 | sed "s|$DG_TMP/||g; s/^/$DG_NAME:   /"
}

# dg_summaries FILE: the shim's exit summary lines found in a log.
dg_summaries() {
	grep -ao 'dgshim\[[0-9]*\]: info: summary: .*' "$1" 2>/dev/null
}

# dg_sum FILE KEY: sum of KEY=N over all summary lines of FILE (0 when none).
dg_sum() {
	dg_summaries "$1" | awk -v k="$2" '
		{ for (i = 1; i <= NF; i++) { n = split($i, kv, "="); if (n == 2 && kv[1] == k) s += kv[2] } }
		END { printf "%.0f\n", s + 0 }'
}

# dg_check_framed LABEL FILE DIR: asserts the process(es) logging to FILE wrote a summary and
# that in direction DIR (tx or rx) datagrams were carried framed: DIR_framed > 0 and at least
# 90 % of DIR_framed + DIR_plain. Also asserts crc_drops = 0 (loopback never corrupts).
# Prints the summary. Returns 1 (after printing why) on failure.
dg_check_framed() {
	local label=$1 f=$2 dir=$3 n framed plain crc
	n=$(dg_summaries "$f" | wc -l)
	if [ "$n" -eq 0 ]; then
		dg_log "$label: no 'dgshim[PID]: info: summary:' line (shim not loaded, DGSHIM_LOG lost, or process killed)"
		dg_tail "$f"
		return 1
	fi
	dg_summaries "$f" | sed "s/^/$DG_NAME: $label: /"
	framed=$(dg_sum "$f" "${dir}_framed")
	plain=$(dg_sum "$f" "${dir}_plain")
	crc=$(dg_sum "$f" crc_drops)
	if [ "$framed" -le 0 ]; then
		dg_log "$label: ${dir}_framed=$framed: traffic was not carried as datagram-iWARP"
		return 1
	fi
	if [ $((framed * 100)) -lt $(((framed + plain) * 90)) ]; then
		dg_log "$label: only $framed of $((framed + plain)) ${dir} datagrams framed (< 90 %)"
		return 1
	fi
	if [ "$crc" -ne 0 ]; then
		dg_log "$label: crc_drops=$crc on loopback"
		return 1
	fi
	dg_log "$label: ${dir}_framed=$framed ${dir}_plain=$plain: OK"
}

# --- stream sockets (TCP carried over iWARP RC): vlc_http.sh, sipp_tcp.sh, tcp_interop.sh -----

# dg_wait_tcp PORT SECONDS [PID]: dg_wait_port tcp (a TCP socket listening on PORT).
dg_wait_tcp() { dg_wait_port tcp "$@"; }

# dg_rc_summary LABEL FILE: common part of dg_check_rc and dg_check_rc_plain: the process(es)
# logging to FILE wrote a summary and it has the stream keys. Prints the summary lines.
dg_rc_summary() {
	local label=$1 f=$2 n
	n=$(dg_summaries "$f" | wc -l)
	if [ "$n" -eq 0 ]; then
		dg_log "$label: no 'dgshim[PID]: info: summary:' line in ${f#"$DG_TMP"/}: the shim was not loaded, took no socket in this process (a shim without stream sockets takes no TCP socket), DGSHIM_LOG was lost, or the process was killed"
		grep -a 'dgshim\[[0-9]*\]' "$f" | tail -n 5 | cut -c1-300 | sed 's/^/    | /'
		return 1
	fi
	dg_summaries "$f" | sed "s/^/$DG_NAME: $label: /"
	if dg_summaries "$f" | grep -qv ' rc_conns=[0-9]'; then
		dg_log "$label: summary has no rc_conns= key: this shim does not carry stream (TCP) sockets over RC"
		return 1
	fi
}

# dg_check_rc LABEL FILE [MIN_CONNS]: asserts the process(es) logging to FILE carried their TCP
# connections over iWARP RC: rc_conns >= MIN_CONNS (default 1), rc_tx_bytes + rc_rx_bytes > 0,
# and rc_plain = 0 (no stream socket fell back to plain TCP). Returns 1 (after printing why) on
# failure.
dg_check_rc() {
	local label=$1 f=$2 min=${3:-1} conns plain tx rx bad=0
	dg_rc_summary "$label" "$f" || return 1
	conns=$(dg_sum "$f" rc_conns)
	plain=$(dg_sum "$f" rc_plain)
	tx=$(dg_sum "$f" rc_tx_bytes)
	rx=$(dg_sum "$f" rc_rx_bytes)
	if [ "$conns" -lt "$min" ]; then
		dg_log "$label: rc_conns=$conns, expected >= $min: stream connections were not carried over RC"
		bad=1
	fi
	if [ $((tx + rx)) -le 0 ]; then
		dg_log "$label: rc_tx_bytes=$tx rc_rx_bytes=$rx: no payload went over RC"
		bad=1
	fi
	if [ "$plain" -ne 0 ]; then
		dg_log "$label: rc_plain=$plain: stream sockets fell back to plain TCP between two preloaded programs"
		bad=1
	fi
	[ $bad -eq 0 ] || return 1
	dg_log "$label: rc_conns=$conns rc_tx_bytes=$tx rc_rx_bytes=$rx rc_plain=0: OK"
}

# dg_check_rc_plain LABEL FILE: asserts the preloaded process(es) logging to FILE, talking to an
# unmodified peer, fell back to plain TCP: rc_plain > 0 and rc_conns = 0 (and, with it, no RC
# payload bytes). Returns 1 (after printing why) on failure.
dg_check_rc_plain() {
	local label=$1 f=$2 conns plain tx rx bad=0
	dg_rc_summary "$label" "$f" || return 1
	conns=$(dg_sum "$f" rc_conns)
	plain=$(dg_sum "$f" rc_plain)
	tx=$(dg_sum "$f" rc_tx_bytes)
	rx=$(dg_sum "$f" rc_rx_bytes)
	if [ "$plain" -le 0 ]; then
		dg_log "$label: rc_plain=$plain: the stream socket to the unmodified peer was not taken and let go to plain TCP"
		bad=1
	fi
	if [ "$conns" -ne 0 ] || [ $((tx + rx)) -ne 0 ]; then
		dg_log "$label: rc_conns=$conns rc_tx_bytes=$tx rc_rx_bytes=$rx: RC used with an unmodified peer"
		bad=1
	fi
	[ $bad -eq 0 ] || return 1
	dg_log "$label: rc_plain=$plain rc_conns=0: OK (plain TCP to the unmodified peer)"
}
