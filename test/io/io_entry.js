// The native I/O engine's tests, run inside the real library's embedded Node by
// test/io/io_harness.c (TSNET_JS_ENTRY points here). Like plugin/index.ts it calls
// binding.start({control, data}); its `devices` answer is the verdict the harness polls:
// ndev 0 while the tests run, 1 once they passed, an internal error (3) if one failed.
// Everything is reported through NCCL's logger; the harness prints it.
'use strict';
const net = require('net');
const crypto = require('crypto');
const path = require('path');

const binding = process._linkedBinding('tsnet');
const dist = path.resolve(__dirname, '../../dist/plugin');
const { setLogSink } = require(path.join(dist, 'log.js'));
const { NativeIo, NativeLane, adoptSocket } = require(path.join(dist, 'transports/native-lane.js'));

const WARN = 2;
const INFO = 3;
const step = (msg) => process.env.TSNET_IO_TEST_VERBOSE && say(msg);
const say = (msg) => binding.log(INFO, 16, `io-test: ${msg}`);
setLogSink((level, flags, msg) => binding.log(level, flags, msg));
process.on('uncaughtException', (e) => fail(`uncaught exception: ${(e && e.stack) || e}`));
process.on('unhandledRejection', (e) => fail(`unhandled rejection: ${(e && e.stack) || e}`));

let verdict = 0; // 0 running, 1 passed, -1 failed
let failures = 0;
function fail(msg) {
  failures++;
  if (failures <= 50) binding.log(WARN, ~0, `io-test: FAIL ${msg}`);
  else if (failures === 51) binding.log(WARN, ~0, 'io-test: more failures follow; not logged');
}
function check(cond, msg) {
  if (!cond) fail(msg);
  return cond;
}

binding.start({
  control(op) {
    switch (op) {
      case 'init':
        return { ctx: 1 };
      case 'devices':
        return verdict < 0 ? { result: 3 } : { ndev: verdict };
      case 'finalize':
        return {};
      default:
        return { result: 3 };
    }
  },
  data() {},
});

// ---------------------------------------------------------------- helpers

const MiB = 1 << 20;
const THREADS = 4;
const io = NativeIo.get({ threads: THREADS });
const S = binding.ioStatus;

/** Two connected, paused Node sockets on 127.0.0.1. */
function socketPair() {
  return new Promise((resolve, reject) => {
    const server = net.createServer({ pauseOnConnect: true });
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      let accepted, connected;
      const done = () => {
        if (accepted && connected) {
          server.close();
          resolve([connected, accepted]);
        }
      };
      server.once('connection', (s) => {
        accepted = s;
        done();
      });
      const c = net.connect({ port: server.address().port, host: '127.0.0.1' });
      c.pause();
      c.on('error', reject);
      c.once('connect', () => {
        connected = c;
        done();
      });
    });
  });
}

/** Two native lanes joined by one TCP connection; threads pins each end. */
async function lanePair(ta, tb) {
  const [a, b] = await socketPair();
  return [adoptSocket(a, io, ta), adoptSocket(b, io, tb)];
}

const write = (lane, views) => new Promise((res) => lane.write(views, (err) => res(err)));
const read = (lane, view) => new Promise((res) => lane.read(view, (err) => res(err)));

function random(n) {
  const b = Buffer.allocUnsafe(n);
  for (let at = 0; at < n; at += 64 * MiB) crypto.randomFillSync(b, at, Math.min(64 * MiB, n - at));
  return new Uint8Array(b.buffer, b.byteOffset, n);
}

const equal = (a, b) => a.length === b.length && Buffer.compare(a, b) === 0;

/** Deterministic sizes for both ends of a stream. */
function rng(seed) {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x;
  };
}

function splitAt(buf, parts) {
  const out = [];
  let at = 0;
  for (let i = 0; i < parts; i++) {
    const end = i === parts - 1 ? buf.length : Math.floor((buf.length * (i + 1)) / parts);
    out.push(buf.subarray(at, end));
    at = end;
  }
  return out;
}

const seconds = (t0) => Number(process.hrtime.bigint() - t0) / 1e9;

// ---------------------------------------------------------------- tests

