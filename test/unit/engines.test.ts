// The protocol engines (Sender, Receiver) over a real in-memory loopback link: data of every
// size, eager and striped paths, many requests in flight, multi-receives with tags, sends
// that do not fit, close and peer failures, asynchronous completions.
import { describe, expect, it } from 'vitest';
import { ResultCode } from '../../plugin/abi';
import { readConfig } from '../../plugin/config';
import { FLAG_EAGER, FRAME_BYTES, FrameType, decodeFrame, encodeFrame } from '../../plugin/protocol/frames';
import { Receiver } from '../../plugin/protocol/receiver';
import { isEager, stripes } from '../../plugin/protocol/schedule';
import { Sender } from '../../plugin/protocol/sender';
import type { Link } from '../../plugin/transports/lane';
import { LoopbackTransport } from '../../plugin/transports/loopback';
import { type Completion, KiB, MiB, allBytes, buf, captureLog, fill, firstDiff, pair, settle } from './helpers';

const log = captureLog();
const SENTINEL = 0xee;
const PAD = 100;

/** A receive view of size bytes inside a larger buffer filled with SENTINEL. */
function padded(size: number) {
  const whole = new Uint8Array(size + 2 * PAD).fill(SENTINEL);
  return { whole, view: whole.subarray(PAD, PAD + size), before: whole.subarray(0, PAD), after: whole.subarray(PAD + size) };
}

/** size bytes of pattern seed, as a view at an odd offset of a larger buffer. */
function source(size: number, seed: number): Uint8Array {
  const b = new Uint8Array(size + 13);
  return fill(b.subarray(5, 5 + size), seed);
}

const bySlot = (list: Completion[]) => [...list].sort((a, b) => a.slot - b.slot);

const SIZES = [0, 1, 7, 24, 4095, 4096, 4097, 16 * KiB - 1, 16 * KiB, 16 * KiB + 1, 64 * KiB, 128 * KiB - 1, 128 * KiB,
  128 * KiB + 1, 512 * KiB + 5, MiB, MiB + 1, 3 * MiB + 4097, 8 * MiB];

const CONFIGS: Record<string, string>[] = [
  { TSNET_NSOCKS: '0' },
  { TSNET_NSOCKS: '1' },
  { TSNET_NSOCKS: '4' },
  { TSNET_NSOCKS: '4', TSNET_EAGER_MAX: '0' },
  { TSNET_NSOCKS: '4', TSNET_EAGER_MAX: String(MiB) },
  { TSNET_NSOCKS: '3', TSNET_MIN_STRIPE: '4096' },
  { NCCL_SOCKET_NTHREADS: '2', NCCL_NSOCKS_PERTHREAD: '4', TSNET_MIN_STRIPE: '4096', OFI_NCCL_EAGER_MAX_SIZE: '100' },
];

