// The `tsnet` binding as the plugin sees it (native/binding.cc, native/engine/engine_js.cc).
import type { LaneBinding } from './engine/native-link';
import type { ControlCallStats, WakeDelays } from './stats';
import type { OfiBinding } from './transports/ofi/native-rail';
import type { DialBinding } from './transports/tcp/dial';

export interface Handlers {
  /** A control call from NCCL: answers synchronously with { result, ... }. */
  control(op: string, args: Record<string, unknown>): Record<string, unknown>;
  /** A turn: count posted requests wait in the mailbox; completions may wait in the rings. */
  turn(count: number): void;
}

export interface Started {
  mailbox: Float64Array;
  recordStride: number;
  recordHead: number;
  slotsPerComm: number;
  /** This protocol thread's index. */
  thread: number;
}

export interface Binding extends LaneBinding, OfiBinding, DialBinding {
  /** This protocol thread's index (also in start()'s answer). */
  readonly thread: number;
  start(h: Handlers): Started;
  loadFailed(why: string): void;
  /** Starts protocol threads 1..n-1 (thread 0 only); throws naming why on failure. */
  startThreads(n: number): void;
  log(level: number, flags: number, msg: string): void;
  /** The thread polls without sleeping for this many µs after activity (0: never). */
  setSpin(us: number): void;
  /** CLOCK_MONOTONIC in µs. */
  now(): number;
  /** Whole ms on CLOCK_MONOTONIC since the binding was loaded (plugin/clock.ts). */
  monoMs(): number;
  /** Copies len bytes, every store above the one before (plugin/arrays.ts, copyBytes); RangeError out of bounds. */
  copyAscending(dst: Uint8Array, dstOffset: number, src: Uint8Array, srcOffset: number, len: number): void;
  /** CPU µs of the calling thread. */
  threadCpu(): number;
  /** µs the calling protocol thread spent in turns and control calls (not polling, not asleep). */
  busy(): number;
  /** The calling protocol thread's longest turn or control call since the last call (what: "turn" or the call's name), then starts over. */
  longest(): { us: number; what: string | null };
  /** µs the calling thread has waited for a CPU while runnable (/proc/thread-self/schedstat); -1 where the kernel does not tell. */
  runWait(): number;
  /** How many times a lane's readiness woke this protocol thread with its I/O thread (TSNET_EARLY_WAKE). */
  earlyWakes(): number;
  traceOpen(path: string): boolean;
  traceWrite(text: string): void;
  /** Requests carry their posting and taking times (tracing), with no trace file. */
  timestamps(): void;
  /** Completions carry their time (tracing). */
  ioTrace(on: boolean): void;
  /** CPU µs of each I/O thread. */
  ioStats(): Float64Array;
  /** How late each I/O thread woke when asked to. */
  ioWakes(): WakeDelays[];
  /** How late the calling protocol thread took the wake-ups sent to it. */
  wakes(): WakeDelays;
  /** The calling protocol thread's control calls by name, as NCCL's threads waited for them (embed/host.h). */
  controlCalls(): ControlCallStats[];
  /** Whether work waits for the calling protocol thread and a wake-up is on its way (binding.cc). */
  wakeState(): { work: boolean; pending: boolean; readable: boolean; spinning: boolean; sinceTurnMs: number };
  /** Sends the calling protocol thread a wake-up: a full turn right after the current callback. */
  wakeSelf(): void;
  /** Every I/O thread's busy-poll window from now on. */
  ioSetSpin(us: number): void;
}

/** Posted request kinds in the mailbox (native/internal.h OpKind). */
export const enum Op {
  SEND = 1,
  RECV = 2,
  FLUSH = 3,
}

/** The NCCL call that posted each kind of request (traces and statistics). */
export const OP_NAMES: Record<number, string> = { [Op.SEND]: 'isend', [Op.RECV]: 'irecv', [Op.FLUSH]: 'iflush' };
