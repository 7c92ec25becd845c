#!/usr/bin/env bash
# install.sh SOURCE_DIR PORT: `meson install` as a user would do it, into a temporary prefix:
# every file the issue lists is there, the installed launcher preloads the installed library
# (not the build directory's) into an unmodified UDP program whose datagrams then travel framed,
# a program compiles against the installed dgshim.h through pkg-config and runs under it, and a
# DESTDIR install stages the same tree without the DESTDIR in any installed path.
set -uo pipefail
src=$1 port=${2:-24000}
name=install
# shellcheck source=install_lib.sh
. "$(dirname "$0")/install_lib.sh"
inst_setup

prefix=$tmp/prefix
# tests off: only what is installed is built (~15 s on 2 cores)
meson setup "$tmp/build" "$src" --prefix="$prefix" -Dtests=disabled >"$tmp/setup.log" 2>&1 ||
	{ tail -20 "$tmp/setup.log"; fail "meson setup"; }
ninja -C "$tmp/build" >"$tmp/ninja.log" 2>&1 || { tail -20 "$tmp/ninja.log"; fail "build"; }
meson install -C "$tmp/build" >"$tmp/install.log" 2>&1 || { tail -20 "$tmp/install.log"; fail "meson install"; }
libdir=$prefix/$(meson introspect "$tmp/build" --buildoptions |
	python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]=="libdir"][0])')
doc=$prefix/share/doc/dgshim
for f in bin/dgshim bin/dgshim-stat bin/dgperf bin/udpbench include/dgshim.h \
	share/man/man1/dgshim.1 share/man/man5/dgshim.conf.5 share/man/man7/dgshim.7 \
	share/man/man1/dgperf.1 share/doc/dgshim/dgshim.conf.example share/doc/dgshim/examples/iwarp_toggle.c; do
	[ -e "$prefix/$f" ] || fail "$f not installed"
done
[ -e "$libdir/libdgshim.so.0" ] || fail "no $libdir/libdgshim.so.0"
soname=$(readelf -d "$libdir/libdgshim.so.0" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libdgshim.so.0 ] || fail "soname is '$soname', not libdgshim.so.0"
pcdir=$(dirname "$(find "$prefix" -name dgshim.pc | head -1)")
[ -n "$pcdir" ] || fail "no dgshim.pc installed"
lua=$libdir/wireshark/plugins/dgshim.lua
[ -f "$lua" ] || fail "no Wireshark dissector at $lua"
say "installed: bin/{dgshim,dgshim-stat,dgperf,udpbench}, $(basename "$libdir")/libdgshim.so.0 (soname $soname), dgshim.h, dgshim.pc, man pages, example, wireshark/plugins/dgshim.lua"

# The installed launcher names the installed library, nothing of the build directory.
"$prefix/bin/dgshim" --version >"$tmp/version" || fail "dgshim --version"
grep -qx "library: $libdir/libdgshim.so.0" "$tmp/version" || { cat "$tmp/version"; fail "installed launcher does not name $libdir/libdgshim.so.0"; }
if grep -q "$tmp/build" "$prefix/bin/dgshim"; then fail "installed launcher names the build directory"; fi

# An unmodified program from the prefix, both ends preloaded through the installed launcher.
mv "$tmp/build" "$tmp/build.moved" # nothing may still come from it
env -u DGSHIM_LIB "$prefix/bin/dgshim" -v -- "$prefix/bin/udpbench" server "$port" -b 127.0.0.1 \
	>"$tmp/server.out" 2>"$tmp/server.err" &
pids+=($!)
for _ in $(seq 50); do grep -q listening "$tmp/server.out" && break; sleep 0.1; done
grep -q listening "$tmp/server.out" || { cat "$tmp/server.err"; fail "udpbench server did not start"; }
env -u DGSHIM_LIB "$prefix/bin/dgshim" -v -- "$prefix/bin/udpbench" stream 127.0.0.1 "$port" -s 512 -t 1 \
	>"$tmp/client.out" 2>"$tmp/client.err" || { cat "$tmp/client.out" "$tmp/client.err"; fail "udpbench stream under the installed shim"; }
framed=$(sed -n 's/.*summary:.* tx_framed=\([0-9]*\).*/\1/p' "$tmp/client.err")
[ "${framed:-0}" -gt 100 ] || { cat "$tmp/client.err"; fail "the client's datagrams were not framed (tx_framed=${framed:-none})"; }
say "udpbench stream through $prefix/bin/dgshim: tx_framed=$framed ($(grep -o 'received [^,]*' "$tmp/client.out" | head -1))"

# A program built against the installed header through pkg-config: the installed example.
cflags=$(PKG_CONFIG_PATH=$pcdir pkg-config --cflags dgshim) || fail "pkg-config --cflags dgshim"
libs=$(PKG_CONFIG_PATH=$pcdir pkg-config --libs dgshim)
preload=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=preload dgshim)
[ "$preload" = "$libdir/libdgshim.so.0" ] || fail "pkg-config preload=$preload"
[ -z "$libs" ] || fail "pkg-config --libs dgshim is '$libs': a program must not link the interposer"
cc $cflags -o "$tmp/iwarp_toggle" "$doc/examples/iwarp_toggle.c" $libs 2>"$tmp/cc.err" ||
	{ cat "$tmp/cc.err"; fail "the example does not compile against the installed header"; }
"$prefix/bin/dgshim" -- "$tmp/iwarp_toggle" $((port + 1)) 12 >"$tmp/toggle.out" 2>&1 ||
	{ tail -20 "$tmp/toggle.out"; fail "iwarp_toggle built from the installed header, under the installed shim"; }
say "iwarp_toggle compiled with \`pkg-config --cflags dgshim\` ($cflags) runs under the installed shim: $(tail -1 "$tmp/toggle.out")"

# DESTDIR: the same files staged under it, the paths inside them still the prefix's.
mv "$tmp/build.moved" "$tmp/build"
DESTDIR=$tmp/stage meson install -C "$tmp/build" --no-rebuild >"$tmp/destdir.log" 2>&1 ||
	{ tail -20 "$tmp/destdir.log"; fail "DESTDIR install"; }
[ -x "$tmp/stage$prefix/bin/dgshim" ] && [ -e "$tmp/stage$libdir/libdgshim.so.0" ] || fail "DESTDIR not honoured"
if grep -rq "$tmp/stage" "$tmp/stage$prefix/bin/dgshim" "$tmp/stage$pcdir/dgshim.pc"; then fail "DESTDIR leaked into an installed file"; fi
say "DESTDIR=$tmp/stage: staged, no installed file names it"
say "PASS"
