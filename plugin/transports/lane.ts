// What a transport gives the protocol: lanes, ordered byte streams in both directions, each
// driven like a NIC queue: post a write of memory views, post a read into a memory view,
// get a completion back. The protocol (plugin/protocol/) runs unchanged over every transport.
import type { SchedulePolicy } from '../protocol/schedule';

export type Done = (err?: Error) => void;

export interface Lane {
  /** Sends the views' bytes in order after everything written before; done once the memory is free again. */
  write(views: Uint8Array[], done: Done): void;
  /** Fills view completely with the next bytes of the stream; reads complete in the order posted. */
  read(view: Uint8Array, done: Done): void;
  /** Ends the lane: pending and later operations never touch their memory again. */
  close(): void;
}

/** A connection between a send comm and a receive comm: one control lane plus data lanes. */
export interface Link {
  readonly control: Lane;
  readonly data: readonly Lane[];
  /** Called once when any lane fails or the peer goes away. */
  onFail(cb: (err: Error) => void): void;
  /** Closes every lane. */
  close(): void;
  /** For logs: what this link connects. */
  readonly description: string;
  /** The schedule both ends agreed on (the sender's); the transport's when absent. */
  readonly policy?: SchedulePolicy;
}

/**
 * A link over lanes that a transport made (control first); the first lane failure is
 * reported once through onFail, and close() closes every lane.
 */
export class LaneLink implements Link {
  readonly control: Lane;
  readonly data: Lane[];
  private failCb: ((err: Error) => void) | undefined;
  private done = false;

  constructor(
    makeLanes: (fail: (err: Error) => void) => Lane[],
    readonly description: string,
    readonly policy?: SchedulePolicy,
  ) {
    const lanes = makeLanes((e) => this.fail(e));
    this.control = lanes[0];
    this.data = lanes.slice(1);
  }

  onFail(cb: (err: Error) => void): void {
    this.failCb = cb;
  }

  close(): void {
    this.done = true;
    this.control.close();
    this.data.forEach((l) => l.close());
  }

  private fail(err: Error): void {
    if (this.done) return;
    this.done = true;
    this.failCb?.(err);
  }
}
