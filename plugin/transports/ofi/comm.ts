// What both ends of an ofi connection share: the id that immediate data and headers name, the
// peer's comm id and addresses per rail, liveness (heartbeats, the dead-peer check) and the
// first-failure-wins rule. A comm lives in its endpoint's table until it closes.
import { hiOf, loOf } from '../../addr';
import { type NetError, remoteError } from '../../errors';
import { log } from '../../log';
import { MAX_RAILS } from './config';
import type { OfiEndpoint } from './endpoint';
import type { Complete, Completion, StepTrace } from './fabric';
import { OpKind } from './ops';
import { PROBE_MS } from './peer-process';
import { nicOf } from './policy/rails';
import { completionError } from './status';
import { MsgKind, immClose, immMsg } from './wire';

const OP_NAMES: Record<number, string> = {
  [OpKind.EAGER]: 'eager send',
  [OpKind.WRITE]: 'RDMA write',
  [OpKind.CTRL]: 'control message write',
  [OpKind.EAGER_COPY]: 'eager copy (local RDMA read)',
  [OpKind.FLUSH_WRITE]: 'flush write',
  [OpKind.FLUSH_READ]: 'flush read',
  [OpKind.MESSAGE]: 'message send',
  [OpKind.FENCE]: 'CUDA IPC fence (local RDMA read)',
  [OpKind.ACK]: 'CUDA IPC acknowledgement write',
};

export const noComplete: Complete = () => {};

/**
 * After the peer's CLOSE, how long requests may still be pending before the comm fails: what
 * the peer sent before it may complete here a little later (completions of different operations
 * come in any order), so the wait is about a quarter of the timeout, 250 ms to 1 s.
 */
export const closeGraceMs = (timeoutMs: number): number => Math.max(250, Math.min(1000, timeoutMs / 4));

export abstract class OfiComm {
  /** This comm's id in its endpoint (what the peer's immediate data names). */
  readonly id: number;
  /** Unique per endpoint: tells a comm from a later one with the same id. */
  readonly serial: number;
  name: string;
  /** The peer comm's id in the peer's endpoint; 0 until known. */
  peerComm = 0;
  /** The connector's nonce of this connection (both ends know it from CONNECT): 14 bits of it mark a CLOSE as this connection's. */
  connectorNonce = 0;
  /** When the peer's CLOSE came (ep.now), or -1. */
  peerClosedAt = -1;
  /** Rails this comm uses (both ends agree), and per rail the local NIC and the peer's id. */
  rails = 0;
  readonly nic = new Int32Array(MAX_RAILS);
  readonly peer = new Int32Array(MAX_RAILS);
  /** NICs of this endpoint that the comm's rails use (min(rails, NICs)). */
  nics = 0;
  failed: NetError | undefined;
  closed = false;
  complete: Complete = noComplete;
  /** TSNET_TRACE: steps of this comm's requests, timed by the I/O thread's completions. */
  trace: StepTrace | undefined;
  protected heardAt: number;
  protected wroteAt: number;
  /** The peer's process id and start time where its process is watched (peer-process.ts); pid 0: not watched. */
  private peerPid = 0;
  private peerStart = 0;
  private probedAt = -Infinity;

  constructor(
    protected readonly ep: OfiEndpoint,
    kind: string,
  ) {
    this.serial = ep.nextSerial();
    this.id = ep.addComm(this);
    this.name = `${ep.name} ${kind} comm ${this.id}`;
    this.heardAt = this.wroteAt = ep.now;
  }

  abstract get pending(): number;
  abstract readonly isRecv: boolean;
  /** A remote write with immediate data naming this comm arrived. */
  abstract onRemoteWrite(rail: number, imm: number, len: number): void;
  /**
   * Whether this comm keeps a remote write it cannot check yet, to be checked and taken later
   * (a send comm before its ACCEPT: OfiSendComm.holdEarly). The caller then does nothing more.
   */
  holdEarly(_rail: number, _c: Completion): boolean {
    return false;
  }
  /** An operation of this comm completed. */
  abstract onOpDone(kind: OpKind, a: number, b: number, c: number, rail: number): void;
  /** Completes every pending request with err's code and forgets them. */
  protected abstract failPending(err: NetError): void;
  /** Forgets every pending request without completing it (NCCL closed the comm). */
  protected abstract dropPending(): void;
  /** Registered memory the comm owns, handed back to the endpoint on close. */
  protected abstract release(): void;

  /** Peers per rail: local NIC i mod NICs reaches the peer's NIC i mod its NICs. */
  protected setPeers(peerComm: number, peerRails: number, names: Uint8Array[]): void {
    this.peerComm = peerComm;
    this.rails = Math.min(this.ep.railCount, peerRails);
    this.nics = Math.min(this.rails, this.ep.rails.length);
    for (let l = 0; l < this.rails; l++) {
      this.nic[l] = nicOf(l, this.ep.rails.length);
      this.peer[l] = this.ep.peerId(this.nic[l], names[nicOf(l, names.length)]);
    }
  }

