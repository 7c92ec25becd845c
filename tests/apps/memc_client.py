#!/usr/bin/python3
"""memc_client.py tcp|udp HOST PORT N SEED: a memcached text-protocol client that checks answers.

SETs N keys with random values (sizes 1..MAX bytes: 32 KiB over TCP, 1000 over UDP so that a
GET answer fits in one datagram), GETs each back and compares it byte for byte, then (TCP) GETs all
of them in multi-key GETs of 50 and compares again, and asks for one key never set (must answer
END only). Over UDP each request carries memcached's 8-byte frame header (request id, sequence
number, datagram count, reserved); the answer must carry the same request id, sequence 0 of 1.
Any wrong or missing answer (1 s timeout over UDP, no retry: loopback loses nothing) exits 1
naming the first one. Prints "ops/s N" (requests per second over the whole run) on success.
"""
import random
import socket
import struct
import sys
import time


def fail(msg):
    print("memc_client: FAIL: " + msg, flush=True)
    sys.exit(1)


class Tcp:
    def __init__(self, host, port):
        self.s = socket.create_connection((host, port), timeout=10)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def _fill(self):
        d = self.s.recv(262144)
        if not d:
            fail("server closed the connection")
        self.buf += d

    def line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        ln, self.buf = self.buf.split(b"\r\n", 1)
        return ln

    def exact(self, n):
        while len(self.buf) < n:
            self._fill()
        d, self.buf = self.buf[:n], self.buf[n:]
        return d

    def request(self, req):
        self.s.sendall(req)


class Udp:
    """One request at a time; the reply is parsed from the single datagram's payload."""

    def __init__(self, host, port):
        self.s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.s.settimeout(1.0)
        self.s.connect((host, port))
        self.rid = 0
        self.buf = b""

    def request(self, req):
        self.rid = (self.rid + 1) & 0xFFFF
        self.s.send(struct.pack("!HHHH", self.rid, 0, 1, 0) + req)
        try:
            d = self.s.recv(65536)
        except socket.timeout:
            fail("no UDP answer within 1 s to request id %d (%r)" % (self.rid, req[:40]))
        rid, seq, total, _ = struct.unpack("!HHHH", d[:8])
        if (rid, seq, total) != (self.rid, 0, 1):
            fail("UDP frame header id=%d seq=%d total=%d, expected id=%d seq=0 total=1" %
                 (rid, seq, total, self.rid))
        self.buf = d[8:]

    def line(self):
        if b"\r\n" not in self.buf:
            fail("UDP answer without a complete line: %r" % self.buf[:60])
        ln, self.buf = self.buf.split(b"\r\n", 1)
        return ln

    def exact(self, n):
        if len(self.buf) < n:
            fail("UDP answer short: %d bytes, expected %d" % (len(self.buf), n))
        d, self.buf = self.buf[:n], self.buf[n:]
        return d


def get_values(c, keys, values):
    c.request(b"get " + b" ".join(keys) + b"\r\n")
    for k in keys:
        ln = c.line()
        want = b"VALUE %s 0 %d" % (k, len(values[k]))
        if ln != want:
            fail("GET %s: answer line %r, expected %r" % (k.decode(), ln[:80], want))
        d = c.exact(len(values[k]) + 2)
        if d[:-2] != values[k] or d[-2:] != b"\r\n":
            fail("GET %s: value differs (%d bytes)" % (k.decode(), len(values[k])))
    ln = c.line()
    if ln != b"END":
        fail("GET: %r instead of END" % ln[:80])


def main():
    mode, host, port, n, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    rng = random.Random(seed)
    maxlen = 32768 if mode == "tcp" else 1000
    c = Tcp(host, port) if mode == "tcp" else Udp(host, port)
    keys = [b"%s-%d-%d" % (mode.encode(), seed, i) for i in range(n)]
    values = {k: rng.randbytes(rng.randint(1, maxlen)) for k in keys}
    ops = 0
    t0 = time.monotonic()
    for k in keys:
        v = values[k]
        c.request(b"set %s 0 0 %d\r\n" % (k, len(v)) + v + b"\r\n")
        ln = c.line()
        if ln != b"STORED":
            fail("SET %s: %r" % (k.decode(), ln[:80]))
        ops += 1
    for k in keys:
        get_values(c, [k], values)
        ops += 1
    # Multi-key GETs over TCP only: over UDP their answers would span several datagrams.
    if mode == "tcp":
        for i in range(0, n, 50):
            get_values(c, keys[i:i + 50], values)
            ops += 1
    c.request(b"get never-set-%d\r\n" % seed)
    if c.line() != b"END":
        fail("GET of a key never set did not answer END alone")
    ops += 1
    dt = time.monotonic() - t0
    print("memc_client: %s %d keys, %d requests, all answers exact" % (mode, n, ops))
    print("ops/s %.0f" % (ops / dt), flush=True)


main()