describe('data of every size, eager and striped', () => {
  for (const env of CONFIGS) {
    for (const order of ['receive first', 'send first'] as const) {
      it(`${JSON.stringify(env)}, ${order}`, async () => {
        const p = pair(env);
        const policy = p.transport.policy;
        let lane = 0; // where the next striped message starts, as both ends compute it
        for (const [k, size] of SIZES.entries()) {
          const data = source(size, k);
          const r = padded(size + 50); // a receive larger than the send
          const ctl0 = p.sendLink.control.written;
          const data0 = p.sendLink.data.map((l) => l.written);
          if (order === 'receive first') p.receiver.irecv(k, [buf(r.view, 3)]);
          p.sender.isend(k, data, 3);
          if (order === 'send first') {
            await p.settle();
            p.receiver.irecv(k, [buf(r.view, 3)]);
          }
          await p.settle();
          expect(p.sent.at(-1), `send of ${size}`).toEqual({ slot: k, code: 0, sizes: [size] });
          expect(p.received.at(-1), `receive of ${size}`).toEqual({ slot: k, code: 0, sizes: [size] });
          expect(firstDiff(r.view.subarray(0, size), data), `data of ${size}`).toBe(-1);
          expect(allBytes(r.view.subarray(size), SENTINEL), 'receive bytes past the message').toBe(true);
          expect(allBytes(r.before, SENTINEL) && allBytes(r.after, SENTINEL), 'bytes around the receive').toBe(true);
          // The path the bytes took.
          const onData = p.sendLink.data.map((l, i) => l.written - data0[i]);
          if (isEager(size, policy)) {
            expect(p.sendLink.control.written - ctl0).toBe(FRAME_BYTES + size);
            expect(onData.every((n) => n === 0)).toBe(true);
          } else {
            expect(p.sendLink.control.written - ctl0).toBe(FRAME_BYTES);
            const want = new Array(policy.lanes).fill(0);
            const parts = stripes(size, lane, policy);
            for (const s of parts) want[s.lane] += s.length;
            lane = (lane + parts.length) % policy.lanes;
            expect(onData).toEqual(want);
          }
        }
        expect(p.sent.length).toBe(SIZES.length);
        expect(p.received.length).toBe(SIZES.length);
        expect(p.sender.pending).toBe(0);
        expect(p.receiver.pending).toBe(0);
        expect(log.filter((l) => l.level === 2)).toEqual([]);
      });
    }
  }

  it('config knobs choose the path: NSOCKS=0 sends 8 MiB inline, EAGER_MAX=0 stripes 1 byte', async () => {
    const inline = pair({ TSNET_NSOCKS: '0' });
    expect(inline.sendLink.data.length).toBe(0);
    inline.receiver.irecv(0, [buf(new Uint8Array(8 * MiB))]);
    inline.sender.isend(0, new Uint8Array(8 * MiB), 0);
    await inline.settle();
    expect(inline.sendLink.control.written).toBe(FRAME_BYTES + 8 * MiB);

    const striped = pair({ TSNET_NSOCKS: '4', TSNET_EAGER_MAX: '0' });
    striped.receiver.irecv(0, [buf(new Uint8Array(1))]);
    striped.sender.isend(0, new Uint8Array([42]), 0);
    await striped.settle();
    expect(striped.sendLink.control.written).toBe(FRAME_BYTES);
    expect(striped.sendLink.data.map((l) => l.written)).toEqual([1, 0, 0, 0]);
    expect(striped.received).toEqual([{ slot: 0, code: 0, sizes: [1] }]);
  });

  it('small striped messages go whole, round-robin over the lanes', async () => {
    const p = pair({ TSNET_NSOCKS: '4', TSNET_EAGER_MAX: '0' });
    for (let k = 0; k < 6; k++) {
      p.receiver.irecv(k, [buf(new Uint8Array(100))]);
      p.sender.isend(k, new Uint8Array(100), 0);
    }
    await p.settle();
    expect(p.sendLink.data.map((l) => l.writes)).toEqual([2, 2, 1, 1]);
    expect(p.received.length).toBe(6);
  });
});

describe('many requests in flight', () => {
  for (const env of [{ TSNET_NSOCKS: '0' }, { TSNET_NSOCKS: '4', TSNET_MIN_STRIPE: '4096' }] as Record<string, string>[]) {
    it(`32 sends and 32 receives in flight at once, ${JSON.stringify(env)}`, async () => {
      const p = pair(env);
      const sizes = Array.from({ length: 32 }, (_, k) => [0, 1, 1000, 16 * KiB + 1, 100 * KiB, 300 * KiB + 7][k % 6] + k);
      const data = sizes.map((s, k) => source(s, 100 + k));
      const views = sizes.map((s) => padded(s));
      for (let k = 0; k < 16; k++) p.sender.isend(k, data[k], k);
      for (let k = 0; k < 32; k++) p.receiver.irecv(k, [buf(views[k].view, k)]);
      for (let k = 16; k < 32; k++) p.sender.isend(k, data[k], k);
      expect(p.sent.length + p.received.length).toBe(0);
      await p.settle();
      expect(bySlot(p.sent)).toEqual(sizes.map((s, k) => ({ slot: k, code: 0, sizes: [s] })));
      expect(bySlot(p.received)).toEqual(sizes.map((s, k) => ({ slot: k, code: 0, sizes: [s] })));
      // Receives complete in FIFO order.
      expect(p.received.map((c) => c.slot)).toEqual(sizes.map((_, k) => k));
      for (let k = 0; k < 32; k++) {
        expect(firstDiff(views[k].view, data[k]), `message ${k}`).toBe(-1);
        expect(allBytes(views[k].before, SENTINEL) && allBytes(views[k].after, SENTINEL)).toBe(true);
      }
    });
  }

  it('a send completes only once the receiver matched it', async () => {
    const p = pair({ TSNET_NSOCKS: '4' });
    p.sender.isend(0, source(10, 1), 0); // eager: every byte can leave at once
    await p.settle();
    expect(p.sent).toEqual([]);
    expect(p.sender.pending).toBe(1);
    p.receiver.irecv(0, [buf(new Uint8Array(10))]);
    await p.settle();
    expect(p.sent).toEqual([{ slot: 0, code: 0, sizes: [10] }]);
  });
});

