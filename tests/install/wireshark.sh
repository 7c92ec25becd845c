#!/usr/bin/env bash
# wireshark.sh SOURCE_DIR BUILD_DIR PORT: the Lua dissector on a capture this test makes on
# loopback. Into it go: the two worked examples of docs/wire.md (their hex taken from the
# document), a Read Request and a Terminate (sections 7.1, 7.2), a bad-CRC copy of example 1 to
# the registered port 18515 and to another port, a plain datagram, and real traffic of udpbench
# under the shim over UD and over RD with 5 % loss at the receiver (data, acks with SACK). tshark
# decodes the capture with the dissector and the fields are checked against the document.
set -uo pipefail
# A sanitized build: its runtime first in every preload; leak checks off, since the programs
# run here (python, coreutils, tshark) are not ours (the integration suite checks the shim's).
if [ -n "${DG_ASAN_RT:-}" ]; then
	export LD_PRELOAD=$DG_ASAN_RT ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
fi
src=$1 build=$2 port=${3:-24300}
name=wireshark
lua=$src/tools/wireshark/dgshim.lua
lib=$build/shim/libdgshim.so.0
py=/usr/bin/python3
# shellcheck source=install_lib.sh
. "$(dirname "$0")/install_lib.sh"
inst_setup
if ! command -v tshark >/dev/null || ! command -v tcpdump >/dev/null; then
	export DEBIAN_FRONTEND=noninteractive
	echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
	{ apt-get update -qq && apt-get install -y -qq --no-install-recommends tshark tcpdump; } >"$tmp/apt.log" 2>&1 ||
		{ tail -5 "$tmp/apt.log"; fail "cannot install tshark and tcpdump"; }
fi
[ "$(id -u)" = 0 ] || { echo "$name: SKIP: capturing on loopback needs root"; exit 77; }
pre=${LD_PRELOAD:+$LD_PRELOAD:}$lib

env -u LD_PRELOAD tcpdump -i lo -U -n -w "$tmp/cap.pcap" "udp and (portrange $port-$((port + 9)) or port 18515 or port 18517)" 2>"$tmp/tcpdump.err" &
tdp=$!; pids+=($tdp)
for _ in $(seq 50); do grep -qs listening "$tmp/tcpdump.err" && break; sleep 0.1; done
grep -q listening "$tmp/tcpdump.err" || { cat "$tmp/tcpdump.err"; fail "tcpdump did not start"; }

# the document's examples, crafted; a receiver socket so nothing answers with ICMP
$py - "$src/docs/wire.md" "$port" <<'PY' || fail "sending the worked examples"
import re, socket, sys
doc = open(sys.argv[1]).read()
port = int(sys.argv[2])
def crc32c(b):
    c = 0xffffffff
    for x in b:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c ^ 0xffffffff
ex1 = bytes.fromhex(re.search(r"```\n(c148[0-9a-f]+)\n```", doc).group(1))
assert crc32c(ex1[:-4]) == int.from_bytes(ex1[-4:], "big")
rows = re.findall(r"^\| (\d) +\| (\d+) +\| (\d+) +\| ([01]) +\| `([0-9a-f]{52})` \|$", doc, re.M)
assert len(rows) == 3, rows
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); rx.bind(("127.0.0.1", port + 1))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dst = ("127.0.0.1", port + 1)
tx.sendto(ex1, dst)
msg = bytes((i * 7) & 0xff for i in range(3000))
for seg, mo, plen, last, hdr in rows:
    d = bytes.fromhex(hdr) + msg[int(mo):int(mo) + int(plen)]
    tx.sendto(d + crc32c(d).to_bytes(4, "big"), dst)
import struct
def untagged(op, qn, msn, payload):
    d = bytes([0x41, 0x40 | op]) + struct.pack(">IIIIIHH", 0, qn, msn, 0, len(payload), 1442, 0) + payload
    return d + crc32c(d).to_bytes(4, "big")
