// node_echo.js: echo servers and checking clients on Node.js's own sockets (libuv), for node.sh.
//   node node_echo.js udp-server PORT      echoes every datagram; exits on the datagram "quit"
//   node node_echo.js udp-client PORT N    N ping-pongs (random sizes 1-1400 B, each echo must
//                                          equal what was sent, 2 s timeout), then a burst of
//                                          100 datagrams sent at once: all 100 must come back
//   node node_echo.js tcp-server PORT      echoes one connection's bytes, exits when it ends
//   node node_echo.js tcp-client PORT MB   1000 ping-pongs of 64 B, then sends MB MiB of random
//                                          bytes while reading the echo: equal byte for byte
// A client prints "rate NAME VALUE" lines and exits 0 only when every check held; any mismatch
// or timeout exits 1 with the reason.
'use strict';
const dgram = require('dgram');
const net = require('net');
const crypto = require('crypto');

const [mode, portArg, nArg] = process.argv.slice(2);
const port = Number(portArg);
const host = '127.0.0.1';

function fail(msg) {
  console.log(`node_echo ${mode}: FAIL: ${msg}`);
  process.exit(1);
}

function udpServer() {
  const s = dgram.createSocket('udp4');
  s.on('message', (m, r) => {
    if (m.toString() === 'quit') {
      s.close();
      return;
    }
    s.send(m, r.port, r.address);
  });
  s.on('error', (e) => fail(e.message));
  s.bind(port, host);
}

function udpClient() {
  const n = Number(nArg);
  const s = dgram.createSocket('udp4');
  let pending = null;
  let timer = null;
  const arm = (what) => {
    clearTimeout(timer);
    timer = setTimeout(() => fail(`timeout waiting for ${what}`), 2000);
  };
  s.on('error', (e) => fail(e.message));
  s.on('message', (m) => pending(m));
  s.connect(port, host, async () => {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < n; i++) {
      const out = crypto.randomBytes(1 + crypto.randomInt(1400));
      const echo = await new Promise((res) => {
        pending = res;
        arm(`echo ${i}`);
        s.send(out);
      });
      if (!echo.equals(out)) fail(`echo ${i} differs (${echo.length} bytes, sent ${out.length})`);
    }
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    console.log(`rate udp_pingpong_per_s ${(n / dt).toFixed(0)}`);
    // Burst: 100 numbered datagrams without waiting; every number must come back once.
    const seen = new Set();
    let late = null;
    await new Promise((res) => {
      pending = (m) => {
        const k = m.readUInt32BE(0);
        if (m.length !== 200 || seen.has(k) || k >= 100) fail(`burst: unexpected echo #${k} (${m.length} B)`);
        seen.add(k);
        if (seen.size === 100) res();
      };
      arm('the burst echoes');
      for (let k = 0; k < 100; k++) {
        const b = Buffer.alloc(200, k & 0xff);
        b.writeUInt32BE(k, 0);
        s.send(b);
      }
      clearTimeout(timer);
      late = setTimeout(() => fail(`burst: ${seen.size} of 100 echoes came back within 2 s`), 2000);
    });
    clearTimeout(late);
    console.log(`node_echo udp-client: ${n} ping-pongs exact, burst 100/100`);
    s.send('quit', () => s.close());
  });
}

function tcpServer() {
  const srv = net.createServer((c) => {
    c.pipe(c);
    c.on('error', (e) => fail(e.message));
    c.on('close', () => srv.close());
  });
  srv.on('error', (e) => fail(e.message));
  srv.listen(port, host);
}

function tcpClient() {
  const total = Number(nArg) * 1024 * 1024;
  const c = net.connect(port, host);
  c.setNoDelay(true);
  c.on('error', (e) => fail(e.message));
  let onData = null;
  c.on('data', (d) => onData(d));
  c.on('connect', async () => {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < 1000; i++) {
      const out = crypto.randomBytes(64);
      let got = Buffer.alloc(0);
      await new Promise((res) => {
        onData = (d) => {
          got = Buffer.concat([got, d]);
          if (got.length >= 64) res();
        };
        c.write(out);
      });
      if (!got.equals(out)) fail(`ping-pong ${i}: echo differs (${got.length} bytes)`);
    }
    const t1 = process.hrtime.bigint();
    console.log(`rate tcp_pingpong_per_s ${(1000 / (Number(t1 - t0) / 1e9)).toFixed(0)}`);
    const data = crypto.randomBytes(total);
    const want = crypto.createHash('sha256').update(data).digest('hex');
    const h = crypto.createHash('sha256');
    let n = 0;
    let off = 0;
    const t2 = process.hrtime.bigint();
    const timer = setTimeout(() => fail(`bulk echo: ${n} of ${total} bytes after 60 s`), 60000);
    onData = (d) => {
      if (!d.equals(data.subarray(n, n + d.length))) fail(`bulk echo differs in bytes ${n}-${n + d.length}`);
      h.update(d);
      n += d.length;
      if (n > total) fail(`bulk echo: ${n} bytes, more than the ${total} sent`);
      if (n === total) {
        clearTimeout(timer);
        const dt = Number(process.hrtime.bigint() - t2) / 1e9;
        const got = h.digest('hex');
        if (got !== want) fail('bulk echo sha256 differs');
        console.log(`rate tcp_bulk_MiB_per_s ${(total / 1048576 / dt).toFixed(1)}`);
        console.log(`node_echo tcp-client: 1000 ping-pongs exact, ${total} bytes echoed, sha256 ${got}`);
        c.end();
      }
    };
    // Writes of 64 KiB, pausing when the socket's buffer is full (as a streaming program does).
    const pump = () => {
      while (off < total) {
        const ok = c.write(data.subarray(off, off + 65536));
        off += 65536;
        if (!ok) {
          c.once('drain', pump);
          return;
        }
      }
    };
    pump();
  });
}

({ 'udp-server': udpServer, 'udp-client': udpClient, 'tcp-server': tcpServer, 'tcp-client': tcpClient }[mode] ||
  (() => fail('unknown mode')))();
