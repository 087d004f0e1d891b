// Transfers: sizes at every boundary (0, 1, eager limit with its header, large), multi-chunk
// writes of 28 KiB and more over several rails with small stripes (with and without
// FI_RX_CQ_DATA), an exhausted eager pool, several comms on one endpoint, and sends that do not
// fit their receive. The receive reports the bytes that came, and nothing lands past a buffer.
import { describe, expect, it } from 'vitest';
import type { RecvComm, Region, SendComm } from '../../plugin/transports/ofi/fabric';
import { World, buf, expectBytes, pattern } from './harness';

const KiB = 1024;

function world(seed: number, opts: ConstructorParameters<typeof World>[0] = {}) {
  const w = new World({ seed, ...opts });
  const { send, recv } = w.connect();
  const src = w.a.region(4 << 20);
  src.bytes!.set(pattern(seed, 4 << 20));
  return { w, send, recv, src };
}

/** One message of size into a receive of room bytes; eager: the send goes first. */
function transfer(w: World, send: SendComm, recv: RecvComm, src: Region, dst: Region, size: number, room: number, slot: number, sendFirst: boolean) {
  if (sendFirst) send.isend(slot, buf(size ? src : null, 0, size, 3));
  recv.irecv(slot, [buf(room ? dst : null, 0, room, 3)]);
  if (!sendFirst) send.isend(slot, buf(size ? src : null, 0, size, 3));
  w.run(() => w.a.has(slot) && w.b.has(slot), `transfer of ${size} bytes`);
  expect(w.a.take(slot)).toEqual({ code: 0, sizes: [size] });
  expect(w.b.take(slot)).toEqual({ code: 0, sizes: [size] });
  const mem = w.fabric.bytesOf(dst);
  expectBytes(mem, 0, src.bytes!.subarray(0, size));
  expect(mem[size], 'the byte after the message is untouched').toBe(0);
  mem.fill(0);
}

describe('sizes', () => {
  const cases = [0, 1, 8192 - 8, 8192 - 7, 8192, 8193, 4 << 20];
  for (const kind of ['host', 'cuda'] as const)
    for (const sendFirst of [false, true])
      it.each(cases)(`%i bytes, ${kind} memory, ${sendFirst ? 'send' : 'receive'} first`, (size) => {
        for (const seed of [1, 2, 3]) {
          const { w, send, recv, src } = world(seed);
          const dst = w.b.region((4 << 20) + 64, kind);
          transfer(w, send, recv, src, dst, size, size + 64, 1, sendFirst);
          transfer(w, send, recv, src, dst, size, size + 1, 2, !sendFirst);
        }
      });

  it('a receive without a buffer (size 0, no region) takes a 0-byte send', () => {
    const { w, send, recv, src } = world(5);
    const dst = w.b.region(64);
    transfer(w, send, recv, src, dst, 0, 0, 1, false);
    transfer(w, send, recv, src, dst, 0, 0, 2, true);
  });
});

