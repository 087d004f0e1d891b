// What the stream protocol (sender.ts, receiver.ts) needs from a transport: a link between a
// send comm and a receive comm made of one control lane and N data lanes, each an ordered byte
// stream, driven like a NIC's queues. Submissions name memory by address; completions come
// back through LinkEvents with the op token the protocol chose. The control lane's incoming
// bytes land in a receive ring the protocol parses in place.
import type { SchedulePolicy } from './policies';

/** The op token of a submission that wants no completion (protocol-owned bytes). */
export const NO_OP = -1;

export interface LinkEvents {
  /**
   * A submission finished: status 0, EOF (-1000) or -errno (closed links are silent). time: when
   * (microseconds, CLOCK_MONOTONIC) if tracing, else 0; io: the I/O thread that did it.
   */
  onOp(op: number, status: number, time: number, io: number): void;
  /**
   * The control lane received bytes (status 0) or ended (status < 0). time: when the I/O thread
   * put them in the ring (microseconds, CLOCK_MONOTONIC) if tracing, else 0 or absent; io: that
   * I/O thread.
   */
  onRx(status: number, time?: number, io?: number): void;
}

/** The control lane's receive ring: a byte ring filled by the transport, parsed in place. */
export interface RxRing {
  readonly bytes: Uint8Array;
  readonly view: DataView;
  /** capacity - 1 (a power of two minus one). */
  readonly mask: number;
  /** Bytes received so far, modulo 2^32. */
  written(): number;
  /** The protocol is done with every byte before `to` (modulo 2^32): the transport may reuse them. */
  release(to: number): void;
}

export interface StreamLink {
  /** Data lanes (0 = every byte rides the control lane). */
  readonly lanes: number;
  readonly rx: RxRing;
  /** The schedule both ends use (the sender's). */
  readonly policy: SchedulePolicy;
  /** For logs: what this link connects. */
  readonly description: string;
  /** When the peer was last heard from, and this side last wrote (ms, plugin/clock.ts). */
  readonly heard: number;
  readonly wrote: number;
  /** Where events go; what happened before attach is delivered at attach. */
  attach(events: LinkEvents): void;
  /**
   * Queues a 24-byte frame on the control lane, followed by [addr, addr+len) (an eager payload).
   * Addresses here go as addr = hi * ADDR_SPLIT + lo (plugin/addr.ts: hiOf, loOf).
   */
  frame(type: number, flags: number, tag: number, seq: number, size: number, hi: number, lo: number, len: number, op: number): void;
  /** Queues a write of [addr, addr+len) on data lane `lane`, after its earlier writes. */
  write(lane: number, hi: number, lo: number, len: number, op: number): void;
  /** Queues a read of len bytes into addr (0: dropped) from data lane `lane`, after its earlier reads. */
  read(lane: number, hi: number, lo: number, len: number, op: number): void;
  /**
   * Reads into [base, base+len) drop the rest of their bytes (their completions still come);
   * writes from there are counted: they cannot be taken back without breaking the stream.
   */
  cancel(base: number, len: number): { reads: number; writes: number };
  /** Where each lane stands, one line each, for the WARN of a link gone quiet (where the transport can tell). */
  describe?(): string[];
  /**
   * Ends the link. When it returns nothing submitted touches memory again and no event follows.
   * graceful: protocol-owned bytes already queued (a CLOSE frame) still go out first, unless a
   * write of external memory was half sent. Returns true when it could end gracefully.
   */
  close(graceful: boolean): boolean;
}

/** Limits every tsnet keeps to, and a receiver checks in the sender's HELLO before it sizes anything by them. */
export const LIMITS = { eagerMax: 1 << 20, lanes: 64, minStripe: 4096, maxStripe: 64 << 20 } as const;

/**
 * The receive ring a receiver needs for the sender's eagerMax: at least two of the largest
 * frames (so one held while waiting for its receive does not stop the next), at least 64 KiB.
 */
export function recvRingBytes(eagerMax: number): number {
  let n = 1 << 16;
  while (n < 2 * (eagerMax + 24)) n *= 2;
  return n;
}

/** The sender's receive ring: it only gets NACK, HEARTBEAT and CLOSE frames. */
export const SEND_RING_BYTES = 1 << 14;
