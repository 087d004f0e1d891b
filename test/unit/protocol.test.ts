// The stream protocol (plugin/protocol/sender.ts, receiver.ts) over an in-memory link
// (memoryLinkPair): data of every size on the eager and striped paths with guard bytes around
// every buffer, many requests in flight, grouped receives and aws-ofi-nccl's tag push-back,
// messages before their receive, unmatched messages, sends larger than their receive, every
// policy, close, cancelRegion (deregMr), liveness, and hand-driven peers for the frames a
// well-behaved peer never sends.
import { split } from '../support/addr';
import { afterEach, describe, expect, it } from 'vitest';
import { LogLevel, ResultCode } from '../../plugin/abi';
import { monoMs, setClock } from '../../plugin/clock';
import { FLAG_EAGER, FRAME_BYTES, type Frame, FrameType, readFrame } from '../../plugin/protocol/frames';
import { type LinkEvents, NO_OP, SEND_RING_BYTES, type StreamLink, recvRingBytes } from '../../plugin/protocol/link';
import { EAGER_POLICIES, LANE_POLICIES, STRIPE_POLICIES, type SchedulePolicy, stripeCount } from '../../plugin/protocol/policies';
import { STATUS_EOF } from '../../plugin/protocol/endpoint';
import { Receiver, newRecvArgs } from '../../plugin/protocol/receiver';
import { Sender } from '../../plugin/protocol/sender';
import { CQE_RX, OP_REMOTE } from '../../plugin/engine/records';
import { memoryLinkPair } from '../../plugin/transports/memory-link';
import {
  type Buf, type Completion, GUARD_BYTE, KiB, MiB, type Pair, SpyLink, TestMemory, allBytes, bySlot, captureLog, firstDiff, pair,
  policyOf, prng, settle, shuffled, testClock,
} from './helpers';

const log = captureLog();
const warnings = () => log.filter((l) => l.level === LogLevel.WARN).map((l) => l.msg);
const infos = () => log.filter((l) => l.level === LogLevel.INFO).map((l) => l.msg);
const ok = (slot: number, ...sizes: number[]): Completion => ({ slot, code: ResultCode.SUCCESS, sizes });

/** The stripes (lane, offset, length) of a message as both ends must cut it; counter: the link's stripe counter. */
function plan(p: SchedulePolicy, size: number, tag: number, counter: number): { lane: number; off: number; len: number }[] {
  if (p.eager.eager(size, p.eagerMax, p.lanes)) return [];
  const len = p.stripes.length(size, p.minStripe, p.lanes);
  const n = stripeCount(size, len);
  const first = p.laneChoice.first(counter, tag, p.lanes);
  return Array.from({ length: n }, (_, k) => ({ lane: (first + k) % p.lanes, off: k * len, len: Math.min(len, size - k * len) }));
}

/** The bytes a receive buffer must hold once msg landed in it: msg, then untouched bytes. */
function expectLanded(dst: Buf, msg: Uint8Array, what = 'data'): void {
  expect(firstDiff(dst.view.subarray(0, msg.length), msg), what).toBe(-1);
  expect(allBytes(dst.view.subarray(msg.length), GUARD_BYTE), `${what}: bytes past the message`).toBe(true);
  expect(dst.guarded(), `${what}: guard bytes`).toBe(true);
}

const addr = (b: Buf) => b.region.base + b.offset;
/** Lane submissions grouped by lane, each lane's in the order made (a stable sort). */
const byLane = <T extends { lane: number }>(list: T[]) => [...list].sort((a, b) => a.lane - b.lane);

// --- Data of every size

const POLICIES: [string, Partial<SchedulePolicy>][] = [
  ['default (64 KiB eager, 128 KiB even stripes, 4 lanes)', {}],
  ['1 lane', { lanes: 1 }],
  ['3 lanes, 4 KiB stripes, 1000 B eager', { lanes: 3, minStripe: 4 * KiB, eagerMax: 1000 }],
  ['fixed 4 KiB stripes over 3 lanes, nothing eager but empty messages', { lanes: 3, minStripe: 4 * KiB, eagerMax: 0, stripes: STRIPE_POLICIES[1] }],
  ['lanes by tag, 5 lanes', { lanes: 5, minStripe: 8 * KiB, eagerMax: 100, laneChoice: LANE_POLICIES[1] }],
];

function sizesFor(p: SchedulePolicy): number[] {
  const s = [0, 1, 7, 4095, 4096, 4097, p.eagerMax, p.eagerMax + 1, p.minStripe - 1, p.minStripe, p.minStripe + 1,
    p.lanes * p.minStripe + 4097, 1_000_003, 3 * MiB + 5];
  return [...new Set(s.filter((x) => x >= 0))].sort((a, b) => a - b);
}

describe('data of every size, eager and striped', () => {
  for (const [name, over] of POLICIES) {
    for (const order of ['receive first', 'send first'] as const) {
      it(`${name}, ${order}`, async () => {
        const p = pair(over);
        const sizes = sizesFor(p.policy);
        let counter = 0;
        for (const [k, size] of sizes.entries()) {
          const tag = (k % 5) - 1; // -1 .. 3
          const src = p.mem.buf(size, k, 3); // an odd address
          const dst = p.mem.buf(size + 50);
          const f0 = p.sendLink.frames.length;
          const w0 = p.sendLink.writes.length;
          const r0 = p.recvLink.reads.length;
          const eager = p.policy.eager.eager(size, p.policy.eagerMax, p.policy.lanes);
          if (order === 'receive first') p.recv(k, { buf: dst, tag });
          p.send(k, src, tag);
          if (order === 'send first') {
            await p.settle();
            // A send completes once its bytes are handed over: an eager one at once, a striped
            // one only when the receiver reads its stripes.
            expect(p.sent.some((c) => c.slot === k), `send of ${size} before its receive`).toBe(eager);
            p.recv(k, { buf: dst, tag });
          }
          await p.settle();
          expect(p.sent.at(-1), `send of ${size}`).toEqual(ok(k, size));
          expect(p.received.at(-1), `receive of ${size}`).toEqual(ok(k, size));
          expectLanded(dst, src.view, `data of ${size}`);
          expect(src.guarded()).toBe(true);
          // The path the bytes took: one MSG frame, the payload inline or striped alike on both ends.
          expect(p.sendLink.frames.slice(f0)).toEqual([
            { type: FrameType.MSG, flags: eager ? FLAG_EAGER : 0, tag, seq: k, size, addr: eager ? addr(src) : 0, len: eager ? size : 0 },
          ]);
          const stripes = plan(p.policy, size, tag, counter);
          counter += stripes.length;
          expect(stripes.length === 0).toBe(eager);
          expect(p.sendLink.writes.slice(w0), `writes of ${size}`).toEqual(stripes.map((s) => ({ lane: s.lane, addr: addr(src) + s.off, len: s.len })));
          // The receiver submits lane by lane: the order within each lane is what counts.
          expect(byLane(p.recvLink.reads.slice(r0)), `reads of ${size}`).toEqual(byLane(stripes.map((s) => ({ lane: s.lane, addr: addr(dst) + s.off, len: s.len }))));
        }
        expect(p.sent.length).toBe(sizes.length);
        expect(p.received.length).toBe(sizes.length);
        expect(p.sender.pending).toBe(0);
        expect(p.receiver.pending).toBe(0);
        expect(p.sender.stats).toEqual({ messages: sizes.length, bytes: sizes.reduce((a, b) => a + b, 0) });
        expect(p.receiver.stats).toEqual(p.sender.stats);
        expect(warnings()).toEqual([]);
      });
    }
  }

  it('messages without a region (size 0, address 0) on both ends', async () => {
    const p = pair({ eagerMax: 0 });
    p.recv(0, { buf: null, tag: 1 });
    p.send(0, null, 1);
    p.send(1, null, 2);
    p.recv(1, { buf: null, tag: 2, size: 100 });
    await p.settle();
    expect(bySlot(p.sent)).toEqual([ok(0, 0), ok(1, 0)]);
    expect(bySlot(p.received)).toEqual([ok(0, 0), ok(1, 0)]);
    expect(p.sendLink.writes).toEqual([]);
  });

  it('a receive larger than the message reports the message size and leaves the rest untouched (every entry of a group)', async () => {
    const p = pair({ lanes: 2, minStripe: 4 * KiB, eagerMax: 1000 });
    const sizes = [0, 999, 1000, 1001, 9000, 200 * KiB + 1];
    const dst = sizes.map((s) => p.mem.buf(s + 4097));
    const src = sizes.map((s, i) => p.mem.buf(s, 70 + i));
    p.recv(0, ...dst.map((b, i) => ({ buf: b, tag: i })));
    sizes.forEach((_, i) => p.send(i, src[i], i));
    await p.settle();
    expect(p.received).toEqual([ok(0, ...sizes)]);
    sizes.forEach((s, i) => expectLanded(dst[i], src[i].view, `entry ${i} (${s} bytes)`));
  });
});

// --- Many requests in flight

