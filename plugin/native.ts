// The `tsnet` binding as the plugin sees it (native/binding.cc), and the layout of the
// mailbox records the binding fills with posted requests.

export interface Handlers {
  /** A control call from NCCL: answers synchronously with { result, ... }. */
  control(op: string, args: Record<string, unknown>): Record<string, unknown>;
  /** count posted requests wait in the mailbox. */
  data(count: number): void;
}

export interface Started {
  mailbox: Float64Array;
  recordStride: number;
  recordHead: number;
  slotsPerComm: number;
}

export interface Binding {
  start(h: Handlers): Started;
  loadFailed(why: string): void;
  /** Ends a posted request: result code, then the sizes (one per buffer for irecv). */
  complete(comm: number, slot: number, result: number, ...sizes: number[]): void;
  log(level: number, flags: number, msg: string): void;
}

/** Mailbox record fields (doubles): op, comm, slot, n, then per buffer mr, offset, size, tag. */
export const enum Op {
  SEND = 1,
  RECV = 2,
  FLUSH = 3,
}