describe('multi-chunk writes', () => {
  const sizes = [28 * KiB, 28 * KiB + 3, 100 * KiB, 1 << 20, 3 * (1 << 20) + 5];
  for (const rxCqData of [false, true])
    for (const nics of [1, 2, 3, 4])
      it(`${nics} rail(s), 1 KiB stripes, FI_RX_CQ_DATA ${rxCqData}`, () => {
        for (const seed of [1, 2]) {
          const { w, send, recv, src } = world(seed, { nicsA: nics, fake: { rxCqData }, config: { minStripe: KiB, bouncePosted: 8 } });
          const dst = w.b.region(4 << 20);
          sizes.forEach((size, i) => {
            const before = w.a.host.rails.reduce((n, r) => n + r.log.filter((o) => o.type === 'write').length, 0);
            transfer(w, send, recv, src, dst, size, size + 100, i + 1, false);
            const writes = w.a.host.rails.reduce((n, r) => n + r.log.filter((o) => o.type === 'write').length, 0) - before;
            expect(writes).toBe(nics === 3 ? 3 : nics); // one stripe per rail (3 divides 3)
          });
          w.settle();
          w.check();
          for (const a of w.b.ep.pool.accounts) {
            expect(a.posted).toBe(w.b.ep.pool.window);
            if (rxCqData) expect(a.consumed).toBeGreaterThan(0); // every stripe consumed (and replaced) a receive
          }
        }
      });

  // tcp;ofi_rxm completes a remote write with length 0; the sender then puts each segment's
  // length in the immediate data's high half (8 bytes of it there), and sizes stay right.
  for (const nics of [1, 3])
    it(`${nics} rail(s), a provider that reports no length of a remote write`, () => {
      const { w, send, recv, src } = world(4, { nicsA: nics, nicsB: nics, fake: { remoteLen: false }, config: { minStripe: KiB } });
      const dst = w.b.region(4 << 20);
      [0, 1, 9000, ...sizes].forEach((size, i) => transfer(w, send, recv, src, dst, size, size + 100, i + 1, i % 2 === 0));
    });

  it('many multi-chunk messages in flight at once, grouped, FI_RX_CQ_DATA and a tiny window', () => {
    const { w, send, recv, src } = world(9, { nicsA: 2, fake: { rxCqData: true }, config: { minStripe: 4 * KiB, bouncePosted: 2 } });
    const dst = w.b.region(8 << 20);
    for (let r = 0; r < 16; r++) recv.irecv(r, [0, 1, 2, 3].map((t) => buf(dst, (r * 4 + t) * 64 * KiB, 64 * KiB, t)));
    for (let r = 0; r < 16; r++) for (let t = 3; t >= 0; t--) send.isend(r * 4 + t, buf(src, (r * 4 + t) * 32 * KiB, 28 * KiB + t, t));
    w.run(() => w.b.done.size === 16 && w.a.done.size === 64);
    const mem = w.fabric.bytesOf(dst);
    for (let r = 0; r < 16; r++) {
      expect(w.b.done.get(r)!.sizes).toEqual([0, 1, 2, 3].map((t) => 28 * KiB + t));
      for (let t = 0; t < 4; t++) expectBytes(mem, (r * 4 + t) * 64 * KiB, src.bytes!.subarray((r * 4 + t) * 32 * KiB, (r * 4 + t) * 32 * KiB + 28 * KiB + t));
    }
  });
});

describe('the eager pool', () => {
  it('runs out and grows: 3 comms send 32 eager messages each before any receive', () => {
    const w = new World({ seed: 4, config: { bouncePosted: 4 } });
    const pairs = [w.connect(), w.connect(), w.connect()];
    const src = w.a.region(1 << 20);
    src.bytes!.set(pattern(4, 1 << 20));
    const dst = w.b.region(3 * 32 * 4 * KiB);
    const before = w.b.ep.pool.accounts[0].buffers;
    pairs.forEach((p, c) => {
      for (let i = 0; i < 32; i++) p.send.isend(c * 100 + i, buf(src, (c * 32 + i) * 128, 1000 + i, 1));
    });
    w.fabric.run(() => w.fabric.ops.length === 0 && w.sides.every((s) => s.host.rails.every((r) => r.cq.length === 0)));
    const acc = w.b.ep.pool.accounts[0];
    expect(acc.held).toBe(96);
    expect(acc.posted).toBe(4);
    expect(acc.buffers).toBeGreaterThan(before);
    pairs.forEach((p, c) => {
      for (let i = 0; i < 32; i++) p.recv.irecv(c * 100 + i, [buf(dst, (c * 32 + i) * 4 * KiB, 4 * KiB, 1)]);
    });
    w.run(() => w.b.done.size === 96 && w.a.done.size === 96);
    const mem = w.fabric.bytesOf(dst);
    for (let c = 0; c < 3; c++)
      for (let i = 0; i < 32; i++) {
        expect(w.b.done.get(c * 100 + i)!.sizes).toEqual([1000 + i]);
        expectBytes(mem, (c * 32 + i) * 4 * KiB, src.bytes!.subarray((c * 32 + i) * 128, (c * 32 + i) * 128 + 1000 + i));
      }
    w.settle();
    expect(acc.held).toBe(0);
    expect(acc.posted).toBe(4);
  });
});

