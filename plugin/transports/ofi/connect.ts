// Connection setup over the shared endpoints. listen fills the handle with the listener's id,
// a nonce and NIC 0's endpoint name; connect sends CONNECT there (the connector's rails,
// comm id, mailbox address and keys, eager limit); the listener makes the receive comm and
// answers ACCEPT (its rails, comm id and eager capacity). Rail addresses travel in these
// messages because the 128-byte handle cannot hold many. Both stay non-blocking: accept and
// poll answer undefined until their comm is ready, and NCCL calls again.
import { internalError } from '../../errors';
import { log } from '../../log';
import { AcceptQueue } from '../transport';
import type { OfiEndpoint } from './endpoint';
import type { Complete, RecvComm, SendComm } from './fabric';
import { OfiRecvComm } from './recv-comm';
import { OfiSendComm } from './send-comm';
import { type Connect, Refusal, decodeConnect, decodeHandle, encodeHandle } from './wire';

/** A failed CONNECT is sent again after RETRY_MS; one with no answer after RESEND_MS. */
const RETRY_MS = 20;
const RESEND_MS = 500;
/**
 * Receive comms a listener holds for accept at most: a connector beyond them is refused, so
 * that CONNECTs with ever new nonces cannot take every comm id of the endpoint. NCCL accepts
 * one comm per listener.
 */
export const MAX_UNACCEPTED = 256;

/** Names the connector a CONNECT comes from: its endpoint's name on NIC 0, its comm id and nonce. */
export const connectKey = (c: Connect): string => `${Buffer.from(c.names[0]).toString('hex')}/${c.comm}/${c.connectorNonce}`;

/**
 * Whether c repeats a CONNECT whose comm was made (its ACCEPT was lost or is late, and the
 * connector asks again): then that comm answers again, unless it failed, whether or not its
 * listener is still open (NCCL closes a listener as soon as accept returned).
 */
export function answerAgain(ep: OfiEndpoint, c: Connect): boolean {
  const known = ep.accepted.get(connectKey(c));
  if (!known) return false;
  if (!known.failed) known.sendAccept(c.connectorNonce);
  return true;
}

export class OfiListener {
  readonly handle: Uint8Array;
  private readonly nonce: number;
  /** Comms ready for accept, with how long each CONNECT took to become one. */
  private readonly ready = new AcceptQueue<OfiRecvComm>();
  private closed = false;
  private toldFull = false;

  constructor(
    private readonly ep: OfiEndpoint,
    readonly id: number,
  ) {
    this.nonce = ep.random() >>> 0;
    this.handle = encodeHandle({ listener: id, nonce: this.nonce, nics: ep.rails.length, name: ep.rails[0].name });
  }

  /** A receive comm a peer connected, or undefined while none is ready. */
  accept(complete: Complete): RecvComm | undefined {
    if (this.closed) throw internalError(`${this.ep.name} listener ${this.id}: accept after close`);
    const comm = this.ready.shift();
    if (comm) comm.complete = complete;
    return comm;
  }

  /** The comm accept last returned: from its CONNECT to ready, and from ready to that call (µs; TSNET_STATS). */
  get lastAccept(): { handshakeUs: number; waitedUs: number } | undefined {
    return this.ready.lastAccept;
  }

  close(): void {
    this.closed = true;
    this.ep.removeListener(this);
    for (const comm of this.ready.drain()) comm.close();
  }

  /** A CONNECT for this listener arrived. */
  onConnect(bytes: Uint8Array): void {
    if (this.closed) return;
    const t0 = performance.now();
    const c = decodeConnect(bytes);
    if (typeof c === 'string') return log.warn(`${this.ep.name} listener ${this.id}: refused a connection: ${c}`);
    if (c.listenerNonce !== this.nonce) {
      this.ep.refuse(c, Refusal.STALE_HANDLE);
      return log.warn(`${this.ep.name} listener ${this.id}: refused a connection with a stale handle (wrong nonce)`);
    }
    if (answerAgain(this.ep, c)) return;
    if (this.ready.length >= MAX_UNACCEPTED) {
      this.ep.refuse(c, Refusal.TOO_MANY_WAITING);
      if (!this.toldFull) log.warn(`${this.ep.name} listener ${this.id}: refused a connection: ${MAX_UNACCEPTED} connections already wait for accept (further ones are refused without a WARN)`);
      this.toldFull = true;
      return;
    }
    let comm: OfiRecvComm;
    try {
      comm = new OfiRecvComm(this.ep, c);
    } catch (e) {
      this.ep.refuse(c, Refusal.CANNOT_ACCEPT);
      return log.warn(`${this.ep.name} listener ${this.id}: cannot accept a connection: ${(e as Error).message}`);
    }
    comm.sendAccept(c.connectorNonce);
    log.info(`${comm.name}: accepted send comm ${c.comm}, ${comm.rails} rail(s)`);
    comm.connectKey = connectKey(c);
    this.ep.accepted.set(comm.connectKey, comm);
    this.ready.push(comm, t0);
  }
}

export class OfiConnector {
  private readonly comm: OfiSendComm;
  private taken = false;
  private readonly begun = performance.now();

  constructor(
    private readonly ep: OfiEndpoint,
    handle: Uint8Array,
  ) {
    const h = decodeHandle(handle);
    this.comm = new OfiSendComm(ep);
    try {
      this.comm.sendConnect(h.listener, h.nonce, h.name);
    } catch (e) {
      this.comm.close();
      throw e;
    }
  }

  /** The send comm once the listener answered, or undefined while not yet. Throws on failure or timeout. */
  poll(complete: Complete): SendComm | undefined {
    const c = this.comm;
    if (c.connectError || c.failed) {
      const err = c.connectError ?? c.failed!;
      this.close();
      throw err;
    }
    if (c.connected) {
      this.taken = true;
      c.complete = complete;
      return c;
    }
    // The deadline is judged at the watchdog's ticks (OfiSendComm.tick), which set connectError.
    const now = this.ep.clock();
    // No ACCEPT yet: CONNECT again when its send failed, or every RESEND_MS in case it was lost.
    if ((c.connectLost && now - c.connectSentAt >= RETRY_MS) || now - c.connectSentAt >= RESEND_MS) c.resendConnect();
    return undefined;
  }

  /** When it began and when the ACCEPT made its comm ready (performance.now(), ms; TSNET_STATS). */
  get timing(): { begun: number; ready?: number } {
    return { begun: this.begun, ready: this.comm.connectedAt };
  }

  /** Gives up (unless poll returned the comm: then it is the plugin's). */
  close(): void {
    if (!this.taken) this.comm.close();
  }
}
