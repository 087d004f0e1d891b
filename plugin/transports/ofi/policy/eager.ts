// Eager threshold: which sends go before their control message, into the receiver's bounce
// buffers, with an 8-byte header. The limit counts the header (as aws-ofi-nccl's
// OFI_NCCL_EAGER_MAX_SIZE does): with the default 8192, 8184 bytes go eager and 8185 do not.

export const EAGER_HEADER_BYTES = 8;
/** Eager sends a comm may have whose control message it has not seen (NCCL_NET_MAX_REQUESTS). */
export const EAGER_MAX_QUEUED = 32;

/** The limit a comm uses: its own, capped by what the peer's bounce buffers hold; -1: no eager. */
export function eagerLimit(configured: number, peerCapacity: number): number {
  if (configured < 0 || peerCapacity < 0) return -1;
  return configured < peerCapacity ? configured : peerCapacity;
}

/** True when size bytes and the header fit an eager send under limit. */
export function fitsEager(size: number, limit: number): boolean {
  return limit >= 0 && size + EAGER_HEADER_BYTES <= limit;
}

/**
 * Whether a send that matched no known receive may go eager now: it fits, fewer than
 * EAGER_MAX_QUEUED eager sends wait for their control message, no earlier send waits for
 * one (an eager message's target is computed as if every earlier unmatched send were eager),
 * and its payload is not GPU memory where the endpoint cannot send GPU memory eager
 * (gpuEager false: libfabric before 1.18 cannot gather the host header and a GPU payload).
 */
export function mayGoEager(size: number, limit: number, queued: number, waiting: number, fromGpu = false, gpuEager = true): boolean {
  return waiting === 0 && queued < EAGER_MAX_QUEUED && fitsEager(size, limit) && (gpuEager || !fromGpu);
}