describe('many requests in flight', () => {
  const SIZES = [0, 1, 999, 1000, 1001, 4 * 4096 + 3, 100 * KiB + 7, 300 * KiB + 1];
  for (const order of ['receives first', 'sends first', 'half the sends first'] as const) {
    for (const [name, over] of [
      ['eager up to 1000 B, 4 KiB stripes on 4 lanes', { lanes: 4, minStripe: 4 * KiB, eagerMax: 1000 }],
      ['default policy', {}],
    ] as [string, Partial<SchedulePolicy>][]) {
      it(`32 sends and 32 receives, ${order}, ${name}`, async () => {
        const p = pair(over);
        const sizes = Array.from({ length: 32 }, (_, k) => SIZES[k % SIZES.length] + (k >> 3));
        const tags = sizes.map((_, k) => k % 3);
        const src = sizes.map((s, k) => p.mem.buf(s, 100 + k, k % 8));
        const dst = sizes.map((s) => p.mem.buf(s + 10));
        const sendAll = (from: number, to: number) => {
          for (let k = from; k < to; k++) p.send(k, src[k], tags[k]);
        };
        if (order === 'sends first') sendAll(0, 32);
        if (order === 'half the sends first') sendAll(0, 16);
        for (let k = 0; k < 32; k++) p.recv(k, { buf: dst[k], tag: tags[k] });
        if (order === 'receives first') sendAll(0, 32);
        if (order === 'half the sends first') sendAll(16, 32);
        await p.settle();
        expect(bySlot(p.sent)).toEqual(sizes.map((s, k) => ok(k, s)));
        expect(bySlot(p.received)).toEqual(sizes.map((s, k) => ok(k, s)));
        for (let k = 0; k < 32; k++) {
          expectLanded(dst[k], src[k].view, `message ${k}`);
          expect(src[k].guarded()).toBe(true);
        }
        expect(p.sender.pending + p.receiver.pending).toBe(0);
        expect(warnings()).toEqual([]);
      });
    }
  }

  it('256 requests each way in flight (every slot), then every slot again', async () => {
    const p = pair({ lanes: 3, minStripe: 4 * KiB, eagerMax: 512 });
    for (let round = 0; round < 2; round++) {
      const sizes = Array.from({ length: 256 }, (_, k) => (k * 977 + round * 13) % 20_000);
      const src = sizes.map((s, k) => p.mem.buf(s, k + 1000 * round));
      const dst = sizes.map((s) => p.mem.buf(s));
      for (let k = 0; k < 256; k++) p.recv(k, { buf: dst[k], tag: 0 });
      for (let k = 0; k < 256; k++) p.send(k, src[k], 0);
      await p.settle();
      expect(bySlot(p.sent.splice(0))).toEqual(sizes.map((s, k) => ok(k, s)));
      expect(bySlot(p.received.splice(0))).toEqual(sizes.map((s, k) => ok(k, s)));
      for (let k = 0; k < 256; k++) expectLanded(dst[k], src[k].view, `round ${round}, message ${k}`);
    }
    expect(p.receiver.receivesMade).toBe(256); // the second round took the first one's back
    expect(p.sender.sendsMade).toBe(256);
  });

  it('receives and sends come from pools as large as the most in flight: one at a time over every slot makes one, 8 at a time 8', async () => {
    const p = pair({ lanes: 2, minStripe: 4 * KiB, eagerMax: 512 });
    for (const [inFlight, rounds] of [[1, 300], [8, 40]]) {
      for (let round = 0, slot = 0; round < rounds; round++) {
        const sizes = Array.from({ length: inFlight }, (_, k) => ((round * inFlight + k) * 1237) % 12_000);
        const src = sizes.map((s, k) => p.mem.buf(s, round * 8 + k));
        const dst = sizes.map((s) => p.mem.buf(s + 5));
        const slots = sizes.map(() => slot++ % 256);
        slots.forEach((sl, k) => p.recv(sl, { buf: dst[k], tag: k }));
        slots.forEach((sl, k) => p.send(sl, src[k], k));
        await p.settle();
        expect(bySlot(p.received.splice(0))).toEqual(bySlot(sizes.map((s, k) => ok(slots[k], s))));
        p.sent.splice(0);
        sizes.forEach((_, k) => expectLanded(dst[k], src[k].view, `${inFlight} in flight, round ${round}, message ${k}`));
      }
      expect(p.receiver.receivesMade).toBe(inFlight);
      expect(p.sender.sendsMade).toBe(inFlight);
    }
    expect(warnings()).toEqual([]);
  });
});

// --- Grouped receives and the matching rule

/** Sizes that mix empty, eager and striped messages for a policy. */
const mixed = (p: SchedulePolicy) => [0, 5, p.eagerMax, p.eagerMax + 1, 200 * KiB + 3, 4096, MiB + 1, 77, 3 * 4096 + 1];

describe('grouped receives', () => {
  for (const [name, over] of [
    ['default policy', {}],
    ['2 lanes, 4 KiB stripes', { lanes: 2, minStripe: 4 * KiB, eagerMax: 1000 }],
    ['1 lane, fixed stripes', { lanes: 1, minStripe: 4 * KiB, stripes: STRIPE_POLICIES[1] }],
  ] as [string, Partial<SchedulePolicy>][]) {
    for (const order of ['receive first', 'sends first'] as const) {
      it(`n = 8, buffer tags and send order shuffled, ${name}, ${order}`, async () => {
        const p = pair(over);
        const size = (tag: number) => mixed(p.policy)[tag];
        const rtags = shuffled([0, 1, 2, 3, 4, 5, 6, 7], 1);
        const order8 = shuffled([0, 1, 2, 3, 4, 5, 6, 7], 2);
        const dst = rtags.map((t) => p.mem.buf(size(t) + 10));
        const src = new Map(order8.map((t) => [t, p.mem.buf(size(t), 50 + t)]));
        if (order === 'receive first') p.recv(9, ...dst.map((b, i) => ({ buf: b, tag: rtags[i] })));
        order8.forEach((t, k) => p.send(k, src.get(t)!, t));
        if (order === 'sends first') {
          await p.settle();
          p.recv(9, ...dst.map((b, i) => ({ buf: b, tag: rtags[i] })));
        }
        await p.settle();
        expect(p.received).toEqual([ok(9, ...rtags.map(size))]);
        expect(bySlot(p.sent)).toEqual(order8.map((t, k) => ok(k, size(t))));
        rtags.forEach((t, i) => expectLanded(dst[i], src.get(t)!.view, `tag ${t}`));
      });
    }
  }

  it('a group completes only when its last message has landed', async () => {
    const p = pair({ lanes: 1, eagerMax: 100 });
    const dst = [p.mem.buf(10), p.mem.buf(10), p.mem.buf(200 * KiB)];
    p.recv(0, ...dst.map((b, i) => ({ buf: b, tag: i })));
    p.send(0, p.mem.buf(10, 1), 1);
    p.send(1, p.mem.buf(10, 2), 0);
    await p.settle();
    expect(p.received).toEqual([]);
    expect(p.receiver.pending).toBe(1);
    p.send(2, p.mem.buf(150 * KiB, 3), 2);
    await p.settle();
    expect(p.received).toEqual([ok(0, 10, 10, 150 * KiB)]);
  });
});

describe('eager messages held in the ring', () => {
  // The receiver keeps the eager messages whose payload is still in its ring in a queue that
  // keeps its storage (performance.md, item 18): it compacts once more than half of it is
  // behind its head, and grows again as messages keep coming.
  it('150 before their receives, taken one at a time, then 80 more while 50 are held: every payload intact', async () => {
    const p = pair({ lanes: 1, eagerMax: 1000 });
    const size = (k: number) => 1 + ((k * 37) % 200);
    const src = Array.from({ length: 230 }, (_, k) => p.mem.buf(size(k), k + 1));
    const dst = Array.from({ length: 230 }, (_, k) => p.mem.buf(size(k)));
    const take = async (from: number, to: number) => {
      for (let k = from; k < to; k++) {
        p.recv(k, { buf: dst[k], tag: 3 });
        await p.settle();
        expect(p.received.at(-1), `receive ${k}`).toEqual(ok(k, size(k)));
      }
    };
    for (let k = 0; k < 150; k++) p.send(k, src[k], 3);
    await p.settle();
    await take(0, 100);
    for (let k = 150; k < 230; k++) p.send(k, src[k], 3);
    await p.settle();
    await take(100, 230);
    for (let k = 0; k < 230; k++) expectLanded(dst[k], src[k].view.slice(), `message ${k}`);
    expect(p.sent.length).toBe(230);
  });
});

describe('tag push-back (the receive patterns of aws-ofi-nccl)', () => {
  // Each case: receives as lists of tags, the tags of the sends in order, and where each send
  // must land as [receive, entry].
  const CASES: [string, number[][], number[], [number, number][]][] = [
    [
      'a receive (n=1, tag 8) before a receive (n=8, tags 0..7); sends 0, 8, 1..7',
      [[8], [0, 1, 2, 3, 4, 5, 6, 7]],
      [0, 8, 1, 2, 3, 4, 5, 6, 7],
      [[1, 0], [0, 0], [1, 1], [1, 2], [1, 3], [1, 4], [1, 5], [1, 6], [1, 7]],
    ],
    [
      'two groups with equal tags, two tag-1 messages before the first group is full',
      [[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 6, 7]],
      [0, 1, 1, 2, 3, 2, 4, 5, 6, 7, 0, 3, 4, 5, 6, 7],
      [[0, 0], [0, 1], [1, 1], [0, 2], [0, 3], [1, 2], [0, 4], [0, 5], [0, 6], [0, 7], [1, 0], [1, 3], [1, 4], [1, 5], [1, 6], [1, 7]],
    ],
    [
      'three groups with equal tags, sends interleaved across them',
      [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]],
      [3, 3, 0, 3, 1, 0, 2, 1, 0, 2, 1, 2],
      [[0, 3], [1, 3], [0, 0], [2, 3], [0, 1], [1, 0], [0, 2], [1, 1], [2, 0], [1, 2], [2, 1], [2, 2]],
    ],
    [
      'three groups with tags in different orders',
      [[2, 0, 1], [1, 2, 0], [0, 1, 2]],
      [1, 1, 1, 0, 2, 0, 2, 0, 2],
      [[0, 2], [1, 0], [2, 1], [0, 1], [0, 0], [1, 2], [1, 1], [2, 0], [2, 2]],
    ],
    [
      'single and grouped receives alternating',
      [[3], [0, 1, 2, 3], [3], [0, 1, 2, 3]],
      [3, 0, 3, 1, 3, 2, 3, 0, 1, 2],
      [[0, 0], [1, 0], [1, 3], [1, 1], [2, 0], [1, 2], [3, 3], [3, 0], [3, 1], [3, 2]],
    ],
  ];

  for (const [name, recvs, sends, lands] of CASES) {
    for (const kind of ['eager', 'striped', 'mixed'] as const) {
      for (const order of ['receives first', 'sends first'] as const) {
        it(`${name}: ${kind}, ${order}`, async () => {
          const p = pair({ lanes: 3, minStripe: 4 * KiB, eagerMax: 2000 });
          const sizeOf = (k: number) => (kind === 'eager' ? 100 + k : kind === 'striped' ? 5000 + 4096 * (k % 3) + k : k % 2 ? 3000 + k : 50 + k);
          const src = sends.map((_, k) => p.mem.buf(sizeOf(k), 200 + k));
          const dst = recvs.map((tags) => tags.map(() => p.mem.buf(20_000)));
          const postAll = () => recvs.forEach((tags, r) => p.recv(r, ...tags.map((tag, i) => ({ buf: dst[r][i], tag }))));
          if (order === 'receives first') postAll();
          sends.forEach((tag, k) => p.send(k, src[k], tag));
          if (order === 'sends first') {
            await p.settle();
            expect(p.received).toEqual([]);
            postAll();
          }
          await p.settle();
          // Every receive reports the size of the message each entry took.
          const want = recvs.map((tags, r) => ok(r, ...tags.map((_, i) => sizeOf(lands.findIndex(([rr, ii]) => rr === r && ii === i)))));
          expect(bySlot(p.received)).toEqual(want);
          expect(bySlot(p.sent)).toEqual(sends.map((_, k) => ok(k, sizeOf(k))));
          lands.forEach(([r, i], k) => expectLanded(dst[r][i], src[k].view, `send ${k} (tag ${sends[k]}) in receive ${r} entry ${i}`));
          expect(warnings()).toEqual([]);
        });
      }
    }
  }

  it('the first receive to complete is the one whose messages all came first', async () => {
    const p = pair({ eagerMax: 1000, lanes: 2, minStripe: 4 * KiB });
    const a = p.mem.buf(100);
    const group = Array.from({ length: 8 }, () => p.mem.buf(10_000));
    p.recv(0, { buf: a, tag: 8 });
    p.recv(1, ...group.map((b, i) => ({ buf: b, tag: i })));
    p.send(0, p.mem.buf(9000, 1), 0);
    p.send(1, p.mem.buf(100, 2), 8);
    await p.settle();
    expect(p.received).toEqual([ok(0, 100)]);
    for (let t = 1; t < 8; t++) p.send(1 + t, p.mem.buf(10, t), t);
    await p.settle();
    expect(p.received).toEqual([ok(0, 100), ok(1, 9000, 10, 10, 10, 10, 10, 10, 10)]);
  });
});