async function testSizes() {
  const [a, b] = await lanePair(0, 1);
  for (const size of [0, 1, 7, 4096, 65536, MiB + 3, 16 * MiB, 64 * MiB]) {
    const src = random(size);
    const dst = new Uint8Array(size);
    // A gather write of 3 views one way, 2 reads the other way; then back as one view.
    const rs = splitAt(dst, 2).map((v) => read(b, v));
    const w = write(a, splitAt(src, 3));
    const errs = await Promise.all([w, ...rs]);
    check(errs.every((e) => !e), `size ${size} a->b: ${errs.filter(Boolean).join('; ')}`);
    check(equal(src, dst), `size ${size} a->b: the bytes differ`);
    const back = new Uint8Array(size);
    const errs2 = await Promise.all([read(a, back), write(b, [dst])]);
    check(errs2.every((e) => !e) && equal(src, back), `size ${size} b->a`);
  }
  // Empty views in the middle of a gather, and a write of no views at all.
  const src = random(1000);
  const dst = new Uint8Array(1000);
  const errs = await Promise.all([
    write(a, []),
    write(a, [src.subarray(0, 10), new Uint8Array(0), src.subarray(10), new Uint8Array(0)]),
    read(b, dst),
  ]);
  check(errs.every((e) => !e) && equal(src, dst), 'empty views inside a gather');
  a.close();
  b.close();
  say('sizes 0 B .. 64 MiB both ways: done');
}

async function testInflight() {
  // 4 lane pairs over 2 threads, both directions at once, 2000 messages each way per pair,
  // all posted at once; every message's bytes and its order are checked.
  const pairs = [];
  for (let i = 0; i < 4; i++) pairs.push(await lanePair(i % 2, (i + 1) % 2));
  const N = 2000;
  const streams = [];
  let bytes = 0;
  pairs.forEach(([a, b], p) => {
    for (const [from, to, seed] of [
      [a, b, 11 + p],
      [b, a, 101 + p],
    ]) {
      const next = rng(seed);
      const msgs = [];
      for (let k = 0; k < N; k++) {
        const size = 1 + (next() % (k % 10 === 0 ? 256 * 1024 : 4096));
        const src = random(size);
        bytes += size;
        msgs.push({ src, dst: new Uint8Array(size), views: size > 3 ? splitAt(src, 1 + (k % 4)) : [src] });
      }
      streams.push({ p, from, to, msgs, order: [] });
    }
  });
  const jobs = [];
  const t0 = process.hrtime.bigint();
  for (const { p, from, to, msgs, order } of streams)
    msgs.forEach(({ src, dst, views }, k) => {
      jobs.push(
        write(from, views).then((e) => check(!e, `inflight pair ${p} write ${k}: ${e}`)),
        read(to, dst).then((e) => {
          order.push(k);
          check(!e && equal(src, dst), `inflight pair ${p} message ${k}: ${e || 'bytes differ'}`);
        }),
      );
    });
  check(io.inFlight === 4 * 2 * 2 * N, `inflight: ${io.inFlight} operations in flight (want ${4 * 2 * 2 * N})`);
  await Promise.all(jobs);
  const t = seconds(t0);
  for (const { p, order } of streams) check(order.length === N && order.every((k, i) => k === i), `inflight pair ${p}: reads completed out of order`);
  pairs.forEach(([a, b]) => (a.close(), b.close()));
  check(io.inFlight === 0, `inflight: ${io.inFlight} operations left after all completed`);
  say(`${4 * 2 * 2 * N} operations in flight on 4 lane pairs over 2 threads: done, ${(bytes / MiB).toFixed(1)} MiB in ${t.toFixed(2)} s (${((4 * 2 * 2 * N) / t / 1000).toFixed(0)} k ops/s)`);
}

async function testEof() {
  // The peer closes before any byte of a posted read arrived.
  step('eof: at start');
  let [a, b] = await lanePair(0, 1);
  let r = read(b, new Uint8Array(100));
  a.close();
  let e = await r;
  check(e && /closed the connection/.test(e.message), `EOF at a read's start: ${e}`);
  e = await read(b, new Uint8Array(1));
  check(e && /closed the connection/.test(e.message), `a read after EOF: ${e}`);
  e = await read(b, new Uint8Array(0));
  check(e && /closed the connection/.test(e.message), `an empty read after EOF fails too: ${e}`);
  b.close();

  // The peer closes in the middle of a read: half of it arrived.
  step('eof: mid-read');
  [a, b] = await lanePair(1, 0);
  const dst = new Uint8Array(MiB);
  r = read(b, dst);
  const src = random(MiB / 2);
  step('eof: mid-read: pair up, writing');
  check(!(await write(a, [src])), 'mid-read: the first half was written');
  step('eof: mid-read: written, closing');
  a.close();
  e = await r;
  check(e && /closed the connection/.test(e.message), `peer close mid-read: ${e}`);
  check(equal(dst.subarray(0, MiB / 2), src), 'mid-read: the bytes that arrived are in place');
  b.close();

  // The reader goes away while a large write is pending: the write fails (ECONNRESET/EPIPE).
  step('eof: write to a closed peer');
  [a, b] = await lanePair(0, 1);
  const w = write(a, [random(64 * MiB)]);
  await new Promise((res) => setTimeout(res, 50));
  b.close();
  e = await w;
  check(e && /reset the connection/.test(e.message), `a pending write to a closed peer: ${e}`);
  e = await write(a, [new Uint8Array(10)]);
  check(!!e, `a write after the lane failed fails at once: ${e}`);
  a.close();
  say('EOF, peer close mid-read, write to a closed peer: done');
}

