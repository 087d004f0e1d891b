// Arrays of objects that hot code pushes into.
//
// A `[]` literal starts as an array of small integers. The first object pushed into it changes
// its kind, and code V8 compiled for arrays of objects (on the warm-up's comms, say) is thrown
// away when it meets a new comm's array still of the first kind: under NCCL that happened for
// every new comm, on the data path (performance.md, item 16).

/** An empty array whose elements are objects from the start. */
export function objectArray<T>(): T[] {
  const a: T[] = [undefined as T];
  a.pop();
  return a;
}

/** Copies below this many bytes go byte by byte, with no view to allocate. */
export const COPY_LOOP_BELOW = 256;

type Copy = (dst: Uint8Array, dstOffset: number, src: Uint8Array, srcOffset: number, len: number) => void;
let ascending: Copy | undefined;

/**
 * The engine's copy that stores every byte after the ones below it (native/engine/engine_js.cc,
 * copyAscending); plugin/index.ts sets it. Without it (tests without the engine) copies go
 * through TypedArray.set.
 */
export function setAscendingCopy(fn: Copy | undefined): void {
  ascending = fn;
}

/**
 * Copies len bytes from src at srcOffset to dst at dstOffset (not overlapping), in ascending
 * address order: the bytes of an eager message go into NCCL's buffer, where the GPU may poll
 * them while they are written (NCCL's LL and LL128 protocols: a flag at the end of each 8-byte
 * word or 128-byte line says the bytes before it are there), so no byte may show before those
 * below it. TypedArray.set does not keep that order (glibc's memcpy), and made wrong results
 * under LL128 (docs/protocol.md, "Eager copies"). Below COPY_LOOP_BELOW bytes a loop does it and
 * allocates nothing (`dst.set(src.subarray(...))` made a view per call, about 100 bytes of
 * garbage per message: performance.md, item 18); above, the engine's copy.
 */
export function copyBytes(dst: Uint8Array, dstOffset: number, src: Uint8Array, srcOffset: number, len: number): void {
  if (len < COPY_LOOP_BELOW) {
    for (let i = 0; i < len; i++) dst[dstOffset + i] = src[srcOffset + i];
    return;
  }
  if (ascending) ascending(dst, dstOffset, src, srcOffset, len);
  else dst.set(src.subarray(srcOffset, srcOffset + len), dstOffset);
}
