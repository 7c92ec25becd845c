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
# Uses PORT on 127.0.0.1. One line per check; exit 1 if any failed.
set -u
if [ $# -ne 4 ]; then
	echo "usage: $0 LIBDGSHIM VERBS_CONF HAVE_IBVERBS PORT" >&2
	exit 2
fi
lib=$1 conf=$2 have=$3 port=$4
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
maps=$(env -u DGSHIM_PROVIDER ASAN_OPTIONS=detect_leaks=0 DGSHIM_CONF=/dev/null \
	LD_PRELOAD="${asan:+$asan }$lib" cat /proc/self/maps 2>&1)
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
echo "rdma_lazy: $fails failed"
[ $fails -eq 0 ]
