// The receive side of a link. MSG frames are matched to posted receives in FIFO order (tags
// choose the buffer of a multi-receive), then the payload is read straight into the chosen
// buffer: inline from the control lane, or stripe by stripe from the data lanes in the same
// order the sender wrote them. A message that does not fit is drained into scratch memory
// and fails the receive (and, through NACK, the send): no byte lands past a buffer.
import { ResultCode } from '../abi';
import { type NetError, invalidUsage, remoteError } from '../errors';
import { log } from '../log';
import type { Lane } from '../transports/lane';
import { Endpoint } from './endpoint';
import { FLAG_EAGER, type Frame, FrameType } from './frames';
import { type PostedRecv, type RecvBuffer, assign, fullyAssigned, newPostedRecv } from './matching';
import { stripes } from './schedule';

export interface RecvBuf extends RecvBuffer {
  view: Uint8Array;
}

interface Arrival {
  recv: PostedRecv<RecvBuf>;
  seq: number;
  left: number; // bytes still to come
}

/** Bytes a lane must deliver: into view, or (view null) into scratch and dropped. */
interface Expect {
  view: Uint8Array | null;
  left: number;
  arrival: Arrival;
}

const SCRATCH_BYTES = 1 << 20;

export class Receiver extends Endpoint {
  protected readonly kind = 'receive';
  protected readonly peer = 'sender';
  private readonly posted: PostedRecv<RecvBuf>[] = [];
  private nextSeq = 0;
  private nextLane = 0;
  private waiting: Frame | undefined; // a header with no receive posted yet
  private readonly laneQueues: Expect[][];
  private readonly laneBusy: boolean[];
  private scratch: Uint8Array | undefined;
  private ackSeq = -1; // every message up to here has fully arrived
  private readonly arrivedAhead = new Set<number>(); // arrived while an earlier one had not
  private ackQueued = false;

  constructor(...args: ConstructorParameters<typeof Endpoint>) {
    super(...args);
    this.laneQueues = this.link.data.map(() => []);
    this.laneBusy = this.link.data.map(() => false);
    this.readFrame();
  }

  irecv(slot: number, bufs: RecvBuf[]): void {
    if (this.failed) {
      this.complete(slot, this.failed.code, bufs.map(() => 0));
      return;
    }
    this.posted.push(newPostedRecv(slot, bufs));
    if (this.waiting) this.match();
  }

  get pending(): number {
    return this.posted.length;
  }

  protected failPending(err: NetError): void {
    for (const r of this.posted) this.complete(r.slot, r.failed ? r.code : err.code, r.sizes);
    this.dropPending();
  }

  protected dropPending(): void {
    this.posted.length = 0;
    for (const q of this.laneQueues) q.length = 0;
  }

  protected onFrame(f: Frame): boolean {
    if (f.type !== FrameType.MSG) return this.unexpected(f);
    if (f.seq !== this.nextSeq) {
      this.fail(remoteError(`${this.name}: protocol error: message ${f.seq} arrived, expected ${this.nextSeq}`));
      return false;
    }
    this.nextSeq++;
    this.waiting = f;
    this.match(); // reads the next frame once this one's payload is placed
    return false;
  }

  // Gives the waiting header a buffer of the first receive that still has a free one.
  private match(): void {
    const f = this.waiting;
    const recv = f && this.posted.find((r) => !fullyAssigned(r));
    if (!f || !recv) return; // the next irecv resumes matching
    this.waiting = undefined;
    const m = assign(recv, f.tag, f.size);
    if (!m.ok) {
      this.sendFrame(FrameType.NACK, f.seq, recv.bufs[m.index].size);
      this.failRecv(recv, invalidUsage(`${this.name}: ${m.reason}`));
    }
    const arrival: Arrival = { recv, seq: f.seq, left: f.size };
    const dest = recv.failed ? null : recv.bufs[m.index].view.subarray(0, f.size);
    if (f.size === 0) {
      this.arrived(arrival);
      this.readFrame();
    } else if (f.flags & FLAG_EAGER) {
      // Inline payload: read it before the next header.
      this.readInto(this.link.control, { view: dest, left: f.size, arrival }, () => this.readFrame());
    } else {
      const parts = stripes(f.size, this.nextLane, this.policy);
      this.nextLane = (this.nextLane + parts.length) % this.policy.lanes;
      for (const s of parts) {
        this.laneQueues[s.lane].push({ view: dest && dest.subarray(s.offset, s.offset + s.length), left: s.length, arrival });
        this.pumpLane(s.lane);
      }
      this.readFrame();
    }
  }

  private pumpLane(i: number): void {
    const e = this.laneQueues[i][0];
    if (this.laneBusy[i] || !e) return;
    this.laneBusy[i] = true;
    this.readInto(this.link.data[i], e, () => {
      this.laneBusy[i] = false;
      this.laneQueues[i].shift();
      this.pumpLane(i);
    });
  }

  // Reads e's bytes from lane (in scratch-sized pieces when they are dropped), then next().
  private readInto(lane: Lane, e: Expect, next: () => void): void {
    const piece = e.view ?? (this.scratch ??= new Uint8Array(SCRATCH_BYTES)).subarray(0, Math.min(e.left, SCRATCH_BYTES));
    lane.read(piece, (err) => {
      if (this.failed) return;
      if (err) return this.lost(err);
      this.liveness.heardNow();
      e.left -= piece.length;
      e.arrival.left -= piece.length;
      if (e.arrival.left === 0) this.arrived(e.arrival);
      if (e.left > 0) this.readInto(lane, e, next);
      else next();
    });
  }

  private arrived(a: Arrival): void {
    this.queueAck(a.seq);
    const r = a.recv;
    if (++r.arrived < r.bufs.length) return;
    this.posted.splice(this.posted.indexOf(r), 1);
    this.complete(r.slot, r.failed ? r.code : ResultCode.SUCCESS, r.sizes);
  }

  private failRecv(r: PostedRecv<RecvBuf>, err: NetError): void {
    if (r.failed) return;
    r.failed = true;
    r.code = err.code;
    log.warn(err.message);
    // Bytes not yet on their way into its buffers are dropped; the receive is reported once
    // every message it took has been consumed, so nothing lands after NCCL got it back.
    for (let i = 0; i < this.laneQueues.length; i++)
      for (const e of this.laneQueues[i]) if (e.arrival.recv === r && !(this.laneBusy[i] && e === this.laneQueues[i][0])) e.view = null;
  }

  // A send completes once its bytes have fully arrived: the ACK says every message up to
  // ackSeq has. Messages arrive out of order over the data lanes, so later ones wait here.
  private queueAck(seq: number): void {
    this.arrivedAhead.add(seq);
    const before = this.ackSeq;
    while (this.arrivedAhead.delete(this.ackSeq + 1)) this.ackSeq++;
    if (this.ackSeq === before || this.ackQueued) return;
    this.ackQueued = true;
    queueMicrotask(() => {
      this.ackQueued = false;
      if (!this.failed) this.sendFrame(FrameType.ACK, this.ackSeq, 0);
    });
  }
}
