#!/usr/bin/env python3
"""latereq.py: a client whose MPA Request comes long after the server accepted (issue 14: SIPp's
UAC at 500 new connections a second sent it late, and the server's shim, which waited for it 5
s in the program's call, stalled the whole single-threaded UAS and then reset the connection).

The client runs its shim with DGSHIM_PROGRESS=app (no thread of the provider's: the Request goes
out in the client's own next call once TCP is up) and connects without blocking while the
server's accept queue is full (a plain filler connection in it, listen backlog 0), so the
kernel drops its SYN and its connect() returns before TCP is up; the SYN goes again after 1 s,
the server accepts, and the client then sleeps DELAY seconds before its next call. What the
server's program must see meanwhile is what the kernel shows it for a client that has sent
nothing yet, at once: a non-blocking recv EAGAIN, FIONREAD 0, poll(POLLIN) nothing; and later
the client's bytes. Two connections, one after the other:

  A  the server waits for the bytes in epoll_wait (EPOLLIN), then a non-blocking recv
  B  the server waits in a blocking recv

  latereq.py serve PORT DIR      prints "listening"; files in DIR order the steps
  latereq.py fill PORT DIR       a plain client (not preloaded): fills the accept queue twice
  latereq.py connect PORT DIR DELAY
Each side prints "ok NAME ..." per check passed, "FAIL NAME ..." otherwise; exit 0 when all passed.
"""
import errno
import fcntl
import os
import select
import socket
import struct
import sys
import termios
import time

FAILS = 0


def check(cond, name, msg):
    global FAILS
    print(("ok " if cond else "FAIL ") + name + ": " + msg, flush=True)
    if not cond:
        FAILS += 1


def wait_file(path, secs=60):
    end = time.time() + secs
    while not os.path.exists(path):
        if time.time() > end:
            raise RuntimeError("no " + path + " after %d s" % secs)
        time.sleep(0.01)


def touch(path):
    open(path, "w").close()


def serve(port, d):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(0)  # one connection fills the queue
    print("listening", flush=True)
    for tag in ("A", "B"):
        wait_file(os.path.join(d, "connecting" + tag))  # the filler is queued, the client's SYN dropped
        filler, _ = ls.accept()
        c, _ = ls.accept()  # the client's SYN, sent again after 1 s, gets in now
        touch(os.path.join(d, "accepted" + tag))
        t0 = time.time()
        c.setblocking(False)
        try:
            got = c.recv(16)
            check(False, tag + "_nb_recv", "non-blocking recv before the client sent anything: %r" % got)
        except BlockingIOError:
            check(True, tag + "_nb_recv", "EAGAIN")
        n = struct.unpack("i", fcntl.ioctl(c.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
        check(n == 0, tag + "_fionread", "FIONREAD %d" % n)
        p = select.poll()
        p.register(c, select.POLLIN)
        ev = p.poll(0)
        check(ev == [], tag + "_poll", "poll(POLLIN, 0): %r" % ev)
        dt = time.time() - t0
        check(dt < 1.0, tag + "_prompt", "the first calls took %.3f s (want < 1: they must not wait "
              "for the client's MPA Request)" % dt)
        if tag == "A":
            c.setblocking(False)
            ep = select.epoll()
            ep.register(c.fileno(), select.EPOLLIN)
            evs = ep.poll(30)
            check(any(e & select.EPOLLIN for _, e in evs), "A_epoll", "epoll_wait: %r after %.1f s"
                  % (evs, time.time() - t0))
            got = b""
            end = time.time() + 10
            while len(got) < 4 and time.time() < end:
                try:
                    got += c.recv(16)
                except BlockingIOError:
                    ep.poll(1)
            ep.close()
        else:
            c.setblocking(True)
            c.settimeout(None)
            got = c.recv(16)
        check(got == b"ping", tag + "_data", "%r after %.1f s" % (got, time.time() - t0))
        c.setblocking(True)
        c.sendall(b"pong")
        check(c.recv(16) == b"", tag + "_end", "end of stream after the client's close")
        c.close()
        filler.close()
    ls.close()


def fill(port, d):
    for tag in ("A", "B"):
        if tag == "B":
            wait_file(os.path.join(d, "done" + "A"))
        f = socket.create_connection(("127.0.0.1", port))
        touch(os.path.join(d, "filled" + tag))
        wait_file(os.path.join(d, "done" + tag))
        f.close()


def connect(port, d, delay):
    for tag in ("A", "B"):
        wait_file(os.path.join(d, "filled" + tag))
        c = socket.socket()
        c.setblocking(False)
        r = c.connect_ex(("127.0.0.1", port))
        check(r == errno.EINPROGRESS, tag + "_connect", "non-blocking connect: %s" % errno.errorcode.get(r, r))
        touch(os.path.join(d, "connecting" + tag))
        wait_file(os.path.join(d, "accepted" + tag))
        time.sleep(delay)  # no call into the shim: the Request waits
        p = select.poll()
        p.register(c, select.POLLOUT)
        ev = p.poll(30000)
        check(bool(ev) and ev[0][1] & select.POLLOUT, tag + "_connected", "POLLOUT: %r" % ev)
        c.setblocking(True)
        c.sendall(b"ping")
        got = c.recv(16)
        check(got == b"pong", tag + "_reply", "%r" % got)
        c.close()
        touch(os.path.join(d, "done" + tag))


def main():
    role, port, d = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if role == "serve":
        serve(port, d)
    elif role == "fill":
        fill(port, d)
    else:
        connect(port, d, float(sys.argv[4]))
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