async function testClose() {
  // ioClose with reads and a blocked write pending: every callback gets ECANCELED, and the
  // views are free as soon as close() returns.
  let [a, b] = await lanePair(0, 0);
  const results = [];
  for (let i = 0; i < 10; i++) b.read(new Uint8Array(1000), (e) => results.push(['r', e]));
  b.write([random(64 * MiB)], (e) => results.push(['w', e]));
  await new Promise((res) => setTimeout(res, 50));
  b.close();
  b.write([new Uint8Array(1)], (e) => results.push(['w-after', e]));
  b.read(new Uint8Array(1), (e) => results.push(['r-after', e]));
  await new Promise((res) => setTimeout(res, 100));
  check(results.length === 13, `close: ${results.length} of 13 callbacks called`);
  check(results.every(([, e]) => e && e.code === 'ECANCELED'), `close: every callback got ECANCELED: ${results.map(([k, e]) => `${k}:${e && e.code}`).join(' ')}`);
  a.close();

  // Close while an I/O thread is busy on the lane, at random moments of a large transfer;
  // after close no callback reports success and nothing crashes.
  for (let round = 0; round < 20; round++) {
    [a, b] = await lanePair(round % 2, (round + 1) % 2);
    const src = random(8 * MiB);
    let after = 0;
    let closed = false;
    const cbs = [];
    for (let k = 0; k < 8; k++) {
      cbs.push(write(a, [src]));
      cbs.push(
        new Promise((res) =>
          b.read(new Uint8Array(8 * MiB), (e) => {
            if (closed && !e) after++;
            res(e);
          }),
        ),
      );
    }
    await new Promise((res) => setTimeout(res, round % 5));
    closed = true;
    b.close();
    a.close();
    await Promise.all(cbs);
    check(after === 0, `close round ${round}: ${after} reads reported success after close`);
  }
  // Closing twice, and a lane that was never used.
  [a, b] = await lanePair();
  a.close();
  a.close();
  b.close();
  check(io.inFlight === 0, `close: ${io.inFlight} operations left in flight`);
  say('close with pending ops, close racing the I/O threads: done');
}

async function throughput(label, threadOf, lanes = 4, perLane = 256 * MiB) {
  const chunk = 16 * MiB;
  const src = random(chunk);
  const pairs = [];
  for (let i = 0; i < lanes; i++) pairs.push(await lanePair(threadOf(i), threadOf(i)));
  const dsts = pairs.map(() => new Uint8Array(chunk));
  const t0 = process.hrtime.bigint();
  const all = [];
  pairs.forEach(([a, b], i) => {
    for (let k = 0; k < perLane / chunk; k++) {
      all.push(write(a, [src]), read(b, dsts[i]));
    }
  });
  const errs = await Promise.all(all);
  const t = seconds(t0);
  check(errs.every((e) => !e), `throughput ${label}: ${errs.filter(Boolean)[0]}`);
  check(dsts.every((d) => equal(d, src)), `throughput ${label}: the last chunk differs`);
  pairs.forEach(([a, b]) => (a.close(), b.close()));
  const gbs = (lanes * perLane) / t / 1e9;
  say(`throughput ${label}: ${lanes} lanes x ${perLane / MiB} MiB in ${t.toFixed(2)} s = ${gbs.toFixed(2)} GB/s`);
  return gbs;
}

