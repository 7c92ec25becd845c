#!/usr/bin/env python3
"""mpa_trace.py - decode an iWARP (MPA/DDP/RDMAP over TCP) capture made by scripts/vm-test
(VM_CAPTURE=1): reassembles each TCP direction, then prints the MPA Request/Reply and one line per
FPDU (ULPDU length, pad, DDP tagged/last bits, RDMAP opcode, STag/TO or QN/MSN/MO, payload bytes,
CRC as received and as computed). No dependencies beyond the Python standard library.

    tests/vm/mpa_trace.py FILE.pcap [--max N] [--crc]

Assumes no MPA markers (the test bed negotiates none). --crc recomputes each FPDU's CRC32c
(slow in pure Python; only useful when CRC was negotiated).
"""
import struct
import sys

RDMAP_OPS = {0: "Write", 1: "ReadReq", 2: "ReadResp", 3: "Send", 4: "SendInv", 5: "SendSE",
             6: "SendSEInv", 7: "Terminate", 8: "WriteRecord"}


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def packets(path):
    with open(path, "rb") as f:
        gh = f.read(24)
        magic = struct.unpack("<I", gh[:4])[0]
        en = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
        linktype = struct.unpack(en + "I", gh[20:24])[0]
        while True:
            h = f.read(16)
            if len(h) < 16:
                return
            _, _, incl, _ = struct.unpack(en + "IIII", h)
            yield linktype, f.read(incl)


def tcp_segments(path):
    for lt, p in packets(path):
        if lt == 1:          # Ethernet
            if len(p) < 14 or struct.unpack("!H", p[12:14])[0] != 0x0800:
                continue
            ip = p[14:]
        elif lt in (0, 108):  # BSD loopback
            ip = p[4:]
        elif lt == 113:       # Linux cooked
            ip = p[16:]
        else:
            ip = p
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
            continue
        ihl = (ip[0] & 15) * 4
        tot = struct.unpack("!H", ip[2:4])[0]
        src, dst = ip[12:16], ip[16:20]
        t = ip[ihl:tot]
        sport, dport, seq = struct.unpack("!HHI", t[:8])
        off = (t[12] >> 4) * 4
        flags = t[13]
        yield ("%d.%d.%d.%d:%d" % (*src, sport), "%d.%d.%d.%d:%d" % (*dst, dport), seq, flags, t[off:])


def streams(path):
    """{(src, dst): bytes} in sequence order, retransmissions dropped."""
    segs, isn = {}, {}
    for s, d, seq, flags, data in tcp_segments(path):
        k = (s, d)
        if flags & 0x02:  # SYN
            isn[k] = seq + 1
            continue
        if data:
            segs.setdefault(k, {})[seq] = data
    out = {}
    for k, m in segs.items():
        nxt = isn.get(k, min(m))
        buf = bytearray()
        for seq in sorted(m, key=lambda x: (x - nxt) & 0xFFFFFFFF):
            d = m[seq]
            rel = (seq - nxt) & 0xFFFFFFFF
            if rel > len(buf):
                buf += b"\0" * (rel - len(buf))  # a hole (capture loss)
            buf[rel:rel + len(d)] = d
        out[k] = bytes(buf)
    return out


def decode(direction, b, crc_check, maxn):
    print("== %s -> %s: %d bytes" % (direction[0], direction[1], len(b)))
    pos = 0
    if b[:4] == b"MPA " and len(b) >= 20:
        key = b[:16].decode(errors="replace")
        flags, rev, pdl = b[16], b[17], struct.unpack("!H", b[18:20])[0]
        print("  MPA %-16s M=%d C=%d R=%d S=%d rev=%d pd_len=%d" % (key.strip(), flags >> 7 & 1, flags >> 6 & 1,
              flags >> 5 & 1, flags >> 4 & 1, rev, pdl))
        pd = b[20:20 + pdl]
        if flags & 0x10 and rev == 2 and len(pd) >= 4:
            ird, ord_ = struct.unpack("!HH", pd[:4])
            print("    RFC 6581 word: IRD %d%s%s  ORD %d%s%s" % (ird & 0x3FFF, " A" if ird & 0x8000 else "",
                  " P" if ird & 0x4000 else "", ord_ & 0x3FFF, " Z" if ord_ & 0x8000 else "",
                  " R" if ord_ & 0x4000 else ""))
        pos = 20 + pdl
    n = 0
    while pos + 2 <= len(b) and n < maxn:
        ulen = struct.unpack("!H", b[pos:pos + 2])[0]
        pad = (4 - ((ulen + 2) & 3)) & 3
        flen = 2 + ulen + pad + 4
        if pos + flen > len(b):
            print("  @%d: FPDU of ULPDU %d truncated by the capture end" % (pos, ulen))
            break
        u = b[pos + 2:pos + 2 + ulen]
        ctl, rctl = u[0], u[1]
        tagged, last = ctl >> 7 & 1, ctl >> 6 & 1
        op = rctl & 15
        crc = struct.unpack("<I", b[pos + flen - 4:pos + flen])[0]
        line = "  @%-7d ULPDU %5d pad %d %s%s dv=%d rv=%d %-10s" % (pos, ulen, pad, "T" if tagged else "U",
                                                                    "L" if last else "-", ctl & 3, rctl >> 6,
                                                                    RDMAP_OPS.get(op, "op%d" % op))
        if tagged:
            stag, to = struct.unpack("!IQ", u[2:14])
            line += " stag %#010x to %#x payload %d" % (stag, to, ulen - 14)
        else:
            qn, msn, mo = struct.unpack("!III", u[6:18])
            line += " qn %d msn %d mo %d payload %d" % (qn, msn, mo, ulen - 18)
            if op == 1 and ulen >= 18 + 28:
                ss, st, rsz, srs, sto = struct.unpack("!IQIIQ", u[18:46])
                line += " [sink %#x@%#x size %d src %#x@%#x]" % (ss, st, rsz, srs, sto)
            if op == 7 and ulen >= 22:
                h = u[18]
                line += " [layer %d etype %d ecode %#x]" % (h >> 4, h & 15, u[19])
        if crc_check:
            c = crc32c(b[pos:pos + flen - 4])
            line += " crc %08x%s" % (crc, "" if c == crc else " (computed %08x!)" % c)
        else:
            line += " crc %08x" % crc
        print(line)
        pos += flen
        n += 1
    if pos < len(b) and n < maxn:
        print("  %d bytes left over at %d" % (len(b) - pos, pos))


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    maxn = 1 << 30
    if "--max" in args:
        i = args.index("--max")
        maxn = int(args[i + 1])
        del args[i:i + 2]
    crc_check = "--crc" in args
    args = [a for a in args if a != "--crc"]
    for k, b in sorted(streams(args[0]).items()):
        decode(k, b, crc_check, maxn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