describe('random schedules against the rule (per tag, the k-th message takes the k-th entry in posting order)', () => {
  const POLICY_SET: Partial<SchedulePolicy>[] = [
    { lanes: 3, minStripe: 4 * KiB, eagerMax: 2000 },
    { lanes: 1, minStripe: 4 * KiB, eagerMax: 16 * KiB },
    { lanes: 4, minStripe: 8 * KiB, eagerMax: 500, stripes: STRIPE_POLICIES[1], laneChoice: LANE_POLICIES[1] },
    { lanes: 2, minStripe: 4 * KiB, eagerMax: 0 },
  ];
  for (let seed = 1; seed <= 24; seed++) {
    it(`seed ${seed}`, async () => {
      const rnd = prng(seed);
      const pick = <T>(xs: readonly T[]) => xs[Math.floor(rnd() * xs.length)];
      const p = pair(POLICY_SET[seed % POLICY_SET.length]);
      const eagerMax = p.policy.eagerMax;
      // Receives: 1..8 entries, tags from a small set (repeats inside a group too).
      const recvs = Array.from({ length: 6 + Math.floor(rnd() * 20) }, () =>
        Array.from({ length: rnd() < 0.4 ? 1 : 1 + Math.floor(rnd() * 8) }, () => pick([0, 1, 2, 3])));
      // Where each entry's message comes from: per tag, entries in posting order.
      const entriesOf = new Map<number, [number, number][]>();
      recvs.forEach((tags, r) => tags.forEach((t, i) => entriesOf.set(t, [...(entriesOf.get(t) ?? []), [r, i]])));
      // Messages: as many per tag as entries, in a random order; the k-th of a tag takes its k-th entry.
      const msgTags = shuffled([...entriesOf].flatMap(([t, es]) => es.map(() => t)), seed);
      const seen = new Map<number, number>();
      const dest = msgTags.map((t) => {
        const k = seen.get(t) ?? 0;
        seen.set(t, k + 1);
        return entriesOf.get(t)![k];
      });
      const sizes = msgTags.map(() => pick([0, 1, 100, eagerMax, eagerMax + 1, 4096, 4097, 9000, 30_000, 100 * KiB + 3]));
      const src = sizes.map((s, k) => p.mem.buf(s, seed * 1000 + k, k % 5));
      const room = new Map<string, number>();
      dest.forEach(([r, i], k) => room.set(`${r}/${i}`, sizes[k] + pick([0, 0, 1, 4096])));
      const dst = recvs.map((tags, r) => tags.map((_, i) => p.mem.buf(room.get(`${r}/${i}`)!)));
      // A random interleaving of posts, sends and settles.
      let nr = 0;
      let ns = 0;
      while (nr < recvs.length || ns < msgTags.length) {
        const x = rnd();
        if (x < 0.1) await p.settle();
        else if ((x < 0.5 && nr < recvs.length) || ns === msgTags.length) {
          p.recv(nr, ...recvs[nr].map((tag, i) => ({ buf: dst[nr][i], tag })));
          nr++;
        } else {
          p.send(ns, src[ns], msgTags[ns]);
          ns++;
        }
      }
      await p.settle();
      const sizeAt = (r: number, i: number) => sizes[dest.findIndex(([rr, ii]) => rr === r && ii === i)];
      expect(bySlot(p.received)).toEqual(recvs.map((tags, r) => ok(r, ...tags.map((_, i) => sizeAt(r, i)))));
      expect(bySlot(p.sent)).toEqual(sizes.map((s, k) => ok(k, s)));
      dest.forEach(([r, i], k) => expectLanded(dst[r][i], src[k].view, `message ${k} (tag ${msgTags[k]}) in receive ${r} entry ${i}`));
      expect(warnings()).toEqual([]);
    });
  }
});

// --- Messages before their receive

describe('messages that arrive before their receive is posted', () => {
  it('eager messages wait in the receive ring; when it is full, later sends stay pending until receives free it', async () => {
    const p = pair({ eagerMax: 16 * KiB });
    const ring = recvRingBytes(16 * KiB);
    expect(ring).toBe(64 * KiB);
    const src = Array.from({ length: 8 }, (_, k) => p.mem.buf(16 * KiB, k));
    const dst = src.map(() => p.mem.buf(16 * KiB));
    src.forEach((b, k) => p.send(k, b, 0));
    await p.settle();
    // Three 16 KiB messages (with their 24-byte frames) fit in 64 KiB: those sends are done.
    const fit = Math.floor(ring / (FRAME_BYTES + 16 * KiB));
    expect(bySlot(p.sent)).toEqual(Array.from({ length: fit }, (_, k) => ok(k, 16 * KiB)));
    expect(p.sender.pending).toBe(8 - fit);
    expect(p.received).toEqual([]);
    // One receive frees one message's room: one more send goes.
    p.recv(0, { buf: dst[0], tag: 0 });
    expect(p.received).toEqual([ok(0, 16 * KiB)]); // the message was there: copied inside irecv
    await p.settle();
    expect(p.sent.length).toBe(fit + 1);
    for (let k = 1; k < 8; k++) p.recv(k, { buf: dst[k], tag: 0 });
    await p.settle();
    expect(bySlot(p.sent)).toEqual(src.map((_, k) => ok(k, 16 * KiB)));
    expect(bySlot(p.received)).toEqual(src.map((_, k) => ok(k, 16 * KiB)));
    src.forEach((b, k) => expectLanded(dst[k], b.view, `message ${k}`));
  });

  it('a waiting eager message does not hold up messages for receives already posted (while the ring has room)', async () => {
    const p = pair({ eagerMax: 1000 });
    const late = p.mem.buf(800, 1);
    const early = p.mem.buf(900, 2);
    const dLate = p.mem.buf(1000);
    const dEarly = p.mem.buf(1000);
    p.recv(0, { buf: dEarly, tag: 2 });
    p.send(0, late, 1); // no receive for tag 1 yet
    p.send(1, early, 2);
    await p.settle();
    expect(p.received).toEqual([ok(0, 900)]);
    p.recv(1, { buf: dLate, tag: 1 });
    await p.settle();
    expect(p.received).toEqual([ok(0, 900), ok(1, 800)]);
    expectLanded(dLate, late.view);
    expectLanded(dEarly, early.view);
  });

  it('striped messages wait on their lanes; a lane waits at a stripe whose message has no receive yet', async () => {
    const p = pair({ lanes: 2, minStripe: 4 * KiB, eagerMax: 0 });
    const a = p.mem.buf(12 * KiB + 5, 1);
    const b = p.mem.buf(4 * KiB, 2);
    const dA = p.mem.buf(12 * KiB + 5);
    const dB = p.mem.buf(4 * KiB);
    p.send(0, a, 1);
    p.send(1, b, 2);
    p.recv(1, { buf: dB, tag: 2 }); // b is matched, but lane 0 first carries a's stripes
    await p.settle();
    expect(p.sent).toEqual([]);
    expect(p.received).toEqual([]);
    expect(p.recvLink.reads).toEqual([]);
    p.recv(0, { buf: dA, tag: 1 });
    await p.settle();
    expect(bySlot(p.sent)).toEqual([ok(0, 12 * KiB + 5), ok(1, 4 * KiB)]);
    expect(bySlot(p.received)).toEqual([ok(0, 12 * KiB + 5), ok(1, 4 * KiB)]);
    // a: two stripes (8 KiB on lane 0, the rest on lane 1); b: one on lane 0, behind a's.
    expect(p.recvLink.reads).toEqual([
      { lane: 0, addr: addr(dA), len: 8 * KiB },
      { lane: 0, addr: addr(dB), len: 4 * KiB },
      { lane: 1, addr: addr(dA) + 8 * KiB, len: 4 * KiB + 5 },
    ]);
    expectLanded(dA, a.view);
    expectLanded(dB, b.view);
  });

  it('frames and payloads that wrap around the receive ring\'s end, at every split of a frame', async () => {
    const EAGER = 16 * KiB;
    const ring = recvRingBytes(EAGER);
    for (const order of ['receives first', 'sends first'] as const) {
      const p = pair({ eagerMax: EAGER });
      // Sizes that put the next frame `split` bytes before the ring's end (1..23: the header
      // wraps; 24..: the payload does), each followed by a 100-byte message.
      const sizes: number[] = [];
      let pos = 0;
      const push = (s: number) => {
        sizes.push(s);
        pos += FRAME_BYTES + s;
      };
      for (const split of [...Array.from({ length: 23 }, (_, i) => i + 1), 24, 25, 60, 123]) {
        let d = (Math.floor(pos / ring) + 1) * ring - split - pos;
        if (d < 2 * FRAME_BYTES) d += ring;
        while (d > FRAME_BYTES + EAGER) {
          const s = Math.min(EAGER, d - 2 * FRAME_BYTES);
          push(s);
          d -= FRAME_BYTES + s;
        }
        push(d - FRAME_BYTES);
        expect(ring - (pos % ring)).toBe(split);
        push(100);
      }
      let slot = 0;
      for (let at = 0; at < sizes.length; at += 64) {
        const chunk = sizes.slice(at, at + 64);
        const src = chunk.map((s, k) => p.mem.buf(s, at + k));
        const dst = chunk.map((s) => p.mem.buf(s));
        const first = slot;
        if (order === 'receives first') chunk.forEach((_, k) => p.recv(first + k, { buf: dst[k], tag: 0 }));
        chunk.forEach((_, k) => p.send(first + k, src[k], 0));
        if (order === 'sends first') chunk.forEach((_, k) => p.recv(first + k, { buf: dst[k], tag: 0 }));
        await p.settle();
        expect(bySlot(p.received.splice(0))).toEqual(chunk.map((s, k) => ok(first + k, s)));
        expect(bySlot(p.sent.splice(0))).toEqual(chunk.map((s, k) => ok(first + k, s)));
        chunk.forEach((_, k) => expectLanded(dst[k], src[k].view, `message ${at + k}`));
        slot = (slot + 64) % 256;
      }
      expect(warnings()).toEqual([]);
    }
  });
});

// --- A message that matches no posted receive

