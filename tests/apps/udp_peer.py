#!/usr/bin/python3
"""udp_peer.py: numbered datagrams for socat.sh's UDP relay.
  udp_peer.py send PORT N GAP_MS   sends N datagrams "dgram-NNNNN-" + 100 bytes to 127.0.0.1:PORT,
                                   GAP_MS apart
  udp_peer.py recv PORT N SECONDS  receives on 127.0.0.1:PORT until N distinct datagrams came or
                                   SECONDS passed without one; prints "received C of N, D
                                   duplicates" and exits 0 only when every datagram sent came
                                   once, unchanged
"""
import socket
import sys
import time


def payload(i):
    return b"dgram-%05d-" % i + bytes((i + k) & 0xFF for k in range(100))


mode, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if mode == "send":
    gap = float(sys.argv[4]) / 1000
    for i in range(n):
        s.sendto(payload(i), ("127.0.0.1", port))
        time.sleep(gap)
    sys.exit(0)
s.bind(("127.0.0.1", port))
s.settimeout(float(sys.argv[4]))
want = {payload(i) for i in range(n)}
got, dups, bad = set(), 0, 0
try:
    while len(got) < n:
        d = s.recv(65536)
        if d not in want:
            bad += 1
        elif d in got:
            dups += 1
        got.add(d)
except socket.timeout:
    pass
print("received %d of %d, %d duplicates, %d foreign" % (len(got & want), n, dups, bad), flush=True)
sys.exit(0 if got == want and dups == 0 else 1)
