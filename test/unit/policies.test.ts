// The protocol's policies (plugin/protocol/policies/), each a pure function: which messages go
// eager, how a striped message is cut (4 KiB aligned, at least minStripe, every byte once),
// which lane a message starts on, and how they are found by name (configuration) and by id
// (the HELLO).
import { describe, expect, it } from 'vitest';
import {
  DEFAULT_POLICIES, EAGER_POLICIES, LANE_POLICIES, STRIPE_POLICIES, type StripePolicy, byId, byName, configuredPolicy, stripeCount,
} from '../../plugin/protocol/policies';
import { threshold } from '../../plugin/protocol/policies/eager';
import { byTag, roundRobin } from '../../plugin/protocol/policies/lanes';
import { even, fixed } from '../../plugin/protocol/policies/stripes';

const KiB = 1024;
const MiB = 1024 * KiB;
const GiB = 1024 * MiB;
const ALIGN = 4096;

describe('eager: threshold', () => {
  it('is eager up to eagerMax and striped above', () => {
    for (const eagerMax of [0, 1, 4096, 64 * KiB, MiB]) {
      expect(threshold.eager(0, eagerMax, 4)).toBe(true);
      expect(threshold.eager(eagerMax, eagerMax, 4)).toBe(true);
      expect(threshold.eager(eagerMax + 1, eagerMax, 4)).toBe(false);
      expect(threshold.eager(8 * GiB, eagerMax, 4)).toBe(false);
    }
    expect(threshold.eager(1, 0, 1)).toBe(false);
  });

  it('is always eager without data lanes', () => {
    for (const size of [0, 1, 64 * KiB + 1, 8 * MiB, 2 ** 40]) expect(threshold.eager(size, 64 * KiB, 0)).toBe(true);
  });
});

/** Checks every promise of a stripe policy for one message; returns the stripe lengths. */
function cut(p: StripePolicy, size: number, minStripe: number, lanes: number): number[] {
  const len = p.length(size, minStripe, lanes);
  expect(Number.isSafeInteger(len)).toBe(true);
  expect(len % ALIGN).toBe(0);
  expect(len).toBeGreaterThanOrEqual(minStripe);
  const n = stripeCount(size, len);
  expect(n).toBeGreaterThan(0);
  const lens = Array.from({ length: n }, (_, k) => Math.min(len, size - k * len));
  // Every byte exactly once: all stripes full but the last, which holds 1..len bytes.
  expect(lens.slice(0, -1).every((l) => l === len)).toBe(true);
  expect(lens.at(-1)!).toBeGreaterThan(0);
  expect(lens.at(-1)!).toBeLessThanOrEqual(len);
  expect((n - 1) * len + lens.at(-1)!).toBe(size);
  return lens;
}

describe('stripes: even', () => {
  it('cuts one stripe per lane, 4 KiB aligned', () => {
    expect(cut(even, 8 * MiB, 128 * KiB, 4)).toEqual([2 * MiB, 2 * MiB, 2 * MiB, 2 * MiB]);
    expect(cut(even, 1_000_001, 4 * KiB, 4)).toEqual([253952, 253952, 253952, 238145]);
    expect(cut(even, 3 * MiB + 5, 4 * KiB, 3)).toEqual([1052672, 1052672, 1040389]);
  });

  it('keeps stripes at least minStripe: fewer stripes than lanes for middling sizes, one for small ones', () => {
    expect(cut(even, 300 * KiB, 128 * KiB, 4)).toEqual([128 * KiB, 128 * KiB, 44 * KiB]);
    expect(cut(even, 128 * KiB, 128 * KiB, 4)).toEqual([128 * KiB]);
    expect(cut(even, 128 * KiB + 1, 128 * KiB, 4)).toEqual([128 * KiB, 1]);
    expect(cut(even, 1, 128 * KiB, 4)).toEqual([1]);
    expect(cut(even, 64 * KiB + 1, 128 * KiB, 4)).toEqual([64 * KiB + 1]);
  });

  it('with one lane (or zero) sends a message as one stripe', () => {
    for (const size of [1, 128 * KiB + 1, 8 * MiB + 3, 5 * GiB]) {
      expect(cut(even, size, 128 * KiB, 1)).toEqual([size]);
      expect(cut(even, size, 128 * KiB, 0)).toEqual([size]);
    }
  });

  it.each([1, 2, 3, 4, 8, 16, 64])('cuts at most one stripe per lane (%i lanes, many sizes)', (lanes) => {
    for (const minStripe of [4 * KiB, 128 * KiB])
      for (const size of [1, 4095, 4096, 4097, 65535, 65536, 65537, 524287, 524288, 1_000_003, 8 * MiB - 1, 2 ** 40 + 1, 2 ** 50 + 12345]) {
        const lens = cut(even, size, minStripe, lanes);
        expect(lens.length).toBeLessThanOrEqual(lanes);
        // Alignment may leave lanes idle for small sizes, never once each lane's share dwarfs 4 KiB.
        if (size >= lanes * minStripe && size >= ALIGN * lanes * lanes) expect(lens.length).toBe(lanes);
      }
  });
});

