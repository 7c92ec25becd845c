#!/usr/bin/env bash
# postgresql.sh BUILD_DIR BASE_PORT: a PostgreSQL cluster made with initdb in the test's temp
# dir (as the postgres user, trust authentication, fsync off), listening on 127.0.0.1:BASE_PORT
# and on a unix socket in the temp dir; psql and pgbench connect over TCP. PostgreSQL forks a
# backend per connection after accept (accept-then-fork): the connection the postmaster
# accepted is served by the child. Natively, then with the server and its clients preloaded.
# A run passes when
#   - pgbench -i (scale 1) loads the tables, then pgbench runs 4 clients for 3 s, and 2 clients
#     with a new connection per transaction (-C) for 2 s, all without a failed transaction;
#   - psql then answers exactly: count(*) of pgbench_accounts = 100000, and the bank stays
#     balanced: sum(abalance) of accounts = sum(delta) of history = sum(bbalance) of branches;
#   - a 20 MB result (20 000 rows of 32 x md5) fetched by psql has the same sha256 as natively;
#   - the postmaster exits 0 on pg_ctl stop -m fast;
#   - preloaded: psql's, pgbench's and the server's exit summaries say the TCP connections were
#     carried over RC (rc_conns > 0, rc_plain = 0).
# Prints the ratios preloaded/native of pgbench's tps (and with -C).
# Exit 0 pass, 1 fail, 77 only if PostgreSQL cannot be installed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=apps_lib.sh
. "$here/apps_lib.sh"
apps_init postgresql "$@"
apps_need psql postgresql-client
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$pgbin" ] && [ -x "$pgbin/postgres" ] || { apps_need /usr/lib/postgresql postgresql; pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1); }
[ -x "$pgbin/pgbench" ] || dg_fail "$pgbin/pgbench missing (postgresql-contrib / postgresql)"
apps_asan_starts "$pgbin/postgres" --version
id postgres >/dev/null 2>&1 || dg_fail "user postgres does not exist (the postgresql package makes it)"
port=$DG_PORT
aspg=(setpriv --reuid=postgres --regid=postgres --clear-groups env "HOME=$DG_TMP")
conn=(-h 127.0.0.1 -p "$port" -U postgres)
bigq="select repeat(md5(i::text), 32) from generate_series(1, 20000) i"

declare -A TPS

# pgbench_run TAG NAME ARGS...: one pgbench run with ENV from run_case (in $env_words).
pgbench_run() {
	local tag=$1 name=$2 d=$DG_TMP/$1
	shift 2
	if env "${env_words[@]}" timeout -k 5 60 "$pgbin/pgbench" "${conn[@]}" "$@" postgres \
		>"$d/pgbench-$name.out" 2>"$d/pgbench-$name.log"; then
		TPS[$tag:$name]=$(awk '/^tps = / { print $3; exit }' "$d/pgbench-$name.out")
		[ "$name" = init ] || grep -q '^number of failed transactions: 0 ' "$d/pgbench-$name.out" ||
			apps_bad "$tag: pgbench $name: $(grep -m1 'failed transactions' "$d/pgbench-$name.out")"
	else
		dg_tail "$d/pgbench-$name.out" 10
		dg_tail "$d/pgbench-$name.log" 10
		apps_bad "$tag: pgbench $name failed"
	fi
}

# q TAG SQL: psql's unaligned answer to SQL (with ENV from run_case).
q() {
	env "${env_words[@]}" timeout -k 5 30 psql "${conn[@]}" -X -At -c "$2" postgres 2>>"$DG_TMP/$1/psql.log"
}

