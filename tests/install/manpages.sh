#!/usr/bin/env bash
# manpages.sh DIR: every man page renders without a groff warning (what lintian checks), names
# no unfilled @VARIABLE@, and each variable the library reads is in dgshim(7).
set -uo pipefail
dir=$1 src=$2
fail() { echo "manpages: FAIL: $*"; exit 1; }
command -v man >/dev/null || { export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq man-db >/dev/null; }
for p in dgshim.1 dgshim-stat.1 dgperf.1 udpbench.1 dgshim.conf.5 dgshim.7; do
	[ -f "$dir/$p" ] || fail "$p not built"
	w=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings=all -E UTF-8 -l "$dir/$p" 2>&1 >/dev/null)
	[ -z "$w" ] || fail "$p: $w"
	if grep -q '@[A-Z]*@' "$dir/$p"; then fail "$p: unfilled $(grep -o '@[A-Z]*@' "$dir/$p" | head -1)"; fi
done
# every variable of the one table (config/env.c) that reads them
vars=$(grep -oE '\.name = "DGSHIM_[A-Z_]+"' "$src/config/env.c" | sed 's/.*"\(.*\)".*/\1/' | sort -u)
[ "$(wc -w <<<"$vars")" -ge 20 ] || fail "found $(wc -w <<<"$vars") variables in config/env.c: the table's form changed?"

seven=$(LC_ALL=C.UTF-8 MANWIDTH=200 man -l "$dir/dgshim.7" 2>/dev/null)
for v in $vars; do grep -q "$v" <<<"$seven" || fail "dgshim(7) does not describe $v"; done
echo "manpages: PASS ($(wc -w <<<"$vars") variables documented, 6 pages clean)"
