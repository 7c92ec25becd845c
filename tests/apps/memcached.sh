#!/usr/bin/env bash
# memcached.sh BUILD_DIR BASE_PORT: memcached (as nobody, 2 threads) listening on TCP and UDP
# 127.0.0.1:BASE_PORT; natively, then with memcached and its clients all preloaded. A run passes
# when
#   - over TCP, memc_client.py SETs 1000 random values (1 B - 32 KiB), GETs each back and in
#     multi-key GETs of 50, all byte-exact;
#   - over UDP (memcached's 8-byte frame header), memc_client.py SETs 1000 values (1-1000 B) and
#     GETs each back byte-exact, every answer carrying the request's id, none lost;
#   - memcslap (TCP, 2 threads) loads and gets 10 000 keys and exits 0;
#   - memcached exits 0 on SIGTERM (it catches it and exits normally);
#   - preloaded: over TCP the clients' and memcached's exit summaries say the connections were
#     carried over RC (rc_conns > 0, rc_plain = 0); over UDP the client's and memcached's say
#     every datagram was framed both ways (tx/rx_framed > 0, tx/rx_plain = 0).
# Prints the ratios preloaded/native of the clients' requests/s (TCP, UDP) and memcslap's get.
# Exit 0 pass, 1 fail, 77 only if memcached or libmemcached-tools cannot be installed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=apps_lib.sh
. "$here/apps_lib.sh"
apps_init memcached "$@"
apps_need memcached memcached
apps_need memcslap libmemcached-tools
apps_need /usr/bin/python3 python3
port=$DG_PORT
client=$here/memc_client.py

declare -A R

# run_case TAG ENV...: memcached and the three clients, all with ENV. Fills R[TAG:tcp] etc.
run_case() {
	local tag=$1 d mpid user=() m
	shift
	d=$DG_TMP/$tag
	mkdir -p "$d"
	apps_check_port_free tcp "$port"
	apps_check_port_free udp "$port"
	[ "$(id -u)" = 0 ] && user=(-u nobody)
	dg_bg "$d/server.log" env "$@" memcached "${user[@]}" -m 128 -t 2 -l 127.0.0.1 -p "$port" -U "$port"
	mpid=$DG_LAST_PID
	if ! dg_wait_tcp "$port" 15 "$mpid" || ! dg_wait_udp "$port" 5 "$mpid"; then
		dg_tail "$d/server.log"
		apps_bad "$tag: memcached did not listen on TCP and UDP $port"
		return
	fi
	for m in tcp udp; do
		if env "$@" timeout -k 5 60 /usr/bin/python3 "$client" "$m" 127.0.0.1 "$port" 1000 "$((${#tag} + ${#m}))" \
			>"$d/$m.log" 2>&1; then
			R[$tag:$m]=$(awk '/^ops\/s/ { print $2 }' "$d/$m.log")
		else
			dg_tail "$d/$m.log" 10
			apps_bad "$tag: memcached over $m: answers not exact"
		fi
	done
	if env "$@" timeout -k 5 60 memcslap -s "127.0.0.1:$port" -c 2 -e 5000 -t get >"$d/slap.log" 2>&1; then
		# "Time to get 10000 keys by 2 threads: 0.105 seconds."
		R[$tag:slap]=$(awk '/^Time to get/ { printf "%.0f", $4 / $(NF - 1) }' "$d/slap.log")
	else
		dg_tail "$d/slap.log" 10
		apps_bad "$tag: memcslap failed"
	fi
	kill -TERM "$mpid"
	apps_server_end "$tag" memcached "$mpid" "$d/server.log" SIGTERM
	dg_log "$tag: TCP ${R[$tag:tcp]:--} UDP ${R[$tag:udp]:--} requests/s, memcslap get ${R[$tag:slap]:--} keys/s"
}

dg_log "shim: ${DG_SHIM_ENV[*]}"
run_case native
for f in server tcp udp slap; do apps_native_clean "$DG_TMP/native/$f.log"; done
run_case shim "${DG_SHIM_ENV[@]}"
d=$DG_TMP/shim
apps_check_rc "memcached" "$d/server.log" 2
apps_check_udp "memcached (UDP)" "$d/server.log" tx rx
apps_check_rc "client (TCP)" "$d/tcp.log"
apps_check_udp "client (UDP)" "$d/udp.log" tx rx
apps_check_rc "memcslap" "$d/slap.log"
apps_ratio "client TCP" req/s "${R[native:tcp]:--}" "${R[shim:tcp]:--}"
apps_ratio "client UDP" req/s "${R[native:udp]:--}" "${R[shim:udp]:--}"
apps_ratio "memcslap get" keys/s "${R[native:slap]:--}" "${R[shim:slap]:--}"
apps_finish