describe('multi-receive', () => {
  const TAGS = [0, 1, 2, 3, 4, 5, 6, 7];
  const SIZE_OF = (tag: number) => [0, 5, 16 * KiB, 16 * KiB + 1, 200 * KiB + 3, 4096, MiB + 1, 77][tag];
  for (const env of [{ TSNET_NSOCKS: '4' }, { TSNET_NSOCKS: '0' }, { TSNET_NSOCKS: '2', TSNET_MIN_STRIPE: '4096' }] as Record<string, string>[]) {
    it(`n=8, tags sent out of order, ${JSON.stringify(env)}`, async () => {
      const p = pair(env);
      const order = [5, 2, 7, 0, 3, 1, 6, 4];
      // Buffers of different sizes, each larger than its tag's message, tags in buffer order
      // reversed so that buffer index and tag differ.
      const rtags = [...TAGS].reverse();
      const bufs = rtags.map((t) => padded(SIZE_OF(t) + 10));
      const data = new Map(TAGS.map((t) => [t, source(SIZE_OF(t), 50 + t)]));
      p.receiver.irecv(9, bufs.map((b, i) => buf(b.view, rtags[i])));
      order.forEach((t, k) => p.sender.isend(k, data.get(t)!, t));
      await p.settle();
      expect(p.received).toEqual([{ slot: 9, code: 0, sizes: rtags.map(SIZE_OF) }]);
      expect(bySlot(p.sent)).toEqual(order.map((t, k) => ({ slot: k, code: 0, sizes: [SIZE_OF(t)] })));
      rtags.forEach((t, i) => {
        expect(firstDiff(bufs[i].view.subarray(0, SIZE_OF(t)), data.get(t)!), `tag ${t}`).toBe(-1);
        expect(allBytes(bufs[i].view.subarray(SIZE_OF(t)), SENTINEL)).toBe(true);
        expect(allBytes(bufs[i].before, SENTINEL) && allBytes(bufs[i].after, SENTINEL)).toBe(true);
      });
    });
  }

  it('a multi-receive takes the next n messages; the following receive the ones after', async () => {
    const p = pair({ TSNET_NSOCKS: '2' });
    const a = [padded(300 * KiB), padded(300 * KiB)];
    const b = [padded(10), padded(10)];
    p.receiver.irecv(0, [buf(a[0].view, 1), buf(a[1].view, 2)]);
    p.receiver.irecv(1, [buf(b[0].view, 1), buf(b[1].view, 2)]);
    const m = [source(300 * KiB, 1), source(200 * KiB, 2), source(3, 3), source(4, 4)];
    p.sender.isend(0, m[0], 2);
    p.sender.isend(1, m[1], 1);
    p.sender.isend(2, m[2], 2);
    p.sender.isend(3, m[3], 1);
    await p.settle();
    expect(p.received).toEqual([
      { slot: 0, code: 0, sizes: [200 * KiB, 300 * KiB] },
      { slot: 1, code: 0, sizes: [4, 3] },
    ]);
    expect(firstDiff(a[1].view, m[0])).toBe(-1);
    expect(firstDiff(a[0].view.subarray(0, 200 * KiB), m[1])).toBe(-1);
    expect(firstDiff(b[1].view.subarray(0, 3), m[2])).toBe(-1);
    expect(firstDiff(b[0].view.subarray(0, 4), m[3])).toBe(-1);
  });

  it('a multi-receive completes only when its last message has arrived', async () => {
    const p = pair({ TSNET_NSOCKS: '1' });
    p.receiver.irecv(0, [buf(new Uint8Array(10), 0), buf(new Uint8Array(10), 1), buf(new Uint8Array(10), 2)]);
    p.sender.isend(0, source(10, 0), 1);
    p.sender.isend(1, source(10, 1), 0);
    await p.settle();
    expect(p.received).toEqual([]);
    expect(p.sent.length).toBe(2);
    p.sender.isend(2, source(1, 2), 2);
    await p.settle();
    expect(p.received).toEqual([{ slot: 0, code: 0, sizes: [10, 10, 1] }]);
  });
});

