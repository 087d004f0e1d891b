// The native I/O engine (native/engine/) through build/tsnet_engine.node: the real I/O threads
// and rings driven by plugin/engine/port.ts and native-link.ts from plain Node (the tests poll:
// nobody wakes this thread), over socketpairs and TCP loopback sockets. Raw ring writes where
// the native side's validation is the subject. Throughput and small-op rate are printed, never
// asserted.
import { split } from '../support/addr';
import * as fs from 'fs';
import * as net from 'net';
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { NativeLink } from '../../plugin/engine/native-link';
import { type CqeHandler, Port } from '../../plugin/engine/port';
import { CQE, RING, RX, STATUS_EOF, SUB, SUB_F_NOCQE, SubKind } from '../../plugin/engine/records';
import { FRAME_BYTES, FrameType, copyOut, decodeFrame, readFrame, type Frame } from '../../plugin/protocol/frames';
import type { LinkEvents } from '../../plugin/protocol/link';
import { DEFAULT_POLICIES } from '../../plugin/protocol/policies';
import {
  type EngineAddon, KiB, MiB, Mem, allBytes, bindingFor, engine, fdOf, fill, firstDiff, missing, portOf, prng, sleep, tcpPair, turn, until,
} from './helpers';

const EPIPE = -32;
const ECONNRESET = -104;
const EBADF = -9;
const EINVAL = -22;
const IO_THREADS = 2;

let A: EngineAddon;
let port: Port;

beforeAll(() => {
  if (missing) return;
  A = engine(IO_THREADS);
  port = portOf(0);
});

/** What one link of a test is told. */
class Sink implements CqeHandler {
  readonly ops: { op: number; status: number; value: number; io: number }[] = [];
  readonly rx: { status: number; value: number }[] = [];
  onOp(op: number, status: number, value: number, _time: number, io: number): void {
    this.ops.push({ op, status, value, io });
  }
  onRx(status: number, value: number): void {
    this.rx.push({ status, value });
  }
  of(op: number) {
    return this.ops.find((c) => c.op === op);
  }
}

/** One adopted socket: a lane of an I/O thread, a link id of a port, a sink. */
interface End {
  lane: number;
  thread: number;
  link: number;
  sink: Sink;
  port: Port;
  b: EngineAddon;
  rx?: ArrayBuffer;
  closed: boolean;
}

const ends: End[] = [];
afterEach(() => {
  for (const e of ends.splice(0)) {
    if (!e.closed) {
      try {
        e.b.ioClose(e.lane, false);
      } catch {
        // already gone
      }
    }
    e.port.removeLink(e.link);
  }
});

function adopt(fd: number, opts: { thread?: number; rxBytes?: number; index?: number } = {}): End {
  const index = opts.index ?? 0;
  const p = portOf(index);
  const b = bindingFor(index);
  const sink = new Sink();
  const link = p.addLink(sink);
  const r = b.ioAdopt(fd, opts.thread ?? -1, link, opts.rxBytes ?? 0);
  const e: End = { lane: r.lane, thread: r.thread, link, sink, port: p, b, rx: r.rx, closed: false };
  ends.push(e);
  return e;
}

function close(e: End, graceful: boolean) {
  e.port.flush();
  e.closed = true;
  return e.b.ioClose(e.lane, graceful);
}

type Kind = 'unix' | 'tcp';

/** Two connected sockets: [fd, fd] and a function that closes this process's copies. */
async function fdPair(kind: Kind): Promise<{ fds: [number, number]; release: () => void }> {
  if (kind === 'unix') {
    const fds = A.socketPair();
    return { fds, release: () => fds.forEach((fd) => fs.closeSync(fd)) };
  }
  const [c, s] = await tcpPair();
  return { fds: [fdOf(c), fdOf(s)], release: () => (c.destroy(), s.destroy()) };
}

/** Two adopted ends of one connection. */
async function pair(kind: Kind, opts: { threads?: [number, number]; rxBytes?: [number, number]; index?: number } = {}): Promise<[End, End]> {
  const { fds, release } = await fdPair(kind);
  const a = adopt(fds[0], { thread: opts.threads?.[0], rxBytes: opts.rxBytes?.[0], index: opts.index });
  const b = adopt(fds[1], { thread: opts.threads?.[1], rxBytes: opts.rxBytes?.[1], index: opts.index });
  release();
  return [a, b];
}

/** One adopted end; the other is a paused Node socket of this test (written, ended, closed by hand). */
async function half(kind: Kind, opts: { rxBytes?: number } = {}): Promise<{ e: End; peer: net.Socket }> {
  let peer: net.Socket;
  if (kind === 'unix') {
    const [x, y] = A.socketPair();
    const e = adopt(x, opts);
    fs.closeSync(x);
    peer = new net.Socket({ fd: y, readable: true, writable: true, pauseOnCreate: true } as net.SocketConstructorOpts);
    peers.push(peer);
    return { e, peer };
  }
  const [c, s] = await tcpPair();
  const e = adopt(fdOf(c), opts);
  c.destroy();
  peers.push(s);
  return { e, peer: s };
}
const peers: net.Socket[] = [];
afterEach(() => peers.splice(0).forEach((s) => s.destroy()));

const write = (e: End, op: number, addr: number, len: number, frame?: Frame, flags = 0) =>
  frame
    ? e.port.submit(e.thread, e.lane, e.link, op, SubKind.WRITE, flags, ...split(addr), len, frame.type, frame.flags, frame.tag, frame.seq, frame.size)
    : e.port.submit(e.thread, e.lane, e.link, op, SubKind.WRITE, flags, ...split(addr), len);
const read = (e: End, op: number, addr: number, len: number) => e.port.submit(e.thread, e.lane, e.link, op, SubKind.READ, 0, ...split(addr), len);

/** Publishes everything queued, however many turns the rings need (nothing polled meanwhile). */
async function flushAll(p: Port = port): Promise<void> {
  p.flush();
  while (p.backlog) {
    await turn();
    p.flush();
  }
}

const GUARD = 64;

describe.skipIf(!!missing)('engine: sizes both ways', () => {
  for (const kind of ['unix', 'tcp'] as Kind[])
    it(`${kind}: 0 B .. 64 MiB each way at once: a gather write (24-byte inline header + payload), read back as header + two halves`, async () => {
      const [a, b] = await pair(kind, { threads: [0, 1] });
      const sizes = [0, 1, 7, 24, 4095, 4096, 65537, 1 * MiB + 3, 16 * MiB, 64 * MiB];
      const max = sizes[sizes.length - 1];
      const src = [new Mem(max), new Mem(max)];
      const dst = [new Mem(max + 2 * GUARD), new Mem(max + 2 * GUARD)];
      const hdr = [new Mem(FRAME_BYTES + 2 * GUARD), new Mem(FRAME_BYTES + 2 * GUARD)];
      let op = 1;
      for (const [i, size] of sizes.entries()) {
        const dirs = [
          { from: a, to: b, s: src[0], d: dst[0], h: hdr[0] },
          { from: b, to: a, s: src[1], d: dst[1], h: hdr[1] },
        ];
        const want: { e: End; op: number; value: number }[] = [];
        for (const [k, x] of dirs.entries()) {
          fill(x.s.bytes.subarray(0, size), i * 2 + k + 1);
          x.d.bytes.fill(0xee, 0, size + 2 * GUARD);
          x.h.bytes.fill(0xee);
          const frame: Frame = { type: FrameType.MSG, flags: k, tag: 3 - i, seq: i * 2 + k, size };
          const w = op++;
          write(x.from, w, x.s.addr, size, frame);
          want.push({ e: x.from, op: w, value: FRAME_BYTES + size });
          const half = Math.floor(size / 2);
          const r = [op++, op++, op++];
          read(x.to, r[0], x.h.addr + GUARD, FRAME_BYTES);
          read(x.to, r[1], x.d.addr + GUARD, half);
          read(x.to, r[2], x.d.addr + GUARD + half, size - half);
          want.push({ e: x.to, op: r[0], value: FRAME_BYTES }, { e: x.to, op: r[1], value: half }, { e: x.to, op: r[2], value: size - half });
        }
        await until(() => want.every((w) => w.e.sink.of(w.op)), 30_000, `${size} bytes both ways`);
        for (const w of want) expect(w.e.sink.of(w.op), `op ${w.op} of size ${size}`).toMatchObject({ status: 0, value: w.value });
        for (const [k, x] of dirs.entries()) {
          expect(decodeFrame(x.h.bytes.subarray(GUARD, GUARD + FRAME_BYTES))).toEqual({ type: FrameType.MSG, flags: k, tag: 3 - i, seq: i * 2 + k, size });
          expect(firstDiff(x.d.bytes.subarray(GUARD, GUARD + size), x.s.bytes.subarray(0, size)), `payload of ${size}, direction ${k}`).toBe(-1);
          expect(allBytes(x.d.bytes.subarray(0, GUARD), 0xee) && allBytes(x.d.bytes.subarray(GUARD + size, size + 2 * GUARD), 0xee), `guards of ${size}`).toBe(true);
          expect(allBytes(x.h.bytes.subarray(0, GUARD), 0xee) && allBytes(x.h.bytes.subarray(GUARD + FRAME_BYTES), 0xee)).toBe(true);
        }
      }
    });

  it('a read that takes several writes and writes that fill several reads: the stream has no boundaries', async () => {
    const [a, b] = await pair('unix');
    const s = fill(new Mem(100_000).bytes, 3);
    const src = new Mem(100_000);
    src.bytes.set(s);
    const d = new Mem(100_000);
    // 10 writes of 10,000 bytes; reads of 3 sizes that do not line up with them.
    for (let k = 0; k < 10; k++) write(a, k + 1, src.addr + k * 10_000, 10_000);
    const cuts = [1, 9_999, 10_001, 33_333, 46_666];
    let at = 0;
    cuts.forEach((n, k) => {
      read(b, 100 + k, d.addr + at, n);
      at += n;
    });
    await until(() => b.sink.ops.length === cuts.length && a.sink.ops.length === 10, 10_000, 'every op');
    expect(b.sink.ops.map((c) => c.op)).toEqual(cuts.map((_, k) => 100 + k));
    expect(a.sink.ops.every((c) => c.status === 0) && b.sink.ops.every((c) => c.status === 0)).toBe(true);
    expect(firstDiff(d.bytes, src.bytes)).toBe(-1);
  });

  it('zero-byte reads and writes complete in their turn', async () => {
    const [a, b] = await pair('unix');
    const m = new Mem(16);
    const d = new Mem(16);
    fill(m.bytes, 1);
    write(a, 1, 0, 0);
    write(a, 2, m.addr, 16);
    write(a, 3, 0, 0);
    read(b, 1, 0, 0);
    read(b, 2, d.addr, 16);
    read(b, 3, 0, 0);
    await until(() => a.sink.ops.length === 3 && b.sink.ops.length === 3, 5000, 'six ops');
    expect(a.sink.ops.map((c) => [c.op, c.status, c.value])).toEqual([[1, 0, 0], [2, 0, 16], [3, 0, 0]]);
    expect(b.sink.ops.map((c) => [c.op, c.status, c.value])).toEqual([[1, 0, 0], [2, 0, 16], [3, 0, 0]]);
    expect(firstDiff(d.bytes, m.bytes)).toBe(-1);
  });
});

