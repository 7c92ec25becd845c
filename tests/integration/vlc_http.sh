#!/usr/bin/env bash
# vlc_http.sh BUILD_DIR BASE_PORT: VLC serves an MPEG-TS file over HTTP on 127.0.0.1:BASE_PORT
# (its http access output) to VLC clients that fetch http://127.0.0.1:BASE_PORT/x.ts and dump
# what they receive (TCP: the stream sockets the shim carries over iWARP RC). Cases, each run
# natively first (the reference) and then through BUILD_DIR/shim/libdgshim.so:
#   one     one client;                        shim: server and client preloaded
#   three   three clients at once;             shim: server and all clients preloaded
#   srvonly one client;                        shim: only the server preloaded (client unmodified)
#   pysrv   one VLC client fetching the file from an unmodified Python http.server
#           (BASE_PORT+1);                     shim: only the client preloaded
#   pyboth  the same;                          shim: the client and the Python server preloaded
# Passes when
#   - every native dump is byte-identical to the media file (proves the setup itself is exact),
#   - every dump made through the shim is byte-identical to the media file (and so to the
#     native dumps),
#   - the exit summaries (DGSHIM_LOG=info) say: between two preloaded programs the connections
#     went over RC (dg_check_rc: rc_conns > 0, 3 for the server of 'three', RC payload bytes > 0,
#     rc_plain = 0); a preloaded program talking to an unmodified peer fell back to plain TCP
#     (dg_check_rc_plain: rc_plain > 0, rc_conns = 0). The unmodified peer's exact bytes prove
#     it never saw an iWARP byte (an MPA request at the start of the stream would corrupt it).
# Exit 0 pass, 1 fail (also when the shim is not built), 77 only if VLC cannot be installed.
# What the VLC HTTP client does on its socket (strace, native): socket(SOCK_STREAM|SOCK_NONBLOCK|
# SOCK_CLOEXEC, IPPROTO_TCP), sendmsg(request, dest, MSG_NOSIGNAL|MSG_FASTOPEN) -> EINPROGRESS,
# poll, getsockopt(SO_ERROR) -> 0, connect -> 0 (must be 0), sendmsg(request). Had sendmsg said
# EOPNOTSUPP (no TCP Fast Open) it would connect -> EINPROGRESS, poll, SO_ERROR instead. The
# server uses accept4. tcp_interop.sh checks both sequences with tcpcheck --connect fastopen.
#
# Why "demuxdump to the http access output" and not '#std{access=http,mux=ts}' (measured with
# VLC 3.0.24, Debian 12): the sout TS remuxer is not deterministic (random PAT/PMT versions,
# lost tail: see vlc_udp.sh). With --demux=dump --demuxdump-access=http the file's bytes go out
# unchanged, in 16384-byte blocks. VLC's http output is a *live* stream (httpd_stream): a client
# starts at the last block written when its request is answered, the server starts listening
# only once the input has been probed (it needs a few bytes), and at input EOF it closes every
# connection. So the feed, paced by this script through a pipe:
#   - writes the first 1880 bytes (enough for the probe, less than one block: nothing is sent),
#   - waits until every client's log shows the server's answer ("incoming response": the client
#     is registered at offset 0), then completes the first block and writes 16 KiB every 20 ms,
#   - holds the pipe open 1 s after the last byte (all blocks are flushed to the clients before
#     EOF makes VLC close them);
#   - the file is a multiple of 770048 = lcm(188, 16384) bytes (TS null-packet padding), since
#     demuxdump drops a short last block.
# The clients end at EOF: VLC's http live access reconnects once, finds nothing and quits
# (vlc://quit); they have a fixed 16 KiB-block reader, so the dump is exactly the body.
# Verified (VLC 3.0.24, Debian 12): 10 runs of the whole script with a shim that left TCP to the
# OS (so all 7 cases were native TCP: 110 dumps), 3 of them with both CPUs kept busy: every dump
# equalled the media byte for byte and every client had the server's answer before the feed
# went on. A VLC case takes ~2.3 s, the Python one ~0.3 s, the script ~13 s (under an ASan
# build of the shim it skips after ~17 s: see below).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
# shellcheck source=vlc_lib.sh
. "$here/vlc_lib.sh"
dg_init vlc_http "$@"
port=$DG_PORT
pyport=$((DG_PORT + 1))
t_start=$(date +%s.%N)

# VLC runs as nobody in $vdir (vlc_lib.sh), www/ holds the media for the Python server; the
# modules this test needs (vlc-plugin-base): demuxdump, the http access output and input.
vlc_init www
vlc_modules 'demuxdump  *File dumper' 'http  *HTTP stream output' 'access  *HTTPS input'

