// TSNET_SPIN_MAX_US: the busy-poll window from the threads' wake-up delays (plugin/spin.ts).
import { describe, expect, it } from 'vitest';
import { SPIN_MIN_WAKES, SpinAdapter } from '../../plugin/spin';
import { WAKE_BUCKETS, type WakeDelays } from '../../plugin/stats';

/** Cumulative delays: counts[k] wake-ups in bucket k (below 2^(k+1) us). */
function delays(counts: Record<number, number>): WakeDelays {
  const buckets = new Array(WAKE_BUCKETS).fill(0);
  let count = 0;
  for (const [k, n] of Object.entries(counts)) {
    buckets[Number(k)] = n;
    count += n;
  }
  return { count, sumUs: 0, maxUs: 0, buckets };
}

describe('SpinAdapter', () => {
  it('grows at once to 4 x the p90 of late wake-ups, capped at the maximum', () => {
    const a = new SpinAdapter(200, 5000);
    expect(a.current).toBe(200);
    // 10 wake-ups, 9 below 16 us, 1 below 512 us: p90 below 16 us, 4 x 16 = 64 < 200: stays
    expect(a.next([delays({ 3: 9, 8: 1 })])).toEqual({ us: 200 });
    // 10 more, all below 512 us (bucket 8): 4 x 512 = 2048
    expect(a.next([delays({ 3: 9, 8: 11 })])).toEqual({ us: 2048, why: '10 wake-up(s), p90 < 512 us' });
    // 10 more in the last bucket (32 ms and more): capped
    expect(a.next([delays({ 3: 9, 8: 11, [WAKE_BUCKETS - 1]: 10 })])).toEqual({ us: 5000, why: `10 wake-up(s), p90 < ${2 ** WAKE_BUCKETS} us` });
    expect(a.current).toBe(5000);
  });

  it('sums the threads, counts only what is new, and acts on no fewer than 8 wake-ups, added up over ticks', () => {
    const a = new SpinAdapter(200, 5000);
    const few = SPIN_MIN_WAKES - 1;
    expect(a.next([delays({ 9: few })])).toEqual({ us: 200 }); // 7: too few, kept for later
    // one more on another thread: 8 since the start, p90 below 1024 us
    expect(a.next([delays({ 9: few }), delays({ 9: 1 })])).toEqual({ us: 4096, why: '8 wake-up(s), p90 < 1024 us' });
    expect(a.next([delays({ 9: few }), delays({ 9: 1 })])).toEqual({ us: 4096 }); // nothing new
    const b = new SpinAdapter(200, 5000);
    expect(b.next([delays({ 9: 4 }), delays({ 9: 4 })]).us).toBe(4096);
  });

  it('halves per tick while wake-ups are fast, never below the base; keeps the window when there were too few', () => {
    const a = new SpinAdapter(200, 5000);
    let n = 10;
    expect(a.next([delays({ 12: n })]).us).toBe(5000); // below 8192 us: 4 x 8192, capped
    const fast = () => {
      n += 10;
      return a.next([delays({ 12: 10, 2: n - 10 })]); // 10 new below 8 us each tick
    };
    expect(a.next([delays({ 12: 10 })])).toEqual({ us: 5000 }); // nothing new: stays
    expect(fast()).toEqual({ us: 2500, why: '10 wake-up(s), p90 < 8 us' });
    expect(fast().us).toBe(1250);
    expect(fast().us).toBe(625);
    expect(fast().us).toBe(312);
    expect(fast().us).toBe(200);
    expect(fast()).toEqual({ us: 200 });
  });
});
