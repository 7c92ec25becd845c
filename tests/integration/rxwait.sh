#!/usr/bin/env bash
# rxwait.sh BUILD_DIR PORT: a blocking receive on a taken UDP socket waits in the kernel's own
# recvfrom, as natively: one system call per datagram that had to be waited for (issue 14
# item 3: the one-core ping-pong's cost was its system calls). udpbench pingpong (blocking
# sendto/recvfrom) against a preloaded Python echo server that answers each datagram 2 ms late,
# so every receive of the client must wait; the client runs under strace -c. Natively: one
# recvfrom per round trip and no poll. Under the shim before: a look that found nothing
# (recvfrom, EAGAIN), a poll, then the read: 2 receives and 1 poll per round trip. The test
# wants at most 1.2 receive calls and 0.1 polls per round trip, every round trip carried
# framed (the exit summaries).
# TCP the same way (the second half): a blocking Python client (send 64 bytes, recv them back)
# on a carried connection to a preloaded echo server that answers 2 ms late. Under the shim
# before: a look, a poll on the socket and the completion queue's descriptor, the provider's
# read (3.24 system calls per round trip in sockperf's one-core ping-pong); now the wait is one
# recv on the program's socket whose bytes go to the queue pair (dgv_qp_rx_claim/_stream_feed).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
dg_init rxwait "$1" "$2"
dg_require_shim
dg_need strace strace
ub=$DG_BUILD/apps/udpbench
[ -x "$ub" ] || dg_fail "$ub not built"
n=200 warm=10

cat >"$DG_TMP/echo.py" <<'EOF'
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", int(sys.argv[1])))
while True:
    b, a = s.recvfrom(65536)
    time.sleep(0.002)  # the client's receive must wait for this answer
    s.sendto(b, a)
EOF
dg_bg "$DG_TMP/srv.log" env "${DG_SHIM_ENV[@]}" python3 "$DG_TMP/echo.py" "$DG_PORT"
srv=$DG_LAST_PID
dg_wait_udp "$DG_PORT" 10 "$srv" || { dg_tail "$DG_TMP/srv.log"; dg_fail "the echo server did not bind"; }

# the shim's environment for the traced program only (strace itself runs plain); in the ASan
# build without LeakSanitizer, which cannot run under ptrace (it aborts the program at exit)
# (nenv: the same as env's arguments, for the untraced Python client below: Python's own
# allocations at exit are LeakSanitizer reports)
senv=() nenv=()
for e in "${DG_SHIM_ENV[@]}"; do
	case $e in
	ASAN_OPTIONS=*) e="$e:detect_leaks=0" ;;
	esac
	senv+=(-E "$e") nenv+=("$e")
done
timeout -k 5 120 strace -f -qq -c -o "$DG_TMP/strace" -e trace=poll,ppoll,select,pselect6,recvfrom,recvmsg,recvmmsg \
	"${senv[@]}" "$ub" pingpong 127.0.0.1 "$DG_PORT" -s 64 -n "$n" -w "$warm" >"$DG_TMP/cli.out" 2>"$DG_TMP/cli.err" ||
	{ dg_tail "$DG_TMP/cli.out"; dg_tail "$DG_TMP/cli.err"; dg_fail "udpbench pingpong failed under the shim"; }
# carried both ways, else the test says nothing about the shim's receive
dg_check_framed "client sends" "$DG_TMP/cli.err" tx || dg_fail "the client's datagrams were not carried"
dg_check_framed "client receives" "$DG_TMP/cli.err" rx || dg_fail "the answers were not carried"

# strace -c's table: "% time seconds usecs/call calls [errors] syscall"
calls() { awk -v want="$1" '$NF ~ want && $4 ~ /^[0-9]+$/ {s += $4} END {print s + 0}' "$DG_TMP/strace"; }
rt=$((n + warm))
# judge LABEL RECV_RE MAX_PER_RT: the receive calls (matching RECV_RE) and polls the traced
# client made, at most MAX_PER_RT and 0.1 per round trip
judge() {
	local rx po
	rx=$(calls "$2")
	po=$(calls '^(poll|ppoll|select|pselect6)$')
	dg_log "$1$rt round trips each waiting 2 ms for its answer: $rx receive calls, $po polls in the client's process (want <= $3 and <= 0.1 per round trip)"
	awk -v x="$rx" -v r="$rt" -v m="$3" 'BEGIN {exit !(x <= m * r)}' ||
		{ cat "$DG_TMP/strace"; dg_fail "$1$rx receive calls for $rt round trips: the receive looks before it waits"; }
	awk -v x="$po" -v r="$rt" 'BEGIN {exit !(x <= 0.1 * r)}' ||
		{ cat "$DG_TMP/strace"; dg_fail "$1$po polls for $rt round trips: the receive waits in poll, not in its read"; }
}
judge "" '^(recvfrom|recvmsg|recvmmsg)$' 1.2

