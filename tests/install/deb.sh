#!/usr/bin/env bash
# deb.sh [PORT]: the Debian packages from this tree. dpkg-buildpackage -us -uc -b in a copy of the
# working tree; lintian on the result (any error fails; warnings are printed); then the three
# packages installed with dpkg -i into a throw-away root (the host's own root under an overlay
# in a private mount namespace, so the host is not touched and nothing of this tree is visible
# there) where the installed launcher runs the installed udpbench with its datagrams framed, a
# program compiles against the packaged header through pkg-config, the man pages are found and
# tshark loads the packaged dissector. Run by ./scripts/test (about 40 s).
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
port=${1:-24400}
name=deb
fail() { echo "$name: FAIL: $*"; exit 1; }
say() { echo "$name: $*"; }
[ "$(id -u)" = 0 ] || { echo "$name: SKIP: installing packages into a private root needs root"; exit 77; }
need=()
for p in dpkg-dev debhelper lintian fakeroot; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	{ apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >/dev/null 2>&1 ||
		fail "cannot install ${need[*]}"
fi
tmp=$(mktemp -d /dev/shm/dgshim-deb.XXXXXX) || fail "mktemp" # /dev/shm: not under the overlay's lower root
cleanup() { umount -l "$tmp/root" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

version=$(dpkg-parsechangelog -l "$here/debian/changelog" -S Version)
src=$tmp/dgshim-$version
mkdir -p "$src"
(cd "$here" && git ls-files -co --exclude-standard | tar -cf - -T -) | tar -xf - -C "$src" || fail "copying the tree"
start=$(date +%s)
(cd "$src" && dpkg-buildpackage -us -uc -b) >"$tmp/build.log" 2>&1 || { tail -30 "$tmp/build.log"; fail "dpkg-buildpackage"; }
say "dpkg-buildpackage -us -uc -b: $(cd "$tmp" && ls *.deb | grep -v dbgsym | tr '\n' ' ')($(( $(date +%s) - start )) s)"

lintian --tag-display-limit 0 "$tmp"/dgshim_"$version"_*.changes >"$tmp/lintian.txt" 2>&1
grep -v 'root privileges' "$tmp/lintian.txt" | sed "s/^/$name: lintian: /"
if grep -q '^E:' "$tmp/lintian.txt"; then fail "lintian reports errors"; fi
say "lintian: $(grep -c '^E:' "$tmp/lintian.txt") errors, $(grep -c '^W:' "$tmp/lintian.txt") warnings"

# the packages' own contents (what a user gets), then a private root to install them into
for d in libdgshim0 dgshim libdgshim-dev; do
	[ -f "$tmp/${d}_${version}_amd64.deb" ] || fail "no package $d"
done
dpkg-deb -c "$tmp/libdgshim0_${version}_amd64.deb" | grep -q 'libdgshim.so.0 ->' || fail "libdgshim0 has no soname link"

cat >"$tmp/inside.sh" <<INSIDE
set -u
fail() { echo "$name: FAIL: \$*"; exit 1; }
[ ! -e /usr/bin/dgshim ] && ! ls /usr/lib/*/libdgshim.so* >/dev/null 2>&1 || fail "the root already has dgshim installed"
dpkg -i /debs/libdgshim0_${version}_amd64.deb /debs/dgshim_${version}_amd64.deb /debs/libdgshim-dev_${version}_amd64.deb >/debs/dpkg.log 2>&1 ||
	{ tail -20 /debs/dpkg.log; fail "dpkg -i"; }
/usr/bin/dgshim --version | grep -q "library: /usr/lib/.*/libdgshim.so.0" || fail "installed launcher: \$(/usr/bin/dgshim --version)"
cd /
/usr/bin/dgshim -- /usr/bin/udpbench server $port -b 127.0.0.1 >/debs/server.out 2>&1 &
s=\$!
for _ in \$(seq 50); do grep -qs listening /debs/server.out && break; sleep 0.1; done
/usr/bin/dgshim -v -- /usr/bin/udpbench stream 127.0.0.1 $port -s 512 -t 1 >/debs/client.out 2>/debs/client.err ||
	{ kill \$s; cat /debs/client.out /debs/client.err; fail "udpbench under the packaged shim"; }
kill \$s; wait \$s 2>/dev/null
framed=\$(sed -n 's/.*summary:.* tx_framed=\([0-9]*\).*/\1/p' /debs/client.err)
[ "\${framed:-0}" -gt 100 ] || { cat /debs/client.err; fail "not framed (tx_framed=\${framed:-none})"; }
echo "$name: dgshim -- udpbench stream from the packages: tx_framed=\$framed"
cc \$(pkg-config --cflags dgshim) -o /debs/toggle /usr/share/doc/dgshim/examples/iwarp_toggle.c \$(pkg-config --libs dgshim) ||
	fail "the packaged example against the packaged header"
/usr/bin/dgshim -- /debs/toggle $((port + 1)) 12 >/debs/toggle.out 2>&1 || { tail /debs/toggle.out; fail "iwarp_toggle"; }
echo "$name: iwarp_toggle built with pkg-config --cflags dgshim: \$(tail -1 /debs/toggle.out)"
for m in dgshim.1 dgshim-stat.1 dgperf.1 udpbench.1 dgshim.conf.5 dgshim.7; do
	[ -f "/usr/share/man/man\${m##*.}/\$m.gz" ] || fail "man page \$m"
done
[ -f /usr/share/doc/dgshim/dgshim.conf.example ] || fail "no /usr/share/doc/dgshim/dgshim.conf.example"
if command -v tshark >/dev/null; then
	tshark -G plugins 2>/dev/null | grep -q 'dgshim.lua' || fail "tshark does not load the packaged dissector"
	echo "$name: tshark -G plugins lists the packaged dgshim.lua"
fi
dpkg -r libdgshim-dev dgshim libdgshim0 >/debs/remove.log 2>&1 || fail "dpkg -r"
[ ! -e /usr/bin/dgshim ] || fail "dpkg -r left /usr/bin/dgshim"
echo "$name: removed cleanly"
INSIDE
mkdir -p "$tmp/upper/debs" "$tmp/work" "$tmp/root"
mv "$tmp"/*.deb "$tmp/inside.sh" "$tmp/upper/debs/" || fail "staging the packages"
# exit 3: the private root could not be made (then the check cannot run here)
unshare -m --propagation private sh -c "
	mount -t overlay overlay -o lowerdir=/,upperdir=$tmp/upper,workdir=$tmp/work $tmp/root || exit 3
	for d in proc sys dev dev/shm; do mount --rbind /\$d $tmp/root/\$d || exit 3; done
	mount -t tmpfs tmpfs $tmp/root/tmp || exit 3
	exec chroot $tmp/root bash /debs/inside.sh" 2>&1
rc=$?
[ $rc = 3 ] && { echo "$name: SKIP: no overlay mount in a private mount namespace here"; exit 77; }
[ $rc = 0 ] || fail "the install check"
[ ! -e /usr/bin/dgshim ] || dpkg -s dgshim >/dev/null 2>&1 || fail "the host's /usr/bin/dgshim appeared"
say "PASS"