# section 7.1: a Read Request of 4096 bytes; 7.2: a Terminate DDP/tagged/invalid STag (1/1/0x00), M
tx.sendto(untagged(1, 1, 3, struct.pack(">IQIIQ", 0xaabbccdd, 0x1000, 4096, 0x11223344, 0x2000)), dst)
tx.sendto(untagged(7, 2, 1, struct.pack(">IHH", 0x11008000, 39, 0)), dst)
bad = ex1[:-1] + bytes([ex1[-1] ^ 0xff])
tx.sendto(bad, ("127.0.0.1", 18515))   # the registered port: decoded, CRC flagged
tx.sendto(bad, dst)                      # elsewhere: the heuristic leaves it alone
tx.sendto(b"plain datagram, not datagram-iWARP at all....", dst)
# section 13: the worked question and answer, from a socket bound to the discovery port
q, a = re.findall(r"^(?:question|answer): +((?:[0-9a-f]{2} ){23}[0-9a-f]{2})$", doc, re.M)
dq = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    dq.bind(("127.0.0.1", 18517))
except OSError:
    dq = tx
dq.sendto(bytes.fromhex(q), ("127.0.0.1", 18517))
dq.sendto(bytes.fromhex(a), ("127.0.0.1", 18517))
PY

# real traffic: UD, then RD with loss at the server (its acks carry SACK)
run_pair() { # port mode fault
	LD_PRELOAD=$pre DGSHIM_MODE=$2 DGSHIM_FAULT_RX=$3 "$build/apps/udpbench" server "$1" -b 127.0.0.1 >"$tmp/s$1.out" 2>&1 &
	local s=$!; pids+=($s)
	for _ in $(seq 50); do grep -qs listening "$tmp/s$1.out" && break; sleep 0.1; done
	LD_PRELOAD=$pre DGSHIM_MODE=$2 "$build/apps/udpbench" stream 127.0.0.1 "$1" -s 700 -r 3000 -t 0.5 >"$tmp/c$1.out" 2>&1 ||
		{ cat "$tmp/c$1.out"; fail "udpbench $2"; }
	kill "$s"; wait "$s" 2>/dev/null
}
run_pair $((port + 2)) ud ""
run_pair $((port + 3)) rd "loss=5,seed=3"
sleep 0.3
kill -INT "$tdp"; wait "$tdp" 2>/dev/null

env -u LD_PRELOAD tshark -X lua_script:"$lua" -r "$tmp/cap.pcap" -T fields -E separator='|' -E occurrence=f \
	-e frame.number -e udp.dstport -e dgiwarp.kind -e dgiwarp.opcode -e dgiwarp.t -e dgiwarp.l \
	-e dgiwarp.stag -e dgiwarp.to -e dgiwarp.qn -e dgiwarp.msn -e dgiwarp.mo -e dgiwarp.ml \
	-e dgiwarp.segsz -e dgiwarp.payload_len -e dgiwarp.crc -e dgiwarp.crc.good -e dgiwarp.payload \
	-e dgiwarp.rd.flags -e dgiwarp.rd.ack -e dgiwarp.rd.sack -e dgiwarp.rd.sacked -e dgiwarp.rd.seq \
	-e dgiwarp.segment -e dgiwarp.nsegs -e dgiwarp.base -e _ws.col.Info \
	-e dgdisco.type -e dgdisco.port -e dgdisco.nonce -e dgdisco.caps -e dgdisco.lease_ms \
	>"$tmp/fields.txt" 2>"$tmp/tshark.err" || { cat "$tmp/tshark.err"; fail "tshark"; }
if grep -qi "lua.*error\|error.*lua" "$tmp/tshark.err"; then cat "$tmp/tshark.err"; fail "the dissector raised an error"; fi
$py - "$tmp/fields.txt" "$port" <<'PY' || { head -20 "$tmp/fields.txt" | cut -c1-400; fail "decoded fields"; }
import sys
port = int(sys.argv[2])
keys = ("no dport kind op t l stag to qn msn mo ml segsz plen crc good payload rdflags ack sack "
        "sacked seq segment nsegs base info dtype dport2 dnonce dcaps dlease").split()
rows = [dict(zip(keys, l.rstrip("\n").split("|"))) for l in open(sys.argv[1])]
def at(p): return [r for r in rows if r["dport"] == str(p)]
ex = at(port + 1)
assert len(ex) == 8, [r["info"] for r in ex]
e1 = ex[0]
# docs/wire.md section 10, byte by byte
def num(v): return int(v, 16) if v.lower().startswith("0x") else int(v)
def true(v): return v in ("1", "True")
want = dict(op=8, stag=0x12345678, to=0x00007f0000001000, msn=1, mo=0, ml=5, segsz=1438, plen=5,
            crc=0x0fbfc6d1, base=0x00007f0000001000)
