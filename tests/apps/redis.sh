#!/usr/bin/env bash
# redis.sh BUILD_DIR BASE_PORT: redis-server on 127.0.0.1:BASE_PORT with redis-benchmark and
# redis-cli as clients; natively, then with server and clients all preloaded. A run passes when
#   - redis-cli SETs a 1 MiB random binary value (-x, from stdin) and GETs it back with the same
#     sha256, and DBSIZE then answers 1;
#   - redis-benchmark SET and GET (10 clients), without pipelining (-P 1) and with 16 commands
#     per round trip (-P 16), completes and reports requests/s for each;
#   - redis-server exits 0 on SHUTDOWN NOSAVE;
#   - preloaded: the exit summaries of redis-server, redis-benchmark and redis-cli say their TCP
#     connections were carried over RC (rc_conns > 0, rc_plain = 0).
# Prints the ratios preloaded/native of the requests/s of each benchmark.
# Exit 0 pass, 1 fail, 77 only if redis cannot be installed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=apps_lib.sh
. "$here/apps_lib.sh"
apps_init redis "$@"
apps_need redis-server redis-server
apps_need redis-benchmark redis-tools
apps_need redis-cli redis-tools
port=$DG_PORT

head -c 1M /dev/urandom >"$DG_TMP/value.bin"
vsha=$(apps_sha "$DG_TMP/value.bin")

declare -A RPS

# run_case TAG ENV...: one redis-server, the 1 MiB check and the benchmarks, all with ENV.
# Fills RPS[TAG:SET:P1] etc.
run_case() {
	local tag=$1 d spid p t v
	shift
	d=$DG_TMP/$tag
	mkdir -p "$d"
	apps_check_port_free tcp "$port"
	# No persistence, no protected mode: the server lives only for this run.
	dg_bg "$d/server.log" env "$@" redis-server --port "$port" --bind 127.0.0.1 --save '' \
		--appendonly no --dir "$d" --daemonize no --protected-mode no --loglevel notice
	spid=$DG_LAST_PID
	if ! dg_wait_tcp "$port" 15 "$spid"; then
		dg_tail "$d/server.log"
		apps_bad "$tag: redis-server did not listen on $port"
		return
	fi
	# redis-cli prints a bulk reply raw (stdout not a terminal) followed by one newline.
	if env "$@" redis-cli -p "$port" -x SET big <"$DG_TMP/value.bin" >"$d/set.out" 2>"$d/cli.log" &&
		env "$@" redis-cli -p "$port" GET big >"$d/get.out" 2>>"$d/cli.log"; then
		grep -qx OK "$d/set.out" || apps_bad "$tag: SET answered '$(head -c 80 "$d/set.out")'"
		v=$(head -c -1 "$d/get.out" | sha256sum | cut -d' ' -f1)
		[ "$v" = "$vsha" ] ||
			apps_bad "$tag: GET of the 1 MiB value: $(stat -c %s "$d/get.out") bytes, sha256 $v, expected $vsha"
		t=$(env "$@" redis-cli -p "$port" DBSIZE 2>>"$d/cli.log")
		[ "$t" = 1 ] || apps_bad "$tag: DBSIZE answered '$t', expected 1"
	else
		dg_tail "$d/cli.log"
		apps_bad "$tag: redis-cli SET/GET of the 1 MiB value failed"
	fi
	for p in 1 16; do
		if env "$@" timeout -k 5 60 redis-benchmark -p "$port" -c 10 -n $((p == 1 ? 50000 : 200000)) \
			-P "$p" -t set,get --csv >"$d/bench-P$p.csv" 2>"$d/bench-P$p.log"; then
			for t in SET GET; do
				v=$(awk -F'"' -v t="$t" '$2 == t { print $4 }' "$d/bench-P$p.csv")
				if [[ $v =~ ^[0-9.]+$ ]]; then
					RPS[$tag:$t:P$p]=$v
				else
					apps_bad "$tag: redis-benchmark -P $p reported no $t rate"
				fi
			done
		else
			dg_tail "$d/bench-P$p.log"
			apps_bad "$tag: redis-benchmark -P $p failed"
		fi
	done
	env "$@" redis-cli -p "$port" SHUTDOWN NOSAVE >"$d/shutdown.out" 2>>"$d/cli.log"
	apps_server_end "$tag" redis-server "$spid" "$d/server.log" "SHUTDOWN NOSAVE"
	dg_log "$tag: SET/GET -P1 ${RPS[$tag:SET:P1]:--}/${RPS[$tag:GET:P1]:--} -P16 ${RPS[$tag:SET:P16]:--}/${RPS[$tag:GET:P16]:--} requests/s"
}

dg_log "1 MiB value sha256 $vsha; shim: ${DG_SHIM_ENV[*]}"
run_case native
for f in server.log cli.log bench-P1.log bench-P16.log; do apps_native_clean "$DG_TMP/native/$f"; done
run_case shim "${DG_SHIM_ENV[@]}"
apps_check_rc "redis-server" "$DG_TMP/shim/server.log"
apps_check_rc "redis-cli" "$DG_TMP/shim/cli.log" 3
apps_check_rc "redis-benchmark -P 1" "$DG_TMP/shim/bench-P1.log"
apps_check_rc "redis-benchmark -P 16" "$DG_TMP/shim/bench-P16.log"
for p in P1 P16; do
	for t in SET GET; do
		apps_ratio "$t -$p" req/s "${RPS[native:$t:$p]:--}" "${RPS[shim:$t:$p]:--}"
	done
done
apps_finish