describe('a message that matches no posted receive', () => {
  afterEach(() => setClock(undefined));
  const TIMEOUT = 10_000;

  it('fails the link after the timeout (tick), naming the message and the tags the posted receives could take', async () => {
    const clock = testClock();
    const t0 = monoMs();
    const p = pair({ eagerMax: 1000 });
    p.recv(0, { buf: p.mem.buf(100), tag: 1 });
    p.recv(1, { buf: p.mem.buf(100), tag: 2 }, { buf: p.mem.buf(100), tag: 3 });
    p.send(0, p.mem.buf(100, 1), 7); // eager: done once handed over
    p.send(1, p.mem.buf(5000, 2), 9); // striped: pending until read
    await p.settle();
    expect(p.sent).toEqual([ok(0, 100)]);
    // Both ends stay in touch (heartbeats); only the message's wait counts.
    const beat = async (at: number) => {
      clock.set(t0 + at);
      p.sender.tick(monoMs(), TIMEOUT);
      p.receiver.tick(monoMs(), TIMEOUT);
      await p.settle();
    };
    await beat(TIMEOUT / 2);
    await beat(TIMEOUT);
    expect(p.received).toEqual([]);
    expect(warnings()).toEqual([]);
    await beat(TIMEOUT + 1);
    expect(p.received).toEqual([
      { slot: 0, code: ResultCode.INVALID_USAGE, sizes: [0] },
      { slot: 1, code: ResultCode.INVALID_USAGE, sizes: [0, 0] },
    ]);
    expect(warnings()).toContain(
      'test-recv: message 0 (tag 7, 100 bytes) has matched no posted receive for 10.0 s: posted receives have unused tags 1, 2, 3 (2 receives); failing 2 pending receive(s)',
    );
    // The link is gone: the sender's pending send fails, later requests on either end too.
    expect(p.sent).toEqual([ok(0, 100), { slot: 1, code: ResultCode.REMOTE_ERROR, sizes: [0] }]);
    expect(warnings()).toContain('test-send: the peer reset the connection (ECONNRESET); failing 1 pending send(s)');
    p.recv(2, { buf: null, tag: 7 });
    expect(p.received.at(-1)).toEqual({ slot: 2, code: ResultCode.INVALID_USAGE, sizes: [0] });
    p.send(2, null, 7);
    expect(p.sent.at(-1)).toEqual({ slot: 2, code: ResultCode.REMOTE_ERROR, sizes: [0] });
  });

  it('waits as long as no receive is posted at all (NCCL may post late), then matches', async () => {
    const clock = testClock();
    const t0 = monoMs();
    const p = pair();
    const src = p.mem.buf(100, 1);
    p.send(0, src, 7);
    await p.settle();
    for (const at of [TIMEOUT, 2 * TIMEOUT, 3 * TIMEOUT]) {
      clock.set(t0 + at);
      p.sender.tick(monoMs(), TIMEOUT);
      p.receiver.tick(monoMs(), TIMEOUT);
      await p.settle();
    }
    expect(warnings()).toEqual([]);
    const dst = p.mem.buf(100);
    p.recv(0, { buf: dst, tag: 7 });
    expect(p.received).toEqual([ok(0, 100)]);
    expectLanded(dst, src.view);
  });
});

// --- A send larger than its receive

describe('a send larger than its receive', () => {
  const CASES = [
    ['eager', { eagerMax: 1000 }, 100, 101],
    ['eager, much larger', { eagerMax: 64 * KiB }, 10, 64 * KiB],
    ['eager into an empty receive', { eagerMax: 1000 }, 0, 1],
    ['striped', { eagerMax: 1000, lanes: 4, minStripe: 4 * KiB }, 64 * KiB, 3 * MiB + 5],
    ['striped by one byte', { eagerMax: 1000, lanes: 3, minStripe: 4 * KiB }, 100 * KiB, 100 * KiB + 1],
  ] as const;

  for (const [what, over, room, size] of CASES) {
    const eager = size <= over.eagerMax;
    for (const order of ['receive first', 'send first'] as const) {
      it(`${what} (${size} into ${room}), ${order}: the receive fails at once, the ${eager ? 'next send' : 'send'} fails, nothing lands`, async () => {
        const p = pair(over);
        const dst = p.mem.buf(room);
        const src = p.mem.buf(size, 9);
        if (order === 'receive first') p.recv(0, { buf: dst, tag: 1 });
        p.send(0, src, 1);
        if (order === 'send first') {
          await p.settle();
          p.recv(0, { buf: dst, tag: 1 });
        }
        await p.settle();
        // The receive reports the message's size with INVALID_USAGE; no byte reached it.
        expect(p.received).toEqual([{ slot: 0, code: ResultCode.INVALID_USAGE, sizes: [size] }]);
        expect(allBytes(dst.region.bytes, GUARD_BYTE)).toBe(true);
        expect(p.receiver.pending).toBe(0);
        expect(warnings()).toContain(`test-recv: a ${size}-byte send does not fit the ${room}-byte receive (tag 1)`);
        const nack = `test-send: the ${size}-byte send (tag 1, message 0) does not fit the ${room}-byte receive it matched`;
        if (eager) {
          // Handed over before the NACK came back: the send succeeded, the next one carries the error.
          expect(p.sent).toEqual([ok(0, size)]);
          expect(warnings()).toContain(`${nack}; it had completed: the next send on this comm fails`);
        } else {
          expect(p.sent).toEqual([{ slot: 0, code: ResultCode.INVALID_USAGE, sizes: [size] }]);
          expect(warnings()).toContain(nack);
        }
        // The link goes on: the next messages match the next receives, bytes intact.
        const next = [17, 0, 20 * KiB, 500 * KiB + 1, size];
        const srcs = next.map((s, k) => p.mem.buf(s, 20 + k));
        const dsts = next.map((s) => p.mem.buf(s));
        next.forEach((_, k) => p.send(1 + k, srcs[k], 1));
        next.forEach((_, k) => p.recv(1 + k, { buf: dsts[k], tag: 1 }));
        await p.settle();
        expect(bySlot(p.sent).slice(1)).toEqual(next.map((s, k) => (eager && k === 0 ? { slot: 1, code: ResultCode.INVALID_USAGE, sizes: [s] } : ok(1 + k, s))));
        expect(bySlot(p.received).slice(1)).toEqual(next.map((s, k) => ok(1 + k, s)));
        next.forEach((_, k) => expectLanded(dsts[k], srcs[k].view, `message ${k}`));
      });
    }
  }

  it('a failed group takes its remaining messages (dropping their bytes), then reports', async () => {
    const p = pair({ lanes: 2, eagerMax: 1000 });
    const dst = [p.mem.buf(10), p.mem.buf(10), p.mem.buf(300 * KiB)];
    p.recv(0, ...dst.map((b, i) => ({ buf: b, tag: i })));
    const after = p.mem.buf(50);
    p.recv(1, { buf: after, tag: 0 });
    p.send(0, p.mem.buf(11, 0), 0); // too large: fails the group
    await p.settle();
    expect(p.received).toEqual([]); // two of its messages are still due
    p.send(1, p.mem.buf(10, 1), 1); // taken by the group, dropped
    p.send(2, p.mem.buf(300 * KiB, 2), 2); // taken by the group, dropped
    const last = p.mem.buf(50, 3);
    p.send(3, last, 0); // receive 1
    await p.settle();
    expect(bySlot(p.received)).toEqual([{ slot: 0, code: ResultCode.INVALID_USAGE, sizes: [11, 10, 300 * KiB] }, ok(1, 50)]);
    expectLanded(after, last.view);
    for (const b of dst) expect(allBytes(b.region.bytes, GUARD_BYTE)).toBe(true);
    expect(bySlot(p.sent)).toEqual([ok(0, 11), { slot: 1, code: ResultCode.INVALID_USAGE, sizes: [10] }, ok(2, 300 * KiB), ok(3, 50)]);
  });
});

// --- Policies

describe('every combination of the policies gives intact data', () => {
  for (const eager of EAGER_POLICIES)
    for (const stripes of STRIPE_POLICIES)
      for (const laneChoice of LANE_POLICIES)
        for (const lanes of [1, 3, 4]) {
          it(`${eager.name} / ${stripes.name} / ${laneChoice.name}, ${lanes} lane(s)`, async () => {
            const p = pair({ eager, stripes, laneChoice, lanes, eagerMax: 2000, minStripe: 4 * KiB });
            // Both ends cut and place by the one policy the link carries (the sender's).
            expect(p.sendLink.policy).toBe(p.recvLink.policy);
            const sizes = [0, 1, 2000, 2001, 4096, 4097, 3 * 4096 + 5, 40_000, 300 * KiB + 3, 17];
            const tags = [-3, 0, 1, 2, 5, -1, 7, 2147483647, -2147483648, 3];
            for (let round = 0; round < 2; round++) {
              const src = sizes.map((s, k) => p.mem.buf(s, k + 10 * round, k % 4));
              const dst = sizes.map((s) => p.mem.buf(s + 5));
              // Two groups of five, sends in a shuffled order.
              p.recv(0, ...[0, 1, 2, 3, 4].map((k) => ({ buf: dst[k], tag: tags[k] })));
              p.recv(1, ...[5, 6, 7, 8, 9].map((k) => ({ buf: dst[k], tag: tags[k] })));
              for (const k of shuffled([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], round + lanes)) p.send(k, src[k], tags[k]);
              await p.settle();
              expect(bySlot(p.received.splice(0))).toEqual([ok(0, ...sizes.slice(0, 5)), ok(1, ...sizes.slice(5))]);
              expect(bySlot(p.sent.splice(0))).toEqual(sizes.map((s, k) => ok(k, s)));
              sizes.forEach((_, k) => expectLanded(dst[k], src[k].view, `message ${k} (tag ${tags[k]})`));
            }
            // Each lane carries the same stripes, in the same order, on both ends.
            const lens = (calls: { lane: number; len: number }[]) => Array.from({ length: lanes }, (_, l) => calls.filter((c) => c.lane === l).map((c) => c.len));
            expect(lens(p.recvLink.reads)).toEqual(lens(p.sendLink.writes));
            expect(p.sendLink.writes.every((w) => w.lane >= 0 && w.lane < lanes)).toBe(true);
            expect(warnings()).toEqual([]);
          });
        }
});

// --- Close

