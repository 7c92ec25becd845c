#!/usr/bin/env bash
# nginx.sh BUILD_DIR BASE_PORT: nginx serves a 50 MB random file and a small page on
# 127.0.0.1:BASE_PORT in four setups: sendfile on and off, each with one process
# (master_process off) and with a master and two workers (master_process on: the listener is
# made by the master and shared by the forked workers, which accept on it). Each setup runs
# natively, then with nginx, curl and wrk all preloaded. Each run passes when
#   - curl fetched the 50 MB file with the same sha256 as the file on disk, and the small page
#     byte for byte;
#   - wrk (1 thread, 4 keep-alive connections, 2 s) completed requests with no socket error and
#     no non-2xx answer;
#   - nginx logged no [alert], [crit] or [emerg] line and quit (nginx -s quit) within 10 s;
#   - preloaded: curl's, wrk's and nginx's exit summaries say their TCP connections were carried
#     over RC (rc_conns > 0, rc_plain = 0; nginx's summed over its workers).
# Last, one setup (sendfile on, one process) preloaded with DGSHIM_MODE=off: the same checks
# must pass and nothing may be carried (rc_conns = 0).
# Prints the ratios preloaded/native of wrk requests/s and of curl's 50 MB download speed.
# Exit 0 pass, 1 fail, 77 only if nginx, curl or wrk cannot be installed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=apps_lib.sh
. "$here/apps_lib.sh"
apps_init nginx "$@"
apps_need nginx nginx-light
apps_need curl curl
apps_need wrk wrk
apps_asan_starts curl --version
port=$DG_PORT

www=$DG_TMP/www
mkdir -p "$www"
head -c 50M /dev/urandom >"$www/big.bin"
# A small page: wrk's requests are dominated by the request path, not by the copy.
head -c 3000 /dev/urandom | base64 >"$www/index.html"
chmod -R a+rX "$www"
big_sha=$(apps_sha "$www/big.bin")
dg_log "50 MB file sha256 $big_sha"

# nginx_conf DIR SENDFILE WORKERS: nginx.conf for one run in DIR (nginx's prefix: pid, temp).
nginx_conf() {
	local d=$1 sf=$2 w=$3 master=off user=
	[ "$w" -gt 1 ] && master=on
	# Run as root, nginx switches its workers to nobody (which must read the shim and www).
	[ "$(id -u)" = 0 ] && user="user nobody nogroup;"
	mkdir -p "$d/tmp"
	cat >"$d/nginx.conf" <<-EOF
		daemon off;
		master_process $master;
		worker_processes $w;
		$user
		pid $d/nginx.pid;
		error_log stderr notice;
		events { worker_connections 256; }
		http {
			access_log off;
			sendfile $sf;
			keepalive_requests 1000000;
			default_type application/octet-stream;
			client_body_temp_path $d/tmp/body;
			proxy_temp_path $d/tmp/proxy;
			fastcgi_temp_path $d/tmp/fastcgi;
			server {
				listen 127.0.0.1:$port;
				root $www;
			}
		}
	EOF
	chmod -R a+rX "$d"
}