# --- test media: 4 s testsrc + sine in MPEG-TS, padded to a multiple of lcm(188, 16384) bytes
media=$vdir/www/media.ts
vlc_media "$media"
dg_log "media $msize bytes md5 $(md5sum <"$media" | cut -d' ' -f1)"

# feed FILE GOFILE: writes FILE's first 1880 bytes to stdout, waits (at most 30 s) for GOFILE,
# then the rest of the first 16 KiB block and 16 KiB every 20 ms, then holds stdout open 1 s.
feed() {
	python3 -c '
import os, sys, time, signal
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
data = open(sys.argv[1], "rb").read()
out = sys.stdout.buffer
out.write(data[:1880]); out.flush()
t = time.time()
while not os.path.exists(sys.argv[2]) and time.time() - t < 30:
    time.sleep(0.02)
for i in [1880] + list(range(16384, len(data), 16384)):
    out.write(data[i:(i // 16384 + 1) * 16384]); out.flush(); time.sleep(0.02)
time.sleep(1.0)
' "$1" "$2"
}

# serve ENV...: the VLC HTTP server on 127.0.0.1:$port/x.ts, reading the paced media from a pipe.
serve() {
	feed "$media" "$go" | (cd "$vdir" && exec timeout -k 5 60 "${asnobody[@]}" "$@" /usr/bin/vlc \
		"${vlcopts[@]}" - --demux=dump --demuxdump-access=http \
		--demuxdump-file="127.0.0.1:$port/x.ts" vlc://quit)
}

# env_words SIDE WHO: the NAME=VALUE words for the server or a client (SIDE srv or cli) in a
# case where WHO is preloaded.
env_words() {
	local side=$1 mode=$2
	case $mode:$side in
	shim-both:* | shim-srv:srv | shim-cli:cli) printf '%s\n' "${DG_SHIM_ENV[@]}" ;;
	esac
}

# run_case TAG NCLIENTS WHO SERVER: WHO is native, shim-both, shim-srv or shim-cli (who is
# preloaded); SERVER is vlc or python. Dumps in $vdir/TAG.cK.ts, logs in $vdir/TAG.{srv,cK}.log.
# Returns 1 when a program failed or a dump differs from the media.
run_case() {
	local tag=$1 n=$2 who=$3 server=$4 spid k i t0 rc ok=1 url
	local -a senv cenv cpids=()
	mapfile -t senv < <(env_words srv "$who")
	mapfile -t cenv < <(env_words cli "$who")
	local slog=$vdir/$tag.srv.log
	go=$vdir/$tag.go
	if dg_wait_tcp "$port" 0 || dg_wait_tcp "$pyport" 0; then
		dg_log "$tag: TCP port $port or $pyport is already in use by another program"
		return 1
	fi
	t0=$(date +%s.%N)
	if [ "$server" = vlc ]; then
		url=http://127.0.0.1:$port/x.ts
		dg_bg "$slog" serve "${senv[@]}"
		spid=$DG_LAST_PID
		dg_wait_tcp "$port" 20 "$spid"
	else
		url=http://127.0.0.1:$pyport/media.ts
		# An unmodified static file server (Content-Length, one GET); exits 0 on SIGTERM, which
		# timeout(1) delivers twice (to the child and to its process group): the second is ignored.
		dg_bg "$slog" timeout -k 5 60 env "${senv[@]}" python3 -c '
import functools, http.server, signal, sys
def stop(*a):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[2])
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), h).serve_forever()
' "$pyport" "$vdir/www"
		spid=$DG_LAST_PID
		dg_wait_tcp "$pyport" 20 "$spid"
	fi
	case $? in
	1) dg_log "$tag: server not listening after 20 s" && return 1 ;;
	2) dg_log "$tag: server exited before listening" && dg_tail "$slog" && return 1 ;;
	esac
	for k in $(seq "$n"); do
		# --verbose=2: the client logs the server's answer ("incoming response"), which says
		# it is registered on the live stream; the feed waits for that.
		dg_bg "$vdir/$tag.c$k.log" bash -c 'cd "$1" && shift && exec "$@"' _ "$vdir" \
			timeout -k 5 60 "${asnobody[@]}" "${cenv[@]}" /usr/bin/vlc "${vlcopts[@]}" --verbose=2 \
			"$url" --demux=dump --demuxdump-file="$vdir/$tag.c$k.ts" vlc://quit
		cpids+=("$DG_LAST_PID")
	done
	if [ "$server" = vlc ]; then
		for i in $(seq 200); do
			[ "$(cat "$vdir/$tag".c*.log 2>/dev/null | grep -ac 'incoming response')" -ge "$n" ] && break
			sleep 0.1
		done
		[ "$i" -lt 200 ] || dg_log "$tag: warning: not every client had the server's answer after 20 s"
		touch "$go"
	fi
	for k in $(seq "$n"); do
		wait "${cpids[k - 1]}"
		rc=$?
		[ "$rc" -eq 0 ] || { dg_log "$tag: client $k exit $rc" && ok=0; }
	done
	# The VLC server ends by itself at input EOF; the Python one is told to (exits 0).
	[ "$server" = vlc ] || kill -TERM "$spid" 2>/dev/null
	wait "$spid"
	rc=$?
	[ "$rc" -eq 0 ] || { dg_log "$tag: server exit $rc" && ok=0; }
	for k in $(seq "$n"); do
		local d=$vdir/$tag.c$k.ts
		if [ ! -f "$d" ]; then
			dg_log "$tag: client $k wrote no dump"
			ok=0
		elif ! cmp -s "$media" "$d"; then
			dg_diff_report "$media" "$d"
			dg_log "$tag: client $k's dump ($(stat -c %s "$d") bytes) differs from the media"
			ok=0
		fi
	done
	dg_log "$tag: $n client(s), server $server, preloaded: $who, $(dg_elapsed "$t0") s: $([ $ok -eq 1 ] && echo "all dumps identical to the media" || echo FAILED)"
	if [ $ok -ne 1 ]; then
		dg_tail "$slog"
		for k in $(seq "$n"); do dg_tail "$vdir/$tag.c$k.log" 15; done
		return 1
	fi
}

