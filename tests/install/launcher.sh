#!/usr/bin/env bash
# launcher.sh LAUNCHER SOURCE_DIR: the dgshim launcher as a user meets it. --help on stdout with exit 0
# and no script text; --version; every mode accepted with its protocol; every option value
# checked (exit 2, a message naming the value, the program not run); each option sets its
# variable in the program's environment; profiles and their precedence; dgshim stat reached.
set -uo pipefail
# A sanitized build: its runtime first in every preload; leak checks off, since the programs
# run here (python, coreutils, tshark) are not ours (the integration suite checks the shim's).
if [ -n "${DG_ASAN_RT:-}" ]; then
	export LD_PRELOAD=$DG_ASAN_RT ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
fi
L=$1 src=$2
name=launcher
# shellcheck source=install_lib.sh
. "$(dirname "$0")/install_lib.sh"
inst_setup
n=0

out=$("$L" --help 2>"$tmp/err"); rc=$?
[ $rc = 0 ] || fail "--help exits $rc"
[ ! -s "$tmp/err" ] || fail "--help wrote to stderr: $(cat "$tmp/err")"
grep -q '^usage: dgshim' <<<"$out" || fail "--help has no usage line"
if grep -Eq 'LIB=|HERE=|\$\{|exec ' <<<"$out"; then fail "--help shows script text"; fi
# every variable the library reads (config/env.c's table, its one reader) has a flag, and
# DGSHIM_LIB too; and nothing else in the sources reads one behind the table's back
vars=$(grep -hoE '^	\[DG_ENV_[A-Z_]+\] = \{\.name = "DGSHIM_[A-Z_]+"' "$src/config/env.c" | sed 's/.*"\(.*\)"/\1/' | sort -u)
stray=$(grep -rnE 'getenv\("DGSHIM_' "$src/shim" "$src/verbs_backend" "$src/config" "$src/apps" --include='*.c' | grep -v '/dgshim_stat.c:')
[ -z "$stray" ] || fail "DGSHIM_* read outside config/env.c: $stray"
[ "$(wc -w <<<"$vars")" -ge 10 ] || fail "found only these variables in the sources: $(echo $vars)"
for v in $vars DGSHIM_LIB; do
	grep -q "$v" <<<"$out" || fail "--help has no flag for $v"
done
n=$((n + 1))
ver=$("$L" --version) || fail "--version exits $?"
grep -Eq '^dgshim [0-9]+\.[0-9]+\.[0-9]+$' <<<"$(head -1 <<<"$ver")" || fail "--version says '$ver'"
lib=$(sed -n 's/^library: //p' <<<"$ver")
[ -r "$lib" ] || fail "--version names $lib, which is not there"
n=$((n + 1))