describe('close with requests in flight', () => {
  it('the sender: an INFO line, each send ends with INVALID_USAGE, no event after; the receiver sees the CLOSE (REMOTE_ERROR)', async () => {
    const p = pair({ eagerMax: 1000 });
    const dst0 = p.mem.buf(100);
    p.recv(0, { buf: dst0, tag: 0 });
    p.recv(1, { buf: p.mem.buf(10_000), tag: 5 }); // its message never comes
    p.send(0, p.mem.buf(100, 1), 0);
    p.send(1, p.mem.buf(5000, 2), 1); // striped, no receive reads it: in flight
    p.send(2, p.mem.buf(6000, 3), 1);
    await p.settle();
    expect(p.sent).toEqual([ok(0, 100)]);
    expect(p.received).toEqual([ok(0, 100)]);
    p.sender.close();
    expect(infos()).toContain('test-send: closed with 2 send(s) in flight; cancelled');
    expect(p.sent).toEqual([ok(0, 100), { slot: 1, code: ResultCode.INVALID_USAGE, sizes: [0] }, { slot: 2, code: ResultCode.INVALID_USAGE, sizes: [0] }]);
    expect(p.sender.pending).toBe(0);
    await p.settle();
    expect(p.sent.length).toBe(3);
    expect(p.received).toEqual([ok(0, 100), { slot: 1, code: ResultCode.REMOTE_ERROR, sizes: [0] }]);
    // The receive for tag 5 can get no message now: it fails. Messages 1 and 2 (tag 1, their
    // stripes dropped by the close) still wait for a receive.
    expect(warnings()).toEqual(['test-recv: the sender closed the connection; no message is left for 1 pending receive(s) (tag 5); failing them']);
    // Later requests fail at once; a second close does nothing.
    p.send(3, null, 0);
    expect(p.sent.at(-1)).toEqual({ slot: 3, code: ResultCode.REMOTE_ERROR, sizes: [0] });
    p.recv(2, { buf: null, tag: 0 });
    expect(p.received.at(-1)).toEqual({ slot: 2, code: ResultCode.REMOTE_ERROR, sizes: [0] });
    const lines = log.length;
    p.sender.close();
    p.receiver.close();
    await p.settle();
    expect(log.length).toBe(lines);
    expect(p.sent.length + p.received.length).toBe(4 + 3);
  });

  it('the receiver: an INFO line, each receive ends with INVALID_USAGE and what it got, no event after; the sender sees the CLOSE', async () => {
    const p = pair({ eagerMax: 1000 });
    const g = [p.mem.buf(100), p.mem.buf(100)];
    const single = p.mem.buf(100);
    p.recv(0, { buf: g[0], tag: 0 }, { buf: g[1], tag: 1 });
    p.recv(1, { buf: single, tag: 2 });
    const m0 = p.mem.buf(60, 1);
    p.send(0, m0, 0); // lands in the group
    p.send(1, p.mem.buf(5000, 2), 3); // striped, no receive takes it: in flight
    await p.settle();
    expect(p.sent).toEqual([ok(0, 60)]);
    p.receiver.close();
    expect(infos()).toContain('test-recv: closed with 2 receive(s) in flight; cancelled');
    expect(p.received).toEqual([
      { slot: 0, code: ResultCode.INVALID_USAGE, sizes: [60, 0] },
      { slot: 1, code: ResultCode.INVALID_USAGE, sizes: [0] },
    ]);
    await p.settle();
    expect(p.sent).toEqual([ok(0, 60), { slot: 1, code: ResultCode.REMOTE_ERROR, sizes: [0] }]);
    expect(warnings()).toEqual(['test-send: the receiver closed the connection; failing 1 pending send(s)']);
    // Nothing reaches the closed receiver's buffers.
    p.send(2, p.mem.buf(100, 3), 1);
    await p.settle();
    expect(p.received.length).toBe(2);
    expectLanded(g[0], m0.view);
    expect(allBytes(g[1].region.bytes, GUARD_BYTE) && allBytes(single.region.bytes, GUARD_BYTE)).toBe(true);
  });

  it('both ends closed mid-transfer: each reports its own cancellations, nothing after, nothing throws', async () => {
    const p = pair({ lanes: 4, minStripe: 4 * KiB, eagerMax: 1000 });
    const dst = Array.from({ length: 8 }, () => p.mem.buf(2 * MiB));
    for (let k = 0; k < 8; k++) p.recv(k, { buf: dst[k], tag: 0 });
    for (let k = 0; k < 8; k++) p.send(k, p.mem.buf(2 * MiB, k), k < 4 ? 0 : 1);
    p.receiver.close();
    p.sender.close();
    expect(p.received.every((c) => c.code === ResultCode.INVALID_USAGE)).toBe(true);
    expect(p.sent.every((c) => c.code === ResultCode.INVALID_USAGE)).toBe(true);
    expect(p.received.length).toBe(8);
    expect(p.sent.length).toBe(8);
    await p.settle();
    expect(p.received.length + p.sent.length).toBe(16);
    expect(warnings()).toEqual([]);
  });
});

// --- The sender's end: what it sent before is still delivered

describe('the sender closes after its sends completed', () => {
  it('every message it sent reaches its receive, posted before or after the close; then the comm ends, later receives fail with a WARN', async () => {
    const p = pair({ eagerMax: 1000, lanes: 2, minStripe: 4 * KiB });
    const src = [p.mem.buf(100, 1), p.mem.buf(200, 2), p.mem.buf(300, 3), p.mem.buf(8000, 4), p.mem.buf(0)];
    const dst = src.map((b) => p.mem.buf(b.size));
    p.recv(0, { buf: dst[0], tag: 0 });
    p.recv(3, { buf: dst[3], tag: 3 }); // striped: complete once read
    src.forEach((b, k) => p.send(k, b, k));
    await p.settle();
    expect(bySlot(p.sent)).toEqual(src.map((b, k) => ok(k, b.size)));
    expect(bySlot(p.received)).toEqual([ok(0, 100), ok(3, 8000)]);
    p.sender.close();
    await p.settle();
    // The close fails nothing: messages 1, 2 and 4 wait in the receive ring for their receives.
    expect(p.received.length).toBe(2);
    expect(p.recvLink.closes).toEqual([]);
    p.recv(2, { buf: dst[2], tag: 2 });
    p.recv(1, { buf: dst[1], tag: 1 }, { buf: dst[4], tag: 4 });
    await p.settle();
    expect(p.received.slice(2)).toEqual([ok(2, 300), ok(1, 200, 0)]);
    for (const k of [0, 1, 2, 3]) expectLanded(dst[k], src[k].view, `message ${k}`);
    expect(warnings()).toEqual([]);
    // Nothing is left to deliver: the link closes gracefully, without a CLOSE to a sender that
    // has gone, and a later receive fails at once with a WARN naming why.
    expect(p.recvLink.closes).toEqual([true]);
    expect(p.recvLink.frames).toEqual([]);
    p.recv(4, { buf: p.mem.buf(10), tag: 0 });
    expect(p.received.at(-1)).toEqual({ slot: 4, code: ResultCode.REMOTE_ERROR, sizes: [0] });
    expect(warnings()).toEqual(['test-recv: the sender closed the connection; every message it sent has been delivered; the comm has failed: this receive and every later one fail']);
  });

  it('a receive no message is left for fails once the sender has ended (one WARN per comm), after the messages it took are consumed; the others still arrive', async () => {
    const p = pair({ eagerMax: 1000 });
    const src = [p.mem.buf(100, 1), p.mem.buf(100, 2), p.mem.buf(100, 3)];
    src.forEach((b, k) => p.send(k, b, k)); // tags 0, 1, 2
    await p.settle();
    p.sender.close();
    await p.settle();
    const g = [p.mem.buf(100), p.mem.buf(100)];
    p.recv(0, { buf: g[0], tag: 0 }, { buf: g[1], tag: 7 }); // tag 7 never comes
    p.recv(1, { buf: p.mem.buf(100), tag: 8 }); // nor 8
    expect(p.received).toEqual([
      { slot: 0, code: ResultCode.REMOTE_ERROR, sizes: [100, 0] },
      { slot: 1, code: ResultCode.REMOTE_ERROR, sizes: [0] },
    ]);
    expect(warnings()).toEqual(['test-recv: the sender closed the connection; no message is left for 1 pending receive(s) (tag 7); failing them']);
    expect(infos()).toContain('test-recv: the sender closed the connection; no message is left for 1 pending receive(s) (tag 8); failing them');
    // Messages 1 and 2 still wait for their receives.
    const d = [p.mem.buf(100), p.mem.buf(100)];
    p.recv(2, { buf: d[1], tag: 2 }, { buf: d[0], tag: 1 });
    await p.settle();
    expect(p.received.at(-1)).toEqual(ok(2, 100, 100));
    expectLanded(d[0], src[1].view);
    expectLanded(d[1], src[2].view);
    expect(p.recvLink.closes).toEqual([true]);
  });

  it('a data lane that ends before a stripe came fails only that message; a stripe on another lane still lands', async () => {
    const r = rawSender({ lanes: 2, minStripe: 4 * KiB, eagerMax: 100 });
    const d = [r.mem.buf(4096), r.mem.buf(4096)];
    r.recv(0, { buf: d[0], tag: 0 });
    r.recv(1, { buf: d[1], tag: 1 });
    r.raw.frame(FrameType.MSG, 0, 0, 0, 4096, 0, 0, 0, NO_OP); // one stripe, on lane 0
    r.raw.frame(FrameType.MSG, 0, 1, 1, 4096, 0, 0, 0, NO_OP); // one stripe, on lane 1
    await r.settle();
    expect(r.link.reads).toEqual([{ lane: 0, addr: addr(d[0]), len: 4096 }, { lane: 1, addr: addr(d[1]), len: 4096 }]);
    // The transport reports lane 0's read ended by the socket's end (the engine's EOF status).
    r.receiver.onOp(r.link.ops[0], STATUS_EOF, 0, 0);
    await r.settle();
    expect(r.received).toEqual([{ slot: 0, code: ResultCode.REMOTE_ERROR, sizes: [4096] }]);
    expect(warnings()).toEqual(["test-recv: the sender's data stream ended before message 0 (tag 0, 4096 bytes) fully arrived"]);
    const src = r.mem.buf(4096, 9);
    r.raw.write(1, ...split(addr(src)), 4096, NO_OP);
    await r.settle();
    expect(r.received.at(-1)).toEqual(ok(1, 4096));
    expectLanded(d[1], src.view);
  });

  it('a striped message whose send the close cancelled: its receive fails (its stripes never come); the link ends gracefully', async () => {
    const p = pair({ eagerMax: 100, lanes: 2, minStripe: 4 * KiB });
    p.send(0, p.mem.buf(5000, 1), 0); // no receive yet: its stripes are not sent
    await p.settle();
    p.sender.close();
    expect(p.sent).toEqual([{ slot: 0, code: ResultCode.INVALID_USAGE, sizes: [0] }]);
    await p.settle();
    const d = p.mem.buf(5000);
    p.recv(0, { buf: d, tag: 0 });
    await p.settle();
    expect(p.received).toEqual([{ slot: 0, code: ResultCode.REMOTE_ERROR, sizes: [5000] }]);
    expect(warnings()).toEqual(["test-recv: the sender's data stream ended before message 0 (tag 0, 5000 bytes) fully arrived"]);
    expect(allBytes(d.region.bytes, GUARD_BYTE)).toBe(true);
    expect(p.recvLink.closes).toEqual([true]);
  });
});

describe('a request posted on a comm that failed with nothing pending', () => {
  it('fails with the comm\'s error and a WARN naming it, once per comm', async () => {
    const r = rawReceiver();
    r.raw.frame(FrameType.CLOSE, 0, 0, -1, 0, 0, 0, 0, NO_OP);
    await r.settle();
    expect(warnings()).toEqual([]); // nothing was pending
    r.sender.isend(0, null, 0, 0, 0);
    r.sender.isend(1, null, 0, 0, 0);
    expect(r.sent).toEqual([0, 1].map((slot) => ({ slot, code: ResultCode.REMOTE_ERROR, sizes: [0] })));
    expect(warnings()).toEqual(['test-send: the receiver closed the connection; the comm has failed: this send and every later one fail']);
  });
});

// --- cancelRegion (deregMr with requests in flight)