describe('a send larger than its receive', () => {
  const CASES = [
    ['eager', { TSNET_NSOCKS: '4' }, 100, 101],
    ['eager, much larger', { TSNET_NSOCKS: '4' }, 10, 16 * KiB],
    ['eager over the control lane only', { TSNET_NSOCKS: '0' }, 64 * KiB, 3 * MiB],
    ['striped', { TSNET_NSOCKS: '4' }, 64 * KiB, 3 * MiB + 5],
    ['striped by one byte', { TSNET_NSOCKS: '3', TSNET_MIN_STRIPE: '4096' }, 100 * KiB, 100 * KiB + 1],
    ['into an empty receive', { TSNET_NSOCKS: '2' }, 0, 1],
  ] as const;

  for (const [what, env, room, size] of CASES) {
    it(`fails both with INVALID_USAGE and writes nothing (${what}, ${size} into ${room}); later messages flow`, async () => {
      const p = pair(env);
      const r = padded(room);
      p.receiver.irecv(0, [buf(r.view, 1)]);
      p.sender.isend(0, source(size, 9), 1);
      await p.settle();
      expect(p.sent).toEqual([{ slot: 0, code: ResultCode.INVALID_USAGE, sizes: [size] }]);
      expect(p.received.length).toBe(1);
      expect(p.received[0]).toMatchObject({ slot: 0, code: ResultCode.INVALID_USAGE });
      // Nothing lands in the receive (the message is dropped), nor around it.
      expect(allBytes(r.whole, SENTINEL)).toBe(true);
      const warns = log.filter((l) => l.level === 2).map((l) => l.msg).join('\n');
      expect(warns).toContain(`${size}`);
      expect(warns).toMatch(/does not fit/);
      // The link goes on: the next messages match the next receives, bytes intact.
      const next = [0, 17, 20 * KiB, 500 * KiB + 1, size];
      const views = next.map((s) => padded(s));
      const data = next.map((s, k) => source(s, 20 + k));
      next.forEach((_, k) => p.sender.isend(1 + k, data[k], 1));
      next.forEach((_, k) => p.receiver.irecv(1 + k, [buf(views[k].view, 1)]));
      await p.settle();
      expect(bySlot(p.sent).slice(1)).toEqual(next.map((s, k) => ({ slot: 1 + k, code: 0, sizes: [s] })));
      expect(p.received.slice(1)).toEqual(next.map((s, k) => ({ slot: 1 + k, code: 0, sizes: [s] })));
      next.forEach((_, k) => expect(firstDiff(views[k].view, data[k]), `message ${k}`).toBe(-1));
    });
  }

  it('a failed multi-receive absorbs its remaining messages, then reports', async () => {
    const p = pair({ TSNET_NSOCKS: '2' });
    const bufs = [padded(10), padded(10), padded(300 * KiB)];
    p.receiver.irecv(0, bufs.map((b, i) => buf(b.view, i)));
    const after = padded(50);
    p.receiver.irecv(1, [buf(after.view, 0)]);
    p.sender.isend(0, source(11, 0), 0); // too large: fails the receive
    await p.settle();
    expect(p.received).toEqual([]); // two of its messages are still due
    p.sender.isend(1, source(10, 1), 1); // absorbed by receive 0
    p.sender.isend(2, source(300 * KiB, 2), 2); // absorbed by receive 0
    const last = source(50, 3);
    p.sender.isend(3, last, 0); // receive 1
    await p.settle();
    expect(p.received.length).toBe(2);
    expect(p.received.find((c) => c.slot === 0)).toMatchObject({ code: ResultCode.INVALID_USAGE });
    expect(p.received.find((c) => c.slot === 1)).toEqual({ slot: 1, code: 0, sizes: [50] });
    expect(firstDiff(after.view, last)).toBe(-1);
    for (const b of bufs) expect(allBytes(b.whole, SENTINEL)).toBe(true);
    expect(bySlot(p.sent).map((c) => c.code)).toEqual([ResultCode.INVALID_USAGE, 0, 0, 0]);
  });

  it('an unknown tag fails the receive and the send with INVALID_USAGE', async () => {
    const p = pair({ TSNET_NSOCKS: '1' });
    const bufs = [padded(10), padded(10)];
    p.receiver.irecv(0, [buf(bufs[0].view, 1), buf(bufs[1].view, 2)]);
    p.sender.isend(0, source(5, 0), 3);
    p.sender.isend(1, source(5, 1), 1);
    await p.settle();
    expect(p.received).toMatchObject([{ slot: 0, code: ResultCode.INVALID_USAGE }]);
    // The stray message took the first free buffer (tag 1's), so the tag-1 message that
    // follows finds no buffer of its tag and fails too.
    expect(bySlot(p.sent).map((c) => c.code)).toEqual([ResultCode.INVALID_USAGE, ResultCode.INVALID_USAGE]);
    expect(log.map((l) => l.msg).join('\n')).toMatch(/tag 3 matches none/);
    for (const b of bufs) expect(allBytes(b.whole, SENTINEL)).toBe(true);
  });
});

