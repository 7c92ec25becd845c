#!/usr/bin/env bash
# vlc_http.sh BUILD_DIR BASE_PORT: tests/integration/vlc_http.sh between two hosts (netns.sh):
# VLC serves the test media (vlc_lib.sh) over HTTP on host a (10.77.0.1:BASE_PORT, its http
# access output fed through a pipe, paced as in the one-host test) to a VLC client on host b that
# dumps the body; or an unmodified Python http.server on host a (BASE_PORT+1) serves the file.
# NO rules (discovery across hosts decides). Cases, each captured on the veth (capture.sh):
#   native     nothing preloaded, VLC server: the dump must equal the media (the test bed)
#   shim       both preloaded: the dump equals the media; dg_check_rc on both (carried over RC);
#              the capture shows the MPA Request and Reply
#   srvonly    the VLC server preloaded, the client unmodified: the dump equals the media, the
#              server fell back to plain TCP (dg_check_rc_plain), no MPA byte to or from host b
#   pysrv      an unmodified Python server, the VLC client preloaded: the same the other way
# Discovery: the client's connect waits at most 10 ms for host a's answer (docs/shim.md); a
# "shim" run whose client went plain only for that runs again (at most 3 times), said so.
# Exit 77 where VLC cannot run (not installable; an ASan build VLC cannot start: vlc_lib.sh).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../integration/lib.sh
. "$here/../integration/lib.sh"
# shellcheck source=../integration/vlc_lib.sh
. "$here/../integration/vlc_lib.sh"
# shellcheck source=netns.sh
. "$here/netns.sh"
# shellcheck source=capture.sh
. "$here/capture.sh"
dg_init twohost_vlc_http "$@"
port=$DG_PORT
pyport=$((DG_PORT + 1))
t_start=$(date +%s.%N)
vlc_init www
vlc_modules 'demuxdump  *File dumper' 'http  *HTTP stream output' 'access  *HTTPS input'
media=$vdir/www/media.ts
vlc_media "$media"
dg_log "media $msize bytes md5 $(md5sum <"$media" | cut -d' ' -f1)"
vlc_require_shim
cap_need
th_up
DG_SS=(ip netns exec "$TH_NS_A" ss)
DG_WAIT_IP=$TH_A_IP

# feed FILE GOFILE: as in the one-host test (the first 1880 bytes, GOFILE, then 16 KiB / 20 ms).
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

serve() {
	feed "$media" "$go" | (cd "$vdir" && exec ip netns exec "$TH_NS_A" timeout -k 5 60 "${asnobody[@]}" "$@" \
		/usr/bin/vlc "${vlcopts[@]}" - --demux=dump --demuxdump-access=http \
		--demuxdump-file="$TH_A_IP:$port/x.ts" vlc://quit)
}

# run_case TAG SERVER SENV CENV: SERVER vlc or python on host a with the words of the array
# named SENV, one VLC client on host b with CENV's; dump $vdir/TAG.ts, logs $vdir/TAG.{srv,cli}.log
run_case() {
	local tag=$1 server=$2 spid cpid rc ok=1 url i
	local -n senv=$3 cenv=$4
	local slog=$vdir/$tag.srv.log clog=$vdir/$tag.cli.log dump=$vdir/$tag.ts
	go=$vdir/$tag.go
	rm -f "$dump" "$go"
	if [ "$server" = vlc ]; then
		url=http://$TH_A_IP:$port/x.ts
		dg_bg "$slog" serve "${senv[@]}"
		spid=$DG_LAST_PID
		dg_wait_tcp "$port" 20 "$spid"
	else
		url=http://$TH_A_IP:$pyport/media.ts
		th_bg a "$slog" timeout -k 5 60 env "${senv[@]}" python3 -c '
import functools, http.server, signal, sys
def stop(*a):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[3])
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), h).serve_forever()
' "$TH_A_IP" "$pyport" "$vdir/www"
		spid=$TH_LAST_PID
		dg_wait_tcp "$pyport" 20 "$spid"
	fi
	case $? in
	1) dg_log "$tag: server not listening after 20 s" && return 1 ;;
	2) dg_log "$tag: server exited before listening" && dg_tail "$slog" && return 1 ;;
	esac
	th_bg b "$clog" bash -c 'cd "$1" && shift && exec "$@"' _ "$vdir" \
		timeout -k 5 60 "${asnobody[@]}" "${cenv[@]}" /usr/bin/vlc "${vlcopts[@]}" --verbose=2 \
		"$url" --demux=dump --demuxdump-file="$dump" vlc://quit
	cpid=$TH_LAST_PID
	if [ "$server" = vlc ]; then
		for i in $(seq 200); do
			grep -aq 'incoming response' "$clog" 2>/dev/null && break
			sleep 0.1
		done
		[ "$i" -lt 200 ] || dg_log "$tag: warning: the client had no answer from the server after 20 s"
		touch "$go"
	fi
	wait "$cpid"
	rc=$?
	[ "$rc" -eq 0 ] || { dg_log "$tag: client exit $rc" && ok=0; }
	[ "$server" = vlc ] || kill -TERM "$spid" 2>/dev/null
	wait "$spid"
	rc=$?
	[ "$rc" -eq 0 ] || { dg_log "$tag: server exit $rc" && ok=0; }
	if [ ! -f "$dump" ]; then
		dg_log "$tag: the client wrote no dump"
		ok=0
	elif ! cmp -s "$media" "$dump"; then
		dg_diff_report "$media" "$dump"
		dg_log "$tag: the dump ($(stat -c %s "$dump") bytes) differs from the media"
		ok=0
	fi
	dg_log "$tag: server $server: $([ $ok -eq 1 ] && echo "dump identical to the media" || echo FAILED)"
	if [ $ok -ne 1 ]; then
		dg_tail "$slog"
		dg_tail "$clog" 15
		return 1
	fi
}

