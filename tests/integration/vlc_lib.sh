# shellcheck shell=bash
# vlc_lib.sh: what vlc_udp.sh and vlc_http.sh share: the VLC sandbox (VLC runs as nobody), the
# module check, the test media and the ASan probe. Source it after lib.sh; after dg_init call
# vlc_init [SUBDIR...], vlc_modules MODULE..., vlc_media FILE, and vlc_require_shim before the
# native run(s).

# vlc_init [SUBDIR...]: needs ffmpeg, VLC, setpriv, python3, ss, the user nobody and the group
# nogroup. VLC refuses to run as root: everything it touches lives in vdir ($DG_TMP/vlc, with
# home/ and each SUBDIR, owned by nobody). Sets vdir, asnobody (the words that run a command as
# nobody with HOME in vdir) and vlcopts (VLC's options for a quiet, headless run).
vlc_init() {
	local d
	dg_need ffmpeg ffmpeg
	dg_need vlc vlc-bin
	dg_need setpriv util-linux
	dg_need python3 python3
	dg_need ss iproute2
	[ -x /usr/bin/vlc ] || dg_fail "/usr/bin/vlc missing (install vlc-bin)"
	id nobody >/dev/null 2>&1 || dg_fail "user nobody does not exist"
	getent group nogroup >/dev/null || dg_fail "group nogroup does not exist"
	chmod 0755 "$DG_TMP"
	vdir=$DG_TMP/vlc
	mkdir -p "$vdir/home"
	for d in "$@"; do mkdir -p "$vdir/$d"; done
	chown -R nobody:nogroup "$vdir"
	asnobody=(setpriv --reuid=nobody --regid=nogroup --clear-groups env "HOME=$vdir/home")
	vlcopts=(-I dummy --no-dbus --no-media-library --no-metadata-network-access --no-lua -A none
		--no-video --no-stats --verbose=1)
}

# vlc_modules MODULE...: each MODULE (a pattern for a line of 'vlc --list': name, spaces,
# description) must be there, or the test fails (they are in vlc-plugin-base).
vlc_modules() {
	local mods m
	mods=$(cd "$vdir" && timeout 30 "${asnobody[@]}" /usr/bin/vlc -I dummy --list 2>/dev/null)
	for m in "$@"; do
		grep -q "^ *$m" <<<"$mods" || dg_fail "VLC module '$m' missing (install vlc-plugin-base)"
	done
}

# vlc_media FILE: makes the test media, 4 s testsrc + sine in MPEG-TS ($DG_TMP/raw.ts), padded
# with TS null packets to a multiple of 770048 = lcm(188, 16384) bytes into FILE (mode 0644);
# sets msize, FILE's size.
vlc_media() {
	local media=$1
	ffmpeg -hide_banner -loglevel error -nostdin \
		-f lavfi -i testsrc=size=320x240:rate=25 -f lavfi -i sine=frequency=440:sample_rate=48000 \
		-t 4 -map 0:v -map 1:a -c:v mpeg2video -b:v 1000k -c:a mp2 -b:a 64k \
		-fflags +bitexact -flags:v +bitexact -flags:a +bitexact -f mpegts "$DG_TMP/raw.ts" \
		>"$DG_TMP/ffmpeg.log" 2>&1 || { dg_tail "$DG_TMP/ffmpeg.log"; dg_fail "ffmpeg could not make the test media"; }
	python3 - "$DG_TMP/raw.ts" "$media" <<'EOF' || dg_fail "padding the media failed"
import sys
data = open(sys.argv[1], 'rb').read()
assert len(data) % 188 == 0 and data[0] == 0x47, "not a TS file"
unit = 770048  # lcm(188, 16384)
null = bytes([0x47, 0x1F, 0xFF, 0x10]) + b'\xff' * 184
size = -(-len(data) // unit) * unit
open(sys.argv[2], 'wb').write(data + null * ((size - len(data)) // 188))
EOF
	chmod 0644 "$media"
	msize=$(stat -c %s "$media")
}

# vlc_asan_starts: VLC starts (prints its version) with only the ASan runtime preloaded, within
# 15 s. Called with 2>/dev/null, which also silences bash's 'Killed' notice when timeout(1) has
# to kill a hung VLC.
vlc_asan_starts() {
	timeout -k 2 15 env LD_PRELOAD="$DG_ASAN_RT" ASAN_OPTIONS=detect_leaks=0 "${asnobody[@]}" \
		/usr/bin/vlc -I dummy --version >/dev/null 2>&1
}

# vlc_tsan_starts RUNTIME: likewise with only the TSan runtime RUNTIME preloaded.
vlc_tsan_starts() {
	timeout -k 2 15 env LD_PRELOAD="$1" "${asnobody[@]}" /usr/bin/vlc -I dummy --version >/dev/null 2>&1
}

# vlc_require_shim: dg_require_shim, then, in a sanitizer build, exit 77 (skip) when VLC cannot
# run the ASan (or TSan) runtime at all. Call it before the native run(s): the shim's build decides first
# whether VLC can run it.
vlc_require_shim() {
	dg_require_shim
	if [ -n "$DG_ASAN_RT" ] && ! vlc_asan_starts 2>/dev/null; then
		# Seen on Debian 12: VLC hangs in bindtextdomain (glibc's _nl_state_lock) as soon as the ASan
		# runtime is preloaded into it, shim or no shim (llvm/llvm-project#49223).
		dg_log "SKIP: VLC does not start with only the ASan runtime preloaded (no shim), so the ASan build of the shim cannot be tested in it; the normal build runs this test"
		exit 77
	fi
	local tsan
	tsan=$(ldd "$DG_SHIM_USED" 2>/dev/null | awk '/libtsan\.so/ {print $3; exit}')
	if [ -n "$tsan" ] && ! vlc_tsan_starts "$tsan" 2>/dev/null; then
		# Seen on Debian 12 (gcc 12's libtsan): VLC -I dummy --version never returns with only the
		# TSan runtime preloaded into it, shim or no shim.
		dg_log "SKIP: VLC does not start with only the TSan runtime preloaded (no shim), so the TSan build of the shim cannot be tested in it; the normal build runs this test"
		exit 77
	fi
}