/** A control-lane pair of NativeLinks (no data lanes) whose receiving end parses frames in place. */
async function ringPair(kind: Kind, rxBytes: number) {
  const { fds, release } = await fdPair(kind);
  const b = bindingFor(0);
  const policy = { ...DEFAULT_POLICIES, eagerMax: 0, minStripe: 4096, lanes: 0 };
  const tx = new NativeLink(port, b, [fds[0]], policy, 'tx', 1 << 12);
  const rxl = new NativeLink(port, b, [fds[1]], policy, 'rx', rxBytes);
  release();
  const sent: number[] = [];
  const rxStatus: number[] = [];
  tx.attach({ onOp: (op, status) => (status === 0 ? sent.push(op) : rxStatus.push(status)), onRx: () => {} });
  const events: LinkEvents = { onOp: () => {}, onRx: (status) => void (status !== 0 && rxStatus.push(status)) };
  rxl.attach(events);
  linksToClose.push(tx, rxl);
  const hdr = new Uint32Array(rxl.rx.bytes.buffer, 0, RX.bytes / 4);
  return { tx, rxl, sent, rxStatus, hdr, stalled: () => Atomics.load(hdr, RX.stalled / 4) };
}
const linksToClose: NativeLink[] = [];
afterEach(() => linksToClose.splice(0).forEach((l) => l.close(false)));

describe.skipIf(!!missing)('engine: a control lane\'s receive ring', () => {
  it('frames whose header or payload spans the ring\'s end arrive whole (parsed in place, copied out)', async () => {
    const cap = 4096;
    const r = await ringPair('unix', cap);
    const rnd = prng(11);
    const N = 400;
    const sizes = Array.from({ length: N }, () => Math.floor(rnd() * 1500));
    const src = new Mem(N * 1500);
    sizes.forEach((n, i) => fill(src.bytes.subarray(i * 1500, i * 1500 + n), i));
    let splitHeaders = 0;
    let splitPayloads = 0;
    let parsed = 0;
    let next = 0;
    const f: Frame = { type: FrameType.MSG, flags: 0, tag: 0, seq: 0, size: 0 };
    const got = new Uint8Array(1500);
    // A window of 8 frames in flight; the receiver parses and releases as they come.
    let posted = 0;
    const post = () => {
      while (posted < N && posted - r.sent.length < 8) {
        r.tx.frame(FrameType.MSG, 1, posted, posted, sizes[posted], ...split(src.addr + posted * 1500), sizes[posted], posted);
        posted++;
      }
    };
    await until(() => {
      post();
      for (;;) {
        const avail = (r.rxl.rx.written() - parsed) >>> 0;
        if (avail < FRAME_BYTES) break;
        expect(readFrame(r.rxl.rx, parsed, f)).toBeUndefined();
        if (avail < FRAME_BYTES + f.size) break;
        expect(f.seq).toBe(next);
        const o = parsed & (cap - 1);
        if (o + FRAME_BYTES > cap) splitHeaders++;
        else if (o + FRAME_BYTES < cap && o + FRAME_BYTES + f.size > cap) splitPayloads++;
        copyOut(r.rxl.rx, parsed + FRAME_BYTES, f.size, got, 0);
        expect(firstDiff(got.subarray(0, f.size), src.bytes.subarray(next * 1500, next * 1500 + f.size)), `frame ${next}`).toBe(-1);
        parsed = (parsed + FRAME_BYTES + f.size) >>> 0;
        next++;
      }
      r.rxl.rx.release(parsed);
      return next === N;
    }, 20_000, `${N} frames`);
    expect(splitHeaders).toBeGreaterThan(0);
    expect(splitPayloads).toBeGreaterThan(0);
    expect(r.rxStatus).toEqual([]);
  });

  it('a full ring stalls the I/O thread (no byte lost meanwhile); releasing sends RX_RESUME and it reads on', async () => {
    const cap = 4096;
    const r = await ringPair('tcp', cap);
    const N = 40;
    const size = 1000;
    const src = new Mem(N * size);
    for (let i = 0; i < N; i++) fill(src.bytes.subarray(i * size, (i + 1) * size), i + 100);
    for (let i = 0; i < N; i++) r.tx.frame(FrameType.MSG, 1, i, i, size, ...split(src.addr + i * size), size, i);
    await until(() => r.stalled() === 1, 5000, 'the I/O thread to stall');
    await until(() => r.sent.length === N, 5000, 'every frame written (the socket holds what the ring cannot)');
    expect(r.rxl.rx.written()).toBe(cap);
    await sleep(100);
    await until(() => true, 10, 'a poll');
    expect(r.rxl.rx.written()).toBe(cap);
    expect(r.stalled()).toBe(1);
    // Parse and release one frame at a time; each release of a stalled ring resumes it.
    let parsed = 0;
    const f: Frame = { type: FrameType.MSG, flags: 0, tag: 0, seq: 0, size: 0 };
    const got = new Uint8Array(size);
    let resumes = 0;
    for (let i = 0; i < N; i++) {
      await until(() => ((r.rxl.rx.written() - parsed) >>> 0) >= FRAME_BYTES + size, 5000, `frame ${i}`);
      expect(readFrame(r.rxl.rx, parsed, f)).toBeUndefined();
      expect(f).toMatchObject({ type: FrameType.MSG, seq: i, size });
      copyOut(r.rxl.rx, parsed + FRAME_BYTES, size, got, 0);
      expect(firstDiff(got, src.bytes.subarray(i * size, (i + 1) * size)), `frame ${i}`).toBe(-1);
      parsed = (parsed + FRAME_BYTES + size) >>> 0;
      if (r.stalled()) resumes++;
      r.rxl.rx.release(parsed);
    }
    expect(resumes).toBeGreaterThan(1);
    expect(r.rxl.rx.written()).toBe(N * (FRAME_BYTES + size));
    expect(r.rxStatus).toEqual([]);
  });

  for (const kind of ['unix', 'tcp'] as Kind[])
    for (const direct of [false, true])
    it(`${kind}${direct ? ', frames written on the protocol thread where they can be (ioWriteNow)' : ''}: a long randomized run (frame sizes, a sender far ahead, releases held back at random): no byte lost or duplicated`, async () => {
      const cap = 8192;
      const r = await ringPair(kind, cap);
      const was = port.writeNowMax;
      const here = port.writtenHere;
      port.writeNowMax = direct ? 8192 : -1;
      try {
      const rnd = prng(kind === 'tcp' ? 21 : 22);
      const N = 6000;
      const MAXP = 3000;
      const WINDOW = 256;
      const src = new Mem(WINDOW * MAXP);
      const sizes: number[] = [];
      let posted = 0;
      const post = () => {
        while (posted < N && posted - r.sent.length < WINDOW) {
          const n = rnd() < 0.3 ? Math.floor(rnd() * 16) : Math.floor(rnd() * MAXP);
          sizes.push(n);
          const at = (posted % WINDOW) * MAXP;
          fill(src.bytes.subarray(at, at + n), posted);
          r.tx.frame(FrameType.MSG, 1, posted & 0xffff, posted, n, ...split(src.addr + at), n, posted);
          posted++;
        }
      };
      let parsed = 0;
      let released = 0;
      let next = 0;
      let bytes = 0;
      const f: Frame = { type: FrameType.MSG, flags: 0, tag: 0, seq: 0, size: 0 };
      const got = new Uint8Array(MAXP);
      const want = new Uint8Array(MAXP);
      const starts: number[] = []; // ring positions of frames parsed and not yet released
      await until(() => {
        post();
        for (;;) {
          const avail = (r.rxl.rx.written() - parsed) >>> 0;
          if (avail < FRAME_BYTES) break;
          expect(readFrame(r.rxl.rx, parsed, f)).toBeUndefined();
          if (avail < FRAME_BYTES + f.size) break;
          expect(f.seq, 'frames in order, none twice, none missing').toBe(next);
          expect(f.size).toBe(sizes[next]);
          copyOut(r.rxl.rx, parsed + FRAME_BYTES, f.size, got, 0);
          fill(want.subarray(0, f.size), next);
          expect(firstDiff(got.subarray(0, f.size), want.subarray(0, f.size)), `frame ${next}`).toBe(-1);
          starts.push(parsed);
          parsed = (parsed + FRAME_BYTES + f.size) >>> 0;
          bytes += FRAME_BYTES + f.size;
          next++;
        }
        // Release everything, nothing, or up to a frame in between (held payloads).
        const x = rnd();
        if (x < 0.5) {
          released = parsed;
          starts.length = 0;
        } else if (x < 0.8 && starts.length) {
          const k = Math.floor(rnd() * starts.length);
          released = starts[k];
          starts.splice(0, k);
        }
        r.rxl.rx.release(released);
        return next === N;
      }, 120_000, `${N} frames`);
      expect(r.rxStatus).toEqual([]);
      expect(r.rxl.rx.written()).toBe(bytes >>> 0);
      expect(r.sent.length).toBe(N);
      if (direct) expect(port.writtenHere - here, 'frames written on the protocol thread').toBeGreaterThan(0);
      else expect(port.writtenHere).toBe(here);
      } finally {
        port.writeNowMax = was;
      }
    });
});