# shellcheck disable=SC2034 # used through namerefs (run_case)
none=()
# shellcheck disable=SC2034
shim=("${DG_SHIM_ENV[@]}")
cap_start native
run_case native vlc none none || dg_fail "native VLC HTTP run between the hosts failed: the test bed, not the shim"
cap_stop
cap_check native --plain-host "$TH_A_IP" --plain-host "$TH_B_IP" || dg_fail "native: MPA bytes without the shim?"
dg_log "shim: ${DG_SHIM_ENV[*]}"
failed=()
# shim_case TAG SERVER SENV CENV WHO
shim_case() {
	local tag=$1 who=$5 try
	for try in 1 2 3; do
		cap_start "$tag"
		if ! run_case "$@"; then
			cap_stop
			failed+=("$tag: transfer failed")
			return
		fi
		cap_stop
		if [ "$who" = both ] && [ "$try" -lt 3 ] && [ "$(dg_sum "$vdir/$tag.cli.log" rc_conns)" -eq 0 ]; then
			dg_log "$tag: run $try: the client's connection went plain (host a's discovery answer came after 10 ms?): again"
			continue
		fi
		break
	done
	case $who in
	both)
		dg_check_rc "$tag server" "$vdir/$tag.srv.log" || failed+=("$tag server: not over RC")
		dg_check_rc "$tag client" "$vdir/$tag.cli.log" || failed+=("$tag client: not over RC")
		cap_check "$tag" --want-mpa 2 || failed+=("$tag: the capture shows no MPA exchange")
		;;
	server)
		dg_check_rc_plain "$tag server (client unmodified)" "$vdir/$tag.srv.log" || failed+=("$tag server: no plain fallback")
		cap_check "$tag" --plain-host "$TH_B_IP" --min-seen 2 || failed+=("$tag: iWARP bytes reached the unmodified client")
		;;
	client)
		dg_check_rc_plain "$tag client (server unmodified)" "$vdir/$tag.cli.log" || failed+=("$tag client: no plain fallback")
		cap_check "$tag" --plain-host "$TH_A_IP" --min-seen 2 || failed+=("$tag: iWARP bytes reached the unmodified server")
		;;
	esac
}
shim_case shim vlc shim shim both
shim_case srvonly vlc shim none server
shim_case pysrv python none shim client
if [ ${#failed[@]} -ne 0 ]; then
	dg_fail "$(IFS=';'; echo "${failed[*]}" | sed 's/;/; /g')"
fi
dg_log "PASS ($(dg_elapsed "$t_start") s)"
