#!/usr/bin/env bash
# pair.sh PROGRAM PORT [ARGS...]: runs "PROGRAM ARGS -p PORT server" and "PROGRAM ARGS -p PORT
# client 127.0.0.1" as two processes; passes when both exit 0. Output of both is shown.
set -u
prog=$1 port=$2; shift 2
out=$(mktemp -d)
"$prog" "$@" -p "$port" server >"$out/server" 2>&1 &
spid=$!
sleep 0.3
"$prog" "$@" -p "$port" client 127.0.0.1 >"$out/client" 2>&1
crc=$?
wait $spid
src=$?
echo "--- server (exit $src)"; cat "$out/server"
echo "--- client (exit $crc)"; cat "$out/client"
rm -rf "$out"
[ $src -eq 0 ] && [ $crc -eq 0 ]