describe.skipIf(!!missing)('engine: frames the protocol thread writes itself (ioWriteNow)', () => {
  let was = -1;
  beforeEach(() => {
    was = port.writeNowMax;
    port.writeNowMax = 8192;
  });
  afterEach(() => {
    port.writeNowMax = was;
  });
  /** Lets the I/O threads take everything published (the direct path needs the ring to them empty). */
  const settle = async () => {
    await flushAll();
    await sleep(20);
  };
  /** The peer of r receives frames 0, 1, ... (seq i, payloads of lens[i] bytes) whole and in order. */
  const expectInOrder = async (r: { rxl: NativeLink }, lens: number[]) => {
    let parsed = 0;
    const f: Frame = { type: FrameType.MSG, flags: 0, tag: 0, seq: 0, size: 0 };
    for (let i = 0; i < lens.length; i++) {
      await until(() => ((r.rxl.rx.written() - parsed) >>> 0) >= FRAME_BYTES + lens[i], 5000, `frame ${i}`);
      expect(readFrame(r.rxl.rx, parsed, f)).toBeUndefined();
      expect(f.seq, 'in order').toBe(i);
      parsed += FRAME_BYTES + lens[i];
      r.rxl.rx.release(parsed);
    }
  };

  it('a frame on an idle lane leaves during the call, its completion comes from the next poll, the peer gets it whole; over the limit, or without a completion asked for, as it should', async () => {
    const r = await ringPair('tcp', 1 << 15);
    await settle();
    const src = new Mem(8193);
    fill(src.bytes, 9);
    const here = port.writtenHere;
    r.tx.frame(FrameType.MSG, 1, 7, 70, 8192, ...split(src.addr), 8192, 42);
    expect(port.writtenHere).toBe(here + 1);
    expect(r.sent, 'no completion before a poll').toEqual([]);
    port.poll();
    expect(r.sent).toEqual([42]);
    await until(() => r.rxl.rx.written() >= FRAME_BYTES + 8192, 5000, 'the frame at the peer');
    const f: Frame = { type: FrameType.MSG, flags: 0, tag: 0, seq: 0, size: 0 };
    expect(readFrame(r.rxl.rx, 0, f)).toBeUndefined();
    expect(f).toEqual({ type: FrameType.MSG, flags: 1, tag: 7, seq: 70, size: 8192 });
    const got = new Uint8Array(8192);
    copyOut(r.rxl.rx, FRAME_BYTES, 8192, got, 0);
    expect(firstDiff(got, src.bytes.subarray(0, 8192))).toBe(-1);
    let at = FRAME_BYTES + 8192;
    // One byte over the limit: through the I/O thread.
    await settle();
    r.tx.frame(FrameType.MSG, 1, 8, 71, 8193, ...split(src.addr), 8193, 43);
    expect(port.writtenHere).toBe(here + 1);
    await until(() => r.sent.length === 2, 5000, 'the long frame written by the I/O thread');
    at += FRAME_BYTES + 8193;
    // A frame that asks for no completion (a heartbeat): written here, nothing reported.
    await settle();
    r.tx.frame(FrameType.HEARTBEAT, 0, 9, -1, 0, 0, 0, 0, -1);
    expect(port.writtenHere).toBe(here + 2);
    at += FRAME_BYTES;
    await until(() => r.rxl.rx.written() >= at, 5000, 'every byte at the peer');
    await sleep(20);
    await until(() => true, 10, 'a poll');
    expect(r.sent).toEqual([42, 43]);
    expect(r.rxl.rx.written()).toBe(at);
    expect(r.rxStatus).toEqual([]);
  });

  it('in one turn a lane\'s first frame is written here and the next ones go through the ring (gathered by the I/O thread); another lane\'s first too; after the turn, here again', async () => {
    const r = await ringPair('unix', 1 << 16);
    const r2 = await ringPair('unix', 1 << 16);
    await settle();
    const src = new Mem(64);
    const here = port.writtenHere;
    for (let i = 0; i < 5; i++) r.tx.frame(FrameType.MSG, 1, i, i, 8, ...split(src.addr), 8, i);
    expect(port.writtenHere - here, 'the first of the turn').toBe(1);
    await settle(); // the turn's end (flush), and the I/O thread took the other four
    r.tx.frame(FrameType.MSG, 1, 5, 5, 8, ...split(src.addr), 8, 5);
    expect(port.writtenHere - here, 'a new turn').toBe(2);
    // r2's lane may share r's I/O thread; its first frame of a turn still goes here, unless the
    // ring to that thread holds a record of this turn already (none: r's frame went here).
    r2.tx.frame(FrameType.MSG, 1, 0, 0, 8, ...split(src.addr), 8, 0);
    expect(port.writtenHere - here, 'another lane\'s first').toBe(3);
    await until(() => r.sent.length === 6 && r2.sent.length === 1, 5000, 'every completion');
    await expectInOrder(r, [8, 8, 8, 8, 8, 8]);
    expect(r.sent.slice().sort()).toEqual([0, 1, 2, 3, 4, 5]);
  });

  it('ioSetDirectIdle (TSNET_DIRECT_SEND_IDLE_US): a lane that wrote less than that ago, here or by its I/O thread, leaves its frame to the I/O thread; a quiet lane, or the rule at 0, here', async () => {
    const r = await ringPair('unix', 1 << 16);
    const r2 = await ringPair('unix', 1 << 16);
    await settle();
    const src = new Mem(8193);
    const here = port.writtenHere;
    const frame = (e: typeof r, i: number, len = 8) => e.tx.frame(FrameType.MSG, 1, i, i, len, ...split(src.addr), len, i);
    A.ioSetDirectIdle!(200_000); // 200 ms
    try {
      frame(r, 0); // the lane never wrote
      expect(port.writtenHere - here, 'a lane that never wrote').toBe(1);
      await settle();
      frame(r, 1);
      expect(port.writtenHere - here, 'written here a moment ago').toBe(1);
      await settle();
      frame(r2, 0);
      expect(port.writtenHere - here, 'another lane, quiet').toBe(2);
      await sleep(250);
      frame(r, 2, 8193); // over the limit: its I/O thread writes it
      await settle();
      frame(r, 3);
      expect(port.writtenHere - here, 'its I/O thread wrote a moment ago').toBe(2);
      await settle(); // published: its I/O thread writes it now
      await sleep(250);
      frame(r, 4);
      expect(port.writtenHere - here, 'quiet for longer than the rule').toBe(3);
    } finally {
      A.ioSetDirectIdle!(0);
    }
    await settle();
    frame(r, 5);
    expect(port.writtenHere - here, 'no rule').toBe(4);
    await until(() => r.sent.length === 6 && r2.sent.length === 1, 5000, 'every completion');
    await expectInOrder(r, [8, 8, 8193, 8, 8, 8]);
    expect(() => A.ioSetDirectIdle!(-1)).toThrow(/ioSetDirectIdle\(us\) needs 0 \.\. 1e6/);
  });

  it('frames submitted after one that waits for the I/O thread in the same turn go behind it, through the ring', async () => {
    const r = await ringPair('unix', 1 << 16);
    await settle();
    const src = new Mem(20000);
    const here = port.writtenHere;
    r.tx.frame(FrameType.MSG, 1, 0, 0, 20000, ...split(src.addr), 20000, 0); // over the limit: the ring
    for (let i = 1; i <= 10; i++) r.tx.frame(FrameType.MSG, 1, i, i, 8, ...split(src.addr), 8, i);
    expect(port.writtenHere, 'none overtakes the first').toBe(here);
    await until(() => r.sent.length === 11, 5000, 'the 11 frames');
    await expectInOrder(r, [20000, ...Array<number>(10).fill(8)]);
  });

  it('tcp: a socket that fills in the middle of a frame: the rest goes through the I/O thread ahead of everything after it; every frame whole, in order, one completion each', async () => {
    // Frames of 200 KB take several socket buffers' worth of kernel memory each: the one that
    // finds the socket almost full goes in part. A frame that finds it full to the byte goes
    // whole through the I/O thread instead; a fresh connection then tries again.
    port.writeNowMax = 256 * KiB;
    const P = 200_000;
    const src = new Mem(4 * P);
    for (let k = 0; k < 4; k++) fill(src.bytes.subarray(k * P, (k + 1) * P), 30 + k);
    let parts = 0;
    for (let attempt = 0; attempt < 5 && parts === 0; attempt++) {
      const [a, b] = await pair('tcp', { threads: [0, 1] });
      await settle();
      const part0 = port.writtenPart;
      const sizes: number[] = [];
      const send = (n: number, i: number) => {
        sizes.push(n);
        port.submitFrame(a.thread, a.lane, a.link, i, 0, ...split(n ? src.addr + (i % 4) * P : 0), n, FrameType.MSG, 1, i, i, n);
      };
      // b reads nothing yet: frames go here one per turn until one cannot.
      let i = 0;
      for (; i < 400; i++) {
        const here = port.writtenHere;
        send(P, i);
        if (port.writtenHere === here) break;
        port.flush(); // a turn's end: the lane may be written here again
        port.poll();
      }
      parts += port.writtenPart - part0;
      i++;
      // Behind it, through the ring: small ones, a heartbeat without completion, long ones.
      for (let k = 0; k < 20; k++, i++) send(k % 5 === 4 ? P : 8, i);
      port.submitFrame(a.thread, a.lane, a.link, 0, SUB_F_NOCQE, 0, 0, 0, FrameType.HEARTBEAT, 0, 99, -1, 0);
      const hb = i;
      sizes.push(0);
      await flushAll();
      const total = sizes.reduce((x, n) => x + FRAME_BYTES + n, 0);
      const got = new Mem(total);
      read(b, 1, got.addr, total);
      await until(() => !!b.sink.of(1) && a.sink.ops.length === i, 30_000, `${total} bytes at the peer, ${i} completions`);
      expect(b.sink.of(1)).toMatchObject({ status: 0, value: total });
      expect(a.sink.ops.every((o) => o.status === 0) && new Set(a.sink.ops.map((o) => o.op)).size === i).toBe(true);
      let at = 0;
      for (let k = 0; k < sizes.length; k++) {
        const fr = decodeFrame(got.bytes.subarray(at, at + FRAME_BYTES)) as Frame;
        expect(typeof fr, `frame ${k}`).toBe('object');
        if (k === hb) expect(fr).toMatchObject({ type: FrameType.HEARTBEAT, tag: 99 });
        else {
          expect(fr, `frame ${k}`).toMatchObject({ type: FrameType.MSG, tag: k, seq: k, size: sizes[k] });
          const want = src.bytes.subarray((k % 4) * P, (k % 4) * P + sizes[k]);
          expect(firstDiff(got.bytes.subarray(at + FRAME_BYTES, at + FRAME_BYTES + sizes[k]), want), `frame ${k}`).toBe(-1);
        }
        at += FRAME_BYTES + sizes[k];
      }
    }
    expect(parts, 'a frame went in part (5 connections tried)').toBeGreaterThan(0);
  });
});

