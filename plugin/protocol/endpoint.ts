// What both ends of a link share: completions go through one callback; the first failure
// fails what is pending and every later request; close tells the peer (CLOSE) and leaves
// nothing that could touch NCCL's memory; liveness sends heartbeats and spots a dead peer.
import type { ResultCode } from '../abi';
import { type NetError, remoteError } from '../errors';
import { log } from '../log';
import type { Link } from '../transports/lane';
import { FRAME_BYTES, FrameType, encodeFrame } from './frames';
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

  protected sendFrame(type: FrameType, seq: number, size: number): void {
    this.liveness.wroteNow();
    this.link.control.write([encodeFrame({ type, flags: 0, tag: 0, seq, size })], (err) => {
      if (err && !this.failed) this.lost(err);
    });
  }
}