# run_case TAG ENV...: a fresh cluster, the server started with ENV, the clients with ENV.
run_case() {
	local tag=$1 d ppid rc a b c
	shift
	env_words=("$@")
	d=$DG_TMP/$tag
	mkdir -p "$d/sock"
	chown -R postgres:postgres "$d"
	apps_check_port_free tcp "$port"
	if ! (cd "$d" && "${aspg[@]}" "$pgbin/initdb" -D "$d/data" -A trust -U postgres --no-sync -E UTF8 \
		>"$d/initdb.log" 2>&1); then
		dg_tail "$d/initdb.log"
		dg_fail "$tag: initdb failed (without the shim)"
	fi
	dg_bg "$d/server.log" bash -c 'cd "$1" && shift && exec "$@"' _ "$d" "${aspg[@]}" "$@" "$pgbin/postgres" \
		-D "$d/data" -p "$port" -c listen_addresses=127.0.0.1 -c "unix_socket_directories=$d/sock" \
		-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=30
	ppid=$DG_LAST_PID
	if ! dg_wait_tcp "$port" 20 "$ppid"; then
		dg_tail "$d/server.log"
		apps_bad "$tag: postgres did not listen on $port"
		return
	fi
	pgbench_run "$tag" init -i -s 1 -q
	# -n: no vacuum, which would also truncate pgbench_history (kept for the balance check).
	pgbench_run "$tag" c4 -n -c 4 -j 2 -T 3
	pgbench_run "$tag" C -n -C -c 2 -j 2 -T 2
	a=$(q "$tag" "select count(*) from pgbench_accounts")
	[ "$a" = 100000 ] || apps_bad "$tag: count(*) of pgbench_accounts = '$a', expected 100000"
	a=$(q "$tag" "select sum(abalance) from pgbench_accounts")
	b=$(q "$tag" "select coalesce(sum(delta), 0) from pgbench_history")
	c=$(q "$tag" "select sum(bbalance) from pgbench_branches")
	dg_log "$tag: sum(abalance)=$a sum(delta)=$b sum(bbalance)=$c"
	if ! [[ $a =~ ^-?[0-9]+$ ]] || [ "$a" != "$b" ] || [ "$a" != "$c" ]; then
		apps_bad "$tag: the pgbench bank does not balance (accounts '$a', history '$b', branches '$c')"
	fi
	env "${env_words[@]}" timeout -k 5 60 psql "${conn[@]}" -X -At -c "$bigq" postgres >"$d/big.out" 2>>"$d/psql.log" ||
		apps_bad "$tag: psql of the 20 MB result failed"
	bigsha[$tag]=$(apps_sha "$d/big.out")
	dg_log "$tag: 20 MB result $(stat -c %s "$d/big.out") bytes sha256 ${bigsha[$tag]}"
	"${aspg[@]}" "$pgbin/pg_ctl" stop -D "$d/data" -m fast -t 20 >"$d/stop.log" 2>&1 || dg_tail "$d/stop.log"
	apps_wait_gone "$ppid" 10 || { apps_bad "$tag: postgres still running after pg_ctl stop"; dg_kill_tree "$ppid"; }
	wait "$ppid" 2>/dev/null
	rc=$?
	[ "$rc" -eq 0 ] || { dg_tail "$d/server.log" 10; apps_bad "$tag: postgres exited $rc"; }
	if grep -aE '(PANIC|FATAL|server process .* (was terminated|exited with exit code [1-9]))' "$d/server.log" >"$d/server.bad"; then
		head -n 5 "$d/server.bad" | cut -c1-300 | sed 's/^/    | /'
		apps_bad "$tag: the server logged $(wc -l <"$d/server.bad") FATAL/PANIC/backend crash line(s)"
	fi
	dg_log "$tag: pgbench tps ${TPS[$tag:c4]:--} (4 clients), ${TPS[$tag:C]:--} (-C, new connection per transaction)"
}

declare -A bigsha
dg_log "shim: ${DG_SHIM_ENV[*]}"
run_case native
for f in server.log psql.log pgbench-c4.log; do apps_native_clean "$DG_TMP/native/$f"; done
[ "$(stat -c %s "$DG_TMP/native/big.out")" -gt 20000000 ] || apps_bad "native: the 20 MB result is short"
run_case shim "${DG_SHIM_ENV[@]}"
[ "${bigsha[shim]}" = "${bigsha[native]}" ] || apps_bad "shim: the 20 MB result differs from the native one"
d=$DG_TMP/shim
apps_check_rc "postgres" "$d/server.log" 5
apps_check_rc "psql" "$d/psql.log" 5
apps_check_rc "pgbench -c 4" "$d/pgbench-c4.log" 4
apps_check_rc "pgbench -C" "$d/pgbench-C.log" 2
apps_ratio "pgbench -c 4 tps" tps "${TPS[native:c4]:--}" "${TPS[shim:c4]:--}"
apps_ratio "pgbench -C tps" tps "${TPS[native:C]:--}" "${TPS[shim:C]:--}"
apps_finish