# The shim's build decides first whether VLC can run it at all (before the native runs): in an
# ASan build VLC may not start at all (skip, exit 77).
vlc_require_shim

# --- native: every dump must equal the media byte for byte, or the setup (not the shim) is broken
run_case native-one 1 native vlc &&
	run_case native-three 3 native vlc &&
	run_case native-pysrv 1 native python ||
	dg_fail "native VLC HTTP run failed (without the shim): environment problem, not the shim"
dg_log "native dumps identical to the media file"

# --- through the shim: every failure is collected, the verdict comes at the end
dg_log "shim: ${DG_SHIM_ENV[*]}"
failed=()
# check TAG WHAT...: records TAG as failed unless the command WHAT succeeds.
check() {
	local tag=$1
	shift
	"$@" || failed+=("$tag")
}
if run_case shim-one 1 shim-both vlc; then
	check "shim-one server: not over RC" dg_check_rc "shim-one server" "$vdir/shim-one.srv.log"
	check "shim-one client: not over RC" dg_check_rc "shim-one client" "$vdir/shim-one.c1.log"
else
	failed+=("shim-one: transfer")
fi
if run_case shim-three 3 shim-both vlc; then
	check "shim-three server: not over RC" dg_check_rc "shim-three server" "$vdir/shim-three.srv.log" 3
	for k in 1 2 3; do
		check "shim-three client $k: not over RC" dg_check_rc "shim-three client $k" "$vdir/shim-three.c$k.log"
	done
else
	failed+=("shim-three: transfer")
fi
if run_case shim-srvonly 1 shim-srv vlc; then
	check "shim-srvonly server: no plain fallback" dg_check_rc_plain "shim-srvonly server (client unmodified)" "$vdir/shim-srvonly.srv.log"
else
	failed+=("shim-srvonly: transfer to an unmodified VLC client")
fi
if run_case shim-pysrv 1 shim-cli python; then
	check "shim-pysrv client: no plain fallback" dg_check_rc_plain "shim-pysrv client (server unmodified)" "$vdir/shim-pysrv.c1.log"
else
	failed+=("shim-pysrv: transfer from an unmodified Python server")
fi
if run_case shim-pyboth 1 shim-both python; then
	check "shim-pyboth server: not over RC" dg_check_rc "shim-pyboth Python server" "$vdir/shim-pyboth.srv.log"
	check "shim-pyboth client: not over RC" dg_check_rc "shim-pyboth client" "$vdir/shim-pyboth.c1.log"
else
	failed+=("shim-pyboth: transfer from a preloaded Python server")
fi
if [ ${#failed[@]} -ne 0 ]; then
	dg_fail "VLC over HTTP with the shim: $(IFS=';'; echo "${failed[*]}" | sed 's/;/; /g')"
fi
dg_log "PASS ($(dg_elapsed "$t_start") s)"
