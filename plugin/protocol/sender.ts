// The send side of a link. isend writes a MSG frame on the control lane, with the payload
// inline when it is small, else cut into stripes over the data lanes. A request completes
// when every byte has left its memory and has fully arrived at the receiver (ACK), so a
// send that does not fit its receive fails on both sides (NACK).
import { ResultCode } from '../abi';
import { type NetError, invalidUsage } from '../errors';
import { log } from '../log';
import { Endpoint } from './endpoint';
import { FLAG_EAGER, type Frame, FrameType, encodeFrame } from './frames';
import { isEager, stripes } from './schedule';

export type { Complete } from './endpoint';

interface SendOp {
  slot: number;
  seq: number;
  size: number;
  tag: number;
  writes: number; // writes not yet done
  acked: boolean;
  code: ResultCode;
}

export class Sender extends Endpoint {
  protected readonly kind = 'send';
  protected readonly peer = 'receiver';
  private seq = 0;
  private nextLane = 0;
  private readonly ops: SendOp[] = []; // in sequence order

  constructor(...args: ConstructorParameters<typeof Endpoint>) {
    super(...args);
    this.readFrame();
  }

  isend(slot: number, view: Uint8Array, tag: number): void {
    if (this.failed) {
      this.complete(slot, this.failed.code, [0]);
      return;
    }
    const size = view.length;
    const op: SendOp = { slot, seq: this.seq++, size, tag, writes: 0, acked: false, code: ResultCode.SUCCESS };
    this.ops.push(op);
    const eager = isEager(size, this.policy);
    const header = encodeFrame({ type: FrameType.MSG, flags: eager ? FLAG_EAGER : 0, tag, seq: op.seq, size });
    const wrote = (err?: Error) => {
      if (err) return this.lost(err);
      op.writes--;
      this.settle();
    };
    op.writes++;
    this.liveness.wroteNow();
    this.link.control.write(eager && size > 0 ? [header, view] : [header], wrote);
    if (!eager) {
      const parts = stripes(size, this.nextLane, this.policy);
      this.nextLane = (this.nextLane + parts.length) % this.policy.lanes;
      for (const s of parts) {
        op.writes++;
        this.link.data[s.lane].write([view.subarray(s.offset, s.offset + s.length)], wrote);
      }
    }
  }

  get pending(): number {
    return this.ops.length;
  }

  protected failPending(err: NetError): void {
    for (const op of this.ops.splice(0)) this.complete(op.slot, err.code, [0]);
  }

  protected dropPending(): void {
    this.ops.length = 0;
  }

  // Completes, in any order, the operations whose bytes are gone and which the peer matched.
  private settle(): void {
    for (let i = 0; i < this.ops.length; ) {
      const op = this.ops[i];
      if (op.writes === 0 && op.acked) {
        this.ops.splice(i, 1);
        this.complete(op.slot, op.code, [op.size]);
      } else i++;
    }
  }

  protected onFrame(f: Frame): boolean {
    if (f.type === FrameType.ACK) {
      for (const op of this.ops) if (op.seq <= f.seq) op.acked = true;
      this.settle();
      return true;
    }
    if (f.type !== FrameType.NACK) return this.unexpected(f);
    const op = this.ops.find((o) => o.seq === f.seq);
    if (op) {
      const e = invalidUsage(`${this.name}: isend of ${op.size} bytes (tag ${op.tag}) does not fit the ${f.size}-byte receive posted for it`);
      log.warn(e.message);
      op.code = e.code;
    }
    return true;
  }
}