describe('close and peer failures', () => {
  it('closing the receiver with receives pending: no completion, no exception; sends fail with REMOTE_ERROR', async () => {
    const p = pair({ TSNET_NSOCKS: '4' });
    const views = [padded(MiB), padded(10), padded(10)];
    views.forEach((v, k) => p.receiver.irecv(k, [buf(v.view)]));
    p.sender.isend(0, source(8 * MiB, 1), 0); // too large for receive 0: fails it
    await p.settle();
    expect(p.received.length).toBe(1);
    p.receiver.close();
    p.sender.isend(1, source(5 * MiB, 1), 0);
    await p.settle();
    expect(p.received.length).toBe(1); // nothing after close
    expect(p.receiver.pending).toBe(0);
    expect(bySlot(p.sent)).toEqual([
      { slot: 0, code: ResultCode.INVALID_USAGE, sizes: [8 * MiB] },
      { slot: 1, code: ResultCode.REMOTE_ERROR, sizes: [0] },
    ]);
    expect(allBytes(views[1].whole, SENTINEL) && allBytes(views[2].whole, SENTINEL)).toBe(true);
    // A send posted after the peer went away fails at once.
    p.sender.isend(2, source(1, 0), 0);
    await p.settle();
    expect(p.sent.at(-1)).toEqual({ slot: 2, code: ResultCode.REMOTE_ERROR, sizes: [0] });
  });

  it('closing the sender with sends pending: no completion; pending receives fail with REMOTE_ERROR', async () => {
    const p = pair({ TSNET_NSOCKS: '2' });
    const r = padded(10);
    p.receiver.irecv(0, [buf(r.view)]);
    p.receiver.irecv(1, [buf(padded(10).view)]);
    p.sender.isend(0, source(10, 0), 0);
    await p.settle();
    expect(p.received.length).toBe(1);
    p.sender.isend(1, source(MiB, 0), 0); // too large, never acknowledged before close
    p.sender.isend(2, source(MiB, 0), 0);
    p.sender.close();
    await p.settle();
    expect(p.sent.map((c) => c.slot)).toEqual([0]);
    expect(p.sender.pending).toBe(0);
    // Receive 1 was failed by send 1 or by the close; either way it is reported once.
    expect(p.received.slice(1).map((c) => c.slot)).toEqual([1]);
    expect([ResultCode.INVALID_USAGE, ResultCode.REMOTE_ERROR]).toContain(p.received[1].code);
    p.receiver.irecv(2, [buf(padded(10).view)]);
    await p.settle();
    expect(p.received.at(-1)).toEqual({ slot: 2, code: ResultCode.REMOTE_ERROR, sizes: [0] });
  });

  it('the sender closing fails every pending receive with REMOTE_ERROR', async () => {
    const p = pair({ TSNET_NSOCKS: '4' });
    for (let k = 0; k < 5; k++) p.receiver.irecv(k, [buf(new Uint8Array(MiB))]);
    p.sender.isend(0, source(MiB, 0), 0);
    await p.settle();
    p.sender.close();
    await p.settle();
    expect(p.received).toEqual([
      { slot: 0, code: 0, sizes: [MiB] },
      ...[1, 2, 3, 4].map((slot) => ({ slot, code: ResultCode.REMOTE_ERROR, sizes: [0] })),
    ]);
    expect(log.some((l) => l.level === 2 && /sender closed/.test(l.msg))).toBe(true);
  });

  it('the receiver closing fails every pending send with REMOTE_ERROR', async () => {
    const p = pair({ TSNET_NSOCKS: '0' });
    for (let k = 0; k < 4; k++) p.sender.isend(k, source(k * 1000, k), 0);
    await p.settle();
    expect(p.sent).toEqual([]);
    p.receiver.close();
    await p.settle();
    expect(bySlot(p.sent)).toEqual([0, 1, 2, 3].map((slot) => ({ slot, code: ResultCode.REMOTE_ERROR, sizes: [0] })));
    expect(p.received).toEqual([]);
  });

  it('closing both ends mid-transfer completes nothing and throws nothing', async () => {
    const p = pair({ TSNET_NSOCKS: '4', TSNET_MIN_STRIPE: '4096' });
    for (let k = 0; k < 8; k++) p.receiver.irecv(k, [buf(new Uint8Array(2 * MiB))]);
    for (let k = 0; k < 8; k++) p.sender.isend(k, source(2 * MiB, k), 0);
    p.receiver.close();
    p.sender.close();
    p.sender.close();
    p.receiver.close();
    await p.settle();
    expect(p.sent).toEqual([]);
    expect(p.received).toEqual([]);
  });

  it('a link failure (onFail) fails pending requests with REMOTE_ERROR', async () => {
    const p = pair({ TSNET_NSOCKS: '1' });
    p.receiver.irecv(0, [buf(new Uint8Array(10))]);
    p.sender.isend(0, source(100, 0), 0); // does not fit: the receive fails, the send waits for its ACK
    p.sender.isend(1, source(100, 0), 0);
    p.recvLink.close(); // both directions break without a CLOSE frame
    await p.settle();
    expect(bySlot(p.sent).map((c) => c.slot)).toEqual([0, 1]);
    for (const c of p.sent) expect([ResultCode.INVALID_USAGE, ResultCode.REMOTE_ERROR]).toContain(c.code);
    expect(p.sent[1].code === ResultCode.REMOTE_ERROR || p.sent[0].code === ResultCode.REMOTE_ERROR).toBe(true);
  });
});

