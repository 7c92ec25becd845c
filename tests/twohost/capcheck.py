#!/usr/bin/env python3
"""capcheck.py PCAP [--plain-host IP]... [--want-framed N] [--want-mpa N] [--label L]

Reads a capture made on the two-host test bed's veth (tcpdump -w, Ethernet, IPv4) and proves
what crossed the wire between the hosts:

  framed datagram  a UDP payload that is datagram-iWARP: an RD header (first byte 0xD2) or a
                   DDP/RDMAP header (DV=1, RV=1, reserved bits 0, opcode <= 8), followed by a
                   CRC32c of every preceding byte in its last 4 bytes (verbs_backend/wire.h);
                   the CRC makes a coincidental match (a SIP "ACK ..." starts like a header)
                   a 2^-32 event
  MPA connection   a TCP direction whose byte stream (reassembled by sequence number) begins
                   with the MPA Request or Reply key ("MPA ID Req Frame" / "MPA ID Rep Frame");
                   any other direction that contains a key anywhere is counted too

Checks (exit 1 when one fails, after printing why):
  --plain-host IP  IP runs only unmodified programs: no framed UDP datagram was sent to it
                   (except to the discovery port 18517, whose questions are plain anyway) and
                   no TCP stream to or from it contains an MPA key
  --want-framed N  at least N framed datagrams crossed (a carried run: the capture is not blind)
  --want-mpa N     at least N TCP directions began with an MPA key (RC connections)
  --dropped N      the kernel dropped N packets before the capture saw them: with a
                   --plain-host that fails (the proof has holes)
  --min-seen N     the capture saw at least N UDP datagrams to the plain host plus TCP
                   directions with it (the plain-host check cannot pass on an empty capture)
Prints one summary line: packets, UDP datagrams, framed ones (and to the plain host), TCP
directions with payload, MPA ones (and with the plain host).
"""
import argparse
import ctypes
import struct
import sys

DISCO_PORT = 18517
KEYS = (b"MPA ID Req Frame", b"MPA ID Rep Frame")


def _crc_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_T = _crc_table()


def _crc32c_py(b):
    c = 0xFFFFFFFF
    for x in b:
        c = _T[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _isal():
    # ISA-L (a dependency of the shim): crc32_iscsi takes and returns the raw register
    try:
        lib = ctypes.CDLL("libisal.so.2")
        f = lib.crc32_iscsi
        f.restype = ctypes.c_uint32
        f.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint32]

        def crc(b):
            return f(bytes(b), len(b), 0xFFFFFFFF) ^ 0xFFFFFFFF
        if crc(b"123456789") == 0xE3069283 and crc(b"x" * 1000) == _crc32c_py(b"x" * 1000):
            return crc
    except (OSError, AttributeError):
        pass
    return None


crc32c = _isal() or _crc32c_py


def framed(p):
    if len(p) < 28:
        return False
    b0, b1 = p[0], p[1]
    hdr = b0 == 0xD2 or ((b0 & 0x3F) == 0x01 and (b1 & 0xF0) == 0x40 and (b1 & 0x0F) <= 8)
    return hdr and crc32c(p[:-4]) == struct.unpack(">I", p[-4:])[0]


