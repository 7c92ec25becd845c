"""soakpeer.py: the programs ./scripts/soak starts and stops, run unmodified under the shim.

  soakpeer.py udp-server PORT           echo every datagram; check each client's datagrams
  soakpeer.py udp-client PORT RELIABLE SECONDS SEED
  soakpeer.py tcp-server PORT           echo every connection's bytes back
  soakpeer.py tcp-client PORT SECONDS SEED

A datagram is a 16-byte header (magic "SOAK", client id, sequence number, payload length, all
big-endian) and a payload that is a function of (client id, sequence number), so every side can
check every byte. RELIABLE=1 (the RD service) also demands exactly once and in order, on the
server per client and on the client for the echoes; RELIABLE=0 (UD) only that nothing arrives
corrupt, out of thin air or (beyond the duplicates the fault injection makes) twice.
A TCP client writes a stream whose bytes are a function of (seed, offset) in chunks of random
size, reads the echo back and checks it, then shuts down and expects exactly what it sent, then
end of file. Servers count and print a JSON line on SIGTERM or SIGINT (and every 2 s to stdout:
"stat" lines the soak reads); clients print one JSON line at the end. Exit 0 when every check
held, 1 otherwise; a client's failure names the first thing that broke on stderr.
"""
import json, os, random, selectors, signal, socket, struct, sys, time

HDR = struct.Struct("!4sIII")
MAGIC = b"SOAK"
BYE = 0xFFFFFFFF