describe.skipIf(!!missing)('engine: many ops in flight', () => {
  it('32,000 writes and 32,000 reads in flight over 4 lane pairs on 2 I/O threads: order and content', async () => {
    const LANES = 4;
    const PER = 8000;
    const pairs: [End, End][] = [];
    for (let k = 0; k < LANES; k++) pairs.push(await pair(k % 2 ? 'unix' : 'tcp', { threads: [k % 2, (k + 1) % 2] }));
    const rnd = prng(5);
    const plan = pairs.map(() => {
      const sizes = Array.from({ length: PER }, (_, i) => (i % 97 === 0 ? 0 : Math.floor(rnd() * 2048)));
      const headers = sizes.map((_, i) => i % 3 === 0);
      const total = sizes.reduce((s, n, i) => s + n + (headers[i] ? FRAME_BYTES : 0), 0);
      return { sizes, headers, total };
    });
    const src = plan.map((p) => new Mem(p.total));
    src.forEach((m, k) => fill(m.bytes, k + 1));
    const dst = plan.map((p) => new Mem(p.total));
    // The byte stream each lane must carry: inline headers where asked, then the payload.
    const expected = plan.map((p, k) => {
      const out = new Uint8Array(p.total);
      let at = 0;
      let off = 0;
      p.sizes.forEach((n, i) => {
        if (p.headers[i]) {
          out.set(encodeHeader({ type: FrameType.MSG, flags: 0, tag: i, seq: i, size: n }), at);
          at += FRAME_BYTES;
        }
        out.set(src[k].bytes.subarray(off, off + n), at);
        at += n;
        off += n;
      });
      return out;
    });
    const t0 = performance.now();
    pairs.forEach(([a, b], k) => {
      let off = 0;
      let at = 0;
      plan[k].sizes.forEach((n, i) => {
        const h = plan[k].headers[i];
        write(a, i, src[k].addr + off, n, h ? { type: FrameType.MSG, flags: 0, tag: i, seq: i, size: n } : undefined);
        read(b, i, dst[k].addr + at, n + (h ? FRAME_BYTES : 0));
        off += n;
        at += n + (h ? FRAME_BYTES : 0);
      });
    });
    await until(() => pairs.every(([a, b]) => a.sink.ops.length === PER && b.sink.ops.length === PER), 60_000, `${LANES * PER * 2} completions`);
    const ms = performance.now() - t0;
    for (const [k, [a, b]] of pairs.entries()) {
      expect(a.sink.ops.map((c) => c.op), `writes of lane ${k} in order`).toEqual(plan[k].sizes.map((_, i) => i));
      expect(b.sink.ops.map((c) => c.op), `reads of lane ${k} in order`).toEqual(plan[k].sizes.map((_, i) => i));
      expect(a.sink.ops.every((c) => c.status === 0) && b.sink.ops.every((c) => c.status === 0)).toBe(true);
      expect(new Set(a.sink.ops.map((c) => c.io))).toEqual(new Set([a.thread]));
      expect(firstDiff(dst[k].bytes, expected[k]), `content of lane ${k}`).toBe(-1);
    }
    console.log(`engine: ${LANES * PER * 2} ops (${(plan.reduce((s, p) => s + p.total, 0) / MiB).toFixed(1)} MiB) over ${LANES} lane pairs on ${IO_THREADS} I/O threads in ${ms.toFixed(0)} ms`);
  });

  it('more than 4096 completions before a poll: the completion ring fills, the I/O thread holds the rest, nothing is lost', async () => {
    const [a, b] = await pair('unix', { threads: [0, 1] });
    const N = 10_000;
    const src = new Mem(N);
    fill(src.bytes, 9);
    const dst = new Mem(N);
    for (let i = 0; i < N; i++) {
      write(a, i, src.addr + i, 1);
      read(b, i, dst.addr + i, 1);
    }
    await flushAll();
    // Both I/O threads have 10,000 completions for this port: each ring fills up (4096) and waits.
    const cq = bindingFor(0).ioPort().cq.map((b) => new Uint32Array(b, 0, RING.bytes / 4));
    const held = () => cq.map((h) => (Atomics.load(h, RING.tail / 4) - Atomics.load(h, RING.head / 4)) >>> 0);
    const t0 = Date.now();
    while (held().some((n) => n < 4096) && Date.now() - t0 < 10_000) await sleep(10);
    await sleep(50);
    expect(held()).toEqual([4096, 4096]);
    const first = port.poll();
    expect(first).toBe(2 * 4096);
    await until(() => a.sink.ops.length === N && b.sink.ops.length === N, 20_000, `${2 * N} completions`);
    expect(a.sink.ops.map((c) => c.op)).toEqual(Array.from({ length: N }, (_, i) => i));
    expect(b.sink.ops.map((c) => c.op)).toEqual(Array.from({ length: N }, (_, i) => i));
    expect(firstDiff(dst.bytes, src.bytes)).toBe(-1);
  });
});

function encodeHeader(f: Frame): Uint8Array {
  const out = new Uint8Array(FRAME_BYTES);
  const dv = new DataView(out.buffer);
  dv.setUint8(0, f.type);
  dv.setUint8(1, f.flags);
  dv.setInt32(4, f.tag, true);
  dv.setFloat64(8, f.seq, true);
  dv.setFloat64(16, f.size, true);
  return out;
}

describe.skipIf(!!missing)('engine: the peer goes away', () => {
  for (const kind of ['unix', 'tcp'] as Kind[]) {
    it(`${kind}: EOF at the start of a read: it and every later read end with EOF (-1000); writes to the half-closed peer still go`, async () => {
      const { e, peer } = await half(kind);
      const m = new Mem(100);
      m.bytes.fill(0x5a);
      read(e, 1, m.addr, 100);
      await until(() => true, 10, 'a poll');
      peer.end();
      await until(() => !!e.sink.of(1), 5000, 'the read to end');
      expect(e.sink.of(1)).toMatchObject({ status: STATUS_EOF, value: 0 });
      read(e, 2, m.addr, 10);
      await until(() => !!e.sink.of(2), 5000, 'a later read');
      expect(e.sink.of(2)).toMatchObject({ status: STATUS_EOF, value: 0 });
      expect(allBytes(m.bytes, 0x5a)).toBe(true);
      const w = new Mem(10);
      write(e, 3, w.addr, 10);
      await until(() => !!e.sink.of(3), 5000, 'a write');
      expect(e.sink.of(3)).toMatchObject({ status: 0, value: 10 });
    });

    it(`${kind}: the peer closes mid-read: the read ends with EOF, the bytes that came are in place, value = bytes moved`, async () => {
      const { e, peer } = await half(kind);
      const m = new Mem(1000);
      m.bytes.fill(0x5a);
      read(e, 1, m.addr, 1000);
      const part = fill(new Uint8Array(100), 4);
      peer.write(part);
      await until(() => m.bytes[99] !== 0x5a, 5000, 'the first bytes');
      peer.destroy();
      await until(() => !!e.sink.of(1), 5000, 'the read to end');
      expect(e.sink.of(1)).toMatchObject({ status: STATUS_EOF, value: 100 });
      expect(firstDiff(m.bytes.subarray(0, 100), part)).toBe(-1);
      expect(allBytes(m.bytes.subarray(100), 0x5a)).toBe(true);
    });

    it(`${kind}: a write to a closed peer ends with -EPIPE or -ECONNRESET, and so does every later op`, async () => {
      const { e, peer } = await half(kind);
      const m = new Mem(64 * KiB);
      const r = new Mem(10);
      read(e, 1000, r.addr, 10);
      peer.destroy();
      await until(() => !!e.sink.of(1000), 5000, 'the read to see the end');
      expect(e.sink.of(1000)!.status).toBe(STATUS_EOF);
      // The first writes may still be taken by the kernel (TCP answers them with a reset).
      let failed: { status: number } | undefined;
      for (let i = 0; i < 200 && !failed; i++) {
        write(e, i, m.addr, m.size);
        await until(() => !!e.sink.of(i), 5000, `write ${i}`);
        if (e.sink.of(i)!.status !== 0) failed = e.sink.of(i);
        else await sleep(5);
      }
      expect(failed, 'a write failed').toBeDefined();
      expect([EPIPE, ECONNRESET]).toContain(failed!.status);
      read(e, 2000, r.addr, 10);
      write(e, 2001, m.addr, 10);
      await until(() => !!e.sink.of(2000) && !!e.sink.of(2001), 5000, 'later ops');
      expect(e.sink.of(2000)!.status).toBe(failed!.status);
      expect(e.sink.of(2001)!.status).toBe(failed!.status);
    });
  }

  it('tcp: a reset (RST) fails the pending read and the blocked write with -ECONNRESET (or -EPIPE)', async () => {
    const { e, peer } = await half('tcp');
    const m = new Mem(64 * MiB);
    read(e, 1, m.addr, 100);
    write(e, 2, m.addr, m.size);
    await until(() => true, 10, 'a poll');
    await sleep(50);
    expect(e.sink.ops).toEqual([]);
    peer.resetAndDestroy();
    await until(() => !!e.sink.of(1) && !!e.sink.of(2), 5000, 'both ops to fail');
    expect([ECONNRESET, EPIPE]).toContain(e.sink.of(2)!.status);
    expect(e.sink.of(1)!.status).toBe(e.sink.of(2)!.status);
  });

  it('a control lane: its receive ring reports the peer\'s end as an RX notification with EOF, after the last bytes', async () => {
    const { e, peer } = await half('unix', { rxBytes: 4096 });
    peer.write(Buffer.alloc(100, 7));
    peer.end();
    await until(() => e.sink.rx.some((x) => x.status !== 0), 5000, 'the end');
    expect(e.sink.rx[e.sink.rx.length - 1]).toEqual({ status: STATUS_EOF, value: 100 });
    const hdr = new Uint32Array(e.rx!, 0, RX.bytes / 4);
    expect(Atomics.load(hdr, RX.written / 4)).toBe(100);
    expect(allBytes(new Uint8Array(e.rx!, RX.bytes, 100), 7)).toBe(true);
  });

  it('a control lane: the peer\'s end is reported once; later passes over the lane (its writes still go) read and report nothing more', async () => {
    const { e, peer } = await half('unix', { rxBytes: 4096 });
    peer.end();
    await until(() => e.sink.rx.some((x) => x.status !== 0), 5000, 'the end');
    const w = new Mem(10);
    for (let k = 1; k <= 3; k++) {
      write(e, k, w.addr, 10);
      await until(() => !!e.sink.of(k), 5000, `write ${k}`);
      expect(e.sink.of(k)).toMatchObject({ status: 0, value: 10 });
    }
    expect(e.sink.rx).toEqual([{ status: STATUS_EOF, value: 0 }]);
  });
});