describe('cancelRegion', () => {
  it('on the receiver: a receive whose message is matched but not yet read ends with INVALID_USAGE; its bytes are dropped; the link goes on', async () => {
    const p = pair({ lanes: 1, eagerMax: 100, minStripe: 4 * KiB });
    const a = p.mem.buf(5000);
    const x = p.mem.buf(5000);
    const m0 = p.mem.buf(5000, 1);
    const m1 = p.mem.buf(5000, 2);
    p.recv(0, { buf: a, tag: 0 });
    p.send(0, m0, 5); // no receive for tag 5 yet: its stripe holds up the lane
    p.send(1, m1, 0); // matched to receive 0, behind m0 on the lane
    await p.settle();
    expect(p.recvLink.reads).toEqual([]);
    expect(p.receiver.cancelRegion(p.mem.buf(10).region)).toBe(0); // a region nobody uses
    expect(p.recvLink.cancels).toEqual([]);
    expect(p.receiver.cancelRegion(a.region)).toBe(1);
    expect(p.received).toEqual([{ slot: 0, code: ResultCode.INVALID_USAGE, sizes: [5000] }]);
    // Reads already handed to the transport drop the rest of their bytes.
    expect(p.recvLink.cancels).toEqual([{ base: a.region.base, len: a.region.size }]);
    expect(p.receiver.pending).toBe(0);
    p.recv(1, { buf: x, tag: 5 });
    await p.settle();
    expect(p.received.at(-1)).toEqual(ok(1, 5000));
    expectLanded(x, m0.view);
    expect(p.recvLink.reads).toEqual([{ lane: 0, addr: addr(x), len: 5000 }, { lane: 0, addr: 0, len: 5000 }]);
    expect(allBytes(a.region.bytes, GUARD_BYTE)).toBe(true);
    // The sender never knows: its bytes were handed over.
    expect(bySlot(p.sent)).toEqual([ok(0, 5000), ok(1, 5000)]);
    const b = p.mem.buf(3000);
    const m2 = p.mem.buf(3000, 3);
    p.recv(2, { buf: b, tag: 0 });
    p.send(2, m2, 0);
    await p.settle();
    expect(p.received.at(-1)).toEqual(ok(2, 3000));
    expectLanded(b, m2.view);
    expect(warnings()).toEqual(['test-recv: the memory of 1 receive(s) in flight was deregistered; failing them']);
  });

  it('on the receiver: the unused entries of a cancelled receive leave the matching; later messages go to later receives', async () => {
    const p = pair({ eagerMax: 1000 });
    const g = [p.mem.buf(100), p.mem.buf(100), p.mem.buf(100)];
    const later = [p.mem.buf(100), p.mem.buf(100)];
    p.recv(0, { buf: g[0], tag: 0 }, { buf: g[1], tag: 1 }, { buf: g[2], tag: 2 });
    const m0 = p.mem.buf(60, 1);
    p.send(0, m0, 0);
    await p.settle();
    expect(p.receiver.cancelRegion(g[1].region)).toBe(1);
    expect(p.received).toEqual([{ slot: 0, code: ResultCode.INVALID_USAGE, sizes: [60, 0, 0] }]);
    p.recv(1, { buf: later[0], tag: 1 }, { buf: later[1], tag: 2 });
    const m = [p.mem.buf(70, 2), p.mem.buf(80, 3)];
    p.send(1, m[0], 1);
    p.send(2, m[1], 2);
    await p.settle();
    expect(p.received.at(-1)).toEqual(ok(1, 70, 80));
    expectLanded(later[0], m[0].view);
    expectLanded(later[1], m[1].view);
    expectLanded(g[0], m0.view);
    expect(allBytes(g[1].region.bytes, GUARD_BYTE) && allBytes(g[2].region.bytes, GUARD_BYTE)).toBe(true);
  });

  it('on the sender: sends in flight end with INVALID_USAGE and the link closes (the receiver fails with REMOTE_ERROR)', async () => {
    const p = pair({ eagerMax: 1000 });
    const s = p.mem.buf(5000, 1);
    p.recv(0, { buf: p.mem.buf(100), tag: 9 }); // pending: fails with the link
    p.send(0, p.mem.buf(100, 2), 3); // eager: handed over
    p.send(1, s, 4); // striped, in flight on region s
    p.send(2, p.mem.buf(6000, 3), 4); // in flight on another region
    await p.settle();
    expect(p.sent).toEqual([ok(0, 100)]);
    expect(p.sender.cancelRegion(p.mem.buf(10).region)).toBe(0);
    expect(p.sendLink.closes).toEqual([]);
    expect(p.sender.cancelRegion(s.region)).toBe(2);
    // A WARN: NCCL reports the sends' ncclInvalidUsage without a word (there was none before).
    expect(warnings()).toContain('test-send: the memory of 1 send(s) in flight was deregistered; failing 2 pending send(s) and closing the link');
    expect(p.sent).toEqual([ok(0, 100), { slot: 1, code: ResultCode.INVALID_USAGE, sizes: [0] }, { slot: 2, code: ResultCode.INVALID_USAGE, sizes: [0] }]);
    expect(p.sendLink.closes).toEqual([false]);
    await p.settle();
    expect(p.received).toEqual([{ slot: 0, code: ResultCode.REMOTE_ERROR, sizes: [0] }]);
    expect(warnings()).toContain('test-recv: the peer reset the connection (ECONNRESET); failing 1 pending receive(s)');
    p.send(3, null, 0);
    expect(p.sent.at(-1)).toEqual({ slot: 3, code: ResultCode.INVALID_USAGE, sizes: [0] });
    expect(p.sent.length).toBe(4);
  });

  it('on the sender: a region whose sends all completed is free (0, the link stays)', async () => {
    const p = pair({ eagerMax: 1000 });
    const s = p.mem.buf(5000, 1);
    const d = p.mem.buf(5000);
    p.recv(0, { buf: d, tag: 0 });
    p.send(0, s, 0);
    await p.settle();
    expect(p.sender.cancelRegion(s.region)).toBe(0);
    expect(p.receiver.cancelRegion(d.region)).toBe(0);
    p.recv(1, { buf: d, tag: 0 });
    p.send(1, s, 0);
    await p.settle();
    expect(bySlot(p.sent)).toEqual([ok(0, 5000), ok(1, 5000)]);
    expect(p.received).toEqual([ok(0, 5000), ok(1, 5000)]);
  });
});

// --- Liveness

describe('liveness', () => {
  afterEach(() => setClock(undefined));
  const TIMEOUT = 10_000;
  const HEARTBEAT = { type: FrameType.HEARTBEAT, flags: 0, tag: 0, seq: -1, size: 0, addr: 0, len: 0 };

  it('tick sends a heartbeat once a side wrote nothing for a quarter of the timeout; the peer takes it silently', async () => {
    const clock = testClock();
    const t0 = monoMs();
    const p = pair();
    p.sender.tick(t0 + TIMEOUT / 4 - 1, TIMEOUT);
    p.receiver.tick(t0 + TIMEOUT / 4 - 1, TIMEOUT);
    expect(p.sendLink.frames).toEqual([]);
    expect(p.recvLink.frames).toEqual([]);
    clock.set(t0 + TIMEOUT / 4);
    p.sender.tick(monoMs(), TIMEOUT);
    p.receiver.tick(monoMs(), TIMEOUT);
    expect(p.sendLink.frames).toEqual([HEARTBEAT]);
    expect(p.recvLink.frames).toEqual([HEARTBEAT]);
    // Written just now: no second one.
    p.sender.tick(monoMs(), TIMEOUT);
    expect(p.sendLink.frames.length).toBe(1);
    await p.settle();
    expect(p.sent.length + p.received.length).toBe(0);
    expect(log).toEqual([]);
    // Each side heard the other.
    expect(p.recvLink.heard).toBe(t0 + TIMEOUT / 4);
    expect(p.sendLink.heard).toBe(t0 + TIMEOUT / 4);
    // The link still works.
    const d = p.mem.buf(10);
    p.recv(0, { buf: d, tag: 0 });
    p.send(0, p.mem.buf(10, 1), 0);
    await p.settle();
    expect(p.received).toEqual([ok(0, 10)]);
  });

  it('heartbeats keep a quiet link with requests pending alive; a silent peer fails it after the timeout', async () => {
    const clock = testClock();
    const t0 = monoMs();
    const p = pair();
    p.recv(0, { buf: null, tag: 0 }); // pending; its message never comes
    for (let at = TIMEOUT / 4; at <= 6 * TIMEOUT; at += TIMEOUT / 4) {
      clock.set(t0 + at);
      p.sender.tick(monoMs(), TIMEOUT);
      p.receiver.tick(monoMs(), TIMEOUT);
      await p.settle();
    }
    expect(p.received).toEqual([]);
    // The sender falls silent.
    clock.set(t0 + 7 * TIMEOUT);
    p.receiver.tick(monoMs(), TIMEOUT);
    expect(p.received).toEqual([]);
    clock.set(t0 + 7 * TIMEOUT + 1);
    p.receiver.tick(monoMs(), TIMEOUT);
    expect(p.received).toEqual([{ slot: 0, code: ResultCode.REMOTE_ERROR, sizes: [0] }]);
    expect(warnings()).toEqual(['test-recv: nothing heard from the peer for 10.0 s with 1 request(s) pending; failing 1 pending receive(s)']);
    // The sender's end is reset: its next send fails.
    await p.settle();
    p.send(0, null, 0);
    expect(p.sent).toEqual([{ slot: 0, code: ResultCode.REMOTE_ERROR, sizes: [0] }]);
    // Nothing more happens on either end.
    const lines = log.length;
    p.receiver.tick(monoMs() + TIMEOUT, TIMEOUT);
    p.sender.tick(monoMs() + TIMEOUT, TIMEOUT);
    expect(log.length).toBe(lines);
  });

  it('a silent peer with nothing pending is not an error', async () => {
    const p = pair();
    p.receiver.tick(monoMs() + 100 * TIMEOUT, TIMEOUT);
    p.sender.tick(monoMs() + 100 * TIMEOUT, TIMEOUT);
    await p.settle();
    expect(warnings()).toEqual([]);
    const d = p.mem.buf(10);
    p.recv(0, { buf: d, tag: 0 });
    p.send(0, p.mem.buf(10, 1), 0);
    await p.settle();
    expect(p.received).toEqual([ok(0, 10)]);
  });

  it('a sender with a send pending fails a silent receiver', async () => {
    const p = pair({ eagerMax: 1000 });
    p.send(0, p.mem.buf(5000, 1), 0); // striped: pending until read
    await p.settle();
    p.sender.tick(monoMs() + TIMEOUT + 1000, TIMEOUT);
    expect(p.sent).toEqual([{ slot: 0, code: ResultCode.REMOTE_ERROR, sizes: [0] }]);
    expect(warnings()[0]).toMatch(/^test-send: nothing heard from the peer for 1\d\.\d s with 1 request\(s\) pending; failing 1 pending send\(s\)$/);
  });
});

// --- Ordering: NCCL gets a request back only once nothing can touch its memory

