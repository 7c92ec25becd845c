#!/usr/bin/env bash
# rdma_lazy.sh LIBDGSHIM VERBS_CONF HAVE_IBVERBS(0|1) PORT: libibverbs and librdmacm are loaded
# only when the ibverbs provider is opened (verbs_backend/ibverbs/syms.h), never by ld.so:
#  1. libdgshim.so has no DT_NEEDED on either (else ld.so cannot preload the shim on a host
#     without rdma-core, and every preloaded program loads them);
#  2. it has no undefined ibv_*/rdma_* symbol either (linked with -z now, one would make the
#     preload fail where the libraries are missing; the sanitizer build links without
#     --no-undefined, so only this notices);
#  3. a preloaded program that never opens the provider maps neither library;
#  4. with the backend built: a missing library (DGSHIM_IBV_LIB / DGSHIM_RDMACM_LIB pointed at
#     nothing) makes -P ibverbs fail to open (exit 77) with an error naming the library, and
#     -P auto fall back to soft with that reason (and pass the soft conformance run).
#  5. the shim's UDP sockets with DGSHIM_PROVIDER unset (auto) on loopback: framed on the soft
#     provider, and the preloaded programs never map an RDMA library (auto has no address a
#     device could serve);
#  6. with the backend built, DGSHIM_PROVIDER=ibverbs where no device serves 127.0.0.1: the
#     socket runs on soft, and the reason is printed without DGSHIM_LOG (asked for by name);
#     the exit summary says udp_on_device=0 and the choice.
# Uses PORT and UPORT on 127.0.0.1. One line per check; exit 1 if any failed.
set -u
if [ $# -ne 6 ]; then
	echo "usage: $0 LIBDGSHIM VERBS_CONF HAVE_IBVERBS PORT UDPBENCH UPORT" >&2
	exit 2
fi
lib=$1 conf=$2 have=$3 port=$4 udpbench=$5 uport=$6
case $lib in /*) ;; *) lib=$PWD/$lib ;; esac
fails=0
res() { # PASS|FAIL check detail
	echo "$1 $2: $3"
	[ "$1" = FAIL ] && fails=$((fails + 1))
	return 0
}
rdma='lib(ibverbs|rdmacm)\.so'

need=$(readelf -d "$lib" | awk '/\(NEEDED\)/ {print $NF}' | tr -d '[]' | tr '\n' ' ')
if [ -z "$need" ]; then
	res FAIL no_needed "readelf -d $lib printed no NEEDED entries at all"
elif echo "$need" | grep -Eq "$rdma"; then
	res FAIL no_needed "libdgshim.so needs: $need"
else
	res PASS no_needed "NEEDED: $need"
fi

undef=$(nm -D --undefined-only "$lib" | awk '$NF ~ /^(ibv|rdma)_/ {print $NF}' | tr '\n' ' ')
if [ -n "$undef" ]; then
	res FAIL no_undefined "undefined RDMA symbols (call them through verbs_backend/ibverbs/syms.h): $undef"
else
	res PASS no_undefined "no undefined ibv_*/rdma_* symbol"
fi

# A sanitizer build needs its runtime first among the preloaded libraries (as lib.sh does).
asan=$(ldd "$lib" 2>/dev/null | awk '/libasan\.so/ {print $3; exit}')
# TSan's runtime is preloaded after the library instead (lib.sh says why); cat is not TSan-built.
tsan=$(ldd "$lib" 2>/dev/null | awk '/libtsan\.so/ {print $3; exit}')
maps=$(env -u DGSHIM_PROVIDER ASAN_OPTIONS=detect_leaks=0 DGSHIM_CONF=/dev/null \
	LD_PRELOAD="${asan:+$asan }$lib${tsan:+ $tsan}" cat /proc/self/maps 2>&1)
if ! echo "$maps" | grep -q libdgshim; then
	res FAIL preload_maps "the shim was not preloaded into cat: $(echo "$maps" | head -3)"
elif echo "$maps" | grep -Eq "$rdma"; then
	res FAIL preload_maps "a preloaded cat maps $(echo "$maps" | grep -Eo "$rdma[^ ]*" | sort -u | tr '\n' ' ')"
else
	res PASS preload_maps "a preloaded cat maps the shim and no RDMA library"
fi

if [ "$have" = 1 ]; then
	for v in DGSHIM_IBV_LIB=/nonexistent/libibverbs.so.1 DGSHIM_RDMACM_LIB=/nonexistent/librdmacm.so.1; do
		out=$(env "$v" DGSHIM_LOG=error "$conf" -P ibverbs 127.0.0.1 "$port" 2>&1)
		r=$?
		e=$(echo "$out" | grep -m1 -o 'error: provider ibverbs: .*')
		if [ $r -eq 77 ] && echo "$e" | grep -qF "cannot load ${v#*=}: "; then
			res PASS "missing_${v%%=*}" "exit 77, \"$e\""
		else
			res FAIL "missing_${v%%=*}" "exit $r (want 77), error \"${e:-none}\" (want one naming ${v#*=})"
		fi
	done
	out=$(env DGSHIM_IBV_LIB=/nonexistent/libibverbs.so.1 DGSHIM_LOG=info "$conf" -P auto 127.0.0.1 "$port" 2>&1)
	r=$?
	w=$(echo "$out" | grep -m1 -o 'provider auto: .*')
	if [ $r -eq 0 ] && echo "$w" | grep -qF 'auto: soft (ibverbs: cannot load /nonexistent/libibverbs.so.1: '; then
		res PASS missing_auto "exit 0, \"$w\", $(echo "$out" | grep -m1 '^verbs_conf:' | cut -d' ' -f2-)"
	else
		res FAIL missing_auto "exit $r, \"${w:-no choice logged}\" (want soft with the missing library named)"
		echo "$out" | tail -20 | sed 's/^/  /'
	fi
else
	echo "SKIP missing_*: this build has no ibverbs backend"
fi
# udp_pair NAME PROVIDER(or "") LOGLEVEL: udpbench server + 50-round-trip ping-pong, both
# preloaded, DGSHIM_MODE=ud; the server's maps sampled while it runs. Sets rc, srv, cli, smaps.
udp_pair() {
	local prov=$2 lvl=$3
	local envs=(ASAN_OPTIONS=detect_leaks=0 DGSHIM_CONF=/dev/null DGSHIM_MODE=ud LD_PRELOAD="${asan:+$asan }$lib${tsan:+ $tsan}")
	[ -n "$lvl" ] && envs+=(DGSHIM_LOG="$lvl")
	[ -n "$prov" ] && envs+=(DGSHIM_PROVIDER="$prov")
	env -u DGSHIM_PROVIDER -u DGSHIM_LOG "${envs[@]}" "$udpbench" server "$uport" -b 127.0.0.1 > /tmp/rdma_lazy.$$.srv 2>&1 &
	local sp=$! n=0
	while ! grep -q listening /tmp/rdma_lazy.$$.srv && kill -0 $sp 2>/dev/null && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
	cli=$(env -u DGSHIM_PROVIDER -u DGSHIM_LOG "${envs[@]}" timeout 30 "$udpbench" pingpong 127.0.0.1 "$uport" -s 64 -n 50 -w 5 2>&1)
	rc=$?
	smaps=$(cat /proc/$sp/maps 2>/dev/null)
	kill -INT $sp 2>/dev/null; wait $sp
	srv=$(cat /tmp/rdma_lazy.$$.srv); rm -f /tmp/rdma_lazy.$$.srv
}
sumval() { echo "$1" | grep -o 'summary: .*' | tail -1 | tr ' ' '\n' | grep "^$2=" | cut -d= -f2; }

udp_pair auto "" info
f=$(sumval "$srv" rx_framed) d=$(sumval "$srv" udp_on_device)
if [ $rc -ne 0 ]; then
	res FAIL shim_udp_auto "ping-pong exit $rc: $(echo "$cli" | tail -2 | tr '\n' ' ')"
elif [ "${f:-0}" -lt 55 ] || [ "${d:-x}" != 0 ]; then
	res FAIL shim_udp_auto "server summary rx_framed=${f:-?} (want 55) udp_on_device=${d:-?} (want 0)"
elif echo "$smaps" | grep -Eq "$rdma"; then
	res FAIL shim_udp_auto "the preloaded UDP server maps $(echo "$smaps" | grep -Eo "$rdma[^ ]*" | sort -u | tr '\n' ' ')"
else
	res PASS shim_udp_auto "55 pings framed on soft, udp_on_device=0, no RDMA library mapped"
fi

if [ "$have" = 1 ]; then
	udp_pair ibverbs ibverbs ""
	why=$(echo "$srv" | grep -m1 -E 'DGSHIM_PROVIDER=ibverbs: .*UDP sockets on soft|soft provider carries this socket')
	if [ $rc -eq 0 ] && [ -n "$why" ]; then
		res PASS shim_udp_ibverbs_nodev "ping-pong ok on soft; said without DGSHIM_LOG: \"$why\""
	else
		res FAIL shim_udp_ibverbs_nodev "exit $rc, reason ${why:+\"$why\"}${why:-not printed}: $(echo "$srv" | head -5 | tr '\n' ' ')"
	fi
	udp_pair ibverbs ibverbs info
	f=$(sumval "$srv" rx_framed) d=$(sumval "$srv" udp_on_device) p=$(echo "$srv" | grep -o 'provider=ibverbs: UDP sockets on soft[^)]*)')
	if [ $rc -eq 0 ] && [ "${f:-0}" -ge 55 ] && [ "${d:-x}" = 0 ] && [ -n "$p" ]; then
		res PASS shim_udp_ibverbs_summary "rx_framed=$f udp_on_device=0 $p"
	else
		res FAIL shim_udp_ibverbs_summary "exit $rc, rx_framed=${f:-?} udp_on_device=${d:-?}, choice in the summary: ${p:-missing}"
	fi
fi
echo "rdma_lazy: $fails failed"
[ $fails -eq 0 ]
