#!/usr/bin/env python3
"""mpa_responder_probe.py - does an MPA responder hold its FPDUs until the initiator's first one?

RFC 5044 section 7.1.2 (connection startup rules): an MPA responder MUST receive and validate at
least one FPDU before it sends any FPDU or marker (so that the initiator can move its receiver
into full operation after the Reply; RFC 6581's peer-to-peer RTR exists to relax exactly this).
Linux siw as initiator fails the connection with EPROTO/EINVAL when an FPDU arrives together
with the MPA Reply, which makes this rule observable in interop (scripts/vm-test).

This probe plays a bare initiator over plain TCP on the loopback against `rc_interop -E server`
(the soft provider's responder, whose application posts a Send right after ESTABLISHED):
  1. sends an MPA Request (revision 2, enhanced, IRD/ORD 4, no peer-to-peer RTR, CRC off) whose
     private data is an interop_proto.h iop_pdata;
  2. reads the Reply, then listens for --wait seconds: any byte now is an FPDU sent too early;
  3. sends its own first FPDU (an untagged Send of one iop_ctl READY; with CRC when the Reply
     asked for it) and reads what follows: the held FPDU should arrive now.
Prints the bytes seen and `@@OP responder_waits PASS|FAIL ...`; exit 0 on PASS, 1 on FAIL.

    tests/vm/mpa_responder_probe.py HOST PORT [--wait SECONDS]
"""
import select
import socket
import struct
import sys
import time

IOP_MAGIC = 0x44474957


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def recv_exact(s, n, deadline):
    b = b""
    while len(b) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([s], [], [], left)[0]:
            raise TimeoutError("wanted %d bytes, got %d" % (n, len(b)))
        c = s.recv(n - len(b))
        if not c:
            raise ConnectionError("peer closed after %d of %d bytes" % (len(b), n))
        b += c
    return b


def drain(s, seconds):
    b = b""
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0 or not select.select([s], [], [], left)[0]:
            return b
        c = s.recv(65536)
        if not c:
            return b
        b += c


def main():
    args = sys.argv[1:]
    wait = 1.0
    if "--wait" in args:
        i = args.index("--wait")
        wait = float(args[i + 1])
        del args[i:i + 2]
    if len(args) != 2:
        print(__doc__)
        return 2
    host, port = args[0], int(args[1])
    s = socket.create_connection((host, port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pdata = struct.pack("!IIQII", IOP_MAGIC, 1, 0x10000, 0x1234, 256 * 1024)
    v2 = struct.pack("!HH", 4, 4)  # IRD 4, ORD 4, no A/P/Z/R control bits: no RTR
    flags = 0x10                   # E (enhanced, RFC 6581) set; M=0, C=0, R=0
    req = b"MPA ID Req Frame" + bytes([flags, 2]) + struct.pack("!H", len(v2) + len(pdata)) + v2 + pdata
    s.sendall(req)
    dl = time.monotonic() + 10
    hdr = recv_exact(s, 20, dl)
    if hdr[:16] != b"MPA ID Rep Frame":
        print("not an MPA Reply: %s" % hdr.hex(" "))
        print("@@OP responder_waits FAIL no MPA Reply")
        return 1
    rflags, rrev, pdl = hdr[16], hdr[17], struct.unpack("!H", hdr[18:20])[0]
    rpd = recv_exact(s, pdl, dl)
    crc_on = bool(rflags & 0x40) or bool(flags & 0x40)
    print("MPA Reply: flags %#04x (M=%d C=%d R=%d) rev %d, %d bytes of private data%s" % (
        rflags, rflags >> 7 & 1, rflags >> 6 & 1, rflags >> 5 & 1, rrev, pdl,
        ", IRD/ORD word %s" % rpd[:4].hex(" ") if rflags & 0x10 else ""))
    if rflags & 0x20:
        print("@@OP responder_waits FAIL the responder rejected the request")
        return 1
    early = drain(s, wait)
    print("bytes from the responder in the %.1f s after its Reply, before our first FPDU: %d%s" % (
        wait, len(early), (": " + early[:48].hex(" ")) if early else ""))
    # our first FPDU: untagged Send (DDP ctrl 0x41 = T0 L1 DV1, RDMAP 0x43 = RV1 Send), QN 0 MSN 1 MO 0
    ctl = struct.pack("!IIIIII", IOP_MAGIC, 1, 0, 0, 0, 0)
    ulpdu = bytes([0x41, 0x43]) + struct.pack("!IIII", 0, 0, 1, 0) + ctl
    fpdu = struct.pack("!H", len(ulpdu)) + ulpdu
    fpdu += b"\0" * ((4 - len(fpdu) % 4) % 4)
    fpdu += struct.pack("<I", crc32c(fpdu) if crc_on else 0)
    s.sendall(fpdu)
    late = drain(s, 3.0)
    print("bytes from the responder after our first FPDU: %d%s" % (
        len(late), (": " + late[:48].hex(" ")) if late else ""))
    s.close()
    if early:
        ulen = struct.unpack("!H", early[:2])[0] if len(early) >= 2 else 0
        op = early[3] & 15 if len(early) >= 4 else -1
        print("@@OP responder_waits FAIL the responder sent an FPDU (ULPDU %d bytes, RDMAP opcode %d) before "
              "receiving the initiator's first FPDU (RFC 5044 section 7.1.2)" % (ulen, op))
        return 1
    if not late:
        print("@@OP responder_waits FAIL nothing arrived even after our first FPDU (the held Send was lost)")
        return 1
    print("@@OP responder_waits PASS the responder held its Send until the initiator's first FPDU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