# ---- TCP: a carried connection, the client's blocking receives
tport=$((DG_PORT + 1))
cat >"$DG_TMP/techo.py" <<'PYEOF'
import socket, sys, time
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1])))
ls.listen(1)
print("listening", flush=True)
c = ls.accept()[0]
while True:
    b = c.recv(65536)
    if not b:
        break
    time.sleep(0.002)  # the client's receive must wait for this answer
    c.sendall(b)
PYEOF
cat >"$DG_TMP/tcli.py" <<'PYEOF'
import socket, sys
n = int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
msg = bytes(range(64))
for i in range(n):
    s.sendall(msg)
    got = b""
    while len(got) < 64:
        b = s.recv(64 - len(got))  # blocking, no timeout: CPython calls recv at once
        if not b:
            sys.exit("end of stream after %d round trips" % i)
        got += b
    if got != msg:
        sys.exit("round trip %d: wrong bytes" % i)
print("round trips", n, flush=True)
PYEOF
dg_bg "$DG_TMP/tsrv.log" env "${DG_SHIM_ENV[@]}" python3 "$DG_TMP/techo.py" "$tport"
for _ in $(seq 200); do grep -qs listening "$DG_TMP/tsrv.log" && break; sleep 0.05; done
grep -qs listening "$DG_TMP/tsrv.log" || { dg_tail "$DG_TMP/tsrv.log"; dg_fail "the TCP echo server did not listen"; }
timeout -k 5 120 strace -f -qq -c -o "$DG_TMP/strace" -e trace=poll,ppoll,select,pselect6,recvfrom,recvmsg,recvmmsg \
	"${senv[@]}" python3 "$DG_TMP/tcli.py" "$tport" "$rt" >"$DG_TMP/tcli.out" 2>"$DG_TMP/tcli.err" ||
	{ dg_tail "$DG_TMP/tcli.out"; dg_tail "$DG_TMP/tcli.err"; dg_fail "the TCP client failed under the shim"; }
grep -q "^round trips $rt" "$DG_TMP/tcli.out" || { dg_tail "$DG_TMP/tcli.out"; dg_fail "the TCP client did not finish"; }
[ "$(dg_sum "$DG_TMP/tcli.err" rc_conns)" -ge 1 ] ||
	{ dg_tail "$DG_TMP/tcli.err"; dg_fail "the TCP connection was not carried (rc_conns)"; }
# CPython's recv is recvfrom; the process's recvmsg calls are netlink dumps at start-up (the
# provider's device probe: ~200 of them, none per round trip)
judge "tcp: " '^recvfrom$' 1.3

# ---- TCP: an epoll-driven server's completion queue descriptor stays quiet
# A non-blocking Python echo server on epoll (as redis, nginx) answering at once: the shim
# wakes it through the connection's socket, and what it completes for the program inside the
# program's own calls needs no eventfd write, nor a read of an eventfd nothing wrote. Before:
# every answer's data record asked for a completion, whose push on the armed CQ wrote the
# eventfd (the epoll translation then read it), and every wake-up read the eventfd once more
# to find it empty: 3 eventfd calls per request of 8 system calls (redis GET, 8.4 -> 4.6 now).
# The server runs under strace; an eventfd is read and written 8 bytes at a time. And the
# server's receive takes the request its readiness check placed without reading TCP again:
# one recvfrom per request (before: the check's, then the receive's that found nothing).
eport=$((DG_PORT + 2))
cat >"$DG_TMP/eecho.py" <<'PYEOF'
import selectors, socket, sys
sel = selectors.EpollSelector()
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1])))
ls.listen(8)
ls.setblocking(False)
sel.register(ls, selectors.EVENT_READ)
print("listening", flush=True)
done = False
while not done:
    for key, _ in sel.select():
        if key.fileobj is ls:
            c = ls.accept()[0]
            c.setblocking(False)
            sel.register(c, selectors.EVENT_READ)
            continue
        c = key.fileobj
        try:
            b = c.recv(65536)
        except BlockingIOError:
            continue
        if not b:
            done = True
            break
        c.sendall(b)
PYEOF
dg_bg "$DG_TMP/esrv.log" timeout -k 5 120 strace -f -qq -o "$DG_TMP/estrace" -e trace=read,write,recvfrom "${senv[@]}" \
	python3 "$DG_TMP/eecho.py" "$eport"
esrv=$DG_LAST_PID
for _ in $(seq 300); do grep -qs listening "$DG_TMP/esrv.log" && break; sleep 0.05; done
grep -qs listening "$DG_TMP/esrv.log" || { dg_tail "$DG_TMP/esrv.log"; dg_fail "the epoll echo server did not listen"; }
timeout -k 5 120 env "${nenv[@]}" python3 "$DG_TMP/tcli.py" "$eport" "$rt" >"$DG_TMP/ecli.out" 2>"$DG_TMP/ecli.err" ||
	{ dg_tail "$DG_TMP/ecli.out"; dg_tail "$DG_TMP/ecli.err"; dg_fail "the client of the epoll server failed"; }
