// The send side of a link. isend writes a MSG frame on the control lane, with the payload
// inline when it is eager, else cut into stripes over the data lanes (policies/). A send
// completes when every byte has been handed to the transport, as NCCL's Socket transport does:
// no round trip. A send larger than its receive is reported by the receiver (NACK): the send
// it names fails if still pending, else the next isend on this comm does.
import { ResultCode } from '../abi';
import { objectArray } from '../arrays';
import { type NetError, internalError, invalidUsage, remoteError } from '../errors';
import { log } from '../log';
import { hiOf, loOf } from '../addr';
import type { Region } from '../memory';
import { Endpoint, ZEROS, laneError } from './endpoint';
import { FLAG_EAGER, type Frame, FrameType } from './frames';
import { NO_OP, type StreamLink } from './link';
import { stripeCount } from './policies';

/**
 * Generations run 1..GEN_MAX, so a token (id | gen << 8) stays below 2^30: never NO_OP, never
 * one of the engine's markers (CQE_RX, OP_REMOTE), and a small integer to V8, which boxed larger
 * ones at each call they crossed.
 */
const GEN_MAX = 0x3fffff;
/** Sends in flight at most: a token keeps 8 bits for its send's id (a comm has 256 request slots). */
const MAX_OPS = 0x100;

interface SendOp {
  id: number; // index in ops, in the token
  slot: number; // NCCL's request
  gen: number;
  active: boolean;
  writes: number; // writes not yet done
  seq: number;
  size: number;
  tag: number;
  code: ResultCode;
  region: Region | null;
}

export class Sender extends Endpoint {
  protected readonly kind = 'send';
  protected readonly peer = 'receiver';
  private seq = 0;
  private counter = 0; // stripes sent so far: the lane policy's counter
  private active = 0;
  // Sends in flight, from a pool as large as the most at once (the receiver's, item 38 of
  // docs/performance.md): one object per request slot held 256 per comm.
  private readonly ops: SendOp[] = objectArray();
  private readonly freeOps: SendOp[] = objectArray();
  private readonly sizeOut = new Float64Array(1); // typed: sizes from the mailbox are boxed numbers
  /** A NACK for a send that had already completed: the next isend reports it. */
  private nacked: NetError | undefined;

  /** Sends made so far (the most in flight at once), for tests. */
  get sendsMade(): number {
    return this.ops.length;
  }

  get pending(): number {
    return this.active;
  }

  isend(slot: number, region: Region | null, offset: number, size: number, tag: number): void {
    if (this.failed) return this.refuse(slot, 1);
    let op = this.freeOps.pop();
    if (!op) {
      if (this.ops.length >= MAX_OPS) {
        this.fail(internalError(`${this.name}: more than ${MAX_OPS} sends in flight`));
        return this.refuse(slot, 1); // this one ends with the others
      }
      op = { id: this.ops.length, slot, gen: 0, active: false, writes: 0, seq: 0, size: 0, tag: 0, code: ResultCode.SUCCESS, region: null };
      this.ops.push(op);
    }
    op.slot = slot;
    op.gen = op.gen >= GEN_MAX ? 1 : op.gen + 1;
    op.active = true;
    op.seq = this.seq;
    op.size = size;
    op.tag = tag;
    op.region = region;
    op.code = ResultCode.SUCCESS;
    if (this.nacked) {
      // The message still goes (the receiver counts on it); its request carries the error.
      op.code = this.nacked.code;
      this.nacked = undefined;
    }
    const token = (op.id | (op.gen << 8)) >>> 0;
    // The address as two small integers (plugin/addr.ts); a stripe's offset is added to lo.
    const addr = region ? region.base + offset : 0;
    const hi = hiOf(addr);
    const lo = loOf(addr);
    const p = this.link.policy;
    if (p.eager.eager(size, p.eagerMax, p.lanes)) {
      op.writes = 1;
      this.link.frame(FrameType.MSG, FLAG_EAGER, tag, this.seq, size, hi, lo, size, token);
    } else {
      this.link.frame(FrameType.MSG, 0, tag, this.seq, size, 0, 0, 0, NO_OP);
      const len = p.stripes.length(size, p.minStripe, p.lanes);
      const n = stripeCount(size, len);
      let lane = p.laneChoice.first(this.counter, tag, p.lanes);
      op.writes = n;
      for (let k = 0, off = 0; k < n; k++, off += len) {
        this.link.write(lane, hi, lo + off, Math.min(len, size - off), token);
        if (++lane === p.lanes) lane = 0;
      }
      this.counter += n;
      if (n === 0) this.done(op);
    }
    this.seq++;
    this.active++;
    this.stats.messages++;
    this.stats.bytes += size;
  }

  onOp(token: number, status: number, time: number, io: number): void {
    const op = this.ops[token & 0xff];
    if (!op || !op.active || op.gen !== token >>> 8 || this.failed) return;
    if (status !== 0) return this.fail(laneError(this.name, status));
    // io -1: the protocol thread wrote the frame itself (Port.submitFrame), during its turn.
    if (this.trace) this.trace.step(op.slot, io < 0 ? 'written here' : 'written', time, io);
    if (--op.writes === 0) this.done(op);
  }

  // NCCL gets the send back; its object serves the next (a write still naming it is told apart
  // by the generation, which the next isend moves on).
  private done(op: SendOp): void {
    op.active = false;
    op.region = null;
    this.active--;
    this.sizeOut[0] = op.size;
    this.complete(op.slot, op.code, this.sizeOut, 1);
    this.freeOps.push(op);
  }

  protected onFrame(f: Frame): void {
    if (f.type !== FrameType.NACK) return this.unexpected(f);
    if (f.seq < 0 || f.seq >= this.seq)
      return this.fail(remoteError(`${this.name}: protocol error: a NACK for message ${f.seq}, which was never sent (${this.seq} sent)`));
    const op = this.ops.find((o) => o.seq === f.seq && o.gen > 0); // a completed one keeps its words until reused
    const what = op ? `the ${op.size}-byte send (tag ${op.tag}, message ${f.seq})` : `message ${f.seq}`;
    const e = invalidUsage(`${this.name}: ${what} does not fit the ${f.size}-byte receive it matched`);
    if (op?.active) {
      log.warn(e.message);
      op.code = e.code;
    } else {
      log.warn(`${e.message}; it had completed: the next send on this comm fails`);
      this.nacked = e;
    }
  }

  protected failPending(err: NetError): void {
    for (const op of this.ops) {
      if (!op.active) continue;
      op.active = false;
      op.region = null;
      this.complete(op.slot, err.code, ZEROS, 1);
      this.freeOps.push(op);
    }
    this.active = 0;
  }

  protected cancelPending(err: NetError): number {
    const n = this.active;
    this.failPending(err);
    return n;
  }

  cancelRegion(region: Region): number {
    let n = 0;
    for (const op of this.ops) if (op.active && op.region === region) n++;
    if (n === 0) return 0;
    // Bytes already promised to the receiver cannot be taken back: the link ends (the peer's
    // receives fail), and every send in flight with it.
    // A WARN: each of those sends fails with ncclInvalidUsage, which NCCL reports without a word.
    const all = this.active;
    log.warn(`${this.name}: the memory of ${n} send(s) in flight was deregistered; failing ${all} pending send(s) and closing the link`);
    const err = invalidUsage(`${this.name}: the send's memory was deregistered while in flight`);
    this.failed = err;
    this.link.close(false);
    this.failPending(err);
    return all;
  }
}