  /**
   * The peer's process (from CONNECT or ACCEPT): watched where the peer runs on this host (its
   * boot id is ours) and the pid names the same process here; for a peer on this host that
   * cannot be watched the INFO line says why, once per endpoint. Unwatched, only silence tells
   * a dead peer.
   */
  protected watchPeer(pid: number, start: number, boot: Uint8Array): void {
    const procs = this.ep.procs;
    if (!procs || pid === this.ep.pid || !procs.sameHost(boot)) return; // ourselves, or another host
    const ok = procs.check(pid, start);
    if (ok === true) {
      this.peerPid = pid;
      this.peerStart = start;
    } else if (!procs.toldUnwatched) {
      procs.toldUnwatched = true;
      log.info(`${this.ep.name}: a dead peer is noticed by silence only (TSNET_TIMEOUT_SEC), not by its process: ${ok}`);
    }
  }

  /**
   * Whether src, an id in the address vector of this endpoint's NIC nic, is this comm's peer on
   * a rail that uses that NIC (FI_SOURCE: who sent a message or remote write naming this comm).
   */
  sentBy(nic: number, src: number): boolean {
    for (let l = 0; l < this.rails; l++) if (this.nic[l] === nic && this.peer[l] === src) return true;
    return false;
  }

  /** The peer's ids in NIC nic's address vector, one per rail of this comm on that NIC. */
  peersOn(nic: number): number[] {
    const ids: number[] = [];
    for (let l = 0; l < this.rails; l++) if (this.nic[l] === nic) ids.push(this.peer[l]);
    return ids;
  }

  /** The peer showed a sign of life. */
  heard(): void {
    this.heardAt = this.ep.now;
  }

  /**
   * The peer closed its comm (CLOSE): nothing more comes from it. Requests still pending, or
   * posted from now on, fail at the watchdog tick after closeGraceMs; a comm with nothing
   * pending (both ends closing, as NCCL does) says nothing.
   */
  onPeerClosed(): void {
    if (this.closed || this.failed || this.peerClosedAt >= 0) return;
    this.peerClosedAt = this.ep.now;
    this.heard();
  }

  /** An operation of this comm failed: the comm fails (provider words in the WARN). */
  onOpError(kind: OpKind, rail: number, c: Completion, _a = 0): void {
    this.fail(completionError(this.name, OP_NAMES[kind] ?? `operation ${kind}`, rail, c));
  }

  /**
   * Heartbeats when quiet for a quarter of the timeout; fails when the peer is silent for all of
   * it with work pending, or, where its process is watched, quiet for PROBE_MS and that process
   * is gone. Silence fails nothing where judge is false (Transport.tick); a process found gone does.
   */
  tick(now: number, timeoutMs: number, judge = true): void {
    if (this.failed || this.closed || this.peerComm === 0) return;
    if (this.peerClosedAt >= 0) {
      // No heartbeats to a comm that is gone, and no silence check: the CLOSE said it all.
      const since = now - this.peerClosedAt;
      if (judge && this.pending > 0 && since >= closeGraceMs(timeoutMs))
        this.fail(remoteError(`${this.name}: the peer closed its comm ${(since / 1000).toFixed(1)} s ago with requests pending here`));
      return;
    }
    if (now - this.wroteAt >= timeoutMs / 4) {
      this.wroteAt = now;
      const line = this.ep.line;
      const nic = this.nic[0];
      const token = this.ep.ops.alloc(OpKind.MESSAGE, this.id, this.serial, nic, 0, 0, 0);
      const la = line.base + this.ep.zeroAt;
      this.ep.rails[nic].send(this.peer[0], hiOf(la), loOf(la), 0, line.regs[nic].desc, immMsg(MsgKind.HEARTBEAT, this.peerComm), token);
    }
    if (this.peerPid && this.pending > 0 && now - this.heardAt >= PROBE_MS && now - this.probedAt >= PROBE_MS) {
      this.probedAt = now;
      const gone = this.ep.procs!.gone(this.peerPid, this.peerStart);
      if (gone) return this.fail(remoteError(`${this.name}: the peer's ${gone}`));
    }
    if (judge && this.pending > 0 && now - this.heardAt > timeoutMs)
      this.fail(remoteError(`${this.name}: nothing heard from the peer for ${((now - this.heardAt) / 1000).toFixed(1)} s with ${this.pending} request(s) pending`));
  }

  /** Fails every pending request and every later one with err. */
  fail(err: NetError): void {
    if (this.failed || this.closed) return;
    this.failed = err;
    log.warn(this.pending ? `${err.message}; failing ${this.pending} pending request(s)` : err.message);
    this.failPending(err);
  }

  /** Stops the comm: pending requests are dropped, in-flight operations complete into nothing. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.failed ??= remoteError(`${this.name}: closed`);
    this.dropPending();
    this.release();
    this.ep.removeComm(this);
    // The peer learns at once (its pending requests fail after a grace instead of the timeout).
    if (this.peerComm !== 0 && this.peerClosedAt < 0) this.ep.sendClose(this.nic[0], this.peer[0], immClose(this.peerComm, this.connectorNonce));
  }

  protected protocolError(msg: string): void {
    this.fail(remoteError(`${this.name}: protocol error: ${msg}`));
  }
}