/** Small-message rate: 64 B writes and reads on one lane pair, posted in waves of 1000. */
async function opRate(total = 200000, wave = 1000) {
  const [a, b] = await lanePair(0, 1);
  const src = random(64);
  const dsts = Array.from({ length: wave }, () => new Uint8Array(64));
  let errors = 0;
  const t0 = process.hrtime.bigint();
  for (let done = 0; done < total; done += wave) {
    await new Promise((res) => {
      let left = 2 * wave;
      const cb = (e) => {
        if (e) errors++;
        if (--left === 0) res();
      };
      for (let k = 0; k < wave; k++) {
        a.write([src], cb);
        b.read(dsts[k], cb);
      }
    });
  }
  const t = seconds(t0);
  check(errors === 0 && dsts.every((d) => equal(d, src)), `op rate: ${errors} errors`);
  a.close();
  b.close();
  say(`op rate: ${total} x 64 B writes + reads (waves of ${wave}) in ${t.toFixed(2)} s = ${((2 * total) / t / 1e6).toFixed(2)} M ops/s`);
}

/** The same transfer through Node's own sockets on the plugin thread (the baseline). */
async function nodeThroughput(lanes = 4, perLane = 256 * MiB) {
  const chunk = 16 * MiB;
  const src = Buffer.from(random(chunk));
  const pairs = [];
  for (let i = 0; i < lanes; i++) pairs.push(await socketPair());
  const t0 = process.hrtime.bigint();
  await Promise.all(
    pairs.map(
      ([a, b]) =>
        new Promise((res) => {
          let got = 0;
          b.on('data', (d) => {
            got += d.length;
            if (got >= perLane) res();
          });
          b.resume();
          for (let k = 0; k < perLane / chunk; k++) a.write(src);
        }),
    ),
  );
  const t = seconds(t0);
  pairs.forEach(([a, b]) => (a.destroy(), b.destroy()));
  const gbs = (lanes * perLane) / t / 1e9;
  say(`throughput node net (plugin thread, baseline): ${lanes} lanes x ${perLane / MiB} MiB in ${t.toFixed(2)} s = ${gbs.toFixed(2)} GB/s`);
  return gbs;
}

async function main() {
  const t0 = process.hrtime.bigint();
  say(`starting (${THREADS} I/O threads, ${require('os').cpus().length} cores)`);
  check(S.OK === 0 && S.EOF === -1000 && S.CANCELLED < 0, `ioStatus constants: ${JSON.stringify(S)}`);
  for (const [name, fn] of [
    ['sizes', testSizes],
    ['inflight', testInflight],
    ['eof', testEof],
    ['close', testClose],
  ]) {
    try {
      await fn();
    } catch (e) {
      fail(`${name} threw: ${(e && e.stack) || e}`);
    }
  }
  // Argument errors (the engine is running by now) are thrown, never crash.
  let threw = 0;
  for (const bad of [() => binding.ioWrite(999999, [], 1), () => binding.ioRead(999999, new Uint8Array(1), 1), () => binding.ioClose(999999), () => binding.ioAdopt(-1), () => binding.ioStart(1, () => {})])
    try {
      bad();
    } catch {
      threw++;
    }
  check(threw === 5, `bad arguments throw (${threw} of 5)`);
  try {
    await opRate();
  } catch (e) {
    fail(`op rate threw: ${(e && e.stack) || e}`);
  }
  const perLane = Number(process.env.TSNET_IO_TEST_MIB || 256) * MiB;
  try {
    const g4 = await throughput('4 threads (one per lane pair)', (i) => i % 4, 4, perLane);
    const g1 = await throughput('1 thread (all lanes)', () => 0, 4, perLane);
    const gn = await nodeThroughput(4, perLane);
    say(`THROUGHPUT 4 lanes x ${perLane / MiB} MiB over 127.0.0.1: 4 I/O threads ${g4.toFixed(2)} GB/s, 1 I/O thread ${g1.toFixed(2)} GB/s, Node net on the plugin thread ${gn.toFixed(2)} GB/s`);
  } catch (e) {
    fail(`throughput threw: ${(e && e.stack) || e}`);
  }
  check(io.inFlight === 0, `${io.inFlight} operations left in flight at the end`);
  say(`${failures ? 'IO-TESTS FAILED' : 'IO-TESTS PASSED'} (${failures} failures, ${seconds(t0).toFixed(1)} s)`);
  verdict = failures ? -1 : 1;
}

setImmediate(() =>
  main().catch((e) => {
    fail(`main threw: ${(e && e.stack) || e}`);
    verdict = -1;
  }),
);
void NativeLane;
