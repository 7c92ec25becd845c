#!/usr/bin/env bash
# sockapi.sh SOCKAPI LIBDGSHIM BASE_PORT: every sockapi subtest, natively where that means
# something and under LD_PRELOAD=LIBDGSHIM; one line per run, a tally, exit 1 if any run failed.
# Uses the ports BASE_PORT .. BASE_PORT+34 on 127.0.0.1 (and ::1 for basic6).
#
# Each run gets a clean environment: the caller's LD_PRELOAD, DGSHIM_MODE, DGSHIM_RULES,
# DGSHIM_CONF and DGSHIM_FAULT_* are dropped; preloaded runs use DGSHIM_CONF=/dev/null so that an
# /etc/dgshim.conf on the machine does not change what is tested. DGSHIM_LOG is passed through
# (except to the badrules runs, which count the shim's stderr lines).
# SOCKAPI_EXPECT=native|preload tells sockapi how it was started, so a library that fails to
# load (ld.so only warns and goes on) is a failure, not a silent native run.
set -u
if [ $# -ne 3 ]; then
	echo "usage: $0 SOCKAPI LIBDGSHIM BASE_PORT" >&2
	exit 2
fi
bin=$1 lib=$2 base=$3
case $lib in /*) ;; *) lib=$PWD/$lib ;; esac
case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
if [ ! -x "$bin" ]; then
	echo "sockapi: FAIL: test program '$bin' not found or not executable"
	exit 1
fi
libok=1
if [ ! -e "$lib" ]; then
	echo "sockapi: FAIL: shim library '$lib' does not exist; every preloaded run fails"
	libok=0
fi

tmp=$(mktemp -d /tmp/sockapi.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
npass=0 nfail=0 nskip=0 failed=
start=$(date +%s)
# In an ASan build sockapi links libasan, and ASan refuses to start when a preloaded library
# comes before it; the check is only about link order, so it is turned off (harmless otherwise).
drop=(-u LD_PRELOAD -u DGSHIM_MODE -u DGSHIM_RULES -u DGSHIM_CONF -u DGSHIM_FAULT_TX
      -u DGSHIM_FAULT_RX -u SOCKAPI_EXPECT -u SOCKAPI_READY_FD)
asan="ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
native=(env "${drop[@]}" "$asan" SOCKAPI_EXPECT=native)
preload=(env "${drop[@]}" "$asan" SOCKAPI_EXPECT=preload DGSHIM_CONF=/dev/null "LD_PRELOAD=$lib")

# report NAME KIND RC LOG [WHY]
report() {
	local name=$1 kind=$2 rc=$3 log=$4 why=${5:-}
	case $rc in
	0) echo "sockapi: $name [$kind]: PASS"; npass=$((npass + 1)) ;;
	77) echo "sockapi: $name [$kind]: SKIP"; nskip=$((nskip + 1)); sed 's/^/    /' "$log" ;;
	*)
		echo "sockapi: $name [$kind]: FAIL (exit $rc)${why:+: $why}"
		nfail=$((nfail + 1)); failed="$failed $name[$kind]"
		[ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "    (killed by the runner's 40 s timeout)"
		sed 's/^/    /' "$log" | head -60
		;;
	esac
}

# run NAME KIND COMMAND... : one sockapi run, stdout and stderr together
run() {
	local name=$1 kind=$2; shift 2
	local log=$tmp/$name.$kind.log
	if [ "$kind" = preload ] && [ $libok -eq 0 ]; then
		echo "shim library '$lib' does not exist" >"$log"
		report "$name" "$kind" 1 "$log"
		return
	fi
	timeout -k 5 40 "$@" >"$log" 2>&1
	report "$name" "$kind" $? "$log"
}

# badrules NAME WANT ENV... : under the shim with broken configuration; the program must work
# with every socket untaken, and the shim must say so in exactly one stderr line containing WANT.
badrules() {
	local name=$1 want=$2; shift 2
	local out=$tmp/$name.out err=$tmp/$name.err log=$tmp/$name.log
	if [ $libok -eq 0 ]; then
		echo "shim library '$lib' does not exist" >"$log"
		report "$name" preload 1 "$log"
		return
	fi
	timeout -k 5 40 env "${drop[@]}" -u DGSHIM_LOG "$asan" SOCKAPI_EXPECT=preload "LD_PRELOAD=$lib" "$@" \
		"$bin" badrules $((base + 30)) >"$out" 2>"$err"
	local rc=$? why=
	local lines
	lines=$(wc -l <"$err")
	if [ $rc -eq 0 ]; then
		if [ "$lines" -ne 1 ]; then
			rc=1 why="expected exactly one line on stderr, got $lines"
		elif ! grep -qF -- "$want" "$err"; then
			rc=1 why="the stderr line does not mention '$want'"
		fi
	fi
	{ cat "$out"; echo "--- stderr ($lines lines):"; cat "$err"; } >"$log"
	report "$name" preload $rc "$log" "$why"
}

# name offset: each subtest's ports start at base+offset (see "sockapi" without arguments)
tests=(basic4:0 basic6:3 trunc:6 nonblock:8 poll:11 threads:14 cancel:16 fork:18 exec:21
       unix: dup:32)

for t in "${tests[@]}"; do
	name=${t%%:*} off=${t#*:}
	args=(); [ -n "$off" ] && args=($((base + off)))
	run "$name" native "${native[@]}" "$bin" "$name" "${args[@]}"
	run "$name" preload "${preload[@]}" "$bin" "$name" "${args[@]}"
done

# One side preloaded, the other not: plain UDP both ways, nothing framed reaches the
# unmodified side. sockapi starts both sides itself (receiver first), with and without the shim.
run interop native "${native[@]}" "$bin" interop $((base + 24)) 70 "$lib" none
run interop-recv preload "${native[@]}" "$bin" interop $((base + 24)) 70 "$lib" recv
run interop-send preload "${native[@]}" "$bin" interop $((base + 24)) 70 "$lib" send

# Shim only.
run mode preload "${preload[@]}" "$bin" mode $((base + 28))
run rd-loss preload "${preload[@]}" DGSHIM_MODE=rd DGSHIM_FAULT_TX=loss=5 \
	"$bin" rd-loss $((base + 26)) 5000

conf=$tmp/bad.conf
printf '# sockapi.sh: a rules file with a mistake on line 3\nmode=off port=9\nmode=ud port=0\nmode=auto\n' >"$conf"
badrules badrules "$conf:3" "DGSHIM_CONF=$conf"
badrules badrules-inline "DGSHIM_RULES:2" DGSHIM_CONF=/dev/null 'DGSHIM_RULES=mode=off port=9; mode=fast'
badrules badrules-missing "$tmp/missing.conf" "DGSHIM_CONF=$tmp/missing.conf"
badrules badrules-mode "DGSHIM_MODE" DGSHIM_CONF=/dev/null DGSHIM_MODE=fast

echo "sockapi: $npass passed, $nfail failed, $nskip skipped in $(( $(date +%s) - start )) s${failed:+ (failed:$failed)}"
[ $nfail -eq 0 ]
