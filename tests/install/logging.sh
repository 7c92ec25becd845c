#!/usr/bin/env bash
# logging.sh LIB: an unknown DGSHIM_LOG warns once and means warn; DGSHIM_LOG_FILE puts the
# diagnostics in a file per process (%p), none on stderr; a forked child writes its own file; a
# program that closes our descriptor and reuses its number gets none of our lines; a path that
# cannot be opened says so once on stderr and the lines go there.
set -uo pipefail
# A sanitized build: its runtime first in every preload; leak checks off, since the programs
# run here (python, coreutils, tshark) are not ours (the integration suite checks the shim's).
if [ -n "${DG_ASAN_RT:-}" ]; then
	export LD_PRELOAD=$DG_ASAN_RT ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
fi
lib=$1
name=logging
py=/usr/bin/python3 # not a wrapper script: one process, one program
# shellcheck source=install_lib.sh
. "$(dirname "$0")/install_lib.sh"
inst_setup
pre=${LD_PRELOAD:+$LD_PRELOAD:}$lib # a sanitizer runtime stays first
# one UDP datagram to a port nobody listens on: the exit summary has sockets=1
send='import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"x", ("127.0.0.1", 9))'

# 1. unknown level: exactly one warning, naming the value; warn is in force (no info lines)
DGSHIM_LOG=verbose LD_PRELOAD=$pre $py -c "$send" 2>"$tmp/e1" || fail "program under DGSHIM_LOG=verbose"
[ "$(grep -c 'dgshim\[' "$tmp/e1")" = 1 ] || { cat "$tmp/e1"; fail "DGSHIM_LOG=verbose: not exactly one line"; }
grep -q "warn: DGSHIM_LOG=verbose is not a level.*using warn" "$tmp/e1" || { cat "$tmp/e1"; fail "the warning"; }
DGSHIM_LOG=Info LD_PRELOAD=$pre $py -c "$send" 2>"$tmp/e1b"
if grep -q 'not a level' "$tmp/e1b"; then fail "DGSHIM_LOG=Info (any case) was refused"; fi
grep -q 'summary: sockets=1' "$tmp/e1b" || { cat "$tmp/e1b"; fail "DGSHIM_LOG=Info: no summary"; }
echo "$name: DGSHIM_LOG=verbose: one warning; Info accepted"

# 2. a file per process; the child of a fork its own; nothing on stderr
cat >"$tmp/fork.py" <<PY
import os, socket, sys
$send
pid = os.fork()
if pid == 0:
    $send
    sys.exit(0) # destructors run: the exit summary
os.waitpid(pid, 0)
print(os.getpid(), pid)
PY
out=$(DGSHIM_LOG=info DGSHIM_LOG_FILE="$tmp/dg.%p.log" LD_PRELOAD=$pre $py "$tmp/fork.py" 2>"$tmp/e2") ||
	fail "fork program"
read -r ppid cpid <<<"$out"
if grep -q 'dgshim\[' "$tmp/e2"; then cat "$tmp/e2"; fail "diagnostics on stderr with DGSHIM_LOG_FILE"; fi
[ -s "$tmp/dg.$ppid.log" ] && [ -s "$tmp/dg.$cpid.log" ] || { ls -l "$tmp"; fail "no file per process ($ppid, $cpid)"; }
grep -q "^dgshim\[$ppid\]: info: summary: sockets=1 .*tx_plain=1 " "$tmp/dg.$ppid.log" || { cat "$tmp/dg.$ppid.log"; fail "parent's file"; }
grep -q "^dgshim\[$cpid\]: info: summary: sockets=[12] " "$tmp/dg.$cpid.log" || { cat "$tmp/dg.$cpid.log"; fail "child's file"; }
if grep -vq "^dgshim\[$cpid\]" "$tmp/dg.$cpid.log"; then fail "another process's line in the child's file"; fi
echo "$name: DGSHIM_LOG_FILE=dg.%p.log: parent $ppid and child $cpid each in their own file, stderr clean"

# 3. the program closes our descriptor and puts a file of its own on that number
cat >"$tmp/reuse.py" <<PY
import os, socket
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM) # the shim logs: its file is open
u.sendto(b"x", ("127.0.0.1", 9))
u.close()
def link(f):
    try:
        return os.readlink("/proc/self/fd/" + f)
    except OSError:
        return ""
ours = [int(f) for f in os.listdir("/proc/self/fd") if link(f).endswith("/reuse.log")]
assert len(ours) == 1, ours
os.close(ours[0]) # as a close loop would (a whole closerange also ends the shim's own thread)
fd = os.open("$tmp/mine.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
if fd != ours[0]:
    os.dup2(fd, ours[0]); os.close(fd); fd = ours[0]
os.write(fd, b"program data\n")
$send
PY
DGSHIM_LOG=debug DGSHIM_LOG_FILE="$tmp/reuse.log" LD_PRELOAD=$pre $py "$tmp/reuse.py" 2>"$tmp/e3" ||
	{ cat "$tmp/e3"; fail "reuse program"; }
[ "$(cat "$tmp/mine.txt")" = "program data" ] || { cat "$tmp/mine.txt"; fail "our lines went into the program's file"; }
grep -q 'summary: sockets=2' "$tmp/reuse.log" || { cat "$tmp/reuse.log"; fail "the log file was not reopened"; }
echo "$name: a program reusing our descriptor's number keeps its file; our lines went on in the log"

# 4. a path that cannot be opened: one line on stderr saying so, the diagnostics there
DGSHIM_LOG=info DGSHIM_LOG_FILE=/nonexistent/dir/%p.log LD_PRELOAD=$pre $py -c "$send" 2>"$tmp/e4"
[ "$(grep -c 'DGSHIM_LOG_FILE=/nonexistent/dir/%p.log: No such file or directory; diagnostics on stderr' "$tmp/e4")" = 1 ] ||
	{ cat "$tmp/e4"; fail "unopenable DGSHIM_LOG_FILE"; }
grep -q 'summary: sockets=1' "$tmp/e4" || fail "no summary on stderr after the failed open"
echo "$name: an unopenable path: one line, then stderr"
echo "$name: PASS"