describe('a failing link is closed before its requests end', () => {
  const TIMEOUT = 10_000;

  it('the receiver, failed by its watchdog', async () => {
    const p = pair();
    p.recv(0, { buf: p.mem.buf(100), tag: 0 });
    p.recv(1, { buf: p.mem.buf(100), tag: 1 });
    p.journal.length = 0;
    p.receiver.tick(monoMs() + TIMEOUT + 1, TIMEOUT);
    expect(p.journal).toEqual(['close recv', 'received 0', 'received 1']);
  });

  it('the sender, failed by its watchdog', async () => {
    const p = pair({ eagerMax: 100 });
    p.send(0, p.mem.buf(5000, 1), 0);
    p.send(1, p.mem.buf(5000, 2), 0);
    await p.settle();
    p.journal.length = 0;
    p.sender.tick(monoMs() + TIMEOUT + 1, TIMEOUT);
    expect(p.journal).toEqual(['close send', 'sent 0', 'sent 1']);
  });

  it('the sender, whose memory was deregistered (cancelRegion); then the receiver, reset by it', async () => {
    const p = pair({ eagerMax: 100 });
    const s = p.mem.buf(5000, 1);
    p.recv(0, { buf: p.mem.buf(100), tag: 9 });
    p.send(0, s, 0);
    p.send(1, p.mem.buf(5000, 2), 0);
    await p.settle();
    p.journal.length = 0;
    p.sender.cancelRegion(s.region);
    expect(p.journal).toEqual(['close send', 'sent 0', 'sent 1']);
    p.journal.length = 0;
    await p.settle();
    expect(p.journal).toEqual(['close recv', 'received 0']);
  });
});

// --- Hand-driven peers: frames a well-behaved peer never sends

/** One end of a link driven by hand: frames it receives are collected (and their ring space released). */
function handDriven(raw: StreamLink): Frame[] {
  const got: Frame[] = [];
  let at = 0;
  const events: LinkEvents = {
    onOp: () => {},
    onRx: () => {
      for (;;) {
        if (((raw.rx.written() - at) >>> 0) < FRAME_BYTES) break;
        const f: Frame = { type: FrameType.MSG, flags: 0, tag: 0, seq: 0, size: 0 };
        expect(readFrame(raw.rx, at, f)).toBeUndefined();
        got.push(f);
        at = (at + FRAME_BYTES + (f.flags & FLAG_EAGER ? f.size : 0)) >>> 0;
      }
      raw.rx.release(at);
    },
  };
  raw.attach(events);
  return got;
}

/** A Receiver whose sender is driven by hand. */
function rawSender(over: Partial<SchedulePolicy> = {}) {
  const policy = policyOf(over);
  const mem = new TestMemory();
  const [a, b] = memoryLinkPair(mem.regions, policy, { send: SEND_RING_BYTES, recv: recvRingBytes(policy.eagerMax) }, 'raw');
  const link = new SpyLink(b);
  const received: Completion[] = [];
  const receiver = new Receiver(link, (slot, code, sizes, n) => received.push({ slot, code, sizes: Array.from(sizes).slice(0, n) }), 'test-recv');
  receiver.start();
  const frames = handDriven(a);
  const args = newRecvArgs();
  const recv = (slot: number, ...entries: { buf: Buf | null; tag: number }[]) => {
    args.n = entries.length;
    entries.forEach((e, i) => {
      args.regions[i] = e.buf?.region ?? null;
      args.offsets[i] = e.buf?.offset ?? 0;
      args.sizes[i] = e.buf?.size ?? 0;
      args.tags[i] = e.tag;
    });
    receiver.irecv(slot, args);
  };
  return { mem, raw: a, link, receiver, received, frames, recv, settle: () => settle(() => [received.length, frames.length]) };
}

/** A Sender whose receiver is driven by hand. */
function rawReceiver(over: Partial<SchedulePolicy> = {}) {
  const policy = policyOf(over);
  const mem = new TestMemory();
  const [a, b] = memoryLinkPair(mem.regions, policy, { send: SEND_RING_BYTES, recv: recvRingBytes(policy.eagerMax) }, 'raw');
  const sent: Completion[] = [];
  const sender = new Sender(a, (slot, code, sizes, n) => sent.push({ slot, code, sizes: Array.from(sizes).slice(0, n) }), 'test-send');
  sender.start();
  const frames = handDriven(b);
  return { mem, raw: b, sender, sent, frames, settle: () => settle(() => [sent.length, frames.length]) };
}

/** A hand-driven sender's receiver with receives of tags 0 and 1+2 pending; act(raw) fails both with REMOTE_ERROR. */
async function twoPendingFail(act: (raw: StreamLink) => void) {
  const r = rawSender();
  r.recv(0, { buf: r.mem.buf(10), tag: 0 });
  r.recv(1, { buf: r.mem.buf(10), tag: 1 }, { buf: r.mem.buf(10), tag: 2 });
  act(r.raw);
  await r.settle();
  expect(r.received).toEqual([
    { slot: 0, code: ResultCode.REMOTE_ERROR, sizes: [0] },
    { slot: 1, code: ResultCode.REMOTE_ERROR, sizes: [0, 0] },
  ]);
  return r;
}

describe('the receiver against a hand-driven sender', () => {
  it('NACKs a message that does not fit, with its sequence number and the receive\'s size', async () => {
    const r = rawSender();
    r.recv(0, { buf: r.mem.buf(10), tag: 0 });
    r.recv(1, { buf: r.mem.buf(10), tag: 0 });
    const src = r.mem.buf(12, 1);
    r.raw.frame(FrameType.MSG, FLAG_EAGER, 0, 0, 4, ...split(addr(src)), 4, NO_OP);
    r.raw.frame(FrameType.MSG, FLAG_EAGER, 0, 1, 12, ...split(addr(src)), 12, NO_OP);
    await r.settle();
    expect(r.frames).toEqual([{ type: FrameType.NACK, flags: 0, tag: 0, seq: 1, size: 10 }]);
    expect(r.received).toEqual([ok(0, 4), { slot: 1, code: ResultCode.INVALID_USAGE, sizes: [12] }]);
  });

  it('ignores heartbeats', async () => {
    const r = rawSender();
    r.recv(0, { buf: null, tag: 0 });
    for (let i = 0; i < 3; i++) r.raw.frame(FrameType.HEARTBEAT, 0, 0, -1, 0, 0, 0, 0, NO_OP);
    r.raw.frame(FrameType.MSG, FLAG_EAGER, 0, 0, 0, 0, 0, 0, NO_OP);
    await r.settle();
    expect(r.received).toEqual([ok(0, 0)]);
    expect(log).toEqual([]);
  });

  it.each<[string, (raw: StreamLink) => void, string]>([
    ['type 2 (the ACK of protocol version 1)', (raw) => raw.frame(2, 0, 0, 0, 0, 0, 0, 0, NO_OP), 'test-recv: protocol error from the sender: unknown frame type 2'],
    ['type 9', (raw) => raw.frame(9, 0, 0, 0, 0, 0, 0, 0, NO_OP), 'test-recv: protocol error from the sender: unknown frame type 9'],
    ['a bad size', (raw) => raw.frame(FrameType.MSG, 0, 0, 0, -5, 0, 0, 0, NO_OP), 'test-recv: protocol error from the sender: bad size -5'],
    ['a message out of sequence', (raw) => raw.frame(FrameType.MSG, 0, 0, 5, 0, 0, 0, 0, NO_OP), 'test-recv: protocol error: message 5 arrived, expected 0'],
    ['a NACK', (raw) => raw.frame(FrameType.NACK, 0, 0, 0, 10, 0, 0, 0, NO_OP), 'test-recv: protocol error: unexpected frame type 3 from the sender'],
    ['an inline payload larger than the receive ring', (raw) => raw.frame(FrameType.MSG, FLAG_EAGER, 0, 0, MiB, 0, 0, 0, NO_OP),
      'test-recv: protocol error: a 1048576-byte inline payload is larger than the receive ring (262144 bytes)'],
    ['a reset', (raw) => raw.close(false), 'test-recv: the peer reset the connection (ECONNRESET)'],
    // Its stripes would be listed in one loop (2^28 of them with the fixed policy's 4 KiB), until the heap ran out.
    ['a message larger than any send', (raw) => raw.frame(FrameType.MSG, 0, 0, 0, 2 ** 40, 0, 0, 0, NO_OP),
      'test-recv: protocol error: message 0 of 1099511627776 bytes, more than any send (2147483647)'],
  ])('%s fails every pending receive with REMOTE_ERROR', async (_what, act, why) => {
    const r = await twoPendingFail(act);
    expect(warnings()).toEqual([`${why}; failing 2 pending receive(s)`]);
    // The link is closed (hard) and later receives fail at once.
    expect(r.link.closes).toEqual([false]);
    r.recv(2, { buf: null, tag: 0 });
    expect(r.received.at(-1)).toEqual({ slot: 2, code: ResultCode.REMOTE_ERROR, sizes: [0] });
  });

  it.each<[string, (raw: StreamLink) => void, string]>([
    ['a CLOSE', (raw) => raw.frame(FrameType.CLOSE, 0, 0, -1, 0, 0, 0, 0, NO_OP), 'test-recv: the sender closed the connection'],
    ['an orderly end without CLOSE', (raw) => raw.close(true), 'test-recv: the peer closed the connection'],
  ])('%s with no message sent: the pending receives fail with REMOTE_ERROR (one WARN), the link closes gracefully', async (_what, act, why) => {
    const r = await twoPendingFail(act);
    expect(warnings()).toEqual([`${why}; no message is left for 2 pending receive(s) (tags 0, 1, 2); failing them`]);
    // Nothing is left to deliver: the link closes (gracefully) and later receives fail at once,
    // the first with a WARN naming why.
    expect(r.link.closes).toEqual([true]);
    expect(r.link.frames).toEqual([]); // no CLOSE back to a sender that has gone
    r.recv(2, { buf: null, tag: 0 });
    r.recv(3, { buf: null, tag: 0 });
    expect(r.received.slice(2)).toEqual([2, 3].map((slot) => ({ slot, code: ResultCode.REMOTE_ERROR, sizes: [0] })));
    expect(warnings().slice(1)).toEqual([`${why}; every message it sent has been delivered; the comm has failed: this receive and every later one fail`]);
  });

  it('a frame whose handling throws fails the comm (the exception used to leave the completion handler, the comm going on)', async () => {
    const r = rawSender();
    r.recv(0, { buf: r.mem.buf(10), tag: 0 });
    (r.receiver as unknown as { matcher: { arrive: () => void } }).matcher.arrive = () => {
      throw new RangeError('an assumption broke');
    };
    r.raw.frame(FrameType.MSG, 0, 0, 0, 0, 0, 0, 0, NO_OP);
    await r.settle();
    expect(r.received).toEqual([{ slot: 0, code: ResultCode.REMOTE_ERROR, sizes: [0] }]);
    expect(warnings()).toEqual(['test-recv: protocol error: handling frame type 1 (message 0) failed: an assumption broke; failing 1 pending receive(s)']);
  });

  it('65535 messages in flight that match nothing: the next one fails the comm (it used to throw out of the completion handler and be lost)', async () => {
    const r = rawSender();
    r.recv(0, { buf: r.mem.buf(10), tag: 0 });
    for (let seq = 0; seq < 0xffff; seq++) r.raw.frame(FrameType.MSG, 0, 7 + (seq % 5), seq, 0, 0, 0, 0, NO_OP);
    await r.settle();
    expect(r.received).toEqual([]);
    expect(warnings()).toEqual([]);
    r.raw.frame(FrameType.MSG, 0, 7, 0xffff, 0, 0, 0, 0, NO_OP);
    await r.settle();
    expect(r.received).toEqual([{ slot: 0, code: ResultCode.REMOTE_ERROR, sizes: [0] }]);
    expect(warnings()).toEqual(['test-recv: protocol error: more than 65535 messages in flight on one link (message 65535); failing 1 pending receive(s)']);
  }, 60_000);

  // DESIGN.md: "nothing may read or write a buffer after NCCL gets it back". A group that fails
  // while an earlier message's stripe is still being read into it is reported once that read ended.
  it('no byte lands in a group after it was reported failed', async () => {
    const r = rawSender({ lanes: 1 });
    const big = r.mem.buf(64 * KiB);
    r.recv(0, { buf: big, tag: 1 }, { buf: r.mem.buf(10), tag: 2 });
    const src = r.mem.buf(68 * KiB, 5);
    r.raw.frame(FrameType.MSG, 0, 1, 0, 64 * KiB, 0, 0, 0, NO_OP); // striped: its bytes come later
    r.raw.frame(FrameType.MSG, FLAG_EAGER, 2, 1, 100, ...split(addr(src)), 100, NO_OP); // does not fit: fails the group
    await r.settle();
    expect(r.frames).toEqual([{ type: FrameType.NACK, flags: 0, tag: 0, seq: 1, size: 10 }]);
    expect(r.received).toEqual([]); // not yet: 64 KiB are still being read into it
    expect(r.link.reads).toEqual([{ lane: 0, addr: addr(big), len: 64 * KiB }]);
    r.raw.write(0, ...split(addr(src)), 64 * KiB, NO_OP);
    await r.settle();
    expect(r.received).toEqual([{ slot: 0, code: ResultCode.INVALID_USAGE, sizes: [64 * KiB, 100] }]);
    const atCompletion = big.region.bytes.slice();
    r.raw.write(0, ...split(addr(src) + 64 * KiB), 4 * KiB, NO_OP);
    await r.settle();
    expect(big.region.bytes).toEqual(atCompletion);
  });
});