# run_case TAG SENDFILE WORKERS ENV...: one nginx with curl and wrk against it, all with ENV
# (NAME=VALUE words; none for native). Sets rps and speed (wrk requests/s, curl bytes/s).
run_case() {
	local tag=$1 sf=$2 w=$3 d npid rc
	shift 3
	d=$DG_TMP/$tag
	mkdir -p "$d"
	rps=-
	speed=-
	nginx_conf "$d" "$sf" "$w"
	apps_check_port_free tcp "$port"
	dg_bg "$d/nginx.log" env "$@" nginx -p "$d" -c "$d/nginx.conf" -e stderr
	npid=$DG_LAST_PID
	if ! dg_wait_tcp "$port" 15 "$npid"; then
		dg_tail "$d/nginx.log"
		apps_bad "$tag: nginx did not listen on $port"
		return
	fi
	if env "$@" curl -sS --max-time 30 -o "$d/big.out" -w '%{speed_download}\n' \
		"http://127.0.0.1:$port/big.bin" >"$d/curl.out" 2>"$d/curl.log"; then
		speed=$(tail -n 1 "$d/curl.out")
		[ "$(apps_sha "$d/big.out")" = "$big_sha" ] ||
			apps_bad "$tag: 50 MB file fetched by curl differs ($(stat -c %s "$d/big.out") bytes, sha256 $(apps_sha "$d/big.out"))"
	else
		dg_tail "$d/curl.log"
		apps_bad "$tag: curl of the 50 MB file failed"
	fi
	if env "$@" curl -sS --max-time 10 -o "$d/index.out" "http://127.0.0.1:$port/index.html" \
		2>"$d/curl2.log"; then
		cmp -s "$d/index.out" "$www/index.html" || apps_bad "$tag: small page fetched by curl differs"
	else
		dg_tail "$d/curl2.log"
		apps_bad "$tag: curl of the small page failed"
	fi
	if env "$@" timeout -k 5 20 wrk -t1 -c4 -d2s "http://127.0.0.1:$port/index.html" >"$d/wrk.log" 2>&1; then
		rps=$(awk '/^Requests\/sec:/ { print $2 }' "$d/wrk.log")
		if grep -qE 'Socket errors|Non-2xx' "$d/wrk.log"; then
			dg_tail "$d/wrk.log" 12
			apps_bad "$tag: wrk saw errors"
		fi
		awk '/requests in/ { exit !($1 > 0) }' "$d/wrk.log" || apps_bad "$tag: wrk completed no request"
	else
		dg_tail "$d/wrk.log"
		apps_bad "$tag: wrk failed"
	fi
	nginx -p "$d" -c "$d/nginx.conf" -s quit 2>>"$d/quit.log"
	if ! apps_wait_gone "$npid" 10; then
		apps_bad "$tag: nginx did not quit within 10 s of 'nginx -s quit'"
		dg_kill_tree "$npid"
	fi
	wait "$npid" 2>/dev/null
	rc=$?
	[ "$rc" -eq 0 ] || apps_bad "$tag: nginx exited $rc"
	if grep -aE '\[(alert|crit|emerg)\]' "$d/nginx.log" >"$d/nginx.bad"; then
		head -n 5 "$d/nginx.bad" | cut -c1-300 | sed 's/^/    | /'
		apps_bad "$tag: nginx logged $(wc -l <"$d/nginx.bad") alert/crit/emerg line(s)"
	fi
	dg_log "$tag: wrk $rps requests/s, curl 50 MB at $speed bytes/s"
}

dg_log "shim: ${DG_SHIM_ENV[*]}"
for c in "on 1" "off 1" "on 2" "off 2"; do
	read -r sf w <<<"$c"
	name=sendfile-$sf-w$w
	run_case "native-$name" "$sf" "$w"
	for f in nginx curl wrk; do apps_native_clean "$DG_TMP/native-$name/$f.log"; done
	n_rps=$rps n_speed=$speed
	run_case "shim-$name" "$sf" "$w" "${DG_SHIM_ENV[@]}"
	d=$DG_TMP/shim-$name
	apps_check_rc "shim-$name nginx" "$d/nginx.log"
	apps_check_rc "shim-$name curl" "$d/curl.log"
	apps_check_rc "shim-$name wrk" "$d/wrk.log"
	apps_ratio "$name wrk" req/s "$n_rps" "$rps"
	apps_ratio "$name curl 50MB" B/s "$n_speed" "$speed"
done
# Preloaded with DGSHIM_MODE=off the shim carries nothing: nginx must behave exactly as natively
# (promise 1: invisible where it carries nothing), and no connection may be carried.
off_env=("${DG_SHIM_ENV[@]/DGSHIM_MODE=*/DGSHIM_MODE=off}")
run_case "mode-off-sendfile-on-w1" on 1 "${off_env[@]}"
for f in nginx curl wrk; do
	c=$(apps_sum "$DG_TMP/mode-off-sendfile-on-w1/$f.log" rc_conns)
	[ "$c" -eq 0 ] || apps_bad "mode-off $f: rc_conns=$c with DGSHIM_MODE=off"
done
apps_finish
