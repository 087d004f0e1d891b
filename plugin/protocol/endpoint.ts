// What both ends of a link share: completions go through one callback; the first failure
// fails what is pending and every later request; close tells the peer (CLOSE) and leaves
// nothing that could touch NCCL's memory; liveness sends heartbeats and spots a dead peer.
import type { ResultCode } from '../abi';
import { type NetError, remoteError } from '../errors';
import { log } from '../log';
import type { Link } from '../transports/lane';
import { FRAME_BYTES, type Frame, FrameType, decodeFrame, encodeFrame } from './frames';
import { Liveness } from './liveness';
import type { SchedulePolicy } from './schedule';

export type Complete = (slot: number, code: ResultCode, sizes: number[]) => void;

export abstract class Endpoint {
  protected failed: NetError | undefined;
  protected readonly frame = new Uint8Array(FRAME_BYTES);
  protected readonly liveness: Liveness;

  constructor(
    protected readonly link: Link,
    protected readonly policy: SchedulePolicy,
    protected readonly complete: Complete,
    protected readonly name: string,
  ) {
    this.liveness = new Liveness(name);
    link.onFail((err) => this.lost(err));
  }

  /** Requests posted and not yet completed. */
  abstract get pending(): number;
  /** 'send' or 'receive', for log lines. */
  protected abstract readonly kind: string;
  /** 'sender' or 'receiver': the other end, for log lines. */
  protected abstract readonly peer: string;
  /** Handles a frame from the peer (never HEARTBEAT or CLOSE); true reads the next at once. */
  protected abstract onFrame(f: Frame): boolean;
  /** Completes every pending request with err's code and forgets them. */
  protected abstract failPending(err: NetError): void;
  /** Forgets every pending request without completing it: NCCL has closed the comm. */
  protected abstract dropPending(): void;

  /** Periodic: heartbeats and the dead-peer check (see Liveness). */
  tick(now: number, timeoutMs: number): void {
    if (this.failed) return;
    const err = this.liveness.tick(now, timeoutMs, this.pending, this.link.control);
    if (err) this.fail(err);
  }

  /** Stops every operation; the peer sees CLOSE. Nothing touches NCCL's memory afterwards. */
  close(): void {
    if (!this.failed) this.sendFrame(FrameType.CLOSE, -1, 0);
    this.failed ??= remoteError(`${this.name}: closed`);
    this.dropPending();
    this.link.close();
  }

  /** Fails every pending request and every later one with err. */
  fail(err: NetError): void {
    if (this.failed) return;
    this.failed = err;
    if (this.pending) log.warn(`${err.message}; failing ${this.pending} pending ${this.kind}(s)`);
    this.failPending(err);
    this.link.close();
  }

  /** A lane failed or the peer went away. */
  protected lost(err: Error): void {
    this.fail(remoteError(`${this.name}: ${err.message}`));
  }

  // Reads the peer's next frame from the control lane. Any frame proves the peer alive;
  // CLOSE and malformed frames end the link; the rest go to onFrame.
  protected readFrame(): void {
    this.link.control.read(this.frame, (err) => {
      if (this.failed) return;
      if (err) return this.lost(err);
      this.liveness.heardNow();
      const f = decodeFrame(this.frame);
      if (typeof f === 'string') return this.fail(remoteError(`${this.name}: protocol error from the ${this.peer}: ${f}`));
      if (f.type === FrameType.CLOSE) return this.fail(remoteError(`${this.name}: the ${this.peer} closed the connection`));
      if (f.type === FrameType.HEARTBEAT || this.onFrame(f)) this.readFrame();
    });
  }

  /** A frame that has no business on this side of the link. */
  protected unexpected(f: Frame): false {
    this.fail(remoteError(`${this.name}: protocol error: unexpected frame type ${f.type} from the ${this.peer}`));
    return false;
  }

  protected sendFrame(type: FrameType, seq: number, size: number): void {
    this.liveness.wroteNow();
    this.link.control.write([encodeFrame({ type, flags: 0, tag: 0, seq, size })], (err) => {
      if (err && !this.failed) this.lost(err);
    });
  }
}
