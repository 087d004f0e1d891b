// Eager or striped, and the stripes of a message: every byte exactly once, in order on
// each lane, 4 KiB aligned, round-robin from the given lane.
import { describe, expect, it } from 'vitest';
import { type SchedulePolicy, type Stripe, isEager, stripes } from '../../plugin/protocol/schedule';

const KiB = 1024;
const MiB = 1024 * KiB;
const GiB = 1024 * MiB;
const ALIGN = 4096;
const DEFAULT: SchedulePolicy = { eagerMax: 16 * KiB, minStripe: 128 * KiB, lanes: 4 };

/** Checks every promise stripes() makes, and returns the stripes. */
function check(size: number, first: number, p: SchedulePolicy): Stripe[] {
  const s = stripes(size, first, p);
  expect(s.length).toBeGreaterThan(0);
  // Every byte exactly once, in order.
  let at = 0;
  for (const x of s) {
    expect(x.offset).toBe(at);
    expect(x.length).toBeGreaterThan(0);
    at += x.length;
  }
  expect(at).toBe(size);
  // Round-robin from first.
  s.forEach((x, i) => expect(x.lane).toBe((first + i) % p.lanes));
  // Aligned and at least minStripe, but the last.
  for (const x of s.slice(0, -1)) {
    expect(x.length % ALIGN).toBe(0);
    expect(x.length).toBeGreaterThanOrEqual(p.minStripe);
    expect(x.offset % ALIGN).toBe(0);
  }
  // At most one stripe per lane, so each lane's bytes are in order by construction.
  expect(s.length).toBeLessThanOrEqual(p.lanes);
  const perLane = new Map<number, number>();
  for (const x of s) {
    expect(x.offset).toBeGreaterThanOrEqual(perLane.get(x.lane) ?? 0);
    perLane.set(x.lane, x.offset + x.length);
  }
  return s;
}

describe('isEager', () => {
  it('is true up to eagerMax and false above', () => {
    expect(isEager(0, DEFAULT)).toBe(true);
    expect(isEager(1, DEFAULT)).toBe(true);
    expect(isEager(16 * KiB, DEFAULT)).toBe(true);
    expect(isEager(16 * KiB + 1, DEFAULT)).toBe(false);
    expect(isEager(8 * MiB, DEFAULT)).toBe(false);
  });

  it('with eagerMax 0 only empty messages are eager', () => {
    const p = { ...DEFAULT, eagerMax: 0 };
    expect(isEager(0, p)).toBe(true);
    expect(isEager(1, p)).toBe(false);
  });

  it('is always true without data lanes', () => {
    const p = { ...DEFAULT, lanes: 0 };
    for (const size of [0, 1, 16 * KiB + 1, 8 * MiB, 2 ** 40]) expect(isEager(size, p)).toBe(true);
  });
});

describe('stripes', () => {
  it('gives a message just above eagerMax one stripe on the first lane', () => {
    expect(check(16 * KiB + 1, 0, DEFAULT)).toEqual([{ lane: 0, offset: 0, length: 16 * KiB + 1 }]);
    expect(check(16 * KiB + 1, 3, DEFAULT)).toEqual([{ lane: 3, offset: 0, length: 16 * KiB + 1 }]);
    const p = { ...DEFAULT, eagerMax: 0 };
    expect(check(1, 2, p)).toEqual([{ lane: 2, offset: 0, length: 1 }]);
  });

  it('keeps a message up to minStripe whole', () => {
    expect(check(128 * KiB, 1, DEFAULT)).toEqual([{ lane: 1, offset: 0, length: 128 * KiB }]);
    expect(check(128 * KiB + 1, 1, DEFAULT)).toEqual([
      { lane: 1, offset: 0, length: 128 * KiB },
      { lane: 2, offset: 128 * KiB, length: 1 },
    ]);
  });

  it('cuts 8 MiB into one 2 MiB stripe per lane', () => {
    expect(check(8 * MiB, 0, DEFAULT)).toEqual([0, 1, 2, 3].map((i) => ({ lane: i, offset: i * 2 * MiB, length: 2 * MiB })));
  });

  it('starts round-robin at the given lane and wraps', () => {
    expect(check(8 * MiB, 3, DEFAULT).map((s) => s.lane)).toEqual([3, 0, 1, 2]);
    expect(check(8 * MiB, 2, DEFAULT).map((s) => s.lane)).toEqual([2, 3, 0, 1]);
  });

  it('aligns stripes to 4 KiB when the size is not a multiple of the lanes', () => {
    const s = check(1_000_001, 0, { ...DEFAULT, minStripe: 4 * KiB });
    expect(s.map((x) => x.length)).toEqual([253952, 253952, 253952, 238145]);
  });

  it('uses fewer lanes than it has when stripes would fall below minStripe', () => {
    expect(check(300 * KiB, 0, DEFAULT).map((s) => s.length)).toEqual([128 * KiB, 128 * KiB, 44 * KiB]);
  });

  it('with one lane sends everything as one stripe on lane 0', () => {
    const p = { ...DEFAULT, lanes: 1 };
    for (const size of [16 * KiB + 1, 128 * KiB + 1, 8 * MiB + 3, 5 * GiB]) {
      expect(check(size, 0, p)).toEqual([{ lane: 0, offset: 0, length: size }]);
    }
  });

  it.each([
    [4, 2 ** 40],
    [4, 2 ** 40 + 1],
    [64, 8 * GiB + 12345],
    [7, 2 ** 50 + 12345],
    [64, Number.MAX_SAFE_INTEGER],
  ])('covers very large sizes exactly (%i lanes, %i bytes)', (lanes, size) => {
    const s = check(size, 5 % lanes, { ...DEFAULT, lanes });
    expect(s.length).toBe(lanes);
  });

  it.each([1, 2, 3, 4, 8, 16, 64])('covers many sizes exactly over %i lanes', (lanes) => {
    const p = { eagerMax: 0, minStripe: 4 * KiB, lanes };
    for (const size of [1, 4095, 4096, 4097, 65535, 65536, 65537, 524287, 524288, 1_000_003, 8 * MiB - 1]) {
      for (const first of [0, lanes - 1]) check(size, first, p);
    }
  });

  // BUG (minor, plugin/protocol/schedule.ts:26 with plugin/config.ts:93): stripes() promises
  // "Stripes are a multiple of 4 KiB (but the last)", but TSNET_MIN_STRIPE accepts any value
  // from 4096 up, and length = max(minStripe, ...) takes it unaligned: minStripe 5000 gives
  // 5000-byte stripes.
  it('stripes stay 4 KiB aligned for a minStripe that is not a multiple of 4 KiB', () => {
    check(20_000, 0, { eagerMax: 0, minStripe: 5000, lanes: 64 });
  });
});
