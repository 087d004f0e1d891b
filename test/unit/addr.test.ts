// plugin/addr.ts: an address as two small integers, hi * ADDR_SPLIT + lo.
import { describe, expect, it } from 'vitest';
import { ADDR_SPLIT, hiOf, loOf } from '../../plugin/addr';
import { split } from '../support/addr';

const SMI_MAX = 2 ** 30; // V8's small integers end at 2^30 with pointer compression, 2^31 without

describe('addresses as hi, lo', () => {
  const samples = [0, 1, 4095, ADDR_SPLIT - 1, ADDR_SPLIT, 2 ** 30 + 17, 2 ** 32 - 1, 2 ** 32, 0x5555_5555_4000, 0x7f12_3456_7890, 0xffff_ffff_ffff, 2 ** 53 - 1];

  it('give the address back exactly, each part a whole number below 2^30 (up to 2^53)', () => {
    for (const a of samples) {
      const [hi, lo] = split(a);
      expect(hi * ADDR_SPLIT + lo, `0x${a.toString(16)}`).toBe(a);
      expect(Number.isInteger(hi) && Number.isInteger(lo)).toBe(true);
      expect(lo).toBeGreaterThanOrEqual(0);
      expect(lo).toBeLessThan(ADDR_SPLIT);
      expect(hi).toBeLessThan(a < 2 ** 48 ? 2 ** 24 : 2 ** 29); // user-space addresses lie below 2^48
    }
  });

  it('an offset below 2^30 - 2^24 added to lo stays a small integer and names the same byte', () => {
    const a = 0x7f12_3456_7890;
    for (const off of [0, 1, 4096, 2 ** 20, 2 ** 29]) {
      const lo = loOf(a) + off;
      expect(lo).toBeLessThan(SMI_MAX);
      expect(hiOf(a) * ADDR_SPLIT + lo).toBe(a + off);
    }
  });
});