# opt value variable expected: the program (env) sees the variable set
ok() {
	local got
	got=$("$L" "$1" "$2" -- env 2>"$tmp/err" | sed -n "s/^$3=//p")
	[ "$got" = "$4" ] || fail "$1 $2: $3='$got', expected '$4' ($(cat "$tmp/err"))"
	n=$((n + 1))
}
# opt value: refused with exit 2, a message naming the value, the program not run
bad() {
	rm -f "$tmp/ran"
	"$L" "$1" "$2" -- touch "$tmp/ran" 2>"$tmp/err" >/dev/null
	local rc=$?
	[ $rc = 2 ] || fail "$1 '$2' exits $rc, not 2"
	[ ! -e "$tmp/ran" ] || fail "$1 '$2' ran the program"
	grep -qF -- "$2" "$tmp/err" || grep -qF -- "$1" "$tmp/err" || fail "$1 '$2': the message does not name it: $(cat "$tmp/err")"
	n=$((n + 1))
}
for m in auto off ud rd rc; do ok -m $m DGSHIM_MODE $m; done
ok --mode RC DGSHIM_MODE rc
got=$("$L" --mode=rd --spin-us=5 -- env | grep -E '^DGSHIM_(MODE|SPIN_US)=' | sort | paste -sd' ')
[ "$got" = "DGSHIM_MODE=rd DGSHIM_SPIN_US=5" ] || fail "--mode=rd --spin-us=5: $got"
bad -m tcp; bad -m ''
echo 'mode=off program=nothing' >"$tmp/rules.conf"
ok -c "$tmp/rules.conf" DGSHIM_CONF "$tmp/rules.conf"; bad -c "$tmp/none.conf"; bad -c "$tmp"
ok -r 'mode=off port=1' DGSHIM_RULES 'mode=off port=1'; bad -r ''
ok -d off DGSHIM_DISCOVERY off; bad -d maybe
for p in soft ibverbs auto; do ok -P $p DGSHIM_PROVIDER $p; done
bad -P rxe
bad --ibv-device no-such-dev0
ok -z 4096 DGSHIM_ZCOPY_THRESHOLD 4096; bad -z 4k; bad -z -1; bad -z 99999999999
for p in auto app thread; do ok --progress $p DGSHIM_PROGRESS $p; done
bad --progress fast
ok --spin-us 0 DGSHIM_SPIN_US 0; ok --spin-us 100000 DGSHIM_SPIN_US 100000; bad --spin-us 100001; bad --spin-us x
ok --stream-buf 64K DGSHIM_STREAM_BUF 64K; ok --stream-buf 16384 DGSHIM_STREAM_BUF 16384; ok --stream-buf 64M DGSHIM_STREAM_BUF 64M
bad --stream-buf 8K; bad --stream-buf 65M; bad --stream-buf 1G; bad --stream-buf big
ok --mpa-crc off DGSHIM_MPA_CRC off; bad --mpa-crc no
ok --stats off DGSHIM_STATS off; bad --stats 0
ok --udp-gso off DGSHIM_UDP_GSO off; bad --udp-gso 0
ok --dest-idle-ms 100 DGSHIM_DEST_IDLE_MS 100; ok --dest-idle-ms 86400000 DGSHIM_DEST_IDLE_MS 86400000
bad --dest-idle-ms 99; bad --dest-idle-ms 86400001; bad --dest-idle-ms 1s; bad --dest-idle-ms 99999999999999999999
ok --stream-idle-ms 0 DGSHIM_STREAM_IDLE_MS 0; ok --stream-idle-ms 86400000 DGSHIM_STREAM_IDLE_MS 86400000
bad --stream-idle-ms 86400001; bad --stream-idle-ms 2s; bad --stream-idle-ms -1
for l in off error warn info debug 0 4; do ok -l $l DGSHIM_LOG $l; done
bad -l verbose; bad -l 5
ok --log-file "$tmp/x.%p.log" DGSHIM_LOG_FILE "$tmp/x.%p.log"; bad --log-file /nonexistent-dir/x.log
ok --fault-tx loss=5,seed=7 DGSHIM_FAULT_TX loss=5,seed=7; ok --fault-rx reorder=5:3 DGSHIM_FAULT_RX reorder=5:3
bad --fault-tx lose=5; bad --fault-rx loss
ok --ibv-lib libibverbs.so.1 DGSHIM_IBV_LIB libibverbs.so.1; bad --ibv-lib /nonexistent/libibverbs.so
ok --rdmacm-lib librdmacm.so.1 DGSHIM_RDMACM_LIB librdmacm.so.1
bad --lib /nonexistent/libdgshim.so
bad --bogus x
"$L" -m 2>/dev/null -- true; [ $? = 2 ] || fail "-m without a value is not exit 2"
"$L" 2>/dev/null; [ $? = 2 ] || fail "no program is not exit 2"
got=$("$L" -v -- env | sed -n 's/^DGSHIM_LOG=//p'); [ "$got" = info ] || fail "-v: DGSHIM_LOG=$got"
# the library itself is preloaded, after a caller's own preloads
mine=${LD_PRELOAD:+$LD_PRELOAD:}/lib/x86_64-linux-gnu/libdl.so.2 # (a sanitizer runtime stays first)
pre=$(LD_PRELOAD=$mine "$L" -- env | sed -n 's/^LD_PRELOAD=//p')
[ "$pre" = "$mine:$lib" ] || fail "LD_PRELOAD=$pre"
n=$((n + 3))

# Profiles: listed, shown, applied; an option given beats the profile whatever the order.
all=$("$L" --show-profile) || fail "--show-profile"
for p in latency throughput memory; do grep -q "^$p:" <<<"$all" || fail "--show-profile does not list $p"; done
"$L" --show-profile memory | grep -qx 'DGSHIM_STREAM_BUF=64K' || fail "--show-profile memory"
"$L" --show-profile fastest >/dev/null 2>&1; [ $? = 2 ] || fail "--show-profile of an unknown profile is not exit 2"
bad -p fastest
for p in latency throughput memory; do
	want=$("$L" --show-profile $p | sort)
	got=$("$L" -p $p -- env | grep -E "^($(cut -d= -f1 <<<"$want" | paste -sd'|'))=" | sort)
	[ "$got" = "$want" ] || fail "-p $p set '$got', not '$want'"
done
got=$("$L" --stream-buf 1M -p memory -- env | sed -n 's/^DGSHIM_STREAM_BUF=//p')
[ "$got" = 1M ] || fail "--stream-buf before -p memory: $got"
got=$("$L" -p memory --stream-buf 2M -- env | sed -n 's/^DGSHIM_STREAM_BUF=//p')
[ "$got" = 2M ] || fail "--stream-buf after -p memory: $got"
n=$((n + 6))

# dgshim stat is the stat tool (its own test checks what it prints)
"$L" stat 999999999 >/dev/null 2>"$tmp/err"; rc=$?
[ $rc = 1 ] && grep -q 999999999 "$tmp/err" || fail "dgshim stat of no process: exit $rc, $(cat "$tmp/err")"
n=$((n + 1))
echo "$name: PASS ($n checks)"
