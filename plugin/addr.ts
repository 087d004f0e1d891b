// Addresses on the data path, as two small integers.

/**
 * Every address passed to a call on the data path goes as hi * ADDR_SPLIT + lo: two small
 * integers (hiOf, loOf). An address past V8's small integers (2^31 in Node's builds, 2^30 with
 * pointer compression) is a heap number, boxed anew wherever it crosses a call V8 did not
 * inline: 16 bytes of garbage per message over TCP and 71 over libfabric shm where NCCL's
 * buffers lie, above 2^32 (test/integration/tcp.test.ts, "garbage on the data path"). lo may
 * pass ADDR_SPLIT (an offset added to it) while it stays below 2^30.
 */
export const ADDR_SPLIT = 2 ** 24;
/** The high part of address a (a whole number below 2^53): a small integer to V8. */
export function hiOf(a: number): number {
  return Math.floor(a / ADDR_SPLIT);
}
/** The low part of address a: a - hiOf(a) * ADDR_SPLIT. */
export function loOf(a: number): number {
  return a - hiOf(a) * ADDR_SPLIT;
}