for k, v in want.items():
    assert num(e1[k]) == v, (k, e1[k], v)
assert e1["kind"] == "UD tagged" and true(e1["t"]) and true(e1["l"]) and true(e1["good"]), e1
assert e1["payload"] == b"hello".hex(), e1["payload"]
assert "RDMA Write-Record" in e1["info"], e1["info"]
# section 11: three segments of a 3000-byte Send, msn 7, segsz 1442
for i, (mo, plen, l) in enumerate([(0, 1442, "0"), (1442, 1442, "0"), (2884, 116, "1")]):
    r = ex[1 + i]
    assert r["kind"] == "UD untagged" and num(r["op"]) == 3 and r["qn"] == "0" and r["msn"] == "7", r
    assert (r["mo"], r["plen"], r["ml"], r["segsz"]) == (str(mo), str(plen), "3000", "1442"), r
    assert true(r["l"]) == (l == "1"), r
    assert r["segment"] == str(i) and r["nsegs"] == "3" and true(r["good"]), r
rr, te = ex[4], ex[5]
assert num(rr["op"]) == 1 and rr["qn"] == "1" and "read 4096 from stag 0x11223344" in rr["info"], rr
assert num(te["op"]) == 7 and te["qn"] == "2" and "error 1/1/0x00" in te["info"], te
# the bad CRC and the plain datagram are not claimed on another port
assert ex[6]["kind"] == "" and ex[7]["kind"] == "", (ex[6], ex[7])
# on the registered port the bad one is decoded and flagged
b = at(18515)
assert len(b) == 1 and b[0]["kind"] == "UD tagged" and not true(b[0]["good"]), b
assert "[bad CRC]" in b[0]["info"], b[0]["info"]
# real UD traffic: every datagram one the shim framed (an untagged Send of 700 bytes, or
# udpbench's control messages), CRC good
ud = [r for r in rows if r["kind"].startswith("UD") and r["dport"] != str(port + 1) and r["dport"] != "18515"]
assert len(ud) > 500, len(ud)
assert all(true(r["good"]) for r in ud)
assert sum(1 for r in ud if num(r["op"]) == 3 and r["plen"] == "700") > 500
# real RD traffic: data with sequence numbers, acks, and SACK after the injected loss
rd = [r for r in rows if r["kind"].startswith("RD")]
data = [r for r in rd if r["kind"] == "RD data"]
acks = [r for r in rd if r["kind"] == "RD ack"]
assert len(data) > 500 and len(acks) > 10, (len(data), len(acks))
assert all(true(r["good"]) for r in rd)
assert sum(1 for r in data if num(r["op"]) == 3 and r["plen"] == "700") > 500
seqs = [int(r["seq"]) for r in data]
assert max(seqs) > 400, max(seqs)
sacked = [r for r in acks if r["sack"] not in ("", "0x00000000", "0")]
assert sacked, "no ack with SACK bits"
s = sacked[0]
ack = int(s["ack"]); bits = int(s["sack"], 16)
assert s["sacked"].split() == [str(ack + 1 + i) for i in range(32) if bits >> i & 1], s
# section 13: the discovery question and answer
dd = [r for r in rows if r["dport"] == "18517"]
assert len(dd) >= 2, dd
dq_, da_ = dd[0], dd[1]
assert (dq_["dtype"], dq_["dport2"], num(dq_["dnonce"]), num(dq_["dcaps"] or "0")) == ("1", "23610", 0x1122334455667788, 0), dq_
assert (da_["dtype"], da_["dport2"], num(da_["dnonce"]), num(da_["dcaps"]), da_["dlease"]) == ("2", "23610", 0x1122334455667788, 1, "80"), da_
assert "port 23610 speaks: ud (lease 80 ms)" in da_["info"], da_["info"]
print("wireshark: example 1 (Write-Record, stag 0x12345678, ml 5, CRC 0x0fbfc6d1) and example 2 "
      "(3 segments, mo 0/1442/2884) decoded as docs/wire.md says; %d UD and %d RD data datagrams, "
      "%d RD acks (%d with SACK, e.g. ack %d sack %s -> %s), CRC good on all; bad CRC flagged on "
      "18515, not claimed elsewhere; plain UDP left alone"
      % (len(ud), len(data), len(acks), len(sacked), ack, s["sack"], s["sacked"]))
PY
echo "$name: PASS"
