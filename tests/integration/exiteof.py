"""exiteof.py: a writer that sends N bytes on TCP and then ends in one of several ways, and a
reader that must read exactly N bytes and then end of file (issue "Hardening", item 3).

  exiteof.py read PORT N             accept one connection, read to the end, print the count
                                     and how it ended ("EOF" or the error), exit 0 only for N+EOF
  exiteof.py write PORT N HOW        connect, sendall N bytes (a pattern), then HOW: close,
                                     shutdown, return, exit, _exit, kill
EXITEOF_HOST: the reader's address (default 127.0.0.1).
"""
import os, signal, socket, sys

HOST = os.environ.get("EXITEOF_HOST", "127.0.0.1")  # the reader's address (two hosts: host a's)

def pattern(n):
    block = bytes(range(256)) * 256
    out = bytearray()
    while len(out) < n:
        out += block
    return bytes(out[:n])

if sys.argv[1] == "read":
    port, n = int(sys.argv[2]), int(sys.argv[3])
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((HOST, port)); l.listen(1)
    print("listening", flush=True)
    c, _ = l.accept(); c.settimeout(20)
    got = bytearray(); how = "EOF"
    try:
        while True:
            b = c.recv(1 << 16)
            if not b:
                break
            got += b
    except Exception as e:
        how = repr(e)
    ok = len(got) == n and how == "EOF" and bytes(got) == pattern(n)
    print(len(got), how, "same bytes" if bytes(got) == pattern(len(got)) else "DIFFERENT bytes", flush=True)
    sys.exit(0 if ok else 1)

port, n, how = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
s = socket.create_connection((HOST, port))
s.sendall(pattern(n))
if how == "close":
    s.close()
elif how == "shutdown":
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
elif how == "exit":
    sys.exit(0)
elif how == "_exit":
    os._exit(0)
elif how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
# "return": falls off the end
