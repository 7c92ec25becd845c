-- dgshim.lua - Wireshark/tshark dissector for datagram-iWARP as dgshim puts it on UDP
-- (docs/wire.md sections 1-9): DDP/RDMAP segments with the datagram extension (msn, mo, ml,
-- segsz), RDMA Write-Record (opcode 0x8), Read Request and Terminate payloads, the RD header
-- (data, acknowledgements with SACK, reset, RNR) and the CRC32c that ends every datagram.
--
-- Install: copy into a Lua plugin folder (`tshark -G folders`; `meson install` puts it in
-- <libdir>/wireshark/plugins), or run `tshark -X lua_script:dgshim.lua ...`.
-- It claims UDP port 18515 (dgperf's default; preference dgiwarp.ports) and every other UDP
-- datagram that passes a heuristic: a valid first byte and a CRC32c that matches, so ordinary
-- UDP is left alone (a random datagram passes with probability about 2^-36).
-- RC (MPA/DDP/RDMAP over TCP, docs/wire.md section 12) is Wireshark's own iwarp-mpa dissector.

local p = Proto("dgiwarp", "Datagram-iWARP (dgshim)")

local opcodes = {
	[0] = "RDMA Write", [1] = "RDMA Read Request", [2] = "RDMA Read Response", [3] = "Send",
	[4] = "Send with Invalidate", [5] = "Send with Solicited Event",
	[6] = "Send with SE and Invalidate", [7] = "Terminate", [8] = "RDMA Write-Record",
}
local queues = { [0] = "Send", [1] = "Read Request", [2] = "Terminate" }
local layers = { [0] = "RDMAP", [1] = "DDP", [2] = "LLP" }

local f = {
	ctrl = ProtoField.uint16("dgiwarp.ctrl", "Control", base.HEX),
	t = ProtoField.bool("dgiwarp.t", "Tagged", 16, nil, 0x8000),
	l = ProtoField.bool("dgiwarp.l", "Last segment", 16, nil, 0x4000),
	ddp_rsvd = ProtoField.uint16("dgiwarp.ddp_rsvd", "DDP reserved", base.HEX, nil, 0x3c00),
	dv = ProtoField.uint16("dgiwarp.dv", "DDP version", base.DEC, nil, 0x0300),
	rv = ProtoField.uint16("dgiwarp.rv", "RDMAP version", base.DEC, nil, 0x00c0),
	rdmap_rsvd = ProtoField.uint16("dgiwarp.rdmap_rsvd", "RDMAP reserved", base.HEX, nil, 0x0030),
	opcode = ProtoField.uint16("dgiwarp.opcode", "Opcode", base.HEX, opcodes, 0x000f),
	stag = ProtoField.uint32("dgiwarp.stag", "Data sink STag", base.HEX),
	to = ProtoField.uint64("dgiwarp.to", "Tagged offset", base.HEX),
	inv_stag = ProtoField.uint32("dgiwarp.inv_stag", "STag to invalidate", base.HEX),
	qn = ProtoField.uint32("dgiwarp.qn", "Queue number", base.DEC, queues),
	msn = ProtoField.uint32("dgiwarp.msn", "Message sequence number", base.DEC),
	mo = ProtoField.uint32("dgiwarp.mo", "Message offset", base.DEC),
	ml = ProtoField.uint32("dgiwarp.ml", "Message length", base.DEC),
	segsz = ProtoField.uint16("dgiwarp.segsz", "Segment size", base.DEC),
	rsvd = ProtoField.uint16("dgiwarp.rsvd", "Extension reserved", base.HEX),
	base = ProtoField.uint64("dgiwarp.base", "Message base (to - mo)", base.HEX),
	segment = ProtoField.uint32("dgiwarp.segment", "Segment index (mo / segsz)", base.DEC),
	nsegs = ProtoField.uint32("dgiwarp.nsegs", "Segments in the message", base.DEC),
	payload = ProtoField.bytes("dgiwarp.payload", "Payload"),
	plen = ProtoField.uint32("dgiwarp.payload_len", "Payload length", base.DEC),
	crc = ProtoField.uint32("dgiwarp.crc", "CRC32c", base.HEX),
	crc_good = ProtoField.bool("dgiwarp.crc.good", "CRC32c good"),
	crc_calc = ProtoField.uint32("dgiwarp.crc.computed", "CRC32c computed", base.HEX),
	-- RDMA Read Request (RFC 5040 4.4)
	rr_sink_stag = ProtoField.uint32("dgiwarp.rreq.sink_stag", "Sink STag", base.HEX),
	rr_sink_to = ProtoField.uint64("dgiwarp.rreq.sink_to", "Sink tagged offset", base.HEX),
	rr_size = ProtoField.uint32("dgiwarp.rreq.size", "Read size", base.DEC),
	rr_src_stag = ProtoField.uint32("dgiwarp.rreq.src_stag", "Source STag", base.HEX),
	rr_src_to = ProtoField.uint64("dgiwarp.rreq.src_to", "Source tagged offset", base.HEX),
	-- Terminate (RFC 5040 4.8)
	term_ctrl = ProtoField.uint32("dgiwarp.term.ctrl", "Terminate control", base.HEX),
	term_layer = ProtoField.uint32("dgiwarp.term.layer", "Layer", base.DEC, layers, 0xf0000000),
	term_etype = ProtoField.uint32("dgiwarp.term.etype", "Error type", base.DEC, nil, 0x0f000000),
	term_ecode = ProtoField.uint32("dgiwarp.term.ecode", "Error code", base.HEX, nil, 0x00ff0000),
	term_m = ProtoField.bool("dgiwarp.term.m", "Segment length valid (M)", 32, nil, 0x00008000),
	term_d = ProtoField.bool("dgiwarp.term.d", "DDP header copied (D)", 32, nil, 0x00004000),
	term_r = ProtoField.bool("dgiwarp.term.r", "Read Request copied (R)", 32, nil, 0x00002000),
	term_seglen = ProtoField.uint16("dgiwarp.term.ddp_seg_len", "Offending segment length", base.DEC),
	term_copy = ProtoField.bytes("dgiwarp.term.copy", "Copied headers"),
	-- RD header (docs/wire.md section 8)
	rd_magic = ProtoField.uint8("dgiwarp.rd.magic", "RD magic", base.HEX),
	rd_flags = ProtoField.uint8("dgiwarp.rd.flags", "RD flags", base.HEX),
	rd_data = ProtoField.bool("dgiwarp.rd.flags.data", "DATA", 8, nil, 0x01),
	rd_ack = ProtoField.bool("dgiwarp.rd.flags.ack", "ACK", 8, nil, 0x02),
	rd_rst = ProtoField.bool("dgiwarp.rd.flags.rst", "RST", 8, nil, 0x04),
	rd_rnr = ProtoField.bool("dgiwarp.rd.flags.rnr", "RNR", 8, nil, 0x08),
	rd_probe = ProtoField.bool("dgiwarp.rd.flags.probe", "PROBE", 8, nil, 0x10),
	rd_answer = ProtoField.bool("dgiwarp.rd.flags.answer", "ANSWER", 8, nil, 0x20),
	rd_probe_id = ProtoField.uint32("dgiwarp.rd.probe_id", "Probe id", base.DEC),
	rd_wnd = ProtoField.uint16("dgiwarp.rd.wnd", "Window (datagrams)", base.DEC),
	rd_epoch = ProtoField.uint32("dgiwarp.rd.epoch", "Epoch", base.HEX),
	rd_seq = ProtoField.uint32("dgiwarp.rd.seq", "Sequence", base.DEC),
	rd_ack_epoch = ProtoField.uint32("dgiwarp.rd.ack_epoch", "Ack epoch", base.HEX),
	rd_acknum = ProtoField.uint32("dgiwarp.rd.ack", "Next expected", base.DEC),
	rd_sack = ProtoField.uint32("dgiwarp.rd.sack", "SACK bitmap", base.HEX),
	rd_sacked = ProtoField.string("dgiwarp.rd.sacked", "Received out of order"),
	kind = ProtoField.string("dgiwarp.kind", "Datagram"),
}
p.fields = f

local e_crc = ProtoExpert.new("dgiwarp.crc.bad", "CRC32c mismatch: the receiver drops this datagram",
	expert.group.CHECKSUM, expert.severity.ERROR)
local e_hdr = ProtoExpert.new("dgiwarp.invalid", "Invalid segment (docs/wire.md section 9)",
	expert.group.MALFORMED, expert.severity.WARN)
p.experts = { e_crc, e_hdr }

p.prefs.ports = Pref.range("UDP ports", "18515", "UDP ports always decoded as datagram-iWARP", 65535)
p.prefs.heuristic = Pref.bool("Heuristic on all UDP", true, "Try every UDP datagram (first byte and CRC32c)")

-- CRC32c (Castagnoli, reflected 0x82F63B78), as RFC 3720 B.4
local band, bxor, rshift = bit32.band, bit32.bxor, bit32.rshift
local crc_table = {}
for i = 0, 255 do
	local c = i
	for _ = 1, 8 do
		if band(c, 1) ~= 0 then c = bxor(rshift(c, 1), 0x82F63B78) else c = rshift(c, 1) end
	end
	crc_table[i] = c
end
local function crc32c(s)
	local c = 0xFFFFFFFF
	for i = 1, #s do
		c = bxor(crc_table[band(bxor(c, s:byte(i)), 0xff)], rshift(c, 8))
	end
	return bxor(c, 0xFFFFFFFF)
end

local function crc_ok(tvb)
	local n = tvb:len()
	return crc32c(tvb:raw(0, n - 4)) == tvb(n - 4, 4):uint(), n
end

-- one DDP/RDMAP segment at off .. n-4 (the CRC after it); returns a summary for the Info column
local function ddp_segment(tvb, pinfo, tree, off, n)
	local ctrl = tvb(off, 2):uint()
	local tagged = band(ctrl, 0x8000) ~= 0
	local last = band(ctrl, 0x4000) ~= 0
	local op = band(ctrl, 0x000f)
	local hlen = tagged and 30 or 26
	local t = tree:add(p, tvb(off, hlen), (tagged and "Tagged" or "Untagged") .. " DDP/RDMAP header")
	local ct = t:add(f.ctrl, tvb(off, 2))
	for _, k in ipairs({ "t", "l", "ddp_rsvd", "dv", "rv", "rdmap_rsvd", "opcode" }) do
		ct:add(f[k], tvb(off, 2))
	end
	if band(ctrl, 0x0300) ~= 0x0100 or band(ctrl, 0x00c0) ~= 0x0040 or band(ctrl, 0x3c30) ~= 0 or op > 8 then
		t:add_proto_expert_info(e_hdr, "bad version, reserved bits or opcode")
	end
	local info = (opcodes[op] or "reserved opcode") .. " "
	local msn, mo, ml, segsz
	if tagged then
		t:add(f.stag, tvb(off + 2, 4))
		t:add(f.to, tvb(off + 6, 8))
		msn, mo, ml = tvb(off + 14, 4):uint(), tvb(off + 18, 4):uint(), tvb(off + 22, 4):uint()
		segsz = tvb(off + 26, 2):uint()
		t:add(f.msn, tvb(off + 14, 4)); t:add(f.mo, tvb(off + 18, 4)); t:add(f.ml, tvb(off + 22, 4))
		t:add(f.segsz, tvb(off + 26, 2)); t:add(f.rsvd, tvb(off + 28, 2))
		local to = tvb(off + 6, 8):uint64()
		t:add(f.base, tvb(off + 6, 8), to - UInt64(mo)):set_generated()
		info = info .. string.format("stag 0x%08x to 0x%s ", tvb(off + 2, 4):uint(), to:tohex())
	else
		t:add(f.inv_stag, tvb(off + 2, 4))
		t:add(f.qn, tvb(off + 6, 4))
		msn, mo, ml = tvb(off + 10, 4):uint(), tvb(off + 14, 4):uint(), tvb(off + 18, 4):uint()
		segsz = tvb(off + 22, 2):uint()
		t:add(f.msn, tvb(off + 10, 4)); t:add(f.mo, tvb(off + 14, 4)); t:add(f.ml, tvb(off + 18, 4))
		t:add(f.segsz, tvb(off + 22, 2)); t:add(f.rsvd, tvb(off + 24, 2))
		info = info .. string.format("qn %d ", tvb(off + 6, 4):uint())
	end
	if segsz > 0 then
		t:add(f.segment, math.floor(mo / segsz)):set_generated()
		t:add(f.nsegs, math.floor((ml + segsz - 1) / segsz)):set_generated()
	end
	local poff, plen = off + hlen, n - 4 - off - hlen
	t:add(f.plen, plen):set_generated()
	info = info .. string.format("msn %d mo %d ml %d%s", msn, mo, ml, last and " L" or "")
	if plen > 0 then
		local pr = tree:add(f.payload, tvb(poff, plen))
		if not tagged and op == 1 and plen >= 28 then
			local r = tree:add(p, tvb(poff, 28), "RDMA Read Request")
			r:add(f.rr_sink_stag, tvb(poff, 4)); r:add(f.rr_sink_to, tvb(poff + 4, 8))
			r:add(f.rr_size, tvb(poff + 12, 4)); r:add(f.rr_src_stag, tvb(poff + 16, 4))
			r:add(f.rr_src_to, tvb(poff + 20, 8))
			info = info .. string.format(" read %d from stag 0x%08x", tvb(poff + 12, 4):uint(), tvb(poff + 16, 4):uint())
		elseif not tagged and op == 7 and plen >= 8 then
			local r = tree:add(p, tvb(poff, plen), "Terminate")
			local tc = r:add(f.term_ctrl, tvb(poff, 4))
			for _, k in ipairs({ "term_layer", "term_etype", "term_ecode", "term_m", "term_d", "term_r" }) do
				tc:add(f[k], tvb(poff, 4))
			end
			r:add(f.term_seglen, tvb(poff + 4, 2))
			if plen > 8 then r:add(f.term_copy, tvb(poff + 8, plen - 8)) end
			local v = tvb(poff, 4):uint()
			info = info .. string.format(" error %d/%d/0x%02x", rshift(v, 28), band(rshift(v, 24), 0xf), band(rshift(v, 16), 0xff))
		end
		pr:set_text(string.format("Payload (%d bytes)", plen))
	end
	return info
end

local function rd_header(tvb, tree)
	local t = tree:add(p, tvb(0, 24), "RD header")
	t:add(f.rd_magic, tvb(0, 1))
	local ft = t:add(f.rd_flags, tvb(1, 1))
	for _, k in ipairs({ "rd_data", "rd_ack", "rd_rst", "rd_rnr", "rd_probe", "rd_answer" }) do ft:add(f[k], tvb(1, 1)) end
	t:add(f.rd_wnd, tvb(2, 2)); t:add(f.rd_epoch, tvb(4, 4))
	local flags = tvb(1, 1):uint()
	local parts = {}
	if band(flags, 1) ~= 0 then
		t:add(f.rd_seq, tvb(8, 4))
		parts[#parts + 1] = string.format("seq %d", tvb(8, 4):uint())
	end
	if band(flags, 0x30) ~= 0 then
		t:add(f.rd_probe_id, tvb(8, 4))
		parts[#parts + 1] = string.format("%s %d", band(flags, 0x10) ~= 0 and "PROBE" or "ANSWER", tvb(8, 4):uint())
	end
	if band(flags, 6) ~= 0 then t:add(f.rd_ack_epoch, tvb(12, 4)) end
	if band(flags, 2) ~= 0 then
		local ack, sack = tvb(16, 4):uint(), tvb(20, 4):uint()
		t:add(f.rd_acknum, tvb(16, 4)); t:add(f.rd_sack, tvb(20, 4))
		local got = {}
		for i = 0, 31 do
			if band(sack, bit32.lshift(1, i)) ~= 0 then got[#got + 1] = tostring(ack + 1 + i) end
		end
		t:add(f.rd_sacked, table.concat(got, " ")):set_generated()
		parts[#parts + 1] = string.format("ACK %d%s", ack, sack ~= 0 and string.format(" SACK 0x%08x", sack) or "")
		if band(flags, 8) ~= 0 then parts[#parts + 1] = "RNR" end
	end
	if band(flags, 4) ~= 0 then parts[#parts + 1] = "RST" end
	return table.concat(parts, " "), flags
end

local function looks_like(tvb)
	local n = tvb:len()
	if n < 28 then return false end
	local b0, b1 = tvb(0, 1):uint(), tvb(1, 1):uint()
	if b0 == 0xd2 then
		local fl = b1
		if fl == 0 or band(fl, 0xc0) ~= 0 then return false end
		if band(fl, 1) ~= 0 then
			if n < 24 + 26 + 4 then return false end
			local c0 = tvb(24, 1):uint()
			if band(c0, 0x3f) ~= 0x01 then return false end
		elseif n ~= 28 then
			return false
		end
	elseif band(b0, 0x3f) == 0x01 and band(b1, 0xf0) == 0x40 and band(b1, 0x0f) <= 8 then
		if n < (band(b0, 0x80) ~= 0 and 30 or 26) + 4 then return false end
	else
		return false
	end
	return (crc_ok(tvb))
end

function p.dissector(tvb, pinfo, tree)
	local n = tvb:len()
	if n < 28 then return 0 end
	pinfo.cols.protocol = "DG-iWARP"
	local root = tree:add(p, tvb(), "Datagram-iWARP")
	local good = crc_ok(tvb)
	local info, kind
	if tvb(0, 1):uint() == 0xd2 then
		local rdinfo, flags = rd_header(tvb:range(0, n):tvb(), root)
		if band(flags, 1) ~= 0 and n >= 24 + 26 + 4 then
			kind = "RD data"
			info = "RD " .. rdinfo .. " | " .. ddp_segment(tvb, pinfo, root, 24, n)
		else
			kind = band(flags, 4) ~= 0 and "RD reset" or "RD ack"
			info = "RD " .. rdinfo
		end
	else
		kind = band(tvb(0, 1):uint(), 0x80) ~= 0 and "UD tagged" or "UD untagged"
		info = ddp_segment(tvb, pinfo, root, 0, n)
	end
	root:add(f.kind, kind):set_generated()
	local ci = root:add(f.crc, tvb(n - 4, 4))
	root:add(f.crc_good, good):set_generated()
	if not good then
		root:add(f.crc_calc, crc32c(tvb:raw(0, n - 4))):set_generated()
		ci:add_proto_expert_info(e_crc)
		info = info .. " [bad CRC]"
	end
	pinfo.cols.info = info
	return n
end

local udp_table = DissectorTable.get("udp.port")
local registered = "18515"
udp_table:add(registered, p)
function p.prefs_changed()
	udp_table:remove(registered, p)
	registered = p.prefs.ports
	udp_table:add(registered, p)
end

p:register_heuristic("udp", function(tvb, pinfo, tree)
	if not p.prefs.heuristic or not looks_like(tvb) then return false end
	p.dissector(tvb, pinfo, tree)
	return true
end)

-- Discovery between hosts (docs/wire.md section 13): 24-byte questions and answers on UDP 18517
local d = Proto("dgdisco", "dgshim discovery")
local df = {
	magic = ProtoField.string("dgdisco.magic", "Magic"),
	version = ProtoField.uint8("dgdisco.version", "Version", base.DEC),
	type = ProtoField.uint8("dgdisco.type", "Type", base.DEC, {[1] = "question", [2] = "answer"}),
	port = ProtoField.uint16("dgdisco.port", "Port asked about", base.DEC),
	nonce = ProtoField.uint64("dgdisco.nonce", "Nonce", base.HEX),
	caps = ProtoField.uint8("dgdisco.caps", "Speaks", base.HEX),
	ud = ProtoField.bool("dgdisco.caps.ud", "UD (soft)", 8, nil, 0x01),
	rd = ProtoField.bool("dgdisco.caps.rd", "RD", 8, nil, 0x02),
	udv = ProtoField.bool("dgdisco.caps.udv", "UD on an RDMA device", 8, nil, 0x04),
	rc = ProtoField.bool("dgdisco.caps.rc", "TCP carried over RC", 8, nil, 0x08),
	lease = ProtoField.uint32("dgdisco.lease_ms", "Lease (ms)", base.DEC),
}
d.fields = df
local e_disco = ProtoExpert.new("dgdisco.invalid", "Not a valid discovery message: it gets no answer",
	expert.group.MALFORMED, expert.severity.WARN)
d.experts = { e_disco }

function d.dissector(tvb, pinfo, tree)
	local n = tvb:len()
	pinfo.cols.protocol = "DGDISCO"
	local t = tree:add(d, tvb())
	if n ~= 24 or tvb(0, 4):string() ~= "DGDS" then
		t:add_proto_expert_info(e_disco)
		pinfo.cols.info = "not a discovery message (" .. n .. " bytes)"
		return n
	end
	t:add(df.magic, tvb(0, 4))
	t:add(df.version, tvb(4, 1))
	t:add(df.type, tvb(5, 1))
	t:add(df.port, tvb(6, 2))
	t:add(df.nonce, tvb(8, 8))
	local c = t:add(df.caps, tvb(16, 1))
	c:add(df.ud, tvb(16, 1)); c:add(df.rd, tvb(16, 1)); c:add(df.udv, tvb(16, 1)); c:add(df.rc, tvb(16, 1))
	t:add(df.lease, tvb(20, 4))
	local typ, port, caps = tvb(5, 1):uint(), tvb(6, 2):uint(), tvb(16, 1):uint()
	if typ == 1 then
		pinfo.cols.info = string.format("does port %d speak datagram-iWARP? (nonce %s)", port, tvb(8, 8):uint64():tohex())
	else
		local s = {}
		if bit32.band(caps, 1) ~= 0 then s[#s + 1] = "ud" end
		if bit32.band(caps, 2) ~= 0 then s[#s + 1] = "rd" end
		if bit32.band(caps, 4) ~= 0 then s[#s + 1] = "ud-on-device" end
		if bit32.band(caps, 8) ~= 0 then s[#s + 1] = "rc" end
		pinfo.cols.info = string.format("port %d speaks: %s (lease %d ms)", port,
			#s > 0 and table.concat(s, " ") or "nothing", tvb(20, 4):uint())
	end
	return n
end
udp_table:add(18517, d)