describe.skipIf(!!missing)('engine: ioClose', () => {
  for (const kind of ['unix', 'tcp'] as Kind[])
    it(`${kind}: hard, with reads and a blocked write pending: returns at once, no completion afterwards, the memory untouched afterwards`, async () => {
      const [a, b] = await pair(kind, { threads: [0, 1] });
      const rd = new Mem(3 * MiB);
      const wr = new Mem(64 * MiB);
      fill(wr.bytes, 1);
      for (let k = 0; k < 3; k++) read(a, k, rd.addr + k * MiB, MiB);
      write(a, 10, wr.addr, wr.size); // b reads nothing: the socket fills, the write blocks half sent
      await until(() => true, 10, 'a poll');
      await sleep(100);
      expect(a.sink.ops).toEqual([]);
      const t0 = performance.now();
      const r = close(a, false);
      const ms = performance.now() - t0;
      expect(r).toEqual({ partial: true, hard: true });
      expect(ms, 'ms in ioClose (it must not wait for the 64 MiB write)').toBeLessThan(500);
      rd.bytes.fill(0x5a);
      // The peer now writes plenty and reads what there is: nothing of it reaches a's memory.
      const more = new Mem(4 * MiB);
      fill(more.bytes, 2);
      write(b, 1, more.addr, more.size);
      const sink = new Mem(64 * MiB);
      read(b, 2, sink.addr, sink.size);
      await until(() => !!b.sink.of(1) && !!b.sink.of(2), 5000, 'the peer to see the end');
      expect(b.sink.of(2)!.status).not.toBe(0);
      await sleep(200);
      await until(() => true, 10, 'a poll');
      expect(a.sink.ops).toEqual([]);
      expect(allBytes(rd.bytes, 0x5a)).toBe(true);
    });

  it('graceful: every inline byte submitted before arrives, then EOF; {partial: false, hard: false}', async () => {
    const [a, b] = await pair('unix', { threads: [0, 1] });
    // 100,000 inline-only frames (2.4 MB): far more than the socket holds while b reads nothing.
    const N = 100_000;
    for (let i = 0; i < N; i++) write(a, i, 0, 0, { type: FrameType.HEARTBEAT, flags: 0, tag: i, seq: i, size: 0 }, SUB_F_NOCQE);
    await flushAll();
    await sleep(50);
    expect(close(a, true)).toEqual({ partial: false, hard: false });
    const got = new Mem(N * FRAME_BYTES);
    read(b, 1, got.addr, got.size);
    const extra = new Mem(16);
    read(b, 2, extra.addr, 16);
    await until(() => !!b.sink.of(1) && !!b.sink.of(2), 10_000, 'every byte, then the end');
    expect(b.sink.of(1)).toMatchObject({ status: 0, value: N * FRAME_BYTES });
    expect(b.sink.of(2)).toMatchObject({ status: STATUS_EOF, value: 0 });
    const dv = new DataView(got.buffer);
    let bad = -1;
    for (let i = 0; i < N && bad < 0; i++) if (dv.getInt32(i * FRAME_BYTES + 4, true) !== i || dv.getUint8(i * FRAME_BYTES) !== FrameType.HEARTBEAT) bad = i;
    expect(bad).toBe(-1);
    expect(a.sink.ops).toEqual([]);
  });

  it('graceful, with a write of external memory half sent: it turns hard (partial); the peer sees the stream cut short, without the inline frame queued behind it', async () => {
    const [a, b] = await pair('tcp', { threads: [0, 1] });
    const wr = new Mem(64 * MiB);
    write(a, 1, wr.addr, wr.size);
    write(a, 2, 0, 0, { type: FrameType.CLOSE, flags: 0, tag: 0, seq: 0, size: 0 });
    await until(() => true, 10, 'a poll');
    await sleep(100);
    expect(close(a, true)).toEqual({ partial: true, hard: true });
    const sink = new Mem(64 * MiB + FRAME_BYTES);
    read(b, 1, sink.addr, sink.size);
    await until(() => !!b.sink.of(1), 5000, 'the peer to see the end');
    expect(b.sink.of(1)!.status).not.toBe(0);
    expect(b.sink.of(1)!.value).toBeLessThan(64 * MiB);
  });

  it('graceful, with external writes queued but none started: they are dropped, the inline bytes before and after them go', async () => {
    const [a, b] = await pair('unix', { threads: [0, 1] });
    const wr = new Mem(1 * MiB);
    // Block the lane with inline bytes first (b reads nothing), then an external write, then more inline bytes.
    const N = 20_000;
    for (let i = 0; i < N; i++) write(a, i, 0, 0, { type: FrameType.HEARTBEAT, flags: 0, tag: i, seq: i, size: 0 }, SUB_F_NOCQE);
    write(a, N, wr.addr, wr.size);
    write(a, N + 1, 0, 0, { type: FrameType.CLOSE, flags: 0, tag: N + 1, seq: 0, size: 0 }, SUB_F_NOCQE);
    await flushAll();
    await sleep(50);
    expect(close(a, true)).toEqual({ partial: false, hard: false });
    const got = new Mem((N + 1) * FRAME_BYTES + 16);
    read(b, 1, got.addr, (N + 1) * FRAME_BYTES);
    read(b, 2, got.addr + (N + 1) * FRAME_BYTES, 16);
    await until(() => !!b.sink.of(1) && !!b.sink.of(2), 10_000, 'the inline bytes, then the end');
    expect(b.sink.of(1)).toMatchObject({ status: 0 });
    expect(b.sink.of(2)).toMatchObject({ status: STATUS_EOF, value: 0 });
    const dv = new DataView(got.buffer);
    expect(dv.getUint8(N * FRAME_BYTES)).toBe(FrameType.CLOSE);
    expect(dv.getInt32(N * FRAME_BYTES + 4, true)).toBe(N + 1);
  });

  it('a graceful close whose peer never ends its side gives up after the linger time, and the lane is freed', async () => {
    await until(() => A.lanes() === 0, 5000, 'the lanes of earlier tests to be freed');
    const [x, y] = A.socketPair();
    const e = adopt(x);
    fs.closeSync(x);
    expect(A.lanes()).toBe(1);
    expect(close(e, true)).toEqual({ partial: false, hard: false });
    await sleep(500);
    expect(A.lanes()).toBe(1); // lingering: the peer is still there, silent
    await until(() => A.lanes() === 0, 5000, 'the lane to be freed after the linger time (2 s)');
    // The peer saw our end (shutdown of writing) before we gave up.
    const b = Buffer.alloc(8);
    expect(fs.readSync(y, b)).toBe(0);
    fs.closeSync(y);
  });

  // The ring is mapped pages (pagesAlloc): once the lane is freed, its mapping is gone from
  // /proc/self/maps. Before item 45 of docs/performance.md it went only when V8 collected the
  // ArrayBuffer, which a link's views keep alive as long as the link object lives.
  it("a control lane's receive ring: ioClose detaches its ArrayBuffer and the ring goes back to the kernel once the lane is freed, though JavaScript still holds the ArrayBuffer", async () => {
    await until(() => A.lanes() === 0, 5000, 'the lanes of earlier tests to be freed');
    const maps = () => fs.readFileSync('/proc/self/maps', 'utf8').split('\n').map((l) => l.split(' ')[0]);
    const [a, b] = await pair('unix', { rxBytes: [4 * MiB, 0] });
    const ring = a.rx!;
    const view = new Uint8Array(ring);
    expect(ring.byteLength).toBe(RX.bytes + 4 * MiB);
    const lo = A.addressOf(ring);
    const range = `${lo.toString(16)}-${(lo + 4 * MiB + 4096).toString(16)}`; // the header and the ring, in whole pages
    expect(maps()).toContain(range);
    view[RX.bytes] = 7; // JavaScript may touch its ring while the lane is open
    close(a, false);
    expect(ring.byteLength).toBe(0);
    expect(view.length).toBe(0);
    close(b, false);
    await until(() => A.lanes() === 0, 5000, 'both lanes to be freed');
    await until(() => !maps().includes(range), 2000, "the ring's mapping to go, with no collection");
    expect(view[RX.bytes]).toBeUndefined(); // a detached view reads nothing
  });

  it('a graceful close whose peer closes too frees the lane at once', async () => {
    await until(() => A.lanes() === 0, 5000, 'the lanes of earlier tests to be freed');
    const [a, b] = await pair('tcp');
    expect(A.lanes()).toBe(2);
    close(a, true);
    close(b, true);
    await until(() => A.lanes() === 0, 1000, 'both lanes to be freed');
  });

  it('a graceful close with megabytes unread from a peer that has gone: the lane is freed at once, not after the linger time', async () => {
    await until(() => A.lanes() === 0, 5000, 'the lanes of earlier tests to be freed');
    const [a, b] = await pair('tcp', { threads: [0, 1] });
    const m = new Mem(16 * MiB);
    write(b, 1, m.addr, m.size); // a reads nothing: this fills a's socket buffer, then blocks
    await until(() => true, 10, 'a poll');
    await sleep(200);
    close(b, false);
    await until(() => A.lanes() === 1, 1000, 'the peer\'s lane to be freed');
    const t0 = Date.now();
    expect(close(a, true)).toEqual({ partial: false, hard: false });
    await until(() => A.lanes() === 0, 5000, 'the lane to be freed');
    expect(Date.now() - t0, 'ms until the lane was freed (the linger time is 2000)').toBeLessThan(1000);
  });

  it('20 closes racing busy I/O threads: each returns, no completion after it, no memory touched after it, the engine works on', async () => {
    const P = 20;
    const pairs: [End, End][] = [];
    for (let k = 0; k < P; k++) pairs.push(await pair(k % 2 ? 'unix' : 'tcp', { threads: [k % 2, (k + 1) % 2] }));
    const CH = 256 * KiB;
    const bufs = pairs.map(() => ({ w: [new Mem(4 * CH), new Mem(4 * CH)], r: [new Mem(4 * CH), new Mem(4 * CH)] }));
    // Both ways, 4 chunks in flight each; every completion posts the next.
    const next = pairs.map(() => [0, 0, 0, 0]);
    const pump = () => {
      pairs.forEach(([a, b], k) => {
        [a, b].forEach((e, side) => {
          if (e.closed) return;
          const n = next[k];
          while (n[side * 2] - e.sink.ops.filter((c) => c.op < 1e6).length < 4) {
            const i = n[side * 2]++;
            write(e, i, bufs[k].w[side].addr + (i % 4) * CH, CH);
          }
          while (n[side * 2 + 1] - e.sink.ops.filter((c) => c.op >= 1e6).length < 4) {
            const i = n[side * 2 + 1]++;
            read(e, 1e6 + i, bufs[k].r[side].addr + (i % 4) * CH, CH);
          }
        });
      });
      return false;
    };
    // Until every end has moved a few chunks each way (the threads are busy with all of them).
    await until(() => (pump(), pairs.every(([a, b]) => a.sink.ops.length >= 8 && b.sink.ops.length >= 8)), 20_000, 'traffic on every pair');
    // Close one end of each pair, alternating hard and graceful, in one go while the threads move bytes.
    const seen = pairs.map(([a]) => a.sink.ops.length);
    const slow: number[] = [];
    pairs.forEach(([a], k) => {
      const t = performance.now();
      close(a, k % 2 === 0);
      slow.push(performance.now() - t);
    });
    bufs.forEach((x) => x.r[0].bytes.fill(0x5a));
    // A completion made just before a close may be published just after it: take those, then
    // no more may come while the other ends go on (they see the end), then close too.
    await sleep(50);
    port.poll();
    pairs.forEach(([a], k) => expect(a.sink.ops.length - seen[k], `pair ${k}: completions published after its close`).toBeLessThanOrEqual(8));
    const after = pairs.map(([a]) => a.sink.ops.length);
    const t1 = Date.now();
    while (Date.now() - t1 < 200) await until(pump, 10, 'traffic').catch(() => {});
    pairs.forEach(([a], k) => expect(a.sink.ops.length, `pair ${k}`).toBe(after[k]));
    bufs.forEach((x, k) => expect(allBytes(x.r[0].bytes, 0x5a), `memory of pair ${k}`).toBe(true));
    pairs.forEach(([, b]) => close(b, false));
    expect(Math.max(...slow)).toBeLessThan(1000);
    // The engine works on.
    const [x, y] = await pair('tcp');
    const m = fill(new Mem(1 * MiB).bytes, 7);
    const src = new Mem(1 * MiB);
    src.bytes.set(m);
    const dst = new Mem(1 * MiB);
    write(x, 1, src.addr, src.size);
    read(y, 1, dst.addr, dst.size);
    await until(() => !!x.sink.of(1) && !!y.sink.of(1), 5000, 'a transfer after the closes');
    expect(firstDiff(dst.bytes, src.bytes)).toBe(-1);
  });

  it('ioClose of a lane already closed throws (no double retire); so do ioClose and ioCancel of unknown lanes', async () => {
    // A closed lane's id is refused from the thread's own list of closed ids, before anything
    // reads the lane, which its I/O thread may be freeing at that moment.
    const [a] = await pair('unix');
    close(a, false);
    expect(() => A.ioClose(a.lane, false)).toThrow(new RegExp(`ioClose: lane ${a.lane} was closed already`));
    expect(() => A.ioCancel(a.lane, 0, 1)).toThrow(new RegExp(`ioCancel: lane ${a.lane} was closed already`));
    await turn();
    expect(() => A.ioClose(a.lane, false)).toThrow(/was closed already/); // freed by now, most likely
    expect(() => A.ioClose(0, false)).toThrow(/no such lane|was closed already/); // lane 0 may be an earlier test's
    expect(() => A.ioClose(123_456, true)).toThrow(/no such lane/);
    const [c] = await pair('unix');
    expect(close(c, true)).toEqual({ partial: false, hard: false });
    expect(() => A.ioClose(c.lane, false)).toThrow(/was closed already/);
    expect(() => A.ioCancel(c.lane, 0, 1)).toThrow(/was closed already/);
    // The engine is still sound: a lane adopted now works.
    const [x, y] = await pair('unix');
    const m = new Mem(8);
    write(x, 1, m.addr, 8);
    read(y, 1, m.addr, 8);
    await until(() => !!x.sink.of(1) && !!y.sink.of(1), 5000, 'a transfer');
  });
});

