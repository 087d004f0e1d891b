// Stripe policy: how a message that is not eager is cut. Stripes are a multiple of 4 KiB (but
// the last); both ends compute the same cut from the size, so data lanes carry raw bytes.

export interface StripePolicy {
  readonly id: number;
  readonly name: string;
  /** The length of every stripe but the last of a message of size > 0 bytes. */
  length(size: number, minStripe: number, lanes: number): number;
}

const ALIGN = 4096;
const align = (n: number) => Math.ceil(n / ALIGN) * ALIGN;

/** One stripe per lane, at least minStripe (TSNET_MIN_STRIPE): few, large writes. */
export const even: StripePolicy = {
  id: 1,
  name: 'even',
  length: (size, minStripe, lanes) => align(Math.max(minStripe, size / Math.max(1, lanes))),
};

/** Always minStripe: many equal stripes, spread over the lanes in turn. */
export const fixed: StripePolicy = {
  id: 2,
  name: 'fixed',
  length: (_size, minStripe) => minStripe,
};

/** Stripes of a message: count, given the stripe length. */
export const stripeCount = (size: number, length: number) => (size === 0 ? 0 : Math.ceil(size / length));
