// Stripe schedule: how a written message is cut over rails. Messages smaller than smallMax go
// whole on one rail, round-robin; larger ones are cut into clamp(ceil(size / minStripe), 1,
// rails) stripes, reduced to a divisor of the rail count, each a multiple of 128 bytes (but
// the last), on consecutive rails from a second round-robin counter (aws-ofi-nccl's threshold
// scheduler). A stripe longer than the provider's max_msg_size is cut again on its rail.
// With a home rail (TSNET_OFI_SMALL_RAIL=comm) small messages, and messages of one stripe up to
// homeMax bytes (the eager limit: latency-bound ones), go on it; longer messages of one stripe
// take turns over the rails as above (NCCL's 128 KiB AllToAll chunks, all on one rail, copied
// on one I/O thread, took AllToAll at 1 GiB from 10.02 to 8.28 GB/s), and messages of several
// stripes are cut as above.

export const STRIPE_ALIGN = 128;
/** Segments one sub-receive may be written in: 4 bits of immediate data, 0 and 15 reserved. */
export const MAX_SEGMENTS = 14;

/** Stripes for size bytes over rails. */
export function stripeCount(size: number, rails: number, minStripe: number): number {
  let n = Math.ceil(size / minStripe);
  if (n < 1) n = 1;
  if (n > rails) n = rails;
  while (n > 1 && rails % n !== 0) n--;
  return n;
}

/** The length of every stripe but the last. */
export function stripeBytes(size: number, count: number): number {
  return Math.ceil(Math.ceil(size / count) / STRIPE_ALIGN) * STRIPE_ALIGN;
}

/** A message's segments: rail, offset and length of each, in preallocated arrays. */
export class Schedule {
  n = 0;
  readonly rail = new Int32Array(MAX_SEGMENTS);
  readonly offset = new Float64Array(MAX_SEGMENTS);
  readonly len = new Float64Array(MAX_SEGMENTS);
}

export class StripeScheduler {
  private small = 0;
  private big = 0;

  constructor(
    private readonly rails: number,
    private readonly minStripe: number,
    private readonly smallMax: number,
    private readonly maxMsgSize: number,
    private readonly home = -1,
    private readonly homeMax = Infinity,
  ) {}

  /** The rail of the next small message (eager messages take turns with small writes), or home. */
  pickSmall(): number {
    if (this.home >= 0) return this.home;
    const rail = this.small;
    this.small = (rail + 1) % this.rails;
    return rail;
  }

  /** Fills out with size's segments; false when they would exceed MAX_SEGMENTS. */
  plan(size: number, out: Schedule): boolean {
    out.n = 0;
    if (size < this.smallMax) return this.add(out, this.pickSmall(), 0, size);
    const count = stripeCount(size, this.rails, this.minStripe);
    if (count === 1 && this.home >= 0 && size <= this.homeMax) return this.add(out, this.home, 0, size);
    const each = stripeBytes(size, count);
    // 128-byte rounding can leave the last stripes empty (tiny messages): those are not sent.
    let rail = this.big;
    let used = 0;
    for (let off = 0; used === 0 || off < size; used++) {
      const len = Math.min(each, size - off);
      if (!this.add(out, rail, off, len)) return false;
      off += len;
      rail = (rail + 1) % this.rails;
    }
    this.big = (this.big + used) % this.rails;
    return true;
  }

  private add(out: Schedule, rail: number, offset: number, len: number): boolean {
    // A stripe larger than the provider's largest message is cut on its rail.
    do {
      if (out.n === MAX_SEGMENTS) return false;
      const piece = len > this.maxMsgSize ? this.maxMsgSize : len;
      out.rail[out.n] = rail;
      out.offset[out.n] = offset;
      out.len[out.n] = piece;
      out.n++;
      offset += piece;
      len -= piece;
    } while (len > 0);
    return true;
  }
}
