#!/usr/bin/env python3
"""Writes the seed corpora tests/fuzz/corpus/<harness>/ (docs/fuzzing.md).

The seeds start from the worked examples of docs/wire.md (sections 10, 11 and 12.10) and add
one valid input per opcode and per branch a harness's input format has, so that each harness
begins inside the decoder's accepting paths instead of having to find them. Run it after a
change to a harness's input format: ./tests/fuzz/seeds.py (it rewrites the seed directories).
"""
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def wire_hex(text):
    """The hex lines of a fenced block in docs/wire.md, checked to be there."""
    with open(os.path.join(HERE, "..", "..", "docs", "wire.md")) as f:
        doc = f.read()
    assert text in doc, f"docs/wire.md no longer has {text[:20]}..."
    return bytes.fromhex(text)


# --- datagram-iWARP (wire.h) -------------------------------------------------------------
WRITE, READ_REQ, READ_RESP, SEND, SEND_INV, SEND_SE, SEND_SE_INV, TERMINATE, WRITE_RECORD = range(9)


def ctrl(tagged, last, op):
    return (0x8000 if tagged else 0) | (0x4000 if last else 0) | 0x0100 | 0x0040 | op


def tagged(op, last, stag, to, msn, mo, ml, segsz):
    return struct.pack(">HIQIIIHH", ctrl(True, last, op), stag, to, msn, mo, ml, segsz, 0)


def untagged(op, last, qn, msn, mo, ml, segsz, inv=0):
    return struct.pack(">HIIIIIHH", ctrl(False, last, op), inv, qn, msn, mo, ml, segsz, 0)


def read_req(sink_stag, sink_to, size, src_stag, src_to):
    return struct.pack(">IQIIQ", sink_stag, sink_to, size, src_stag, src_to)


def terminate(layer, etype, ecode, hdrct=0, body=b""):
    return struct.pack(">IHH", layer << 28 | etype << 24 | ecode << 16 | hdrct, len(body), 0) + body


def rd_hdr(flags, wnd, epoch, seq, ack_epoch=0, ack=0, sack=0):
    return struct.pack(">BBHIIIII", 0xD2, flags, wnd, epoch, seq, ack_epoch, ack, sack)


def one_segment_messages():
    """One valid single-segment message per opcode, plus the worked examples."""
    ex1 = wire_hex("c1481234567800007f0000001000000000010000000000000005059e000068656c6c6f0fbfc6d1")
    assert struct.unpack(">I", ex1[-4:])[0] == crc32c(ex1[:-4])
    segs = {"wire_ex1_write_record": ex1[:-4]}
    hdrs = [
        wire_hex("01430000000000000000000000070000000000000bb805a20000"),
        wire_hex("0143000000000000000000000007000005a200000bb805a20000"),
        wire_hex("414300000000000000000000000700000b4400000bb805a20000"),
    ]
    segs["wire_ex2_send_seg0"] = hdrs[0] + bytes(1442)
    segs["wire_ex2_send_seg1"] = hdrs[1] + bytes(1442)
    segs["wire_ex2_send_seg2"] = hdrs[2] + bytes(116)
    segs["write"] = tagged(WRITE, True, 0x100, 0x2000, 1, 0, 4, 1438) + b"abcd"
    segs["read_resp"] = tagged(READ_RESP, True, 0x100, 0x2000, 1, 0, 3, 1438) + b"xyz"
    segs["write_record_multi0"] = tagged(WRITE_RECORD, False, 0x100, 0x2000, 2, 0, 600, 256) + bytes(256)
    segs["send"] = untagged(SEND, True, 0, 1, 0, 5, 1442) + b"hello"
    segs["send_inv"] = untagged(SEND_INV, True, 0, 1, 0, 2, 1442, inv=0x100) + b"hi"
    segs["send_se"] = untagged(SEND_SE, True, 0, 1, 0, 1, 1442) + b"!"
    segs["send_se_inv"] = untagged(SEND_SE_INV, True, 0, 1, 0, 1, 1442, inv=0x100) + b"?"
    segs["send_empty"] = untagged(SEND, True, 0, 1, 0, 0, 1442)
    segs["read_req"] = untagged(READ_REQ, True, 1, 1, 0, 28, 1442) + read_req(0x200, 0x3000, 16, 0x100, 0x2000)
    segs["terminate"] = untagged(TERMINATE, True, 2, 1, 0, 8, 1442) + terminate(1, 2, 2)
    body = terminate(0, 2, 6, 0x4000, untagged(SEND, True, 0, 9, 0, 1, 1442))
    segs["terminate_with_hdr"] = untagged(TERMINATE, True, 2, 1, 0, len(body), 1442) + body
    return segs


