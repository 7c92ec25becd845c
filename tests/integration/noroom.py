#!/usr/bin/env python3
"""noroom.py: many TCP connections at once to a server that cannot carry them all (issue
"Hardening" item 7: a descriptor budget or memory near its end must make a connection plain,
never reset). The client starts N non-blocking connects at once (so every one of them found the
server's listener named and asked for iWARP), waits for all of them with poll, then uses each in
turn; the server accepts all N first and only then uses them, so it answers them when its
shim's descriptor budget (a quarter of RLIMIT_NOFILE, which the test sets low) is spent. A carried
connection costs the shim a descriptor only once TCP refuses one of its sends while it is waited
on (its completion queue's eventfd: the provider's thread then finishes the send), so the server
makes each one do that as it accepts it: small socket buffers on both sides, a preamble larger
than they hold written without blocking until EAGAIN, then a look for POLLOUT. On each
connection the server speaks first (the preamble, then a banner: bytes right behind the MPA Reply
must reach the client's program), then echoes what the client sends.

  noroom.py serve PORT N FLAG    prints "listening", waits for the file FLAG (the client has
                                 started all its connects), then "served N BYTES" (exit 0)
  noroom.py connect PORT N FLAG  creates FLAG once its N connects are started, then prints
                                 "echoed N BYTES" (exit 0) or what went wrong (exit 1)
"""
import os
import select
import socket
import sys
import time

BANNER = b"noroom banner: the server speaks first\n"
SIZE = 200_000
PRE = 2 << 20
PREAMBLE = bytes((k * 13) & 0xFF for k in range(256)) * (PRE // 256)
BUF = 4096  # SO_SNDBUF of the server's connections, SO_RCVBUF of the client's


def pattern(i):
    return bytes((i * 31 + k * 7) & 0xFF for k in range(251)) * (SIZE // 251 + 1)


def recv_exact(s, n):
    b = bytearray()
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise RuntimeError(f"end of stream after {len(b)} of {n} bytes")
        b += c
    return bytes(b)


def serve(port, n, flag):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUF)  # the accepted ones inherit it
    ls.bind(("127.0.0.1", port))
    ls.listen(n + 8)
    print("listening", flush=True)
    # every client asks for iWARP before the first accept spends the budget (a slow client,
    # e.g. under ASan, would otherwise find the listener's name withdrawn and connect plain)
    for _ in range(6000):
        if os.path.exists(flag):
            break
        time.sleep(0.01)
    else:
        raise RuntimeError("the client never said its connects were started")
    conns = []
    for _ in range(n):
        c = ls.accept()[0]
        # looked at once, as a server that registers each new connection with its poller
        # does (the shim answers the client now), then written to until TCP refuses and
        # looked at for room: the shim's completion queue for it makes its event descriptor
        # now, so the budget is spent while the clients still wait
        p = select.poll()
        p.register(c, select.POLLIN)
        p.poll(0)
        c.setblocking(False)
        sent = 0
        try:
            while sent < PRE:
                sent += c.send(PREAMBLE[sent:])
        except BlockingIOError:
            pass
        c.setblocking(True)
        if sent >= PRE:
            raise RuntimeError(f"{PRE} bytes went out without EAGAIN: the test needs TCP to refuse")
        p.modify(c, select.POLLIN | select.POLLOUT)
        p.poll(0)
        conns.append((c, sent))
    total = 0
    for i, (c, sent) in enumerate(conns):
        c.sendall(PREAMBLE[sent:])
        c.sendall(BANNER)
        got = recv_exact(c, SIZE)
        c.sendall(got)
        total += len(got)
    for c, _ in conns:
        if c.recv(1) != b"":
            raise RuntimeError("bytes after the client's data")
        c.close()
    print(f"served {n} {total}", flush=True)


def connect(port, n, flag):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUF)
        s.setblocking(False)
        e = s.connect_ex(("127.0.0.1", port))
        if e not in (0, 115):  # EINPROGRESS
            raise RuntimeError(f"connect: errno {e}")
        socks.append(s)
    open(flag, "w").close()
    # half of them waited for with poll, half with epoll: a connection the server tells to stay
    # plain is handed to the kernel while registered, and the program's registration with it
    p, ep = select.poll(), select.epoll()
    in_ep = set()
    for i, s in enumerate(socks):
        if i % 2:
            ep.register(s.fileno(), select.EPOLLOUT)
            in_ep.add(s.fileno())
        else:
            p.register(s, select.POLLOUT)
    left = {s.fileno() for s in socks}
    deadline = time.monotonic() + 30
    while left:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(left)} connects still pending after 30 s")
        for fd, _ in p.poll(20) + ep.poll(0.02):
            if fd in left:
                left.discard(fd)
                if fd in in_ep:
                    ep.unregister(fd)
                else:
                    p.unregister(fd)
    ep.close()
    for i, s in enumerate(socks):
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise RuntimeError(f"connection {i}: SO_ERROR {err}")
        s.setblocking(True)
    total = 0
    for i, s in enumerate(socks):
        if recv_exact(s, PRE) != PREAMBLE:
            raise RuntimeError(f"connection {i}: the preamble differs")
        b = recv_exact(s, len(BANNER))
        if b != BANNER:
            raise RuntimeError(f"connection {i}: banner {b[:40]!r}")
        data = pattern(i)[:SIZE]
        s.sendall(data)
        back = recv_exact(s, SIZE)
        if back != data:
            raise RuntimeError(f"connection {i}: the echo differs")
        s.shutdown(socket.SHUT_WR)
        total += SIZE
    for s in socks:
        s.close()
    print(f"echoed {n} {total}", flush=True)


if __name__ == "__main__":
    role, port, n, flag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    try:
        (serve if role == "serve" else connect)(port, n, flag)
    except Exception as e:  # the script's caller reads the line
        print(f"noroom {role}: FAIL: {e}", flush=True)
        sys.exit(1)