describe('completions are asynchronous', () => {
  it('nothing completes inside isend or irecv', async () => {
    for (const env of [{ TSNET_NSOCKS: '0' }, { TSNET_NSOCKS: '4' }]) {
      const p = pair(env);
      for (const size of [0, 10, MiB]) {
        p.receiver.irecv(size, [buf(new Uint8Array(size))]);
        p.sender.isend(size, new Uint8Array(size), 0);
        expect(p.sent.length + p.received.length).toBe(0);
        await p.settle();
        expect(p.sent.length).toBe(1);
        expect(p.received.length).toBe(1);
        p.sent.length = p.received.length = 0;
      }
    }
  });

  it('nothing completes inside a receive posted after its message arrived', async () => {
    const p = pair({ TSNET_NSOCKS: '4' });
    p.sender.isend(0, new Uint8Array(10), 0);
    await p.settle();
    p.receiver.irecv(0, [buf(new Uint8Array(10))]);
    expect(p.received.length).toBe(0);
    await p.settle();
    expect(p.received.length).toBe(1);
  });
});

// --- The receiver against a hand-driven sender: raw frames on the sender's end of the link.

function rawPair(env: Record<string, string>) {
  const { config } = readConfig({ TSNET_TRANSPORT: 'loopback', ...env });
  const t = new LoopbackTransport(config);
  const l = t.listen(0);
  const raw = t.connect(0, l.handle).poll() as Link;
  const link = l.accept() as Link;
  const received: Completion[] = [];
  const receiver = new Receiver(link, t.policy, (slot, code, sizes) => received.push({ slot, code, sizes: [...sizes] }), 'raw');
  const frames: unknown[] = [];
  const buf24 = new Uint8Array(FRAME_BYTES);
  const pump = () =>
    raw.control.read(buf24, (err) => {
      if (err) return;
      frames.push(decodeFrame(buf24));
      pump();
    });
  pump();
  const msg = (seq: number, tag: number, size: number, payload?: Uint8Array) =>
    raw.control.write(
      [encodeFrame({ type: FrameType.MSG, flags: payload ? FLAG_EAGER : 0, tag, seq, size }), ...(payload ? [payload] : [])],
      () => {},
    );
  return { raw, receiver, received, frames, msg, settle: () => settle(() => [received.length, frames.length]) };
}