def write(harness, name, data):
    d = os.path.join(OUT, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def frame_seeds():
    for name, seg in one_segment_messages().items():
        write("frame", name, b"\x00" + seg)


# --- fuzz_qp.c input: [config] then ops (see the harness) ---------------------------------
OP_DGRAM, OP_RECV, OP_POLL, OP_SEND = 0, 1, 2, 3
DG_CRC, DG_PEER1, DG_EPOCH, DG_PATCH, DG_TAKE, DG_TAKE_SMALL = 1, 2, 4, 8, 16, 32


def qp_dgram(payload, flags=DG_CRC | DG_PATCH):
    return bytes([OP_DGRAM]) + struct.pack(">H", len(payload)) + bytes([flags]) + payload


def qp_seeds():
    segs = one_segment_messages()
    recv = bytes([OP_RECV, 4, 3])
    poll = bytes([OP_POLL])
    for name, seg in segs.items():
        # UD: the segment as one datagram; RD: behind an RD header, the first of an epoch
        write("qp", "ud_" + name, b"\x00" + recv + qp_dgram(seg) + poll)
        write("qp", "rd_" + name, b"\x01" + recv + qp_dgram(rd_hdr(1, 64, 0xE0, 0) + seg) + poll)
    multi = b"".join(qp_dgram(segs[f"wire_ex2_send_seg{i}"]) for i in (2, 0, 1))
    write("qp", "ud_wire_ex2_reordered", b"\x00" + recv + multi + poll)
    rd_multi = b"".join(qp_dgram(rd_hdr(1, 64, 0xE0, s) + segs[f"wire_ex2_send_seg{i}"])
                        for s, i in ((2, 2), (0, 0), (1, 1)))
    write("qp", "rd_wire_ex2_reordered", b"\x01" + recv + rd_multi + poll)
    # a Read of ours (op 3, kind 2), then the peer's response to it; an RD ack of our epoch
    send_read = bytes([OP_SEND, 2]) + struct.pack(">IQI", 0x100, 0x2000, 16)
    resp = tagged(READ_RESP, True, 0, 0, 1, 0, 16, 1438) + bytes(range(16))
    write("qp", "ud_read_then_resp", b"\x00" + send_read + qp_dgram(resp) + poll)
    ack = rd_hdr(2, 64, 0xE1, 0, 0, 1, 0)
    write("qp", "rd_send_then_ack", b"\x01" + bytes([OP_SEND, 0]) + struct.pack(">IQI", 0, 0, 100)
          + qp_dgram(ack, DG_CRC | DG_EPOCH) + poll)
    write("qp", "ud_plain", b"\x02" + recv + qp_dgram(b"GET / HTTP/1.0\r\n", 0) + poll)
    # the caller's own read (dgv_qp_rx_take): whole Sends, one longer than the caller's limit,
    # a multi-segment message around a whole one, a plain datagram
    for name in ("send", "send_se", "send_inv", "wire_ex1_write_record"):
        write("qp", "ud_take_" + name, b"\x00" + recv + qp_dgram(segs[name], DG_CRC | DG_PATCH | DG_TAKE) + poll)
    big = untagged(SEND, True, 0, 1, 0, 2000, 2000) + bytes(2000)
    write("qp", "ud_take_send_over_limit", b"\x00" + recv + qp_dgram(big, DG_CRC | DG_TAKE | DG_TAKE_SMALL) + poll)
    take_multi = b"".join(qp_dgram(segs[f"wire_ex2_send_seg{i}"], DG_CRC | DG_TAKE) for i in (0, 1))
    write("qp", "ud_take_around_a_message", b"\x00" + recv + take_multi
          + qp_dgram(segs["send"], DG_CRC | DG_TAKE) + qp_dgram(segs["wire_ex2_send_seg2"], DG_CRC | DG_TAKE) + poll)
    write("qp", "ud_take_plain", b"\x02" + recv + qp_dgram(b"GET / HTTP/1.0\r\n", DG_TAKE) + poll)


# --- fuzz_rd.c input: ops on one RD endpoint ---------------------------------------------
RD_IN, RD_SEND, RD_TICK, RD_KICK, RD_REFUSE = 0, 1, 2, 3, 4
IN_EPOCH = 1  # patch ack_epoch with our current epoch to that peer


def rd_in(hdr, seg=b"", peer=0, flags=IN_EPOCH):
    d = hdr + seg
    return bytes([RD_IN, peer, flags]) + struct.pack(">H", len(d)) + d


def rd_seeds():
    send = lambda n=100, peer=0: bytes([RD_SEND, peer]) + struct.pack(">H", n)
    tick = lambda ms: bytes([RD_TICK]) + struct.pack(">H", ms)
    seg = untagged(SEND, True, 0, 1, 0, 5, 1442) + b"hello"
    write("rd", "data_in_order", rd_in(rd_hdr(1, 64, 7, 0), seg) + rd_in(rd_hdr(1, 64, 7, 1), seg) + tick(1))
    write("rd", "data_out_of_order", rd_in(rd_hdr(1, 64, 7, 2), seg) + rd_in(rd_hdr(1, 64, 7, 0), seg)
          + rd_in(rd_hdr(1, 64, 7, 1), seg) + tick(1))
    write("rd", "send_ack", send() + send() + rd_in(rd_hdr(2, 64, 0, 0, 0, 2, 0)) + tick(5))
    write("rd", "send_sack", send() + send() + send() + send() + send()
          + rd_in(rd_hdr(2, 64, 0, 0, 0, 1, 0b1110)) + tick(3))
    write("rd", "send_rnr", send() + rd_in(rd_hdr(2 | 8, 0, 0, 0, 0, 0, 0)) + tick(50) + tick(500))
    write("rd", "send_rst", send() + rd_in(rd_hdr(4, 64, 0, 0, 0, 0, 0)))
    write("rd", "timeouts", send() + send(200, 1) + tick(10) + tick(100) + tick(1000) + tick(60000))
    write("rd", "refuse_kick", bytes([RD_REFUSE, 1]) + rd_in(rd_hdr(1, 64, 9, 0), seg) + bytes([RD_REFUSE, 0, RD_KICK]))
    write("rd", "data_piggyback", send() + rd_in(rd_hdr(3, 64, 7, 0, 0, 1, 0), seg) + tick(1))


# --- fuzz_mpa.c input ---------------------------------------------------------------------
def mpa_seeds():
    req = wire_hex("4d504120494420526571204672616d65500200048040c010")
    write("mpa", "wire_ex1_request", b"\x00" + req)
    rep = b"MPA ID Rep Frame" + bytes([0x50, 2, 0, 4, 0x80, 0x40, 0x80, 0x10])
    write("mpa", "reply_default", b"\x01" + rep)
    write("mpa", "reply_v1_pdata", b"\x01" + b"MPA ID Rep Frame" + bytes([0x40, 1, 0, 3]) + b"abc")
    rtr = wire_hex("000ec140000000010000000000000000ebd34c5f")
    send = wire_hex("001741430000000000000000000000010000000068656c6c6f000000b990b10c")
    write("mpa", "strip_unmarked", b"\x02" + struct.pack(">H", 4) + send)
    write("mpa", "strip_marker_first", b"\x02" + struct.pack(">H", 0) + bytes(4) + rtr)
    write("mpa", "roundtrip_rtr", b"\x03" + struct.pack(">H", 500) + b"\x01" + rtr[2:-4])
    write("mpa", "roundtrip_send", b"\x03" + struct.pack(">H", 0) + b"\x01" + send[2:25])


# --- fuzz_rc.c input: [config] [len16 MPA Reply] then records [flags][len16][bytes] ------
def rc_seeds():
    rep = b"MPA ID Rep Frame" + bytes([0x50, 2, 0, 4, 0x80, 0x40, 0x80, 0x10])
    send = wire_hex("001741430000000000000000000000010000000068656c6c6f000000b990b10c")
    rtr = wire_hex("000ec140000000010000000000000000ebd34c5f")
    rr = lambda r: struct.pack(">H", len(r)) + r
    raw = lambda b: bytes([4]) + struct.pack(">H", len(b)) + b      # sent as it is
    ulp = lambda u, fl=1: bytes([fl]) + struct.pack(">H", len(u)) + u  # framed by the harness
    # config: bit0 CRC, bit1 markers, bit2 rev 1, bit3 framed records
    write("rc", "wire_ex3_send_raw", b"\x01" + rr(rep) + raw(send))
    write("rc", "wire_ex2_rtr_then_send_raw", b"\x01" + rr(rep) + raw(rtr) + raw(send))
    rep_nop2p = b"MPA ID Rep Frame" + bytes([0x50, 2, 0, 4, 0x00, 0x40, 0x00, 0x10])
    write("rc", "no_p2p_send_raw", b"\x01" + rr(rep_nop2p) + raw(send))
    rep1 = b"MPA ID Rep Frame" + bytes([0x40, 1, 0, 0])
    write("rc", "rev1_send_raw", b"\x05" + rr(rep1) + raw(send))
    write("rc", "reject", b"\x01" + rr(b"MPA ID Rep Frame" + bytes([0x60, 2, 0, 6, 0x80, 0x40, 0x80, 0x10]) + b"no"))
    s5 = untagged(SEND, True, 0, 1, 0, 0, 0)[:18] + b"hello"
    def rc_untagged(op, last, qn, msn, mo, inv=0):
        return struct.pack(">HIIII", ctrl(False, last, op), inv, qn, msn, mo)
    def rc_tagged(op, last, stag, to):
        return struct.pack(">HIQ", ctrl(True, last, op), stag, to)
    frames = {
        "send": [rc_untagged(SEND, True, 0, 1, 0) + b"hello"],
        "send_two_segments": [rc_untagged(SEND, False, 0, 1, 0) + b"abcd", rc_untagged(SEND, True, 0, 1, 4) + b"efgh"],
        "send_se_inv": [rc_untagged(SEND_SE_INV, True, 0, 1, 0, inv=0x55) + b"x"],
        "write": [rc_tagged(WRITE, True, 0, 64) + b"data"],
        "write_record": [rc_tagged(WRITE_RECORD, False, 0, 0) + b"rec", rc_tagged(WRITE_RECORD, True, 0, 3) + b"ord"],
        "read_req": [rc_untagged(READ_REQ, True, 1, 1, 0) + read_req(0x77, 0x1000, 16, 0, 0)],
        "read_resp": [rc_tagged(READ_RESP, True, 0, 0) + b"resp"],
        "terminate": [rc_untagged(TERMINATE, True, 2, 1, 0) + terminate(0, 2, 6, 0x4000, rc_untagged(SEND, True, 0, 9, 0))],
    }
    rtr_u = rtr[2:-4]
    for name, us in frames.items():
        body = b"".join(ulp(u) for u in us)
        write("rc", "framed_crc_" + name, b"\x09" + rr(rep) + ulp(rtr_u, 0) + body)
        write("rc", "framed_markers_" + name, b"\x0b" + rr(rep) + ulp(rtr_u, 0) + body)
    write("rc", "framed_bad_crc", b"\x09" + rr(rep) + ulp(rtr_u, 0) + ulp(frames["send"][0], 2))
    write("rc", "framed_rev1_nocrc", b"\x0c" + rr(b"MPA ID Rep Frame" + bytes([0, 1, 0, 0])) + ulp(frames["send"][0]))


# --- fuzz_rules.c input -------------------------------------------------------------------
def rules_seeds():
    with open(os.path.join(HERE, "..", "..", "config", "dgshim.conf.example"), "rb") as f:
        example = f.read()
    write("rules", "file_example", b"\x01" + example)
    write("rules", "inline", b"\x00" + b"mode=rd port=5060;mode=ud addr=10.0.0.0/8 role=sender;mode=rc port=80-90")
    write("rules", "inline_v6", b"\x00" + b"mode=ud addr=2001:db8::/32 port=*\nmode=off port=53")
    write("rules", "env", b"\x02" + b"rd\x00mode=ud port=1-100\x00mode=rc proto=tcp\n")
    write("rules", "env_bad_mode", b"\x02" + b"fast\x00\x00")
    write("rules", "mode_fault", b"\x03" + b"loss=1,burst=0.5:4,reorder=5:3,dup=1,corrupt=0.1,seed=7")
    write("rules", "both", b"\x04" + b"mode=ud program=fuzz* port=7\x00\xef\xbb\xbfmode=rd addr=::ffff:1.2.3.4\r\n")


# --- fuzz_stream.c input ------------------------------------------------------------------
def stream_seeds():
    hello = struct.pack(">IIIIQQII", 0x44475331, 512 << 10, 0x1234, 64, 0x7f0000000000, 0x7f0000080000, 256, 0)
    write("stream", "hello", b"\x00" + hello)
    write("stream", "dhello", b"\x00" + hello + struct.pack(">Q", 0xC00C1E))
    # sent, recs (u64 as two u32), base offset, length, then slot bytes
    ctl = struct.pack(">QQQII", 100, 2, 0, 0, 0)
    write("stream", "ctl", b"\x01" + struct.pack(">QQiI", 1000, 10, 0, 32) + ctl)
    fin = struct.pack(">QQQII", 1000, 10, 500, 2 | 4, 7)
    write("stream", "ctl_fin_close_slot7", b"\x01" + struct.pack(">QQiI", 1000, 10, 7 * 64, 32) + bytes(7 * 64) + fin)
    rv4 = struct.pack(">IHH16sQ", 0x64675256, 4, 18515, bytes([127, 0, 0, 1]) + bytes(12), 42)
    write("stream", "rv4", b"\x02" + rv4)
    rv6 = struct.pack(">IHH16sQ", 0x64675256, 6, 18515, bytes(15) + b"\x01", 42)
    write("stream", "rv6", b"\x02" + rv6)
    # records [kind][length][extra]: in order, consume, wrap at the ring end, FIN
    rec = lambda kind, length, extra=0: struct.pack(">BII", kind, length, extra)
    write("stream", "data_in_order", b"\x03\x00" + rec(1, 4096) + rec(3, 8192, 4096) + rec(1, 4096))
    write("stream", "data_fin", b"\x03\x00" + rec(1, 100) + rec(5, 50, 80) + rec(1, 30))
    # regression: 12 KiB in a 16 KiB ring, all consumed, then a record of 8 KiB where the stream
    # stands: it would cross the ring's end (stream.c take_data accepts it; stream_data_check not)
    write("stream", "data_cross_ring_end", b"\x03\x00" + rec(1, 12288) + rec(3, 8192, 12288))


# --- fuzz_disco.c input: one discovery datagram --------------------------------------------
def disco_seeds():
    # the worked example of docs/wire.md section 13
    write("disco", "question", bytes.fromhex("444744530101" "5c3a" "1122334455667788" "00000000" "00000000"))
    write("disco", "answer_ud", bytes.fromhex("444744530102" "5c3a" "1122334455667788" "01000000" "00000050"))
    write("disco", "answer_all", bytes.fromhex("444744530102" "ffff" "0000000000000001" "0f000000" "ffffffff"))


def main():
    only = sys.argv[1:] or ["frame", "qp", "rd", "mpa", "rc", "rules", "stream", "disco"]
    for h in only:
        shutil.rmtree(os.path.join(OUT, h), ignore_errors=True)
        globals()[h + "_seeds"]()


if __name__ == "__main__":
    main()
