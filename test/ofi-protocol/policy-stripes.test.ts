// Stripe schedule (aws-ofi-nccl's threshold scheduler): small messages whole and round-robin,
// large ones in a divisor-of-rails number of 128-byte-aligned stripes on consecutive rails.
import { describe, expect, it } from 'vitest';
import { MAX_SEGMENTS, STRIPE_ALIGN, Schedule, StripeScheduler, stripeBytes, stripeCount } from '../../plugin/transports/ofi/policy/stripes';

const KiB = 1024;

function plan(s: StripeScheduler, size: number): { rail: number; offset: number; len: number }[] {
  const out = new Schedule();
  expect(s.plan(size, out)).toBe(true);
  const segs = [];
  for (let i = 0; i < out.n; i++) segs.push({ rail: out.rail[i], offset: out.offset[i], len: out.len[i] });
  // Every byte exactly once, in order.
  let at = 0;
  for (const g of segs) {
    expect(g.offset).toBe(at);
    at += g.len;
  }
  expect(at).toBe(size);
  return segs;
}

describe('stripeCount', () => {
  it('is ceil(size / minStripe) clamped to 1..rails and reduced to a divisor of rails', () => {
    expect(stripeCount(0, 4, 128 * KiB)).toBe(1);
    expect(stripeCount(1, 4, 128 * KiB)).toBe(1);
    expect(stripeCount(128 * KiB, 4, 128 * KiB)).toBe(1);
    expect(stripeCount(128 * KiB + 1, 4, 128 * KiB)).toBe(2);
    expect(stripeCount(3 * 128 * KiB, 4, 128 * KiB)).toBe(2); // 3 does not divide 4
    expect(stripeCount(4 * 128 * KiB, 4, 128 * KiB)).toBe(4);
    expect(stripeCount(64 * 128 * KiB, 4, 128 * KiB)).toBe(4);
    expect(stripeCount(5 * KiB, 3, KiB)).toBe(3);
    expect(stripeCount(2 * KiB, 3, KiB)).toBe(1); // 2 does not divide 3
  });

  it('stripes are multiples of 128 bytes but the last', () => {
    expect(stripeBytes(1000, 2)).toBe(512);
    expect(stripeBytes(28 * KiB, 4) % STRIPE_ALIGN).toBe(0);
    expect(stripeBytes(100, 1)).toBe(128);
  });
});

describe('StripeScheduler', () => {
  it('sends messages below the small limit whole, round-robin over rails', () => {
    const s = new StripeScheduler(3, 128 * KiB, 64, 1 << 30);
    expect([0, 1, 63, 10, 0].map((n) => plan(s, n)[0].rail)).toEqual([0, 1, 2, 0, 1]);
    expect(plan(s, 63)).toHaveLength(1);
  });

  it('stripes large messages over consecutive rails from a second counter', () => {
    const s = new StripeScheduler(4, 4 * KiB, 64, 1 << 30);
    const a = plan(s, 28 * KiB);
    expect(a.map((g) => g.rail)).toEqual([0, 1, 2, 3]);
    expect(a.map((g) => g.len)).toEqual([7 * KiB, 7 * KiB, 7 * KiB, 7 * KiB]);
    const b = plan(s, 8 * KiB); // 2 stripes, next rails
    expect(b.map((g) => g.rail)).toEqual([0, 1]);
    const c = plan(s, 8 * KiB);
    expect(c.map((g) => g.rail)).toEqual([2, 3]);
    // small messages keep their own counter
    expect(plan(s, 10)[0].rail).toBe(0);
  });

  it('at exactly the small limit a message takes the striped path', () => {
    const s = new StripeScheduler(2, 32, 64, 1 << 30);
    plan(s, 10); // small counter -> rail 1 next
    expect(plan(s, 64)).toEqual([{ rail: 0, offset: 0, len: 64 }]); // big counter, one 128-byte-rounded stripe
    expect(plan(s, 63)[0].rail).toBe(1);
  });

  it('never sends an empty stripe when 128-byte rounding covers the message early', () => {
    const s = new StripeScheduler(4, 64, 64, 1 << 30);
    const segs = plan(s, 256); // 4 stripes wanted, each rounded up to 128: two carry it all
    expect(segs.map((g) => g.len)).toEqual([128, 128]);
    expect(plan(s, 256).map((g) => g.rail)).toEqual([2, 3]);
  });

  it('with a home rail (TSNET_OFI_SMALL_RAIL=comm) small and single-stripe messages stay on it; larger ones still stripe', () => {
    const s = new StripeScheduler(4, 4 * KiB, 64, 1 << 30, 3);
    expect([1, 2, 3].map(() => s.pickSmall())).toEqual([3, 3, 3]);
    expect([0, 10, 63, 64, 4 * KiB].map((n) => plan(s, n))).toEqual([0, 10, 63, 64, 4 * KiB].map((n) => [{ rail: 3, offset: 0, len: n }]));
    expect(plan(s, 16 * KiB).map((g) => g.rail)).toEqual([0, 1, 2, 3]); // 4 stripes: every rail
    expect(plan(s, 8 * KiB).map((g) => g.rail)).toEqual([0, 1]); // 2 stripes, from the second counter
    expect(plan(s, 100)).toEqual([{ rail: 3, offset: 0, len: 100 }]);
    // a stripe larger than max_msg_size is cut on the home rail
    expect(new StripeScheduler(2, 1 << 20, 64, 1000, 1).plan(2500, new Schedule())).toBe(true);
    const cut = plan(new StripeScheduler(2, 1 << 20, 64, 1000, 1), 2500);
    expect(cut).toEqual([{ rail: 1, offset: 0, len: 1000 }, { rail: 1, offset: 1000, len: 1000 }, { rail: 1, offset: 2000, len: 500 }]);
  });

  it('with a home rail, single-stripe messages longer than homeMax take turns over the rails', () => {
    const s = new StripeScheduler(4, 128 * KiB, 64, 1 << 30, 2, 8 * KiB);
    expect([10, 8 * KiB].map((n) => plan(s, n)[0].rail)).toEqual([2, 2]);
    expect([1, 2, 3, 4, 5].map(() => plan(s, 128 * KiB))).toEqual([0, 1, 2, 3, 0].map((rail) => [{ rail, offset: 0, len: 128 * KiB }]));
    expect(plan(s, 8 * KiB + 1)[0].rail).toBe(1);
    expect(plan(s, 100)[0].rail).toBe(2);
    expect(plan(s, 512 * KiB).map((g) => g.rail)).toEqual([2, 3, 0, 1]); // 4 stripes, from the same counter
  });

  it('cuts a stripe larger than max_msg_size on its rail, and refuses more than 14 segments', () => {
    const s = new StripeScheduler(2, 1024, 64, 1000);
    const segs = plan(s, 4000);
    expect(segs.every((g) => g.len <= 1000)).toBe(true);
    expect(new Set(segs.map((g) => g.rail))).toEqual(new Set([0, 1]));
    expect(new StripeScheduler(1, 1024, 64, 100).plan(100 * MAX_SEGMENTS + 1, new Schedule())).toBe(false);
    expect(new StripeScheduler(1, 1024, 64, 100).plan(100 * MAX_SEGMENTS, new Schedule())).toBe(true);
  });
});