describe.skipIf(!!missing)('engine: ioCancel', () => {
  it('queued reads into the range drop their bytes and still complete; the stream stays whole (the next read gets the right bytes)', async () => {
    const [a, b] = await pair('unix');
    const x = new Mem(1000);
    const y = new Mem(1000);
    const z = new Mem(3000);
    x.bytes.fill(0x5a);
    read(b, 1, x.addr, 1000);
    read(b, 2, y.addr + 500, 500);
    read(b, 3, x.addr + 500, 500);
    read(b, 4, z.addr, 3000);
    await until(() => true, 10, 'a poll');
    expect(A.ioCancel(b.lane, x.addr, x.size)).toEqual({ reads: 2, writes: 0 });
    const src = fill(new Mem(5000).bytes, 3);
    const s = new Mem(5000);
    s.bytes.set(src);
    write(a, 1, s.addr, 5000);
    await until(() => b.sink.ops.length === 4, 5000, 'the four reads');
    expect(b.sink.ops.map((c) => [c.op, c.status, c.value])).toEqual([[1, 0, 1000], [2, 0, 500], [3, 0, 500], [4, 0, 3000]]);
    expect(allBytes(x.bytes, 0x5a)).toBe(true);
    expect(firstDiff(y.bytes.subarray(500), s.bytes.subarray(1000, 1500))).toBe(-1);
    expect(firstDiff(z.bytes, s.bytes.subarray(2000, 5000))).toBe(-1);
  });

  it('a read half done: the bytes that came stay, the rest are dropped', async () => {
    const [a, b] = await pair('tcp');
    const x = new Mem(2000);
    x.bytes.fill(0x5a);
    const s = new Mem(3000);
    fill(s.bytes, 8);
    read(b, 1, x.addr, 2000);
    write(a, 1, s.addr, 500);
    await until(() => x.bytes[499] !== 0x5a, 5000, 'the first 500 bytes');
    expect(A.ioCancel(b.lane, x.addr + 1000, 1)).toEqual({ reads: 1, writes: 0 });
    write(a, 2, s.addr + 500, 2500);
    const y = new Mem(1000);
    read(b, 2, y.addr, 1000);
    await until(() => !!b.sink.of(1) && !!b.sink.of(2), 5000, 'both reads');
    expect(b.sink.of(1)).toMatchObject({ status: 0, value: 2000 });
    expect(firstDiff(x.bytes.subarray(0, 500), s.bytes.subarray(0, 500))).toBe(-1);
    expect(allBytes(x.bytes.subarray(500), 0x5a)).toBe(true);
    expect(firstDiff(y.bytes, s.bytes.subarray(2000, 3000))).toBe(-1);
  });

  it('writes from the range are only counted: they go on, every byte arrives', async () => {
    const [a, b] = await pair('tcp', { threads: [0, 1] });
    const w = new Mem(32 * MiB);
    fill(w.bytes, 4);
    write(a, 1, w.addr, w.size);
    write(a, 2, w.addr, 100);
    await until(() => true, 10, 'a poll');
    await sleep(50);
    expect(A.ioCancel(a.lane, w.addr + 16 * MiB, 1)).toEqual({ reads: 0, writes: 1 });
    expect(A.ioCancel(a.lane, w.addr, w.size)).toEqual({ reads: 0, writes: 2 });
    expect(A.ioCancel(a.lane, w.addr + w.size, 100)).toEqual({ reads: 0, writes: 0 });
    const d = new Mem(32 * MiB + 100);
    read(b, 1, d.addr, d.size);
    await until(() => !!a.sink.of(2) && !!b.sink.of(1), 10_000, 'the writes');
    expect(a.sink.ops.map((c) => c.status)).toEqual([0, 0]);
    expect(firstDiff(d.bytes.subarray(0, 32 * MiB), w.bytes)).toBe(-1);
  });

  it('a range no queued op touches: nothing is counted', async () => {
    const [, b] = await pair('unix');
    const x = new Mem(100);
    read(b, 1, x.addr, 100);
    await until(() => true, 10, 'a poll');
    expect(A.ioCancel(b.lane, x.addr + 100, 100)).toEqual({ reads: 0, writes: 0 });
    expect(A.ioCancel(b.lane, x.addr - 100, 100)).toEqual({ reads: 0, writes: 0 });
    expect(A.ioCancel(b.lane, x.addr + 99, 1)).toEqual({ reads: 1, writes: 0 });
  });
});

/** Raw access to the rings of protocol thread `index`: every field of a submission written by hand. */
class RawPort {
  private readonly sub: { hdr: Uint32Array; u8: Uint8Array; dv: DataView; mask: number }[];
  private readonly cq: { hdr: Uint32Array; dv: DataView; mask: number; head: number }[];
  private readonly sleeping: Int32Array;
  constructor(private readonly b: EngineAddon) {
    const p = b.ioPort();
    this.sub = p.sub.map((buf) => {
      const hdr = new Uint32Array(buf, 0, RING.bytes / 4);
      return { hdr, u8: new Uint8Array(buf), dv: new DataView(buf), mask: hdr[RING.mask / 4] };
    });
    this.cq = p.cq.map((buf) => {
      const hdr = new Uint32Array(buf, 0, RING.bytes / 4);
      return { hdr, dv: new DataView(buf), mask: hdr[RING.mask / 4], head: Atomics.load(hdr, RING.head / 4) };
    });
    this.sleeping = p.sleeping;
  }

  put(t: number, s: { lane: number; link?: number; op: number; kind: number; inlineLen?: number; addr: number; len: number; flags?: number; inl?: Uint8Array }) {
    const r = this.sub[t];
    const tail = Atomics.load(r.hdr, RING.tail / 4);
    const at = RING.bytes + (tail & r.mask) * SUB.bytes;
    r.u8.fill(0, at, at + SUB.bytes);
    r.dv.setUint32(at + SUB.lane, s.lane >>> 0, true);
    r.dv.setUint32(at + SUB.link, s.link ?? 77, true);
    r.dv.setUint32(at + SUB.op, s.op, true);
    r.dv.setUint16(at + SUB.kind, s.kind, true);
    r.dv.setUint16(at + SUB.inlineLen, s.inlineLen ?? 0, true);
    r.dv.setFloat64(at + SUB.addr, s.addr, true);
    r.dv.setFloat64(at + SUB.len, s.len, true);
    r.dv.setUint32(at + SUB.flags, s.flags ?? 0, true);
    if (s.inl) r.u8.set(s.inl, at + SUB.inl);
    Atomics.store(r.hdr, RING.tail / 4, tail + 1);
    if (Atomics.load(this.sleeping, t) === 1) this.b.ioWake(t);
  }

  poll(): { link: number; op: number; status: number; value: number; io: number }[] {
    const out: { link: number; op: number; status: number; value: number; io: number }[] = [];
    this.cq.forEach((r, io) => {
      const tail = Atomics.load(r.hdr, RING.tail / 4);
      for (; r.head !== tail; r.head = (r.head + 1) >>> 0) {
        const at = RING.bytes + (r.head & r.mask) * CQE.bytes;
        out.push({ link: r.dv.getUint32(at + CQE.link, true), op: r.dv.getUint32(at + CQE.op, true), status: r.dv.getInt32(at + CQE.status, true), value: r.dv.getFloat64(at + CQE.value, true), io });
      }
      Atomics.store(r.hdr, RING.head / 4, tail);
    });
    return out;
  }
}

