#!/usr/bin/env python3
"""splicecheck.py: splice(2) into and out of a TCP connection, as a proxy or a file server
would (os.splice: the kernel moves the bytes, the program never sees them).

  splicecheck.py serve PORT N    accept one connection, splice everything it receives into a
                                 pipe (another thread reads the pipe), until end of file;
                                 prints "got BYTES SHA256"
  splicecheck.py send PORT N     connect, send N pattern bytes: the first half spliced from a
                                 pipe (a thread writes it), the second half from a file at an
                                 offset through a pipe; prints "sent BYTES SHA256"

Under the shim both ends are carried over RC: the bytes spliced must travel as the program's
data, never as raw bytes in the middle of the iWARP stream.
"""
import hashlib
import os
import socket
import sys
import tempfile
import threading


def pattern(n):
    out = bytearray(n)
    x = 0x9E3779B9
    for i in range(0, n, 4):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        out[i:i + 4] = x.to_bytes(4, "little")[: n - i]
    return bytes(out)


def serve(port, n):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(1)
    print("listening", flush=True)
    c, _ = ls.accept()
    r, w = os.pipe()
    h = hashlib.sha256()
    got = [0]

    def drain():
        while True:
            b = os.read(r, 65536)
            if not b:
                return
            h.update(b)
            got[0] += len(b)

    t = threading.Thread(target=drain)
    t.start()
    while True:
        k = os.splice(c.fileno(), w, 65536)
        if k == 0:
            break
    os.close(w)
    t.join()
    print("got", got[0], h.hexdigest(), flush=True)
    return 0 if got[0] == n else 1


def send(port, n):
    data = pattern(n)
    half = n // 2
    s = socket.create_connection(("127.0.0.1", port))
    r, w = os.pipe()

    def feed():
        os.write(w, data[:half])
        os.close(w)

    t = threading.Thread(target=feed)
    t.start()
    sent = 0
    while sent < half:
        k = os.splice(r, s.fileno(), half - sent)
        if k == 0:
            break
        sent += k
    t.join()
    os.close(r)
    # the second half from a file at an offset: file -> pipe -> socket, as a file server would
    with tempfile.TemporaryFile() as f:
        f.write(b"x" * 1000 + data[half:])
        f.flush()
        off = 1000
        r, w = os.pipe()
        while sent < n:
            k = os.splice(f.fileno(), w, min(65536, n - sent), offset_src=off)
            if k == 0:
                break
            off += k
            while k:
                m = os.splice(r, s.fileno(), k)
                k -= m
                sent += m
        os.close(r)
        os.close(w)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    s.close()
    print("sent", sent, hashlib.sha256(data[:sent]).hexdigest(), flush=True)
    return 0 if sent == n else 1


if __name__ == "__main__":
    role, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sys.exit(serve(port, n) if role == "serve" else send(port, n))