def payload(cid, seq, n):
    """n bytes determined by (cid, seq): a repeated 8-byte word, cheap to make and to check."""
    word = struct.pack("!II", cid, seq ^ 0x5A5A5A5A)
    return (word * (n // 8 + 1))[:n]


_cycles = {}


def stream_bytes(seed, off, n):
    """n bytes of the TCP stream of seed from offset off: byte i is (i * 131 + seed) mod 251,
    which repeats every 251 bytes, so the bytes are cut from a repeated cycle."""
    c = _cycles.get(seed)
    if c is None:
        c = _cycles[seed] = bytes((i * 131 + seed) % 251 for i in range(251))
    o = off % 251
    return (c * ((o + n) // 251 + 1))[o:o + n]


def fail(msg):
    sys.stderr.write("soakpeer: %s\n" % msg)
    sys.stderr.flush()


stop = [False]


def on_stop(sig, frame):
    stop[0] = True


def udp_server(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    s.bind(("127.0.0.1", port))
    s.settimeout(0.2)
    st = {"datagrams": 0, "bytes": 0, "bad": 0, "order": 0, "dups": 0, "clients": 0}
    peers = {}  # address -> [next expected seq, highest seen, last heard]
    last = time.monotonic()
    print("ready", flush=True)
    while not stop[0]:
        now = time.monotonic()
        if now - last >= 2:
            # forget clients that went quiet (killed before their goodbye): bounded state
            for a in [a for a, p in peers.items() if now - p[2] > 10]:
                del peers[a]
            print("stat " + json.dumps(dict(st, peers=len(peers))), flush=True)
            last = now
        try:
            d, a = s.recvfrom(65536)
        except socket.timeout:
            continue
        except InterruptedError:
            continue
        if len(d) < HDR.size:
            st["bad"] += 1
            fail("short datagram (%d bytes) from %s" % (len(d), a))
            continue
        magic, cid, seq, n = HDR.unpack_from(d)
        if magic != MAGIC or n != len(d) - HDR.size:
            st["bad"] += 1
            fail("bad header from %s" % (a,))
            continue
        p = peers.get(a)
        if seq == BYE:
            peers.pop(a, None)
            s.sendto(d, a)
            continue
        if d[HDR.size:] != payload(cid, seq, n):
            st["bad"] += 1
            fail("corrupt payload cid=%d seq=%d from %s" % (cid, seq, a))
            continue
        if p is None:
            p = peers[a] = [0, -1, now]
            st["clients"] += 1
        p[2] = now
        if reliable:
            if seq != p[0]:
                st["order"] += 1
                fail("RD: seq %d from %s, expected %d" % (seq, a, p[0]))
            p[0] = seq + 1
        elif seq <= p[1]:
            st["dups"] += 1  # UD: a duplicate or a late one; the client tells them apart
        p[1] = max(p[1], seq)
        st["datagrams"] += 1
        st["bytes"] += n
        s.sendto(d, a)
    print("final " + json.dumps(dict(st, peers=len(peers))), flush=True)
    return 0 if st["bad"] == 0 and st["order"] == 0 else 1


def udp_client(port, secs, seed):
    rnd = random.Random(seed)
    cid = seed & 0xFFFFFFFF
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("127.0.0.1", port))
    s.settimeout(10 if reliable else 0.2)
    window = 8 if reliable else 1
    st = {"sent": 0, "echoed": 0, "bytes": 0, "lost": 0, "bad": 0, "order": 0}
    seq = 0
    want = 0  # RD: the next echo expected
    seen = set()
    t_end = time.monotonic() + secs
    ok = True
    while ok and time.monotonic() < t_end:
        first = seq
        for _ in range(window):
            n = rnd.choice((rnd.randint(1, 64), rnd.randint(1, 1400), rnd.randint(1400, 6000)))
            s.send(HDR.pack(MAGIC, cid, seq, n) + payload(cid, seq, n))
            seq += 1
            st["sent"] += 1
        got = 0
        while got < seq - first:
            try:
                d = s.recv(65536)
            except socket.timeout:
                if reliable:
                    fail("RD: no echo of seq %d within 10 s" % want)
                    ok = False
                else:
                    st["lost"] += seq - first - got
                break
            magic, rcid, rseq, n = HDR.unpack_from(d)
            if magic != MAGIC or rcid != cid or rseq >= seq or d[HDR.size:] != payload(cid, rseq, n):
                st["bad"] += 1
                fail("bad echo (cid %d seq %d)" % (rcid, rseq))
                ok = False
                break
            if reliable:
                if rseq != want:
                    st["order"] += 1
                    fail("RD: echo seq %d, expected %d" % (rseq, want))
                    ok = False
                    break
                want += 1
                got += 1
            else:
                if rseq in seen:
                    continue  # a duplicate the fault injection made, or a late echo
                seen.add(rseq)
                if rseq >= first:
                    got += 1
            st["echoed"] += 1
            st["bytes"] += n
    if ok:
        s.send(HDR.pack(MAGIC, cid, BYE, 0))
    print(json.dumps(st), flush=True)
    return 0 if ok and st["bad"] == 0 and st["order"] == 0 else 1


def tcp_server(port):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(128)
    l.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(l, selectors.EVENT_READ)
    st = {"conns": 0, "eof": 0, "reset": 0, "bytes": 0}
    pend = {}  # socket -> bytes not yet echoed
    last = time.monotonic()
    print("ready", flush=True)
    while not stop[0]:
        now = time.monotonic()
        if now - last >= 2:
            print("stat " + json.dumps(dict(st, open=len(pend))), flush=True)
            last = now
        for key, ev in sel.select(0.2):
            c = key.fileobj
            if c is l:
                try:
                    n, _ = l.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                n.setblocking(False)
                pend[n] = b""
                sel.register(n, selectors.EVENT_READ)
                st["conns"] += 1
                continue
            closed = False
            if ev & selectors.EVENT_READ:
                try:
                    b = c.recv(1 << 16)
                    if not b:
                        st["eof"] += 1
                        closed = True
                    else:
                        pend[c] += b
                        st["bytes"] += len(b)
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    st["reset"] += 1
                    closed = True
            if pend.get(c):
                try:
                    k = c.send(pend[c])
                    pend[c] = pend[c][k:]
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    st["reset"] += 1
                    closed = True
            if closed:
                # the echo of what came before the end still goes out (blocking, bounded)
                if pend.get(c):
                    try:
                        c.setblocking(True)
                        c.settimeout(5)
                        c.sendall(pend[c])
                    except OSError:
                        pass
                sel.unregister(c)
                pend.pop(c, None)
                c.close()
            else:
                sel.modify(c, selectors.EVENT_READ | (selectors.EVENT_WRITE if pend[c] else 0))
    print("final " + json.dumps(dict(st, open=len(pend))), flush=True)
    return 0


def tcp_client(port, secs, seed):
    rnd = random.Random(seed)
    sseed = seed % 251
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    st = {"sent": 0, "echoed": 0}
    t_end = time.monotonic() + secs
    ok = True
    while ok and time.monotonic() < t_end:
        n = rnd.choice((rnd.randint(1, 100), rnd.randint(100, 8000), rnd.randint(8000, 200000)))
        s.sendall(stream_bytes(sseed, st["sent"], n))
        st["sent"] += n
        while st["echoed"] < st["sent"]:
            b = s.recv(min(1 << 16, st["sent"] - st["echoed"]))
            if not b:
                fail("TCP: end of stream after %d of %d echoed bytes" % (st["echoed"], st["sent"]))
                ok = False
                break
            if b != stream_bytes(sseed, st["echoed"], len(b)):
                fail("TCP: echo differs at offset %d" % st["echoed"])
                ok = False
                break
            st["echoed"] += len(b)
    if ok:
        s.shutdown(socket.SHUT_WR)
        if s.recv(1) != b"":
            fail("TCP: bytes after the whole echo")
            ok = False
    s.close()
    print(json.dumps(st), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    role, port = sys.argv[1], int(sys.argv[2])
    reliable = role == "udp-server" and os.environ.get("SOAK_RELIABLE") == "1"
    if role == "udp-server":
        sys.exit(udp_server(port))
    if role == "udp-client":
        reliable = sys.argv[3] == "1"
        sys.exit(udp_client(port, float(sys.argv[4]), int(sys.argv[5])))
    if role == "tcp-server":
        sys.exit(tcp_server(port))
    if role == "tcp-client":
        sys.exit(tcp_client(port, float(sys.argv[3]), int(sys.argv[4])))
    sys.exit(2)