describe.skipIf(!!missing)('engine: submissions the engine refuses (raw ring writes)', () => {
  const RAW = 5;
  let raw: RawPort;
  const got: { link: number; op: number; status: number; value: number; io: number }[] = [];
  const wait = (n: number, what: string) => until(() => (got.push(...raw.poll()), got.length >= n), 5000, what);

  beforeAll(() => {
    if (!missing) raw = new RawPort(bindingFor(RAW));
  });

  // Only RawPort reads index RAW's rings (no Port of that index is made: it would consume them too).
  it('bad lanes: -EBADF (never adopted, out of range, another protocol thread\'s, another I/O thread\'s ring, closed)', async () => {
    got.length = 0;
    await until(() => A.lanes() === 0, 5000, 'the lanes of earlier tests to be freed');
    const b = bindingFor(RAW);
    const [x, y] = A.socketPair();
    const mine = b.ioAdopt(x, 0, 1, 0);
    const [other] = await pair('unix', { threads: [0, 0] });
    const n0 = A.lanes();
    const [gx, gy] = A.socketPair();
    const gone = b.ioAdopt(gx, 0, 2, 0).lane;
    [gx, gy].forEach((fd) => fs.closeSync(fd));
    b.ioClose(gone, false);
    // Until its I/O thread freed it (a submission to a lane closed but not yet freed is dropped unanswered).
    await until(() => A.lanes() === n0, 5000, 'the closed lane to be freed');
    const m = new Mem(8);
    const bad = [0, 0xffffffff, 1 << 20, other.lane, gone];
    bad.forEach((lane, i) => raw.put(0, { lane, link: 100 + i, op: i, kind: SubKind.WRITE, addr: m.addr, len: 8 }));
    raw.put(1, { lane: mine.lane, link: 200, op: 9, kind: SubKind.READ, addr: m.addr, len: 8 }); // its thread is 0
    await wait(bad.length + 1, 'the refusals');
    // Two I/O threads answer on two rings: compare in link order.
    expect(got.map((c) => [c.link, c.op, c.status, c.value]).sort((x, y) => x[0] - y[0])).toEqual([...bad.map((_, i) => [100 + i, i, EBADF, 0]), [200, 9, EBADF, 0]]);
    expect(got.find((c) => c.link === 200)!.io).toBe(1);
    b.ioClose(mine.lane, false);
    fs.closeSync(x);
    fs.closeSync(y);
  });

  it('bad numbers: -EINVAL (kind, addresses and lengths that are not integers in [0, 2^53), a null address, inline bytes past 32, inline bytes or reads where they do not belong, RX_RESUME of a lane without a ring); the lane works on', async () => {
    got.length = 0;
    const b = bindingFor(RAW);
    const [x, y] = A.socketPair();
    const lane = b.ioAdopt(x, 0, 1, 0).lane;
    const [cx, cy] = A.socketPair();
    const ctl = b.ioAdopt(cx, 0, 2, 4096).lane;
    const m = new Mem(64);
    const W = SubKind.WRITE;
    const R = SubKind.READ;
    const cases: [string, Parameters<RawPort['put']>[1]][] = [
      ['kind 0', { lane, op: 0, kind: 0, addr: m.addr, len: 8 }],
      ['kind 9', { lane, op: 0, kind: 9, addr: m.addr, len: 8 }],
      ['kind 5 (no CLOSE submission)', { lane, op: 0, kind: 5, addr: m.addr, len: 8 }],
      ['addr NaN', { lane, op: 0, kind: W, addr: NaN, len: 8 }],
      ['addr -1', { lane, op: 0, kind: W, addr: -1, len: 8 }],
      ['addr 1.5', { lane, op: 0, kind: R, addr: 1.5, len: 8 }],
      ['addr 2^53', { lane, op: 0, kind: R, addr: 2 ** 53, len: 8 }],
      ['addr Infinity', { lane, op: 0, kind: R, addr: Infinity, len: 8 }],
      ['len NaN', { lane, op: 0, kind: W, addr: m.addr, len: NaN }],
      ['len -8', { lane, op: 0, kind: W, addr: m.addr, len: -8 }],
      ['len 0.5', { lane, op: 0, kind: R, addr: m.addr, len: 0.5 }],
      ['len 2^60', { lane, op: 0, kind: R, addr: m.addr, len: 2 ** 60 }],
      ['a null write', { lane, op: 0, kind: W, addr: 0, len: 8 }],
      ['a null read', { lane, op: 0, kind: R, addr: 0, len: 8 }],
      ['33 inline bytes', { lane, op: 0, kind: W, inlineLen: 33, addr: m.addr, len: 8 }],
      ['65535 inline bytes', { lane, op: 0, kind: W, inlineLen: 65535, addr: 0, len: 0 }],
      ['a read with inline bytes', { lane, op: 0, kind: R, inlineLen: 8, addr: m.addr, len: 8 }],
      ['a read of a control lane', { lane: ctl, op: 0, kind: R, addr: m.addr, len: 8 }],
      ['a discard of a control lane', { lane: ctl, op: 0, kind: SubKind.DISCARD, addr: 0, len: 8 }],
      ['RX_RESUME of a data lane', { lane, op: 0, kind: SubKind.RX_RESUME, addr: 0, len: 0 }],
    ];
    cases.forEach(([, s], i) => raw.put(0, { ...s, op: i }));
    await wait(cases.length, 'the refusals');
    expect(got.map((c) => `${cases[c.op][0]}: ${c.status}`)).toEqual(cases.map(([what]) => `${what}: ${EINVAL}`));
    got.length = 0;
    // Refused with NOCQE: no completion at all. Then the lane still carries bytes, 32 inline ones too.
    raw.put(0, { lane, op: 50, kind: 9, addr: 0, len: 0, flags: SUB_F_NOCQE });
    raw.put(0, { lane: 0, op: 51, kind: W, addr: 0, len: 0, flags: SUB_F_NOCQE });
    const inl = fill(new Uint8Array(32), 5);
    fill(m.bytes.subarray(0, 8), 6);
    raw.put(0, { lane, op: 52, kind: W, inlineLen: 32, inl, addr: m.addr, len: 8 });
    raw.put(0, { lane: ctl, op: 53, kind: W, inlineLen: 32, inl, addr: 0, len: 0 });
    await wait(2, 'the writes');
    await sleep(20);
    got.push(...raw.poll());
    expect(got.map((c) => [c.op, c.status, c.value])).toEqual([[52, 0, 40], [53, 0, 32]]);
    const back = Buffer.alloc(40);
    expect(fs.readSync(y, back)).toBe(40);
    expect(firstDiff(back.subarray(0, 32), inl)).toBe(-1);
    expect(firstDiff(back.subarray(32), m.bytes.subarray(0, 8))).toBe(-1);
    b.ioClose(lane, false);
    b.ioClose(ctl, false);
    [x, y, cx, cy].forEach((fd) => fs.closeSync(fd));
  });
});

describe.skipIf(!!missing)('engine: two protocol threads in one process (setThread)', () => {
  it('each index has its own port: its lanes complete on its rings only, and the other index cannot close or cancel them', async () => {
    const p1 = portOf(1);
    expect(p1.index).toBe(1);
    expect(port.index).toBe(0);
    const [a1, b1] = await pair('unix', { index: 1, threads: [0, 1] });
    const [a0, b0] = await pair('unix', { index: 0, threads: [1, 0] });
    const src = fill(new Mem(1 * MiB).bytes, 2);
    const s = new Mem(1 * MiB);
    s.bytes.set(src);
    const d = [new Mem(1 * MiB), new Mem(1 * MiB)];
    const before = [port.completions, p1.completions];
    write(a1, 1, s.addr, s.size);
    read(b1, 1, d[1].addr, d[1].size);
    await until(() => !!b1.sink.of(1) && !!a1.sink.of(1), 5000, 'the transfer of index 1', [p1]);
    expect(p1.completions - before[1]).toBe(2);
    write(a0, 1, s.addr, s.size);
    read(b0, 1, d[0].addr, d[0].size);
    await until(() => !!b0.sink.of(1) && !!a0.sink.of(1), 5000, 'the transfer of index 0', [port]);
    expect(port.completions - before[0]).toBe(2);
    await until(() => true, 10, 'a poll', [port, p1]);
    expect([port.completions - before[0], p1.completions - before[1]]).toEqual([2, 2]);
    expect(firstDiff(d[0].bytes, s.bytes)).toBe(-1);
    expect(firstDiff(d[1].bytes, s.bytes)).toBe(-1);
    // Index 0 does not own index 1's lanes, and the other way round.
    expect(() => A.ioClose(a1.lane, false)).toThrow(/no such lane of this thread/);
    expect(() => A.ioCancel(b1.lane, 0, 1)).toThrow(/no such lane of this thread/);
    expect(() => bindingFor(1).ioClose(a0.lane, false)).toThrow(/no such lane of this thread/);
    // A submission naming another index's lane: -EBADF on the submitter's ring.
    read(a0, 7, d[0].addr, 10);
    port.submit(a1.thread, a1.lane, a0.link, 8, SubKind.READ, 0, ...split(d[0].addr), 10);
    await until(() => !!a0.sink.of(8), 5000, 'the refusal', [port]);
    expect(a0.sink.of(8)!.status).toBe(EBADF);
  });
});

describe.skipIf(!!missing)('engine: copyAscending (eager copies into NCCL buffers)', () => {
  it('copies like TypedArray.set at every alignment and length up to 300 bytes, and 64 KiB + 7; nothing outside the range', () => {
    const src = new Uint8Array(70 * KiB);
    fill(src, 11);
    for (const len of [...Array.from({ length: 301 }, (_v, i) => i), 64 * KiB + 7])
      for (let so = 0; so < 16; so += len > 300 ? 5 : 1)
        for (let dof = 0; dof < 16; dof += len > 300 ? 3 : 1) {
          const dst = new Uint8Array(len + 64).fill(0xa5);
          const want = dst.slice();
          want.set(src.subarray(so, so + len), dof + 16);
          A.copyAscending(dst, dof + 16, src, so, len);
          if (firstDiff(dst, want) !== -1) throw new Error(`len ${len}, src offset ${so}, dst offset ${dof}: byte ${firstDiff(dst, want)} differs`);
        }
    // A view's own offset counts (Uint8Array over part of a buffer).
    const buf = new Uint8Array(256).fill(0);
    A.copyAscending(buf.subarray(100), 3, src, 0, 20);
    expect(Array.from(buf.subarray(103, 123))).toEqual(Array.from(src.subarray(0, 20)));
    expect(buf[102]).toBe(0);
    expect(buf[123]).toBe(0);
  });

  it('refuses a range out of bounds with a RangeError, copying nothing', () => {
    const src = new Uint8Array(100).fill(7);
    const dst = new Uint8Array(100);
    expect(() => A.copyAscending(dst, 50, src, 0, 51)).toThrow(RangeError);
    expect(() => A.copyAscending(dst, 0, src, 60, 41)).toThrow(RangeError);
    expect(() => A.copyAscending(dst, -1, src, 0, 10)).toThrow(RangeError);
    expect(dst.every((b) => b === 0)).toBe(true);
    expect(() => A.copyAscending(dst, 0, [1, 2] as unknown as Uint8Array, 0, 1)).toThrow(TypeError);
  });
});

describe.skipIf(!!missing)('engine: figures (printed, never asserted)', () => {
  it('throughput, one and four lane pairs, 16 MiB ops; small-op rate, 64 B writes and reads', async () => {
    const lines: string[] = [];
    for (const lanes of [1, 4]) {
      const pairs: [End, End][] = [];
      for (let k = 0; k < lanes; k++) pairs.push(await pair('tcp', { threads: [k % 2, (k + 1) % 2] }));
      const OP = 16 * MiB;
      const TOTAL = 256 * MiB;
      const src = new Mem(OP);
      const dst = pairs.map(() => new Mem(OP));
      const per = TOTAL / lanes / OP;
      const t0 = performance.now();
      pairs.forEach(([a, b], k) => {
        for (let i = 0; i < per; i++) {
          write(a, i, src.addr, OP);
          read(b, i, dst[k].addr, OP);
        }
      });
      await until(() => pairs.every(([a, b]) => a.sink.ops.length === per && b.sink.ops.length === per), 60_000, 'the bulk transfer');
      const s = (performance.now() - t0) / 1000;
      lines.push(`engine: throughput, ${lanes} TCP lane pair(s) on ${IO_THREADS} I/O threads, ${TOTAL / MiB} MiB in 16 MiB ops: ${(TOTAL / s / 1e9).toFixed(2)} GB/s`);
    }
    const [a, b] = await pair('tcp', { threads: [0, 1] });
    const N = 100_000;
    const WAVE = 1000;
    const src = new Mem(64 * WAVE);
    const dst = new Mem(64 * WAVE);
    const t0 = performance.now();
    for (let w = 0; w < N / WAVE; w++) {
      for (let i = 0; i < WAVE; i++) {
        write(a, w * WAVE + i, src.addr + 64 * i, 64);
        read(b, w * WAVE + i, dst.addr + 64 * i, 64);
      }
      await until(() => b.sink.ops.length === (w + 1) * WAVE && a.sink.ops.length === (w + 1) * WAVE, 10_000, `wave ${w}`);
    }
    const s = (performance.now() - t0) / 1000;
    lines.push(`engine: small ops, one TCP lane pair, 64 B writes + reads in waves of ${WAVE}: ${((2 * N) / s / 1e6).toFixed(2)} M ops/s (${(N / s / 1e6).toFixed(2)} M messages/s)`);
    const cpu = Array.from(A.ioStats()).map((us) => `${(us / 1e6).toFixed(2)} s`);
    lines.push(`engine: I/O threads' CPU so far: ${cpu.join(', ')}`);
    for (const l of lines) console.log(l);
  });
});