describe('the receiver against a hand-driven sender', () => {
  it('acknowledges matched messages and NACKs one that does not fit, with the receive size', async () => {
    const r = rawPair({ TSNET_NSOCKS: '0' });
    r.receiver.irecv(0, [buf(new Uint8Array(10))]);
    r.receiver.irecv(1, [buf(new Uint8Array(10))]);
    r.msg(0, 0, 4, new Uint8Array(4));
    r.msg(1, 0, 12, new Uint8Array(12));
    await r.settle();
    expect(r.frames).toContainEqual({ type: FrameType.NACK, flags: 0, tag: 0, seq: 1, size: 10 });
    expect(r.frames.at(-1)).toEqual({ type: FrameType.ACK, flags: 0, tag: 0, seq: 1, size: 0 });
    expect(r.received.map((c) => c.code)).toEqual([0, ResultCode.INVALID_USAGE]);
  });

  it.each([
    ['a malformed frame', (r: ReturnType<typeof rawPair>) => r.raw.control.write([new Uint8Array(FRAME_BYTES)], () => {}), /protocol error/],
    ['a message out of sequence', (r: ReturnType<typeof rawPair>) => r.msg(5, 0, 0), /message 5 arrived, expected 0/],
    ['an ACK from the sender', (r: ReturnType<typeof rawPair>) =>
      r.raw.control.write([encodeFrame({ type: FrameType.ACK, flags: 0, tag: 0, seq: 0, size: 0 })], () => {}), /unexpected frame type 2/],
  ])('%s fails pending receives with REMOTE_ERROR', async (_what, send, why) => {
    const r = rawPair({ TSNET_NSOCKS: '1' });
    r.receiver.irecv(0, [buf(new Uint8Array(10))]);
    r.receiver.irecv(1, [buf(new Uint8Array(10), 1), buf(new Uint8Array(10), 2)]);
    send(r);
    await r.settle();
    expect(r.received).toEqual([
      { slot: 0, code: ResultCode.REMOTE_ERROR, sizes: [0] },
      { slot: 1, code: ResultCode.REMOTE_ERROR, sizes: [0, 0] },
    ]);
    expect(log.map((l) => l.msg).join('\n')).toMatch(why);
  });

  // DESIGN.md: "nothing may read or write a buffer after NCCL gets it back". A multi-receive
  // that fails while an earlier message's stripes are still due is reported only once those
  // bytes were consumed. (The loopback Sender writes every stripe inside isend, so the data
  // is written by hand here, later, as it arrives over TCP.)
  it('no byte lands in a multi-receive after it was reported failed', async () => {
    const r = rawPair({ TSNET_NSOCKS: '1' });
    const big = padded(64 * KiB);
    r.receiver.irecv(0, [buf(big.view, 1), buf(new Uint8Array(10), 2)]);
    r.msg(0, 1, 64 * KiB); // striped: its bytes come on data lane 0 later
    r.msg(1, 2, 100, new Uint8Array(100)); // does not fit: fails the receive
    await r.settle();
    expect(r.received).toEqual([]); // not yet: 64 KiB are still due for it
    r.raw.data[0].write([new Uint8Array(64 * KiB).fill(0x55)], () => {});
    await r.settle();
    expect(r.received).toMatchObject([{ slot: 0, code: ResultCode.INVALID_USAGE }]);
    const atCompletion = big.whole.slice();
    r.raw.data[0].write([new Uint8Array(4 * KiB).fill(0x66)], () => {});
    await r.settle();
    expect(big.whole).toEqual(atCompletion);
  });
});

