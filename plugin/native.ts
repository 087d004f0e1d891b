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
  /** The plugin thread polls without sleeping for this many µs after activity (0: never). */
  setSpin(us: number): void;
  /** Starts the native I/O threads (once); onDone(count): count (opId, status) pairs wait in completions. */
  ioStart(threads: number, onDone: (count: number) => void, spinUs?: number): { completions: Float64Array; records: number; threads: number };
  /** Takes over a connected TCP socket (dup'd; the caller closes its own); returns a lane id. */
  ioAdopt(fd: number, thread?: number): number;
  /** Posts a gather write of the views on a lane, after its earlier writes. */
  ioWrite(lane: number, views: Uint8Array[], opId: number): void;
  /** Posts a read that fills view exactly, after the lane's earlier reads. */
  ioRead(lane: number, view: Uint8Array, opId: number): void;
  /** Closes a lane now: its views are never touched again; pending ops complete with CANCELLED. */
  ioClose(lane: number): void;
  /** Completion statuses besides -errno: OK 0, EOF -1000 (peer closed), CANCELLED -ECANCELED. */
  readonly ioStatus: { OK: number; EOF: number; CANCELLED: number };
}

/** Mailbox record fields (doubles): op, comm, slot, n, then per buffer mr, offset, size, tag. */
export const enum Op {
  SEND = 1,
  RECV = 2,
  FLUSH = 3,
}
