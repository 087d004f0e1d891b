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

/**
 * Copies len bytes from src at srcOffset to dst at dstOffset. `dst.set(src.subarray(...))`
 * allocates a view per call, about 100 bytes of garbage per small message on the data path
 * (garbage makes young-generation collections, which stop the protocol thread for 0.2-1.2 ms
 * under NCCL: performance.md, item 18); below COPY_LOOP_BELOW bytes a loop is as fast and
 * allocates nothing.
 */
export function copyBytes(dst: Uint8Array, dstOffset: number, src: Uint8Array, srcOffset: number, len: number): void {
  if (len < COPY_LOOP_BELOW) {
    for (let i = 0; i < len; i++) dst[dstOffset + i] = src[srcOffset + i];
    return;
  }
  dst.set(src.subarray(srcOffset, srcOffset + len), dstOffset);
}