describe('several comms on one endpoint', () => {
  it('keep their messages apart, both directions', () => {
    const w = new World({ seed: 6, nicsA: 2 });
    const ab = [w.connect(w.a, w.b), w.connect(w.a, w.b), w.connect(w.b, w.a)];
    const srcA = w.a.region(1 << 20);
    const srcB = w.b.region(1 << 20);
    srcA.bytes!.set(pattern(1, 1 << 20));
    srcB.bytes!.set(pattern(2, 1 << 20));
    const dstB = w.b.region(4 << 20);
    const dstA = w.a.region(4 << 20);
    for (let i = 0; i < 20; i++) {
      ab.forEach((p, c) => {
        const dst = c === 2 ? dstA : dstB;
        const src = c === 2 ? srcB : srcA;
        const size = [10, 5000, 40000][(i + c) % 3];
        p.recv.irecv(1000 * c + i, [buf(dst, (c * 20 + i) * 64 * KiB, 40000, 0)]);
        p.send.isend(1000 * c + i, buf(src, (c * 20 + i) * 8 * KiB, size, 0));
      });
    }
    w.run(() => w.a.done.size === 60 && w.b.done.size === 60);
    ab.forEach((_, c) => {
      const recvSide = c === 2 ? w.a : w.b;
      const dst = c === 2 ? dstA : dstB;
      const src = c === 2 ? srcB : srcA;
      for (let i = 0; i < 20; i++) {
        const size = [10, 5000, 40000][(i + c) % 3];
        expect(recvSide.done.get(1000 * c + i)).toEqual({ code: 0, sizes: [size] });
        expectBytes(w.fabric.bytesOf(dst), (c * 20 + i) * 64 * KiB, src.bytes!.subarray((c * 20 + i) * 8 * KiB, (c * 20 + i) * 8 * KiB + size));
      }
    });
  });
});

describe('a send larger than its receive', () => {
  for (const size of [100, 20000])
    it(`fails both sides with ncclInvalidUsage (${size} bytes into 64), writes nothing, and the comm goes on`, () => {
      const { w, send, recv, src } = world(7);
      const dst = w.b.region(1 << 16);
      recv.irecv(1, [buf(dst, 0, 64, 1)]);
      if (size > 8192) w.settle(); // the control message is there: the send is matched, not eager
      send.isend(1, buf(src, 0, size, 1));
      w.run(() => w.a.has(1) && w.b.has(1));
      expect(w.a.take(1).code).toBe(5);
      expect(w.b.take(1)).toEqual({ code: 5, sizes: [0] });
      expect(w.fabric.bytesOf(dst).every((b) => b === 0)).toBe(true);
      transfer(w, send, recv, src, dst, 60, 64, 2, false);
      transfer(w, send, recv, src, dst, 60, 64, 3, true);
    });

  it('in a grouped receive fails that receive only once all its sub-receives are accounted for', () => {
    const { w, send, recv, src } = world(8);
    const dst = w.b.region(1 << 16);
    recv.irecv(1, [buf(dst, 0, 64, 1), buf(dst, 1024, 64, 2)]);
    send.isend(1, buf(src, 0, 30000, 1));
    w.settle();
    expect(w.b.has(1)).toBe(false);
    send.isend(2, buf(src, 0, 50, 2));
    w.run(() => w.a.has(1, 2) && w.b.has(1));
    expect(w.b.take(1)).toEqual({ code: 5, sizes: [0, 50] });
    expect(w.a.take(1).code).toBe(5);
    expect(w.a.take(2).code).toBe(0);
  });
});