def packets(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24:
        raise SystemExit(f"capcheck: {path}: not a pcap file ({len(data)} bytes)")
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        e = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        e = ">"
    else:
        raise SystemExit(f"capcheck: {path}: not a pcap file (magic {magic.hex()})")
    linktype = struct.unpack(e + "I", data[20:24])[0]
    if linktype != 1:
        raise SystemExit(f"capcheck: {path}: link type {linktype}, want Ethernet (1)")
    off = 24
    while off + 16 <= len(data):
        _, _, incl, orig = struct.unpack(e + "IIII", data[off:off + 16])
        off += 16
        yield data[off:off + incl], incl < orig
        off += incl


def ip4(b):
    return ".".join(str(x) for x in b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pcap")
    ap.add_argument("--plain-host", action="append", default=[])
    ap.add_argument("--want-framed", type=int, default=0)
    ap.add_argument("--want-mpa", type=int, default=0)
    ap.add_argument("--min-seen", type=int, default=0)
    ap.add_argument("--dropped", type=int, default=0)
    ap.add_argument("--label", default="capture")
    a = ap.parse_args()
    plain = set(a.plain_host)
    n = nudp = nframed = nframed_plain = truncated = nudp_plain = 0
    flows = {}  # (src, sport, dst, dport) -> {seq: payload}
    frags = {}  # (src, dst, id, proto) -> {offset: bytes, 'end': length}
    nfrag = 0
    bad = []
    for frame, trunc in packets(a.pcap):
        n += 1
        truncated += trunc
        if len(frame) < 34 or frame[12:14] != b"\x08\x00":
            continue
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        tot = struct.unpack(">H", ip[2:4])[0]
        proto, src, dst = ip[9], ip4(ip[12:16]), ip4(ip[16:20])
        l4 = ip[ihl:tot]
        fl = struct.unpack(">H", ip[6:8])[0]
        if fl & 0x3FFF:
            # a fragment (a datagram larger than the veth's MTU): reassembled by IP id
            key = (src, dst, ip[4:6], proto)
            fr = frags.setdefault(key, {})
            fr[(fl & 0x1FFF) * 8] = bytes(l4)
            if not fl & 0x2000:
                fr["end"] = (fl & 0x1FFF) * 8 + len(l4)
            if "end" not in fr:
                continue
            whole, pos = bytearray(), 0
            while pos in fr and pos < fr["end"]:
                whole += fr[pos]
                pos += len(fr[pos])
            if pos != fr["end"]:
                continue
            del frags[key]
            nfrag += 1
            l4 = bytes(whole)
        if proto == 17 and len(l4) >= 8:
            sport, dport = struct.unpack(">HH", l4[:4])
            p = l4[8:]
            nudp += 1
            to_plain = dst in plain and DISCO_PORT not in (sport, dport)
            nudp_plain += to_plain
            if DISCO_PORT in (sport, dport):
                continue
            if framed(p):
                nframed += 1
                if to_plain:
                    nframed_plain += 1
                    if nframed_plain <= 3:
                        bad.append(f"framed datagram {src}:{sport} -> {dst}:{dport} "
                                   f"({len(p)} bytes, starts {p[:8].hex()})")
        elif proto == 6 and len(l4) >= 20:
            sport, dport, seq = struct.unpack(">HHI", l4[:8])
            doff = (l4[12] >> 4) * 4
            p = l4[doff:]
            if p:
                flows.setdefault((src, sport, dst, dport), {})[seq] = bytes(p)
    ntcp = nmpa = nmpa_plain = ntcp_plain = 0
    for (src, sport, dst, dport), segs in flows.items():
        ntcp += 1
        ntcp_plain += src in plain or dst in plain
        # reassemble: segments by sequence number (wraparound relative to the lowest seen)
        base = min(segs)
        if max(segs) - base > 1 << 31:
            base = min(s for s in segs if s > 1 << 31)
        stream = bytearray()
        end = None
        for s in sorted(segs, key=lambda s: (s - base) & 0xFFFFFFFF):
            rel = (s - base) & 0xFFFFFFFF
            p = segs[s]
            if end is None or rel >= end:
                stream += p
            elif rel + len(p) > end:
                stream += p[end - rel:]
            end = max(end or 0, rel + len(p))
        head = bytes(stream[:16])
        anywhere = any(k in stream for k in KEYS)
        if head in KEYS or anywhere:
            nmpa += head in KEYS
            if src in plain or dst in plain:
                nmpa_plain += 1
                bad.append(f"MPA key in the TCP stream {src}:{sport} -> {dst}:{dport} "
                           f"({'at its start' if head in KEYS else 'inside'})")
    what = (f"{a.label}: {n} packets ({truncated} truncated, {a.dropped} dropped); {nudp} UDP datagrams, "
            f"{nframed} framed ({nfrag} reassembled from fragments), {nudp_plain} to the unmodified "
            f"host ({nframed_plain} framed); {ntcp} TCP directions with payload ({ntcp_plain} with "
            f"the unmodified host), {nmpa} beginning with an MPA key ({nmpa_plain} with the "
            f"unmodified host)")
    print(what)
    fail = []
    if plain and (nframed_plain or nmpa_plain):
        fail.append("iWARP bytes reached the unmodified host " + ", ".join(sorted(plain)))
    if plain and a.dropped:
        fail.append(f"the kernel dropped {a.dropped} packets before the capture saw them: "
                    "the check is blind there")
    if truncated:
        fail.append(f"{truncated} packets truncated by the capture (snaplen): the check is blind there")
    if nframed < a.want_framed:
        fail.append(f"{nframed} framed datagrams crossed the veth, want >= {a.want_framed}")
    if nudp_plain + ntcp_plain < a.min_seen:
        fail.append(f"the capture saw {nudp_plain} datagrams to the unmodified host and "
                    f"{ntcp_plain} TCP directions with it, want >= {a.min_seen} in all")
    if nmpa < a.want_mpa:
        fail.append(f"{nmpa} TCP directions began with an MPA key, want >= {a.want_mpa}")
    for b in bad:
        print(f"{a.label}:   {b}")
    for f in fail:
        print(f"{a.label}: FAIL: {f}")
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