describe.skipIf(!!missing)('engine: NativeLink over the engine', () => {
  /** A link of one control lane and `lanes` data lanes each way, over socketpairs. */
  function linkPair(lanes: number) {
    const fds = Array.from({ length: lanes + 1 }, () => A.socketPair());
    const policy = { ...DEFAULT_POLICIES, eagerMax: 0, minStripe: 4096, lanes };
    const b = bindingFor(0);
    const tx = new NativeLink(port, b, fds.map((f) => f[0]), policy, 'tx', 1 << 14);
    const rx = new NativeLink(port, b, fds.map((f) => f[1]), policy, 'rx', 1 << 16);
    fds.flat().forEach((fd) => fs.closeSync(fd));
    linksToClose.push(tx, rx);
    const txOps: { op: number; status: number }[] = [];
    const rxOps: { op: number; status: number }[] = [];
    const rxEnd: number[] = [];
    tx.attach({ onOp: (op, status) => txOps.push({ op, status }), onRx: () => {} });
    rx.attach({ onOp: (op, status) => rxOps.push({ op, status }), onRx: (status) => void (status !== 0 && rxEnd.push(status)) });
    return { tx, rx, txOps, rxOps, rxEnd };
  }

  it('adopts the control lane with a receive ring and the data lanes without; TCP_NODELAY does not apply to Unix sockets', () => {
    const { tx } = linkPair(3);
    const lanes = (tx as unknown as { ctl: { lane: number }; data: { lane: number }[] });
    expect(tx.lanes).toBe(3);
    expect(tx.rx.mask + 1).toBe(1 << 14);
    for (const l of [lanes.ctl, ...lanes.data]) expect(A.noDelay(l.lane)).toBe(-1);
  });

  it('close(true) with more submissions queued than the ring holds: every frame queued before it still goes, then the end', async () => {
    const { tx, rx, rxEnd } = linkPair(1);
    const N = 5000; // more than the 2048 records of a submission ring, in one turn
    for (let i = 0; i < N; i++) tx.frame(FrameType.HEARTBEAT, 0, i, -1, 0, 0, 0, 0, -1);
    tx.frame(FrameType.CLOSE, 0, N, -1, 0, 0, 0, 0, -1);
    expect(tx.close(true)).toBe(true);
    let parsed = 0;
    const f: Frame = { type: FrameType.MSG, flags: 0, tag: 0, seq: 0, size: 0 };
    const tags: number[] = [];
    await until(() => {
      while (((rx.rx.written() - parsed) >>> 0) >= FRAME_BYTES) {
        expect(readFrame(rx.rx, parsed, f)).toBeUndefined();
        tags.push(f.tag);
        parsed = (parsed + FRAME_BYTES) >>> 0;
      }
      rx.rx.release(parsed);
      return rxEnd.length > 0;
    }, 10_000, 'the frames, then the end');
    expect(tags.length).toBe(N + 1);
    expect(tags.every((t, i) => t === i)).toBe(true);
    expect(rxEnd).toEqual([STATUS_EOF]);
  });

  it('cancel with more reads queued than the ring holds: every one of them is cancelled, none lands in the range afterwards', async () => {
    const { tx, rx, rxOps } = linkPair(1);
    const N = 5000;
    const x = new Mem(N * 16);
    x.bytes.fill(0x5a);
    for (let i = 0; i < N; i++) rx.read(0, ...split(x.addr + 16 * i), 16, i);
    expect(rx.cancel(x.addr, x.size)).toEqual({ reads: N, writes: 0 });
    const src = new Mem(N * 16);
    fill(src.bytes, 1);
    tx.write(0, ...split(src.addr), src.size, 1);
    await until(() => rxOps.length === N, 10_000, 'the reads to complete');
    expect(rxOps.every((c, i) => c.op === i && c.status === 0)).toBe(true);
    expect(allBytes(x.bytes, 0x5a)).toBe(true);
  });

  it('close(false) with more reads queued than the ring holds: nothing lands afterwards, even in a lane adopted later', async () => {
    const { tx, rx, rxOps } = linkPair(1);
    const N = 5000;
    const x = new Mem(N * 16);
    for (let i = 0; i < N; i++) rx.read(0, ...split(x.addr + 16 * i), 16, i);
    rx.close(false);
    x.bytes.fill(0x5a);
    // New lanes may take the closed lanes' ids: stale reads must not reach them.
    const again = linkPair(1);
    const src = new Mem(N * 16);
    fill(src.bytes, 2);
    again.tx.write(0, ...split(src.addr), src.size, 1);
    tx.write(0, ...split(src.addr), src.size, 1);
    const y = new Mem(N * 16);
    again.rx.read(0, ...split(y.addr), y.size, 7);
    await until(() => again.rxOps.length === 1, 5000, 'the new link\'s read');
    await sleep(50);
    await until(() => true, 10, 'a poll');
    expect(again.rxOps).toEqual([{ op: 7, status: 0 }]);
    expect(firstDiff(y.bytes, src.bytes)).toBe(-1);
    expect(rxOps).toEqual([]);
    expect(allBytes(x.bytes, 0x5a)).toBe(true);
  });
});

describe.skipIf(!!missing)('engine: I/O threads stuck inside a provider call (ioStalls)', () => {
  it('reports a thread inside one call past the threshold once, never an idle one, and again at its next stall', async () => {
    expect(() => A.ioStalls(-1)).toThrow(/ioStalls\(thresholdMs\) needs a number >= 0/);
    await sleep(300);
    expect(A.ioStalls(0)).toEqual([]); // both threads idle (asleep outside any call)
    const seen: { thread: number; lane: number; ms: number; call: string }[] = [];
    const stallOnce = async () => {
      A.ioTestStall(1, 900);
      const start = Date.now();
      const got: typeof seen = [];
      while (Date.now() - start < 850) {
        got.push(...A.ioStalls(250));
        await sleep(20);
      }
      return got;
    };
    seen.push(...(await stallOnce()));
    expect(seen).toHaveLength(1);
    expect(seen[0]).toMatchObject({ thread: 1, lane: -1, call: 'a test stall' });
    expect(seen[0].ms).toBeGreaterThanOrEqual(250);
    expect(seen[0].ms).toBeLessThan(900);
    await until(() => A.ioStalls(0).length === 0 && A.ioStalls(0).length === 0, 3000, 'the stall to end');
    const again = await stallOnce();
    expect(again.map((s) => s.thread)).toEqual([1]);
  });
});

describe.skipIf(!!missing)('engine: waits on an I/O thread stuck inside a provider call', () => {
  it('ioClose gives up on submissions a stuck thread cannot take after about a second (before: 10 s), then at once', async () => {
    const [x] = await pair('unix', { threads: [1, 0] });
    const [y] = await pair('unix', { threads: [1, 0] });
    const m = new Mem(64);
    const stallMs = 5000;
    A.ioTestStall(1, stallMs);
    const stalled = Date.now();
    await sleep(200); // thread 1 took the admin and sleeps inside the pretended call
    write(x, 1, m.addr, 64); // a submission thread 1 cannot take
    let t0 = Date.now();
    close(x, false);
    const first = Date.now() - t0;
    // The stall's time (half the link timeout, 1 s at least; the tests' link timeout is 2 s),
    // counted from the start of the wait.
    expect(first).toBeGreaterThanOrEqual(900);
    expect(first).toBeLessThan(3000);
    // Found stuck once: the next wait on it, still inside the same call, gives up at once.
    write(y, 2, m.addr, 64);
    t0 = Date.now();
    close(y, false);
    expect(Date.now() - t0).toBeLessThan(500);
    expect(Date.now() - stalled).toBeLessThan(stallMs); // all of it inside the stall
    await sleep(Math.max(0, stalled + stallMs + 300 - Date.now())); // the thread is back
  }, 15_000);
});

describe.skipIf(!!missing)('engine: how late I/O threads wake (ioWakes)', () => {
  it('counts each wake-up a sleeping thread was asked for, with its delay in a power-of-two bucket', async () => {
    const before = A.ioWakes();
    expect(before).toHaveLength(IO_THREADS);
    for (const w of before) expect(w.buckets).toHaveLength(16);
    const sleeping = A.ioPort().sleeping;
    for (let k = 0; k < 3; k++) {
      // No busy-poll window here (ioStart with 0): an idle thread sleeps within a pass.
      await until(() => Atomics.load(sleeping, 1) === 1, 2000, 'I/O thread 1 to sleep', []);
      A.ioWake(1);
      await until(() => A.ioWakes()[1].count === before[1].count + k + 1, 2000, `wake-up ${k + 1} to be counted`, []);
    }
    const w = A.ioWakes()[1];
    const sum = (b: number[]) => b.reduce((a, x) => a + x, 0);
    expect(sum(w.buckets) - sum(before[1].buckets)).toBe(3);
    expect(w.maxUs).toBeGreaterThan(0);
    expect(w.sumUs - before[1].sumUs).toBeGreaterThan(0);
    expect(w.sumUs - before[1].sumUs).toBeLessThanOrEqual(3 * w.maxUs + 1e-6);
  });
});

describe.skipIf(!!missing)('engine: the I/O threads\' busy-poll window set at run time (ioSetSpin)', () => {
  it('keeps a woken thread polling for the window, and 0 lets it sleep at once', async () => {
    expect(() => A.ioSetSpin(-1)).toThrow(/ioSetSpin\(us\) needs a number from 0 to 1000000/);
    const sleeping = A.ioPort().sleeping;
    try {
      A.ioSetSpin(1_000_000); // 1 s
      await until(() => Atomics.load(sleeping, 1) === 1, 2000, 'I/O thread 1 to sleep', []);
      A.ioWake(1); // work: the window starts
      const t0 = Date.now();
      let slept = false;
      while (Date.now() - t0 < 300) {
        if (Atomics.load(sleeping, 1) === 1) slept = true;
        await sleep(5);
      }
      expect(slept).toBe(false); // polled through the first 300 ms of its window
      A.ioSetSpin(0);
      const t1 = Date.now();
      await until(() => Atomics.load(sleeping, 1) === 1, 2000, 'I/O thread 1 to sleep without a window', []);
      expect(Date.now() - t1).toBeLessThan(500); // well before the 1 s window would have ended
    } finally {
      A.ioSetSpin(0);
    }
  });
});