describe('cancelRegion with reads in flight (a hand-driven sender: bytes that come later)', () => {
  it('a receive cancelled for one region drops the bytes still due for its buffers in other regions', async () => {
    const r = rawSender({ lanes: 1 });
    const a = r.mem.buf(4096);
    const b = r.mem.buf(4096);
    const c = r.mem.buf(4096); // another receive's buffer in flight: keeps its bytes
    r.recv(0, { buf: a, tag: 0 }, { buf: b, tag: 1 });
    r.recv(1, { buf: c, tag: 2 });
    r.raw.frame(FrameType.MSG, 0, 1, 0, 4096, 0, 0, 0, NO_OP); // striped, for b: its read waits for the bytes
    r.raw.frame(FrameType.MSG, 0, 2, 1, 4096, 0, 0, 0, NO_OP); // striped, for c
    await r.settle();
    expect(r.link.reads).toEqual([{ lane: 0, addr: addr(b), len: 4096 }, { lane: 0, addr: addr(c), len: 4096 }]);
    expect(r.receiver.cancelRegion(a.region)).toBe(1);
    expect(r.received).toEqual([{ slot: 0, code: ResultCode.INVALID_USAGE, sizes: [0, 4096] }]);
    expect(r.link.cancels).toEqual([{ base: a.region.base, len: a.region.size }, { base: addr(b), len: 4096 }]);
    // NCCL has receive 0 back: nothing may land in b any more. c is untouched by the cancel.
    const src = r.mem.buf(8192, 7);
    r.raw.write(0, ...split(addr(src)), 8192, NO_OP);
    await r.settle();
    expect(allBytes(b.region.bytes, GUARD_BYTE)).toBe(true);
    expect(allBytes(a.region.bytes, GUARD_BYTE)).toBe(true);
    expect(r.received.at(-1)).toEqual(ok(1, 4096));
    expectLanded(c, src.view.subarray(4096));
  });
});

describe('the sender against a hand-driven receiver', () => {
  it('a NACK fails the send it names while pending; for one already done, the next send fails', async () => {
    const r = rawReceiver({ eagerMax: 100, lanes: 1 });
    r.sender.isend(0, r.mem.buf(50, 1).region, 64, 50, 0); // eager: done once handed over
    const big = r.mem.buf(5000, 2);
    r.sender.isend(1, big.region, big.offset, 5000, 0); // striped: pending until read
    await r.settle();
    expect(r.sent).toEqual([ok(0, 50)]);
    r.raw.frame(FrameType.NACK, 0, 0, 1, 10, 0, 0, 0, NO_OP);
    r.raw.frame(FrameType.NACK, 0, 0, 0, 10, 0, 0, 0, NO_OP);
    await r.settle();
    expect(r.sent).toEqual([ok(0, 50)]);
    r.raw.read(0, 0, 0, 5000, NO_OP); // the receiver drops the stripe
    await r.settle();
    expect(r.sent).toEqual([ok(0, 50), { slot: 1, code: ResultCode.INVALID_USAGE, sizes: [5000] }]);
    expect(warnings()).toEqual([
      'test-send: the 5000-byte send (tag 0, message 1) does not fit the 10-byte receive it matched',
      'test-send: the 50-byte send (tag 0, message 0) does not fit the 10-byte receive it matched; it had completed: the next send on this comm fails',
    ]);
    r.sender.isend(2, null, 0, 0, 0);
    r.sender.isend(3, null, 0, 0, 0);
    await r.settle();
    expect(r.sent.slice(2)).toEqual([{ slot: 2, code: ResultCode.INVALID_USAGE, sizes: [0] }, ok(3, 0)]);
    // Every message went, the failed ones too: the receiver counts on them.
    expect(r.frames.map((f) => [f.type, f.flags, f.seq])).toEqual([
      [FrameType.MSG, FLAG_EAGER, 0], [FrameType.MSG, 0, 1], [FrameType.MSG, FLAG_EAGER, 2], [FrameType.MSG, FLAG_EAGER, 3],
    ]);
  });

  it('a NACK naming a message sent long ago, whose send it no longer holds, fails the next send', async () => {
    const r = rawReceiver();
    // One at a time: each send's object serves the next, so message 0's is gone.
    for (let i = 0; i < 20; i++) {
      r.sender.isend(i % 16, null, 0, 0, 0);
      await r.settle();
    }
    expect(r.sender.sendsMade).toBe(1);
    r.raw.frame(FrameType.NACK, 0, 0, 0, 10, 0, 0, 0, NO_OP);
    await r.settle();
    expect(warnings()).toEqual(['test-send: message 0 does not fit the 10-byte receive it matched; it had completed: the next send on this comm fails']);
    r.sender.isend(0, null, 0, 0, 0);
    await r.settle();
    expect(r.sent.at(-1)).toEqual({ slot: 0, code: ResultCode.INVALID_USAGE, sizes: [0] });
  });

  it('a 257th send in flight (NCCL has 256 request slots per comm) fails the comm with INTERNAL_ERROR, itself included', async () => {
    const r = rawReceiver();
    for (let i = 0; i < 257; i++) r.sender.isend(i % 256, null, 0, 0, 0); // none has completed yet
    await r.settle();
    expect(r.sent).toHaveLength(257);
    expect(r.sent.every((c) => c.code === ResultCode.INTERNAL_ERROR)).toBe(true);
    expect(r.sender.sendsMade).toBe(256);
    expect(warnings()[0]).toMatch(/^test-send: more than 256 sends in flight/);
  });

  it.each<[string, (raw: StreamLink) => void, string]>([
    ['a MSG', (raw) => raw.frame(FrameType.MSG, 0, 0, 0, 0, 0, 0, 0, NO_OP), 'test-send: protocol error: unexpected frame type 1 from the receiver'],
    ['type 2', (raw) => raw.frame(2, 0, 0, 0, 0, 0, 0, 0, NO_OP), 'test-send: protocol error from the receiver: unknown frame type 2'],
    ['a CLOSE', (raw) => raw.frame(FrameType.CLOSE, 0, 0, -1, 0, 0, 0, 0, NO_OP), 'test-send: the receiver closed the connection'],
    ['a reset', (raw) => raw.close(false), 'test-send: the peer reset the connection (ECONNRESET)'],
    ['a NACK for a message never sent', (raw) => raw.frame(FrameType.NACK, 0, 0, 99, 10, 0, 0, 0, NO_OP), 'test-send: protocol error: a NACK for message 99, which was never sent (2 sent)'],
  ])('%s from the receiver fails every pending send with REMOTE_ERROR', async (_what, act, why) => {
    const r = rawReceiver({ eagerMax: 100 });
    const big = r.mem.buf(5000, 2);
    r.sender.isend(0, big.region, big.offset, 5000, 0);
    r.sender.isend(1, big.region, big.offset, 4000, 1);
    act(r.raw);
    await r.settle();
    expect(r.sent).toEqual([0, 1].map((slot) => ({ slot, code: ResultCode.REMOTE_ERROR, sizes: [0] })));
    expect(warnings()).toEqual([`${why}; failing 2 pending send(s)`]);
  });
});

describe('op tokens', () => {
  it.each([0x3ffffe, 0x7ffffe])('stay below 2^30 (small integers to V8, never the engine\'s markers), even where a slot\'s or a message\'s generation wraps (from %i)', async (gen) => {
    const p = pair({ eagerMax: 1000 });
    // White box: a pool of 256 sends whose next is the highest id (the top token bits), its
    // generation fast-forwarded; and the receiver's first message's.
    const sender = p.sender as unknown as { ops: object[]; freeOps: object[] };
    for (let id = 0; id < 256; id++) sender.ops.push({ id, slot: 0, gen: id === 255 ? gen : 0, active: false, writes: 0, seq: 0, size: 0, tag: 0, code: 0, region: null });
    sender.freeOps.push(...sender.ops);
    const msgs = (p.receiver as unknown as { msgs: { gen: number }[] }).msgs;
    const roundTrip = async (slot: number, size: number, seed: number) => {
      const d = p.mem.buf(size);
      const s = p.mem.buf(size, seed);
      p.recv(slot, { buf: d, tag: 0 });
      p.send(slot, s, 0);
      await p.settle();
      expect(p.sent.at(-1)).toEqual(ok(slot, size));
      expect(p.received.at(-1)).toEqual(ok(slot, size));
      expectLanded(d, s.view);
    };
    for (let i = 0; i < 3; i++) await roundTrip(255, 100, i);
    // Striped messages: the receiver's reads carry its message tokens.
    for (let i = 0; i < 3; i++) {
      if (msgs.length) msgs[0].gen = 0x3ffe;
      await roundTrip(254, 5000, i);
    }
    const tokens = [...p.sendLink.ops, ...p.recvLink.ops].filter((op) => op !== NO_OP);
    expect(tokens.length).toBeGreaterThan(0);
    for (const op of tokens) {
      expect(Number.isInteger(op) && op >= 0 && op < 2 ** 30).toBe(true);
      expect(op).not.toBe(CQE_RX);
      expect(op).not.toBe(OP_REMOTE);
    }
  });
});