describe('the sender against a hand-driven receiver', () => {
  it('a malformed or unexpected frame from the receiver fails pending sends with REMOTE_ERROR', async () => {
    for (const frame of [new Uint8Array(FRAME_BYTES), encodeFrame({ type: FrameType.MSG, flags: 0, tag: 0, seq: 0, size: 0 })]) {
      const { config } = readConfig({ TSNET_TRANSPORT: 'loopback', TSNET_NSOCKS: '0' });
      const t = new LoopbackTransport(config);
      const l = t.listen(0);
      const link = t.connect(0, l.handle).poll() as Link;
      const raw = l.accept() as Link;
      const sent: Completion[] = [];
      const sender = new Sender(link, t.policy, (slot, code, sizes) => sent.push({ slot, code, sizes }), 'raw');
      sender.isend(0, new Uint8Array(0), 0);
      raw.control.write([frame], () => {});
      await settle(() => sent.length);
      expect(sent).toEqual([{ slot: 0, code: ResultCode.REMOTE_ERROR, sizes: [0] }]);
    }
  });

  it('an ACK completes every send up to its sequence number; a NACK turns one into INVALID_USAGE', async () => {
    const { config } = readConfig({ TSNET_TRANSPORT: 'loopback', TSNET_NSOCKS: '0' });
    const t = new LoopbackTransport(config);
    const l = t.listen(0);
    const link = t.connect(0, l.handle).poll() as Link;
    const raw = l.accept() as Link;
    const sent: Completion[] = [];
    const sender = new Sender(link, t.policy, (slot, code, sizes) => sent.push({ slot, code, sizes }), 'raw');
    for (let k = 0; k < 4; k++) sender.isend(10 + k, new Uint8Array(3), 0);
    // Take the bytes off the wire so the writes complete.
    const sink = new Uint8Array(4 * (FRAME_BYTES + 3));
    raw.control.read(sink, () => {});
    await settle(() => sent.length);
    expect(sent).toEqual([]);
    const frame = (type: FrameType, seq: number, size = 0) => encodeFrame({ type, flags: 0, tag: 0, seq, size });
    raw.control.write([frame(FrameType.NACK, 1, 2), frame(FrameType.ACK, 2)], () => {});
    await settle(() => sent.length);
    expect(sent).toEqual([
      { slot: 10, code: 0, sizes: [3] },
      { slot: 11, code: ResultCode.INVALID_USAGE, sizes: [3] },
      { slot: 12, code: 0, sizes: [3] },
    ]);
    expect(sender.pending).toBe(1);
  });
});
