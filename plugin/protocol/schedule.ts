// Where the bytes of a message travel. Small messages go whole on the control lane (eager)
// or on one data lane; large ones are cut into stripes spread round-robin over the data
// lanes. Sender and receiver compute the same schedule from the message size and a shared
// per-link counter, so data lanes carry raw payload with no per-stripe header.

export interface Stripe {
  lane: number;
  offset: number;
  length: number;
}

export interface SchedulePolicy {
  eagerMax: number;
  minStripe: number;
  lanes: number;
}

/** True when the message travels inline after its header on the control lane. */
export function isEager(size: number, p: SchedulePolicy): boolean {
  return size <= p.eagerMax || p.lanes === 0;
}

/**
 * The stripes of a non-eager message of size bytes; first is the lane the first stripe
 * goes to. Stripes are a multiple of 4 KiB (but the last), at least minStripe, and at most
 * one per lane unless the message is very large.
 */
export function stripes(size: number, first: number, p: SchedulePolicy): Stripe[] {
  const align = 4096;
  const length = Math.ceil(Math.max(p.minStripe, size / p.lanes) / align) * align;
  const out: Stripe[] = [];
  for (let offset = 0, i = 0; offset < size; offset += length, i++) {
    out.push({ lane: (first + i) % p.lanes, offset, length: Math.min(length, size - offset) });
  }
  return out;
}
