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
