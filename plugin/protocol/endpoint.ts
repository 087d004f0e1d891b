// What both ends of a link share: completions go through one callback; frames from the peer
// are parsed in place from the control lane's receive ring; the first failure fails what is
// pending and every later request; close tells the peer (CLOSE) and leaves nothing that could
// touch NCCL's memory; heartbeats and the dead-peer check tell a quiet link from a dead one.
import { ResultCode } from '../abi';
import { type NetError, invalidUsage, remoteError, systemError } from '../errors';
import { log } from '../log';
import type { Region } from '../memory';
import { FLAG_EAGER, FRAME_BYTES, type Frame, FrameType, readFrame } from './frames';
import { type LinkEvents, NO_OP, type StreamLink } from './link';

/** Ends a request: n sizes (one per buffer of a receive, one for a send, none for a flush). */
export type Complete = (slot: number, code: ResultCode, sizes: ArrayLike<number>, n: number) => void;

/** TSNET_TRACE's view of a comm's requests (plugin/trace.ts); absent when tracing is off. */
export interface RequestTrace {
  step(slot: number, what: string, us: number, io: number): void;
}

/** Per comm: what TSNET_STATS reports. */
export interface CommStats {
  messages: number;
  bytes: number;
}

export const STATUS_EOF = -1000;
const ERRNO_NAMES: Record<number, string> = { 104: 'ECONNRESET', 32: 'EPIPE', 110: 'ETIMEDOUT', 113: 'EHOSTUNREACH', 111: 'ECONNREFUSED' };

/** The error a failed lane operation means. EOF and resets are the peer going away. */
export function laneError(name: string, status: number): NetError {
  if (status === STATUS_EOF) return remoteError(`${name}: the peer closed the connection`);
  const errno = ERRNO_NAMES[-status];
  if (errno === 'ECONNRESET' || errno === 'EPIPE') return remoteError(`${name}: the peer reset the connection (${errno})`);
  return systemError(`${name}: a socket failed (${errno ?? `errno ${-status}`})`);
}

export abstract class Endpoint implements LinkEvents {
  readonly stats: CommStats = { messages: 0, bytes: 0 };
  trace: RequestTrace | undefined;
  protected failed: NetError | undefined;
  /**
   * The peer will send no more frames: its CLOSE frame was parsed, or its control stream ended
   * in order. What it sent before is still taken (a receiver delivers it: Receiver.peerEnded).
   */
  protected peerDone: NetError | undefined;
  /** A WARN has named why this comm failed (fail, or the first request refused after it). */
  private warned = false;
  /** Ring position of the next frame to parse (modulo 2^32). */
  protected parsed = 0;
  private readonly frame: Frame = { type: FrameType.MSG, flags: 0, tag: 0, seq: 0, size: 0 };

  constructor(
    protected readonly link: StreamLink,
    protected readonly complete: Complete,
    protected readonly name: string,
  ) {}

  /** Requests posted and not yet completed. */
  abstract get pending(): number;
  /** 'send' or 'receive', for log lines. */
  protected abstract readonly kind: string;
  /** 'sender' or 'receiver': the other end, for log lines. */
  protected abstract readonly peer: string;
  /** A frame from the peer (never HEARTBEAT or CLOSE); its payload starts at ring position payloadAt. */
  protected abstract onFrame(f: Frame, payloadAt: number): void;
  abstract onOp(op: number, status: number, time: number, io: number): void;
  /** Completes every pending request with err's code and forgets them. */
  protected abstract failPending(err: NetError): void;
  /** Completes every pending request with err's code: the comm is closing. */
  protected abstract cancelPending(err: NetError): number;
  /**
   * Requests using region end with an error now; nothing touches the region afterwards.
   * Returns how many ended.
   */
  abstract cancelRegion(region: Region): number;
  /** Ring position before which received bytes are still needed (default: all parsed). */
  protected keepFrom(): number {
    return this.parsed;
  }

  /** Starts taking events (the link delivers what came before). */
  start(): void {
    this.link.attach(this);
  }

  /** When the frames being parsed reached the receive ring (tracing, else 0), and which I/O thread put them there. */
  protected rxTime = 0;
  protected rxIo = 0;

  onRx(status: number, time = 0, io = 0): void {
    // After the peer's end nothing more is read from the control lane: a later reset of it (a
    // frame of ours reaching a socket the peer has closed) takes nothing the ring holds.
    if (this.failed || this.peerDone) return;
    this.rxTime = time;
    this.rxIo = io;
    this.parseFrames();
    if (status === 0 || this.failed || this.peerDone) return;
    if (status !== STATUS_EOF) return this.fail(laneError(this.name, status));
    // An orderly end without CLOSE (a peer that exited): what it wrote before is whole.
    const cut = (this.link.rx.written() - this.parsed) >>> 0;
    const err = laneError(this.name, status);
    this.peerEnded(cut ? remoteError(`${err.message} inside a frame (${cut} byte(s) of it came)`) : err);
  }