describe('stripes: fixed', () => {
  it('always cuts minStripe, whatever the lanes', () => {
    expect(cut(fixed, 8 * MiB, 128 * KiB, 4)).toEqual(new Array(64).fill(128 * KiB));
    expect(cut(fixed, 10 * KiB + 1, 4 * KiB, 3)).toEqual([4 * KiB, 4 * KiB, 2 * KiB + 1]);
    expect(cut(fixed, 4 * KiB, 4 * KiB, 1)).toEqual([4 * KiB]);
    expect(cut(fixed, 1, 64 * KiB, 64)).toEqual([1]);
    expect(cut(fixed, 2 ** 40, 64 * MiB, 4).length).toBe(2 ** 14);
    for (const lanes of [1, 2, 5, 64]) expect(fixed.length(12345, 8 * KiB, lanes)).toBe(8 * KiB);
  });
});

describe('stripeCount', () => {
  it('counts the stripes of a length; an empty message has none', () => {
    expect(stripeCount(0, 4096)).toBe(0);
    expect(stripeCount(1, 4096)).toBe(1);
    expect(stripeCount(4096, 4096)).toBe(1);
    expect(stripeCount(4097, 4096)).toBe(2);
    expect(stripeCount(2 ** 40, 4096)).toBe(2 ** 28);
  });
});

describe('lanes: roundrobin', () => {
  it('starts where the link\'s stripe counter stands, modulo the lanes, whatever the tag', () => {
    expect([0, 1, 2, 3, 4, 5, 6, 7].map((c) => roundRobin.first(c, 0, 3))).toEqual([0, 1, 2, 0, 1, 2, 0, 1]);
    for (const tag of [-7, 0, 1, 12345]) expect(roundRobin.first(10, tag, 4)).toBe(2);
    expect(roundRobin.first(2 ** 40 + 3, 0, 4)).toBe(3);
    expect(roundRobin.first(123, 0, 1)).toBe(0);
  });

  it('spreads consecutive messages over the lanes as both ends count them', () => {
    // Messages of 1, 3, 2, 1 stripes over 4 lanes start on lanes 0, 1, 0, 2.
    let counter = 0;
    const starts = [1, 3, 2, 1].map((n) => {
      const first = roundRobin.first(counter, 0, 4);
      counter += n;
      return first;
    });
    expect(starts).toEqual([0, 1, 0, 2]);
  });
});

describe('lanes: tag', () => {
  it('starts a peer\'s messages on the lane of its tag, whatever the counter', () => {
    expect([0, 1, 2, 3, 4, 5, 6, 7].map((tag) => byTag.first(0, tag, 3))).toEqual([0, 1, 2, 0, 1, 2, 0, 1]);
    for (const counter of [0, 1, 99]) expect(byTag.first(counter, 6, 4)).toBe(2);
  });

  it('maps negative tags into range too', () => {
    expect([-1, -2, -3, -4, -5].map((tag) => byTag.first(0, tag, 4))).toEqual([3, 2, 1, 0, 3]);
    expect(byTag.first(0, -2147483648, 3)).toBe(((-2147483648 % 3) + 3) % 3);
    for (const lanes of [1, 2, 3, 7, 64])
      for (const tag of [-2147483648, -65, -1, 0, 1, 63, 2147483647]) {
        const l = byTag.first(5, tag, lanes);
        expect(Number.isInteger(l) && l >= 0 && l < lanes).toBe(true);
        expect(Object.is(l, -0)).toBe(false);
      }
  });
});

describe('the registry', () => {
  const KINDS: readonly (readonly { id: number; name: string }[])[] = [EAGER_POLICIES, STRIPE_POLICIES, LANE_POLICIES];

  it('has unique names and ids per kind, and the defaults first', () => {
    for (const list of KINDS) {
      expect(new Set(list.map((p) => p.id)).size).toBe(list.length);
      expect(new Set(list.map((p) => p.name)).size).toBe(list.length);
      // Ids travel in one HELLO byte; 0 means none.
      for (const p of list) expect(p.id >= 1 && p.id <= 255).toBe(true);
    }
    expect(DEFAULT_POLICIES).toEqual({ eager: EAGER_POLICIES[0], stripes: STRIPE_POLICIES[0], laneChoice: LANE_POLICIES[0] });
    expect(DEFAULT_POLICIES).toEqual({ eager: threshold, stripes: even, laneChoice: roundRobin });
  });

  it('byName and byId find each policy, and nothing else', () => {
    expect(EAGER_POLICIES.map((p) => p.name)).toEqual(['threshold']);
    expect(STRIPE_POLICIES.map((p) => p.name)).toEqual(['even', 'fixed']);
    expect(LANE_POLICIES.map((p) => p.name)).toEqual(['roundrobin', 'tag']);
    for (const list of KINDS) {
      for (const p of list) {
        expect(byName(list, p.name)).toBe(p);
        expect(byId(list, p.id)).toBe(p);
      }
      expect(byName(list, 'nope')).toBeUndefined();
      expect(byName(list, '')).toBeUndefined();
      expect(byId(list, 0)).toBeUndefined();
      expect(byId(list, 255)).toBeUndefined();
    }
    expect(byName(STRIPE_POLICIES, 'EVEN')).toBeUndefined(); // names are exact
  });

  it('configuredPolicy takes a configuration\'s settings: its data sockets are the lanes', () => {
    const p = configuredPolicy({ eagerMax: 1000, minStripe: 8192, nsocks: 3, eagerPolicy: threshold, stripePolicy: fixed, lanePolicy: byTag });
    expect(p).toEqual({ eagerMax: 1000, minStripe: 8192, lanes: 3, eager: threshold, stripes: fixed, laneChoice: byTag });
  });
});
