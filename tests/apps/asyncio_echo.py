#!/usr/bin/python3
"""asyncio_echo.py: Python asyncio echo servers and checking clients, for asyncio.sh.
  asyncio_echo.py udp-server PORT     echoes datagrams; exits on the datagram b"quit"
  asyncio_echo.py udp-client PORT N   N ping-pongs of random datagrams (1-1400 B, 2 s timeout
                                      each, echo must be equal), then 100 sent at once: all back
  asyncio_echo.py tcp-server PORT     echoes one connection (streams), exits when it ends
  asyncio_echo.py tcp-client PORT MB  1000 ping-pongs of 64 B, then MB MiB of random bytes
                                      written while the echo is read; equal byte for byte
A client prints "rate NAME VALUE" lines and exits 0 only when every check held.
"""
import asyncio
import hashlib
import os
import random
import struct
import sys
import time

HOST = "127.0.0.1"


def fail(msg):
    print("asyncio_echo %s: FAIL: %s" % (sys.argv[1], msg), flush=True)
    os._exit(1)


class Echo(asyncio.DatagramProtocol):
    def __init__(self, done):
        self.done = done

    def connection_made(self, t):
        self.t = t

    def datagram_received(self, d, addr):
        if d == b"quit":
            self.done.set_result(None)
        else:
            self.t.sendto(d, addr)


async def udp_server(port):
    done = asyncio.get_running_loop().create_future()
    t, _ = await asyncio.get_running_loop().create_datagram_endpoint(lambda: Echo(done), local_addr=(HOST, port))
    await done
    t.close()


class Client(asyncio.DatagramProtocol):
    def __init__(self):
        self.q = asyncio.Queue()

    def datagram_received(self, d, addr):
        self.q.put_nowait(d)


async def udp_client(port, n):
    t, c = await asyncio.get_running_loop().create_datagram_endpoint(Client, remote_addr=(HOST, port))
    t0 = time.monotonic()
    for i in range(n):
        out = os.urandom(random.randint(1, 1400))
        t.sendto(out)
        try:
            d = await asyncio.wait_for(c.q.get(), 2)
        except asyncio.TimeoutError:
            fail("no echo for ping-pong %d within 2 s" % i)
        if d != out:
            fail("echo %d differs (%d bytes, sent %d)" % (i, len(d), len(out)))
    print("rate udp_pingpong_per_s %.0f" % (n / (time.monotonic() - t0)))
    for k in range(100):
        t.sendto(struct.pack("!I", k) + bytes([k]) * 196)
    seen = set()
    try:
        while len(seen) < 100:
            d = await asyncio.wait_for(c.q.get(), 2)
            k = struct.unpack("!I", d[:4])[0]
            if len(d) != 200 or k >= 100 or k in seen or d[4:] != bytes([k]) * 196:
                fail("burst: unexpected echo #%d (%d B)" % (k, len(d)))
            seen.add(k)
    except asyncio.TimeoutError:
        fail("burst: %d of 100 echoes came back" % len(seen))
    print("asyncio_echo udp-client: %d ping-pongs exact, burst 100/100" % n)
    t.sendto(b"quit")
    t.close()


async def tcp_server(port):
    done = asyncio.get_running_loop().create_future()

    async def serve(r, w):
        while True:
            d = await r.read(262144)
            if not d:
                break
            w.write(d)
            await w.drain()
        w.close()
        done.set_result(None)

    srv = await asyncio.start_server(serve, HOST, port)
    await done
    srv.close()


async def tcp_client(port, mb):
    r, w = await asyncio.open_connection(HOST, port)
    t0 = time.monotonic()
    for i in range(1000):
        out = os.urandom(64)
        w.write(out)
        d = await asyncio.wait_for(r.readexactly(64), 5)
        if d != out:
            fail("ping-pong %d: echo differs" % i)
    print("rate tcp_pingpong_per_s %.0f" % (1000 / (time.monotonic() - t0)))
    total = mb << 20
    data = os.urandom(total)

    async def writer():
        for off in range(0, total, 65536):
            w.write(data[off:off + 65536])
            await w.drain()

    t1 = time.monotonic()
    wt = asyncio.ensure_future(writer())
    h = hashlib.sha256()
    n = 0
    while n < total:
        d = await asyncio.wait_for(r.read(262144), 30)
        if not d:
            fail("connection ended after %d of %d echoed bytes" % (n, total))
        if d != data[n:n + len(d)]:
            fail("bulk echo differs in bytes %d-%d" % (n, n + len(d)))
        h.update(d)
        n += len(d)
    await wt
    if h.digest() != hashlib.sha256(data).digest():
        fail("bulk echo sha256 differs")
    print("rate tcp_bulk_MiB_per_s %.1f" % (mb / (time.monotonic() - t1)))
    print("asyncio_echo tcp-client: 1000 ping-pongs exact, %d bytes echoed, sha256 %s" % (total, h.hexdigest()))
    w.close()
    await w.wait_closed()


mode, port = sys.argv[1], int(sys.argv[2])
coro = {"udp-server": lambda: udp_server(port), "tcp-server": lambda: tcp_server(port),
        "udp-client": lambda: udp_client(port, int(sys.argv[3])),
        "tcp-client": lambda: tcp_client(port, int(sys.argv[3]))}[mode]
asyncio.run(coro())