grep -q "^round trips $rt" "$DG_TMP/ecli.out" || { dg_tail "$DG_TMP/ecli.out"; dg_fail "the epoll server's client did not finish"; }
wait "$esrv" 2>/dev/null
[ "$(dg_sum "$DG_TMP/esrv.log" rc_conns)" -ge 1 ] ||
	{ dg_tail "$DG_TMP/esrv.log"; dg_fail "the epoll server's connection was not carried (rc_conns)"; }
ev=$(grep -cE '^[0-9]+ +(read|write)\([0-9]+, .*, 8\) += ' "$DG_TMP/estrace")
dg_log "tcp epoll server: $rt requests, $ev eventfd reads and writes in the server (want <= 0.2 per request)"
awk -v x="$ev" -v r="$rt" 'BEGIN {exit !(x <= 0.2 * r)}' ||
	{ grep -E ', 8\) += ' "$DG_TMP/estrace" | tail -20; dg_fail "tcp epoll server: $ev eventfd calls for $rt requests"; }
erx=$(grep -cE '^[0-9]+ +recvfrom\(' "$DG_TMP/estrace")
dg_log "tcp epoll server: $rt requests, $erx recvfrom in the server (want <= 1.3 per request)"
awk -v x="$erx" -v r="$rt" 'BEGIN {exit !(x <= 1.3 * r)}' ||
	{ grep -E 'recvfrom' "$DG_TMP/estrace" | tail -20; dg_fail "tcp epoll server: $erx recvfrom for $rt requests"; }

# ---- TCP: an epoll client that switches its interest around every request (hiredis,
# redis-benchmark: EPOLLOUT on before each write by MOD, then the registration deleted and
# added again for reading) makes no epoll_ctl of its own per switch: a carried stream's kernel
# registration is the same for both (the shim decides its readiness), and a deleted one is kept
# until the next wait, so the ADD right after takes it back. What a MOD or ADD asks about is
# reported from the shim's state. Before: each MOD changed the socket's and its completion
# queue's registrations, each DEL and ADD removed and made both (10 epoll_ctl per request).
hport=$((DG_PORT + 3))
dg_bg "$DG_TMP/hsrv.log" env "${DG_SHIM_ENV[@]}" python3 "$DG_TMP/eecho.py" "$hport"
hsrv=$DG_LAST_PID
for _ in $(seq 300); do grep -qs listening "$DG_TMP/hsrv.log" && break; sleep 0.05; done
grep -qs listening "$DG_TMP/hsrv.log" || { dg_tail "$DG_TMP/hsrv.log"; dg_fail "the second epoll echo server did not listen"; }
cat >"$DG_TMP/hcli.py" <<'PYEOF'
import selectors, socket, sys
n = int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setblocking(False)
sel = selectors.EpollSelector()
sel.register(s, selectors.EVENT_READ)
msg = b"y" * 64
for i in range(n):
    sel.modify(s, selectors.EVENT_WRITE)
    while not sel.select(5):
        pass
    s.send(msg)
    sel.unregister(s)  # as hiredis: delete and add, not MOD
    sel.register(s, selectors.EVENT_READ)
    got = b""
    while len(got) < 64:
        if not sel.select(5):
            sys.exit("no answer in 5 s at round trip %d" % i)
        try:
            b = s.recv(64 - len(got))
        except BlockingIOError:
            continue
        if not b:
            sys.exit("end of stream after %d round trips" % i)
        got += b
    if got != msg:
        sys.exit("round trip %d: wrong bytes" % i)
print("round trips", n, flush=True)
PYEOF
timeout -k 5 120 strace -f -qq -c -o "$DG_TMP/hstrace" -e trace=epoll_ctl,epoll_wait,epoll_pwait \
	"${senv[@]}" python3 "$DG_TMP/hcli.py" "$hport" "$rt" >"$DG_TMP/hcli.out" 2>"$DG_TMP/hcli.err" ||
	{ dg_tail "$DG_TMP/hcli.out"; dg_tail "$DG_TMP/hcli.err"; dg_fail "the switching epoll client failed"; }
grep -q "^round trips $rt" "$DG_TMP/hcli.out" || { dg_tail "$DG_TMP/hcli.out"; dg_fail "the switching epoll client did not finish"; }
wait "$hsrv" 2>/dev/null
[ "$(dg_sum "$DG_TMP/hcli.err" rc_conns)" -ge 1 ] ||
	{ dg_tail "$DG_TMP/hcli.err"; dg_fail "the switching client's connection was not carried (rc_conns)"; }
ctl=$(awk '$NF == "epoll_ctl" {print $4}' "$DG_TMP/hstrace")
ctl=${ctl:-0}
dg_log "tcp epoll client switching EPOLLOUT: $rt requests, $ctl epoll_ctl (natively 3 per request; want <= 0.5)"
awk -v x="$ctl" -v r="$rt" 'BEGIN {exit !(x <= 0.5 * r)}' ||
	{ cat "$DG_TMP/hstrace"; dg_fail "switching epoll client: $ctl epoll_ctl for $rt requests"; }
dg_log "PASS"
