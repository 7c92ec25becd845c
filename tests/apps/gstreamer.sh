#!/usr/bin/env bash
# gstreamer.sh BUILD_DIR BASE_PORT: GStreamer RTP over UDP on 127.0.0.1, two streams:
#   - audio: audiotestsrc (100 buffers of 10 ms, S16BE mono 44.1 kHz) ! rtpL16pay ! udpsink to
#     BASE_PORT -> udpsrc ! rtpL16depay ! filesink;
#   - video: videotestsrc (50 frames of 320x240 I420 at 25 fps: ~80 datagrams per frame, sent
#     at once) ! rtpvrawpay ! udpsink to BASE_PORT+1 -> udpsrc ! rtpvrawdepay ! filesink.
# The senders pace in real time (udpsink sync). Natively, then with sender and receiver
# preloaded. A run passes when the receiver's file equals byte for byte the reference (the same
# test source written straight to a file: 88 200 bytes of audio, 5 760 000 of video), both
# gst-launch processes exit 0 (the receiver on SIGINT with -e: EOS, then a normal exit), and
# preloaded the sender's summary shows its datagrams framed (tx_framed > 0, tx_plain = 0) and
# the receiver's (rx_framed > 0, rx_plain = 0).
# Prints the count of bytes received preloaded/native (1.00 when nothing was lost).
# Exit 0 pass, 1 fail, 77 only if GStreamer cannot be installed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=apps_lib.sh
. "$here/apps_lib.sh"
apps_init gstreamer "$@"
apps_need gst-launch-1.0 gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good
for e in audiotestsrc videotestsrc udpsrc udpsink rtpL16pay rtpL16depay rtpvrawpay rtpvrawdepay; do
	gst-inspect-1.0 "$e" >/dev/null 2>&1 ||
		dg_fail "GStreamer element $e missing (gstreamer1.0-plugins-base / -good)"
done
port=$DG_PORT
acaps='audio/x-raw,format=S16BE,rate=44100,channels=1'
vcaps='video/x-raw,format=I420,width=320,height=240,framerate=25/1'
asrc=(audiotestsrc num-buffers=100 samplesperbuffer=441 ! "$acaps")
vsrc=(videotestsrc num-buffers=50 ! "$vcaps")
artp='application/x-rtp,media=audio,clock-rate=44100,encoding-name=L16,channels=1,payload=96'
vrtp='application/x-rtp,media=video,clock-rate=90000,encoding-name=RAW,sampling=YCbCr-4:2:0,depth=(string)8,width=(string)320,height=(string)240,payload=96'
gst-launch-1.0 -q "${asrc[@]}" ! filesink location="$DG_TMP/audio.ref" >/dev/null 2>&1 || dg_fail "audio reference failed"
gst-launch-1.0 -q "${vsrc[@]}" ! filesink location="$DG_TMP/video.ref" >/dev/null 2>&1 || dg_fail "video reference failed"
declare -A R

# stream TAG KIND PORT ENV...: KIND audio or video. Fills R[TAG:KIND] (bytes received).
stream() {
	local tag=$1 kind=$2 p=$3 d rpid rc src pay depay rtp
	shift 3
	d=$DG_TMP/$tag
	mkdir -p "$d"
	if [ "$kind" = audio ]; then
		local src=("${asrc[@]}")
		pay=rtpL16pay depay=rtpL16depay rtp=$artp
	else
		local src=("${vsrc[@]}")
		pay=rtpvrawpay depay=rtpvrawdepay rtp=$vrtp
	fi
	apps_check_port_free udp "$p"
	dg_bg "$d/$kind-recv.log" env "$@" gst-launch-1.0 -q -e udpsrc address=127.0.0.1 port="$p" caps="$rtp" \
		! "$depay" ! filesink location="$d/$kind.raw"
	rpid=$DG_LAST_PID
	dg_wait_udp "$p" 10 "$rpid" || { dg_tail "$d/$kind-recv.log"; apps_bad "$tag: $kind receiver did not bind"; return; }
	env "$@" timeout -k 5 60 gst-launch-1.0 -q "${src[@]}" ! "$pay" ! udpsink host=127.0.0.1 port="$p" \
		>"$d/$kind-send.log" 2>&1
	src=$?
	sleep 0.5
	kill -INT "$rpid"
	apps_wait_gone "$rpid" 10 || { apps_bad "$tag: $kind receiver still running 10 s after SIGINT"; dg_kill_tree "$rpid"; }
	wait "$rpid"
	rc=$?
	[ "$src" -eq 0 ] || { dg_tail "$d/$kind-send.log" 8; apps_bad "$tag: $kind sender exited $src"; }
	[ "$rc" -eq 0 ] || { dg_tail "$d/$kind-recv.log" 8; apps_bad "$tag: $kind receiver exited $rc"; }
	R[$tag:$kind]=$(stat -c %s "$d/$kind.raw" 2>/dev/null || echo 0)
	if cmp -s "$d/$kind.raw" "$DG_TMP/$kind.ref"; then
		dg_log "$tag: $kind: ${R[$tag:$kind]} bytes, identical to the reference"
	else
		dg_diff_report "$DG_TMP/$kind.ref" "$d/$kind.raw"
		apps_bad "$tag: $kind received differs from the reference (${R[$tag:$kind]} of $(stat -c %s "$DG_TMP/$kind.ref") bytes)"
	fi
}

dg_log "shim: ${DG_SHIM_ENV[*]}"
for tag in native shim; do
	env_words=()
	[ "$tag" = shim ] && env_words=("${DG_SHIM_ENV[@]}")
	stream "$tag" audio "$port" "${env_words[@]}"
	stream "$tag" video $((port + 1)) "${env_words[@]}"
done
for f in audio-send audio-recv video-send video-recv; do apps_native_clean "$DG_TMP/native/$f.log"; done
for k in audio video; do
	apps_check_udp "$k sender" "$DG_TMP/shim/$k-send.log" tx
	apps_check_udp "$k receiver" "$DG_TMP/shim/$k-recv.log" rx
	apps_ratio "$k bytes received" bytes "${R[native:$k]:--}" "${R[shim:$k]:--}"
done
apps_finish
