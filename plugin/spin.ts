// TSNET_SPIN_MAX_US: a busy-poll window that follows how late sleeping threads wake.
//
// After activity a thread polls for the window (TSNET_SPIN_US) before it sleeps. Where waking a
// sleeping thread is slow (a VM that parks idle vCPUs, say), one late wake-up lets the other
// threads' windows run out too, and every later message pays wake-ups: on one H100 x 2 lease
// every tsnet path had millisecond tails that threads which never sleep removed
// (docs/performance.md). The adapter reads the wake-up delays the threads measure
// (native/wake_delays.h) once per watchdog tick and sets the window to 4 x their p90, between
// TSNET_SPIN_US and TSNET_SPIN_MAX_US: it grows at once when wake-ups are late, halves per tick
// while they are fast, and stays put while there are too few to tell (they add up over ticks).
import { WAKE_BUCKETS, type WakeDelays, quantileBucket, sumBuckets } from './stats';

/** Wake-ups a tick needs before the adapter acts on them. */
export const SPIN_MIN_WAKES = 8;
/** The window is this many times the wake-ups' p90. */
export const SPIN_FACTOR = 4;

export class SpinAdapter {
  private last: number[] = new Array(WAKE_BUCKETS).fill(0);
  private window: number;

  constructor(
    readonly base: number,
    readonly max: number,
  ) {
    this.window = base;
  }

  get current(): number {
    return this.window;
  }

  /**
   * The window (µs) from the threads' cumulative wake-up delays; `why` says what moved it, or
   * undefined when it stayed.
   */
  next(all: WakeDelays[]): { us: number; why?: string } {
    const total = sumBuckets(all);
    const delta = new Float64Array(WAKE_BUCKETS);
    let n = 0;
    for (let k = 0; k < WAKE_BUCKETS; k++) n += delta[k] = total[k] - this.last[k];
    if (n < SPIN_MIN_WAKES) return { us: this.window }; // too few: they count with the next ones
    this.last = total;
    // The upper bound of the bucket holding the p90 (the last bucket: its lower bound, doubled).
    const p90 = 2 ** (quantileBucket(delta, 0.9) + 1);
    const want = SPIN_FACTOR * p90;
    const before = this.window;
    if (want > this.window) this.window = Math.min(this.max, want);
    else if (want < this.window / 2) this.window = Math.max(this.base, Math.floor(this.window / 2));
    if (this.window === before) return { us: this.window };
    return { us: this.window, why: `${n} wake-up(s), p90 < ${p90} us` };
  }
}
