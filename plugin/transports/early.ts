// A send comm given to NCCL before its link is up, as NCCL's Socket transport gives its own:
// the TCP connector's sockets are connected and its greetings written, the listener's ACKs
// not yet read. Under NCCL a connect answered "not yet" is called again only after NCCL's
// proxy has been round its other work, 2-4 ms later (docs/performance.md, items 42-44), so
// waiting for the ACKs cost about three calls per comm. Sends posted meanwhile wait here, in
// order, and go to the real comm as soon as the connector has made it (a watch on its
// sockets, between NCCL's calls); a connect that then fails ends them, and every later send,
// with the connect's error. Opt-in (TSNET_CONNECT_EARLY=1): under PyTorch it took each comm in
// one call, but the communicators came up no sooner (docs/performance.md, item 44).
import { ResultCode } from '../abi';
import { type NetError, invalidUsage } from '../errors';
import { log } from '../log';
import type { Region } from '../memory';
import { type CommStats, type RequestTrace, ZEROS } from '../protocol/endpoint';
import type { CommHooks, SendComm } from './transport';

/** What the early comm needs of the connector that will make its comm. */
export interface EarlyConnector {
  /** The watchdog's tick: moves the handshake on, and fails it after the timeout. */
  tick?(now: number, timeoutMs: number, judge: boolean): void;
  /** Gives the handshake up: its sockets, and its link if not yet handed over, close. */
  close(): void;
}

interface Queued {
  slot: number;
  region: Region | null;
  offset: number;
  size: number;
  tag: number;
}

const NO_STATS: CommStats = Object.freeze({ messages: 0, bytes: 0 });

export class EarlySend implements SendComm {
  private comm: SendComm | undefined;
  private failed: NetError | undefined;
  private warned = false;
  private started = false;
  private closed = false;
  private queued: Queued[] = [];
  private traced: RequestTrace | undefined;

  constructor(
    readonly hooks: CommHooks,
    private readonly connector: EarlyConnector,
  ) {}

  /** The comm once up (tests). */
  get up(): boolean {
    return this.comm !== undefined;
  }

  get pending(): number {
    return this.comm ? this.comm.pending : this.queued.length;
  }

  get stats(): CommStats {
    return this.comm ? this.comm.stats : NO_STATS;
  }

  get trace(): RequestTrace | undefined {
    return this.comm ? this.comm.trace : this.traced;
  }

  set trace(t: RequestTrace | undefined) {
    this.traced = t;
    if (this.comm) this.comm.trace = t;
  }

  /**
   * The connector's comm is up: it takes the sends that waited, in the order NCCL posted them.
   * The caller publishes their submissions (this runs in a watch, outside a turn).
   */
  attach(comm: SendComm): void {
    if (this.closed || this.failed || this.comm) {
      comm.close();
      return;
    }
    this.comm = comm;
    comm.trace = this.traced;
    if (this.started) comm.start();
    const q = this.queued;
    this.queued = [];
    for (const s of q) comm.isend(s.slot, s.region, s.offset, s.size, s.tag);
  }

  isend(slot: number, region: Region | null, offset: number, size: number, tag: number): void {
    if (this.comm) return this.comm.isend(slot, region, offset, size, tag);
    if (this.failed) return this.refuse(slot);
    this.queued.push({ slot, region, offset, size, tag });
  }

  start(): void {
    this.started = true;
    this.comm?.start();
  }

  tick(now: number, timeoutMs: number, judge = true): void {
    if (this.comm) return this.comm.tick(now, timeoutMs, judge);
    if (!this.failed && !this.closed) this.connector.tick?.(now, timeoutMs, judge);
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.comm) return this.comm.close();
    this.connector.close();
    if (!this.queued.length) return;
    log.info(`${this.hooks.name}: closed with ${this.queued.length} send(s) waiting for the connection; cancelled`);
    this.endQueued(ResultCode.INVALID_USAGE);
  }

  /** The connect failed after NCCL had the comm (or a failure from outside, as for any comm). */
  fail(err: NetError): void {
    if (this.comm) return this.comm.fail(err);
    if (this.failed || this.closed) return;
    this.failed = err;
    this.connector.close();
    if (!this.queued.length) return;
    log.warn(`${this.hooks.name}: ${err.message}; failing ${this.queued.length} pending send(s)`);
    this.warned = true;
    this.endQueued(err.code);
  }

  /** As the Sender does: a send whose memory goes ends the comm, and every send waiting with it. */
  cancelRegion(region: Region): number {
    if (this.comm) return this.comm.cancelRegion(region);
    const n = this.queued.filter((s) => s.region === region).length;
    if (!n) return 0;
    const all = this.queued.length;
    log.warn(`${this.hooks.name}: the memory of ${n} send(s) waiting for the connection was deregistered; failing ${all} pending send(s) and closing the connection`);
    this.warned = true;
    this.failed = invalidUsage(`${this.hooks.name}: the send's memory was deregistered while in flight`);
    this.connector.close();
    this.endQueued(this.failed.code);
    return all;
  }

  private endQueued(code: ResultCode): void {
    const q = this.queued;
    this.queued = [];
    for (const s of q) this.hooks.complete(s.slot, code, ZEROS, 1);
  }

  private refuse(slot: number): void {
    if (!this.warned) {
      this.warned = true;
      log.warn(`${this.hooks.name}: ${this.failed!.message}; the comm has failed: this send and every later one fail`);
    }
    this.hooks.complete(slot, this.failed!.code, ZEROS, 1);
  }
}