  /**
   * The peer will send nothing more (its CLOSE, or its control stream's orderly end). By default
   * the comm fails; a receiver first delivers what was sent before (Receiver).
   */
  protected peerEnded(err: NetError): void {
    this.fail(err);
  }

  /** Periodic: heartbeats and the dead-peer check (judge: false at the watchdog's first tick after the thread was held). */
  tick(now: number, timeoutMs: number, judge = true): void {
    if (this.failed) return;
    // No heartbeat to a peer that has ended: it reads nothing more.
    if (!this.peerDone && now - this.link.wrote >= timeoutMs / 4) this.link.frame(FrameType.HEARTBEAT, 0, 0, -1, 0, 0, 0, 0, NO_OP);
    if (judge && this.pending > 0 && now - this.link.heard > timeoutMs) {
      // Before failing: where the bytes wait, so that a peer that is alive but stuck can be told
      // from one that is gone (the link's sockets, queues and I/O threads, one WARN per lane).
      for (const line of this.link.describe?.() ?? []) log.warn(`${this.name}: ${line}`);
      this.fail(remoteError(`${this.name}: nothing heard from the peer for ${((now - this.link.heard) / 1000).toFixed(1)} s with ${this.pending} request(s) pending`));
    }
  }

  /**
   * Closes the comm: the peer sees CLOSE; requests in flight are cancelled (an INFO line says
   * so) and their memory is never touched again.
   */
  close(): void {
    const inFlight = this.failed ? 0 : this.cancelPending(invalidUsage(`${this.name}: closed with the request in flight`));
    if (inFlight) log.info(`${this.name}: closed with ${inFlight} ${this.kind}(s) in flight; cancelled`);
    if (!this.failed && !this.peerDone) this.link.frame(FrameType.CLOSE, 0, 0, -1, 0, 0, 0, 0, NO_OP);
    this.failed ??= remoteError(`${this.name}: closed`);
    this.warned = true; // NCCL posts nothing on a closed comm
    this.link.close(true);
  }

  /** Fails every pending request and every later one with err; the link ends. */
  fail(err: NetError): void {
    if (this.failed) return;
    this.failed = err;
    if (this.pending) {
      log.warn(`${err.message}; failing ${this.pending} pending ${this.kind}(s)`);
      this.warned = true;
    }
    // The link first: once a request ends NCCL may reuse its memory, so nothing may touch it then.
    this.link.close(false);
    this.failPending(err);
  }

  /** Ends request slot with the error this comm failed with (a request posted after the failure). */
  protected refuse(slot: number, n: number): void {
    if (!this.warned) {
      // The failure came with nothing pending: this request is the first to learn of it.
      this.warned = true;
      log.warn(`${this.failed!.message}; the comm has failed: this ${this.kind} and every later one fail`);
    }
    this.complete(slot, this.failed!.code, ZEROS, n);
  }

  /** The comm has ended for good (the receiver after the sender's end): later requests fail with err. */
  protected retire(err: NetError, graceful: boolean): void {
    if (this.failed) return;
    this.failed = err;
    this.link.close(graceful);
  }

  // Parses every whole frame the ring holds; CLOSE and malformed frames end the link.
  private parseFrames(): void {
    const rx = this.link.rx;
    const f = this.frame;
    for (;;) {
      const avail = (rx.written() - this.parsed) >>> 0;
      if (avail < FRAME_BYTES) break;
      const bad = readFrame(rx, this.parsed, f);
      if (bad) return this.fail(remoteError(`${this.name}: protocol error from the ${this.peer}: ${bad}`));
      const total = FRAME_BYTES + (f.flags & FLAG_EAGER ? f.size : 0);
      if (total > rx.mask + 1)
        return this.fail(remoteError(`${this.name}: protocol error: a ${f.size}-byte inline payload is larger than the receive ring (${rx.mask + 1} bytes)`));
      if (avail < total) break;
      const at = (this.parsed + FRAME_BYTES) >>> 0;
      this.parsed = (this.parsed + total) >>> 0;
      if (f.type === FrameType.CLOSE) {
        // The peer's last frame: what came before it stands, nothing after it is read.
        rx.release(this.keepFrom());
        return this.peerEnded(remoteError(`${this.name}: the ${this.peer} closed the connection`));
      }
      if (f.type !== FrameType.HEARTBEAT) {
        try {
          this.onFrame(f, at);
        } catch (e) {
          // A frame that broke an assumption: this comm fails, not the protocol thread's loop.
          return this.fail(remoteError(`${this.name}: protocol error: handling frame type ${f.type} (message ${f.seq}) failed: ${e instanceof Error ? e.message : String(e)}`));
        }
      }
      if (this.failed) return;
    }
    rx.release(this.keepFrom());
  }

  /** A frame that has no business on this side of the link. */
  protected unexpected(f: Frame): void {
    this.fail(remoteError(`${this.name}: protocol error: unexpected frame type ${f.type} from the ${this.peer}`));
  }
}

export const ZEROS: readonly number[] = [0, 0, 0, 0, 0, 0, 0, 0];
