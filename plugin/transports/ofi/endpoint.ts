// One device's shared endpoints on one protocol thread: its rails (one RDM endpoint per NIC),
// the bounce buffers posted on them, the operations in flight, and the comms and listeners
// that immediate data names. Completions of every rail come in here and are routed by token
// (local operations, posted receives) or by the comm id in the immediate data (remote
// writes, messages). A comm id is reused only after every other id was, and not within the
// quarantine after its comm closed, so late writes for a closed comm find no one. Where the
// provider names senders (FI_SOURCE), what names a comm is taken only from that comm's peer.
import { hiOf, loOf } from '../../addr';
import { internalError, remoteError, systemError } from '../../errors';
import { log } from '../../log';
import { BouncePool, bounceId, isBounceToken } from './bounce';
import type { OfiComm } from './comm';
import type { OfiConfig } from './config';
import { OfiConnector, OfiListener, answerAgain, connectKey } from './connect';
import { CqFlag, type Completion, type HostBuffer, type OnCompletions, type Rail, type Region } from './fabric';
import { Fences } from './fence';
import { LINE_BYTES, REFUSAL_AT, REFUSAL_SLOTS, ZERO_AT } from './line';
import { OpKind, OpTable } from './ops';
import { PeerProcesses, type ProcStat, readProcStat } from './peer-process';
import { deviceRails } from './policy/rails';
import type { OfiRecvComm } from './recv-comm';
import type { OfiSendComm } from './send-comm';
import { ECANCELED, statusName } from './status';
import {
  ACCEPT_BYTES,
  BOOT_ID_BYTES,
  CONNECT_BYTES,
  type Connect,
  LITTLE_ENDIAN,
  MAX_COMMS,
  MsgKind,
  REFUSAL_WORDS,
  Refusal,
  closeMark,
  decodeConnect,
  encodeRefusal,
  immCloseMark,
  immComm,
  immMsg,
  msgId,
  msgKind,
} from './wire';
import { monoMs } from '../../clock';

/** WARNs for messages and writes from senders that are not the named comm's peer; then only stats.foreign. */
const FOREIGN_WARNINGS = 8;

export interface EndpointOptions {
  config: OfiConfig;
  /** For log lines: the device's name. */
  name?: string;
  /** Milliseconds; connect timeout and comm-id quarantine. */
  timeoutMs?: number;
  /** Comm ids 1 .. maxComms - 1 (at most 2^15; tests use fewer to force reuse). */
  maxComms?: number;
  clock?: () => number;
  /** 32 random bits (nonces). */
  random?: () => number;
  /**
   * A line of device memory per NIC (64 bytes each), registered on every rail, that a
   * write-then-read flush writes and reads back. Without it, write-then-read uses a host line
   * (right for host memory and tests; GPU memory needs the device line).
   */
  flushScratch?: Region | null;
  /**
   * Whether a send from GPU memory may go eager (default true). An eager send gathers a host
   * header and the payload in one send; libfabric before 1.18 copies every iovec of a shm send
   * as the first one's memory, and a GPU payload behind a host header killed the sender with
   * SIGSEGV. Where false, such sends wait for their control message and are written.
   */
  gpuEager?: boolean;
  /**
   * This process's id (default process.pid). CONNECT and ACCEPT carry it: CUDA IPC
   * (TSNET_OFI_GPU_IPC) is used only with a peer in another process, as a process cannot open
   * its own IPC handles. Tests give their fake hosts different ids.
   */
  pid?: number;
  /**
   * Watch the processes of peers on this host (the same kernel boot id): a quiet peer's
   * process is looked up in /proc, and a dead one fails its comms at once rather than after
   * the silence of the timeout (peer-process.ts). Default false.
   */
  watchPeers?: boolean;
  /** Reads /proc/<pid>/stat (default readProcStat); tests give fake processes. */
  procStat?: ProcStat;
  /** This process's start time sent in CONNECT and ACCEPT (default: from procStat). */
  start?: number;
  /** This kernel's boot id sent in CONNECT and ACCEPT (default: /proc's). */
  bootId?: Uint8Array;
}

/** Host memory the transport allocated and registered on every NIC. */
export interface OwnedRegion extends Region {
  readonly host: HostBuffer;
}

export class OfiEndpoint {
  readonly name: string;
  readonly config: OfiConfig;
  /** Rails a comm on this device may use (OFI_NCCL_FORCE_NUM_RAILS applied). */
  readonly railCount: number;
  readonly pool: BouncePool;
  readonly ops = new OpTable();
  /** CUDA IPC: receives waiting for a fence, one round of reads for all of a GPU's. */
  readonly fences: Fences;
  /** Registered host lines the transport owns (flush targets, 0-byte sources). */
  readonly line: OwnedRegion;
  readonly zeroAt = ZERO_AT;
  readonly flushScratch: Region | null;
  /** The endpoint's own address per NIC (local reads and writes). */
  readonly selfPeer: Int32Array;
  readonly timeoutMs: number;
  /** The clock as of the last completion batch or tick. */
  now: number;
  /**
   * stale*: for a closed comm; foreign: dropped, from a sender that is not the named comm's
   * peer; unnamed: passed, from AV id 0 where the comm's peer is another endpoint (fromPeer).
   */
  readonly stats = { staleWrites: 0, staleMessages: 0, staleOps: 0, foreign: 0, unnamed: 0, refused: 0, peerClosed: 0 };
  /**
   * Every rail names the senders of its messages (FI_SOURCE): a message that names a comm counts
   * only when its sender is that comm's peer on the rail it came in on.
   */
  readonly checkSenders: boolean;
  /** The same for remote writes with immediate data, where every rail names their senders too. */
  readonly checkWriters: boolean;
  /**
   * TSNET_TRACE: the time (µs) and I/O thread of the completion being handled, for the comms'
   * trace steps; 0 outside a completion batch or when not tracing.
   */
  cqTime = 0;
  cqIo = 0;
  /**
   * Inside a completion batch: comms queue their CUDA IPC acknowledgements, and the fences their
   * rounds, until it ends.
   */
  inBatch = false;
  /** Receive comms with acknowledgements queued in this batch. */
  private readonly acking = new Set<OfiRecvComm>();
  /** Largest eager message (header included) the bounce buffers hold; -1: none. */
  readonly eagerCapacity: number;
  /** A send from GPU memory may go eager (EndpointOptions.gpuEager). */
  readonly gpuEager: boolean;
  /** EndpointOptions.pid. */
  readonly pid: number;
  /** EndpointOptions.watchPeers: the processes of peers on this host; else null. */
  readonly procs: PeerProcesses | null;
  /** This process's start time and kernel boot id (CONNECT and ACCEPT carry them); 0 and zeros: none sent. */
  readonly start: number;
  readonly boot: Uint8Array;

  private readonly comms: (OfiComm | undefined)[];
  /** The same comms, for ticking. */
  private readonly live = new Set<OfiComm>();
  /** Receive comms by the CONNECT that made them (connect.ts, connectKey), until they close. */
  readonly accepted = new Map<string, OfiRecvComm>();
  /** Connectors already told of in a WARN that their listener is closed (at most 1024 kept). */
  private readonly lateWarned = new Set<string>();
  private readonly closedAt: Float64Array;
  private nextId = 0;
  private serials = 0;
  private readonly listeners: (OfiListener | undefined)[] = new Array(MAX_COMMS).fill(undefined);
  private nextListener = 0;
  private readonly peers: Map<string, number>[];
  /** When each peer address went into a rail's address vector (a count of insertions: avSerial). */
  private readonly insertedAt: Map<number, number>[];
  private inserts = 0;
  private retired: { region: OwnedRegion; at: number }[] = [];
  private freed = false; // freeMemory ran
  private shut = false; // close ran
  /** The refusals in flight, by slot of the flush line's refusal area (1: its send has not completed). */
  private readonly refusing = new Uint8Array(REFUSAL_SLOTS);
  readonly clock: () => number;
  readonly random: () => number;

  constructor(
    readonly rails: readonly Rail[],
    opts: EndpointOptions,
  ) {
    if (!LITTLE_ENDIAN) throw internalError('the ofi transport needs a little-endian host');
    if (rails.length === 0) throw internalError('an ofi device without rails');
    for (const r of rails)
      if (r.cqDataBytes < 4) throw systemError(`rail ${r.index}: the provider carries ${r.cqDataBytes} bytes of immediate data; tsnet needs 4`);
    this.config = opts.config;
    this.name = opts.name ?? 'ofi';
    this.clock = opts.clock ?? monoMs;
    this.random = opts.random ?? (() => (Math.random() * 2 ** 32) >>> 0);
    this.now = this.clock();
    this.timeoutMs = opts.timeoutMs ?? 10_000;
    const maxComms = opts.maxComms ?? MAX_COMMS;
    if (maxComms < 2 || maxComms > MAX_COMMS) throw internalError(`maxComms ${maxComms}: 2 to ${MAX_COMMS}`);
    this.comms = new Array(maxComms).fill(undefined);
    this.closedAt = new Float64Array(maxComms).fill(-Infinity);
    this.railCount = deviceRails(rails.length, this.config.forceRails);
    this.peers = rails.map(() => new Map());
    this.insertedAt = rails.map(() => new Map());
    this.selfPeer = new Int32Array(rails.length);
    rails.forEach((r, i) => (this.selfPeer[i] = this.peerId(i, r.name)));
    // The endpoint itself is AV id 0 on every rail (FI_AV_TABLE numbers from 0): the id shm of
    // libfabric 1.17 gives a sender it cannot name (fromPeer), and rxm a remote write's writer.
    this.checkSenders = rails.every((r) => r.source === true) && this.selfPeer.every((id) => id === 0);
    this.checkWriters = this.checkSenders && rails.every((r) => r.sourceWrites === true);
    this.line = this.allocShared(LINE_BYTES);
    this.flushScratch = opts.flushScratch ?? null;
    this.gpuEager = opts.gpuEager ?? true;
    this.pid = (opts.pid ?? process.pid) >>> 0;
    this.procs = opts.watchPeers ? new PeerProcesses(opts.procStat ?? readProcStat, this.pid, opts.start, opts.bootId) : null;
    this.start = this.procs?.selfStart ?? 0;
    this.boot = this.procs?.boot ?? new Uint8Array(BOOT_ID_BYTES);
    const eager = this.config.eagerMax;
    this.eagerCapacity = eager < 0 ? -1 : eager;
    const bufBytes = Math.max(Math.ceil(Math.max(eager, 0) / 64) * 64, CONNECT_BYTES, ACCEPT_BYTES);
    const window = Math.max(4, Math.ceil(this.config.bouncePosted / rails.length));
    this.pool = new BouncePool(rails, window, bufBytes);
    this.pool.start();
    this.fences = new Fences(this);
  }

  /** Give this to the engine: every batch of completions of every rail. */
  readonly onCompletions: OnCompletions = (rail, batch) => {
    this.now = this.clock();
    const r = rail.index;
    this.inBatch = true;
    try {
      for (let i = 0; i < batch.length; i++) {
        const c = batch[i];
        const t = c.token;
        this.cqTime = c.time ?? 0;
        this.cqIo = c.io ?? 0;
        try {
          if (isBounceToken(t)) this.onReceive(r, c);
          else if (t === 0) {
            if (c.flags & CqFlag.REMOTE_WRITE) this.onRemoteWrite(r, c);
            else log.warn(`${this.name}: rail ${r}: a completion without a token (flags 0x${c.flags.toString(16)}, status ${c.status})`);
          } else this.onOp(r, c);
        } catch (e) {
          this.contain(r, c, e);
        }
      }
    } finally {
      this.cqTime = 0;
      this.inBatch = false;
      try {
        this.fences.start(); // one round of fences for the batch's receives
        if (this.acking.size) {
          const comms = [...this.acking];
          this.acking.clear();
          for (const c of comms) c.sendAcks(); // one write per comm for the batch's receives
        }
      } finally {
        this.pool.refill(r);
      }
    }
  };

  /**
   * A completion's handling threw (what a peer sent broke an assumption): the comm it names
   * fails with the reason, and the rest of the batch goes on; where it names none, a WARN.
   */
  private contain(r: number, c: Completion, e: unknown): void {
    const why = e instanceof Error ? e.message : String(e);
    const comm = this.commOf(c);
    if (comm) comm.fail(remoteError(`${comm.name}: protocol error: handling what the peer sent failed: ${why}`));
    else log.warn(`${this.name}: rail ${r}: handling a completion failed: ${why}`);
  }

  /** The comm a peer's completion names by its immediate data (a write's, or a message's but a CONNECT's). */
  private commOf(c: Completion): OfiComm | undefined {
    if (!(c.flags & CqFlag.REMOTE_CQ_DATA)) return undefined;
    if (c.token === 0 || c.flags & CqFlag.REMOTE_WRITE) return this.comms[immComm(c.imm)];
    return msgKind(c.imm) === MsgKind.CONNECT ? undefined : this.comms[msgId(c.imm)];
  }

  listen(): OfiListener {
    for (let k = 0; k < MAX_COMMS; k++) {
      this.nextListener = (this.nextListener % (MAX_COMMS - 1)) + 1;
      if (!this.listeners[this.nextListener]) {
        const l = new OfiListener(this, this.nextListener);
        this.listeners[l.id] = l;
        return l;
      }
    }
    throw internalError(`${this.name}: every listener id is taken`);
  }

  connect(handle: Uint8Array): OfiConnector {
    return new OfiConnector(this, handle);
  }

  /** Periodic: frees the memory of comms whose quarantine ended, ticks every comm. */
  tick(now: number, timeoutMs = this.timeoutMs, judge = true): void {
    this.now = now;
    if (this.retired.length) {
      const keep = [];
      for (const x of this.retired) if (x.at <= now) this.freeShared(x.region);
      else keep.push(x);
      this.retired = keep;
    }
    for (const c of this.live) c.tick(now, timeoutMs, judge);
  }

  /**
   * The thread is done with this device: every comm and listener closes and no receive is
   * posted again. The native side then closes the endpoints, which cancels the posted
   * receives (their -ECANCELED completions are absorbed) and frees the memory.
   */
  close(): void {
    this.shut = true;
    for (const c of [...this.live]) c.close();
    for (const l of this.listeners) l?.close();
    this.pool.close();
  }

  /**
   * After close() and after the rails' endpoints closed: the memory this endpoint registered
   * itself goes now, the bounce buffers, the regions still in quarantine and the flush line
   * (nothing can write into them any more). The memory itself stays until both its
   * registration and its ArrayBuffer are gone (native HostMem).
   */
  freeMemory(): void {
    if (this.freed) return;
    this.freed = true;
    this.pool.freeChunks();
    for (const x of this.retired.splice(0)) this.freeShared(x.region);
    this.freeShared(this.line);
  }

  /** Why the bounce-buffer accounting is wrong, or undefined. */
  check(): string | undefined {
    return this.pool.check();
  }

  // ---- used by comms and listeners --------------------------------------------------------

  /** A receive comm queued acknowledgements in this batch: they leave when it ends. */
  ackLater(c: OfiRecvComm): void {
    this.acking.add(c);
  }

  nextSerial(): number {
    return ++this.serials;
  }

  /** A free comm id, round-robin, skipping ids still in quarantine. */
  addComm(c: OfiComm): number {
    const n = this.comms.length;
    for (let k = 1; k < n; k++) {
      const id = ((this.nextId + k - 1) % (n - 1)) + 1;
      if (this.comms[id] || this.now - this.closedAt[id] < this.timeoutMs) continue;
      this.nextId = id;
      this.comms[id] = c;
      this.live.add(c);
      return id;
    }
    throw internalError(`${this.name}: all ${n - 1} comm ids are in use or in quarantine`);
  }

  removeComm(c: OfiComm): void {
    if (this.comms[c.id] !== c) return;
    this.comms[c.id] = undefined;
    if (c.isRecv && this.accepted.get((c as OfiRecvComm).connectKey) === c) this.accepted.delete((c as OfiRecvComm).connectKey);
    this.live.delete(c);
    this.closedAt[c.id] = this.now;
  }

  /**
   * A CONNECT for a listener that is closed: a repeat of one whose comm was made (its ACCEPT was
   * lost, and NCCL closed the listener once accept returned) gets that comm's ACCEPT again; any
   * other is refused (the connector fails at once), with one WARN per connector.
   */
  private onLateConnect(listener: number, view: Uint8Array): void {
    const c = decodeConnect(view);
    if (typeof c === 'string') return log.warn(`${this.name}: a bad connect message for listener ${listener}, which is closed: ${c}`);
    if (answerAgain(this, c)) return;
    this.refuse(c, Refusal.LISTENER_CLOSED);
    const key = connectKey(c);
    if (this.lateWarned.has(key)) return;
    if (this.lateWarned.size >= 1024) this.lateWarned.clear();
    this.lateWarned.add(key);
    log.warn(`${this.name}: a connect message for listener ${listener}, which is closed (from comm ${c.comm} of a peer endpoint); refused`);
  }

  /**
   * Answers a CONNECT with a refusal (an ACCEPT header with a status), from NIC 0 to the
   * connector's NIC 0: it fails its connect at once with the reason instead of waiting out the
   * timeout. At most REFUSAL_SLOTS in flight; beyond them (a flood) the connector times out.
   */
  refuse(c: Connect, status: Refusal): void {
    const slot = this.refusing.indexOf(0);
    if (slot < 0 || this.shut) return;
    let peer: number;
    try {
      peer = this.peerId(0, c.names[0]);
    } catch (e) {
      log.info(`${this.name}: cannot tell a connector that it is refused (${REFUSAL_WORDS[status]}): ${(e as Error).message}`);
      return;
    }
    const at = REFUSAL_AT + 64 * slot;
    const len = encodeRefusal(c.connectorNonce, status, this.line.bytes!.subarray(at, at + 64));
    this.refusing[slot] = 1;
    this.stats.refused++;
    const token = this.ops.alloc(OpKind.NOTICE, 0, 0, 0, slot, 0, 0);
    const la = this.line.base + at;
    this.rails[0].send(peer, hiOf(la), loOf(la), len, this.line.regs[0].desc, immMsg(MsgKind.ACCEPT, c.comm), token);
  }

  /**
   * Tells a comm's peer that it closed (CLOSE, 0 bytes, from the flush line's zero bytes); not
   * once the endpoint closes (the transport's release at the last finalize, when NCCL has closed
   * its comms, and the peers' endpoints may be closing too). A peer endpoint of this process that
   * has closed is refused by the engine (ECONNREFUSED) rather than written into
   * (native/ofi/ofi_internal.h, LocalEndpoint).
   */
  sendClose(nic: number, peer: number, imm: number): void {
    if (this.shut) return;
    const token = this.ops.alloc(OpKind.NOTICE, 0, 0, nic, -1, 0, 0);
    const la = this.line.base + this.zeroAt;
    this.rails[nic].send(peer, hiOf(la), loOf(la), 0, this.line.regs[nic].desc, imm, token);
  }

  comm(id: number): OfiComm | undefined {
    return this.comms[id];
  }

  removeListener(l: OfiListener): void {
    if (this.listeners[l.id] === l) this.listeners[l.id] = undefined;
  }

  /** The AV id of a peer endpoint name on NIC nic (inserted once). */
  peerId(nic: number, name: Uint8Array): number {
    // The provider reads an address of its own length from the name: a shorter one would be
    // read past its end (the same provider on both ends gives names of one length).
    if (name.length !== this.rails[nic].name.length)
      throw systemError(`${this.name}: a peer's address on NIC ${nic} is ${name.length} bytes; this provider's are ${this.rails[nic].name.length}`);
    const key = Buffer.from(name.buffer, name.byteOffset, name.length).toString('hex');
    let id = this.peers[nic].get(key);
    if (id === undefined) {
      id = this.rails[nic].insertPeer(name);
      this.peers[nic].set(key, id);
      this.insertedAt[nic].set(id, ++this.inserts);
    }
    return id;
  }

  /** Peer addresses inserted so far, on every rail: a point in time for insertedSince. */
  get avSerial(): number {
    return this.inserts;
  }

  /** Whether peer id of NIC nic went into the address vector after avSerial was serial. */
  insertedSince(nic: number, id: number, serial: number): boolean {
    return (this.insertedAt[nic].get(id) ?? 0) > serial;
  }

  /** Host memory registered on every NIC (allocated on NIC 0). */
  allocShared(bytes: number): OwnedRegion {
    const buf = this.rails[0].alloc(bytes);
    const regs = [buf.reg];
    try {
      for (let i = 1; i < this.rails.length; i++) regs.push(this.rails[i].regMr(buf.addr, bytes, 'host'));
    } catch (e) {
      for (let i = 1; i < regs.length; i++) this.rails[i].deregMr(regs[i]);
      this.rails[0].free(buf);
      throw e;
    }
    return { id: 0, base: buf.addr, size: bytes, bytes: buf.bytes, kind: 'host', regs, host: buf };
  }

  freeShared(region: OwnedRegion): void {
    for (let i = 1; i < region.regs.length; i++) this.rails[i].deregMr(region.regs[i]);
    this.rails[0].free(region.host);
  }

  /** Frees region after the quarantine: the peer may still write into it until then. */
  retire(region: OwnedRegion): void {
    this.retired.push({ region, at: this.now + this.timeoutMs });
  }

  // ---- completion routing -----------------------------------------------------------------

  /**
   * Whether c, which names comm, may have come from comm's peer (always so where senders are not
   * checked). AV id 0, the endpoint itself, cannot tell: shm of libfabric 1.17 names a sender
   * it does not know so, and also a peer whose first message came before its address was
   * inserted, for good (docs/ofi-facts.md); it passes and is counted. A sender that is not the
   * peer is counted and dropped: the first few with a WARN.
   */
  private fromPeer(r: number, c: Completion, comm: OfiComm, what: string): boolean {
    if (!(c.flags & CqFlag.REMOTE_WRITE ? this.checkWriters : this.checkSenders)) return true;
    const src = c.src ?? -1;
    if (comm.sentBy(r, src)) return true;
    if (src === 0) {
      this.stats.unnamed++;
      return true;
    }
    const n = ++this.stats.foreign;
    if (n <= FOREIGN_WARNINGS)
      log.warn(
        `${this.name}: rail ${r}: ${what} for ${comm.name} from ${src < 0 ? 'a sender not in the address vector' : `peer ${src}`}, which is not its peer; dropped` +
          (n === FOREIGN_WARNINGS ? ' (further ones are only counted)' : ''),
      );
    return false;
  }

  // A posted receive completed: a message, or (FI_RX_CQ_DATA) a remote write that consumed it.
  private onReceive(r: number, c: Completion): void {
    const id = bounceId(c.token);
    this.pool.consume(id);
    if (c.status !== 0) {
      this.pool.release(id);
      if (c.status === -ECANCELED) return;
      // A message that did not fit a bounce buffer (more than the capacity the peer was told):
      // the comm it names lost it and would wait for it for good.
      const comm = msgKind(c.imm) === MsgKind.EAGER ? this.commOf(c) : undefined;
      const what = `a posted receive failed: ${c.error || ''} (${statusName(c.status)})`;
      if (comm) comm.fail(remoteError(`${comm.name}: protocol error: an eager message was lost: ${what}`));
      else log.warn(`${this.name}: rail ${r}: ${what}`);
      return;
    }
    if (c.flags & CqFlag.REMOTE_WRITE) {
      this.pool.release(id);
      this.onRemoteWrite(r, c);
      return;
    }
    if (!(c.flags & CqFlag.REMOTE_CQ_DATA)) {
      this.pool.release(id);
      log.warn(`${this.name}: rail ${r}: a message of ${c.len} bytes without immediate data, dropped`);
      return;
    }
    const to = msgId(c.imm);
    switch (msgKind(c.imm)) {
      case MsgKind.EAGER: {
        const comm = this.comms[to];
        if (!comm || !comm.isRecv) {
          this.stats.staleMessages++;
          this.pool.release(id);
        } else if (this.fromPeer(r, c, comm, 'an eager message')) (comm as OfiRecvComm).onEager(r, id, c.len);
        else this.pool.release(id);
        return;
      }
      case MsgKind.CONNECT: {
        const l = this.listeners[to];
        const view = this.pool.bytes(id).subarray(this.pool.offset(id), this.pool.offset(id) + c.len);
        try {
          if (l) l.onConnect(view);
          else this.onLateConnect(to, view);
        } finally {
          this.pool.release(id);
        }
        return;
      }
      case MsgKind.ACCEPT: {
        const comm = this.comms[to];
        const view = this.pool.bytes(id).subarray(this.pool.offset(id), this.pool.offset(id) + c.len);
        try {
          if (comm && !comm.isRecv) {
            if (this.fromPeer(r, c, comm, 'an accept message')) (comm as OfiSendComm).onAccept(view);
          } else this.stats.staleMessages++;
        } finally {
          this.pool.release(id);
        }
        return;
      }
      case MsgKind.HEARTBEAT: {
        const comm = this.comms[to];
        if (comm) {
          if (this.fromPeer(r, c, comm, 'a heartbeat')) comm.heard();
        } else this.stats.staleMessages++;
        this.pool.release(id);
        return;
      }
      case MsgKind.CLOSE: {
        // Only the connection it names: a late CLOSE for a closed comm whose id was given again
        // carries another connection's mark.
        const comm = this.comms[to];
        if (comm && closeMark(comm.connectorNonce) === immCloseMark(c.imm)) {
          if (this.fromPeer(r, c, comm, 'a close message')) {
            this.stats.peerClosed++;
            comm.onPeerClosed();
          }
        } else this.stats.staleMessages++;
        this.pool.release(id);
        return;
      }
      default:
        this.pool.release(id);
        log.warn(`${this.name}: rail ${r}: a message of unknown kind ${msgKind(c.imm)}, dropped`);
    }
  }

  private onRemoteWrite(r: number, c: Completion): void {
    if (c.status !== 0) {
      log.warn(`${this.name}: rail ${r}: a remote write failed: ${c.error || ''} (${statusName(c.status)})`);
      return;
    }
    const comm = this.comms[immComm(c.imm)];
    if (comm) {
      if (comm.holdEarly(r, c)) return;
      if (this.fromPeer(r, c, comm, 'a remote write')) comm.onRemoteWrite(r, c.imm, c.len || c.immHi || 0);
    } else this.stats.staleWrites++;
  }

  /**
   * The remote writes a send comm kept before its ACCEPT (OfiSendComm.holdEarly), now that it
   * knows its peer's rails: each is checked as it would have been on arrival, then taken.
   */
  replayEarly(comm: OfiComm, held: readonly { rail: number; c: Completion; serial: number }[]): void {
    for (const { rail: r, c, serial } of held) {
      if (comm.failed || comm.closed) return;
      // A sender the address vector did not have when the write came (FI_ADDR_NOTAVAIL) cannot be
      // named now; where the ACCEPT's address for that rail went in only since, it may well have
      // been the peer: it passes, counted as unnamed (as shm's id 0 does).
      const newPeer = (c.src ?? -1) < 0 && this.checkWriters && comm.peersOn(r).some((id) => this.insertedSince(r, id, serial));
      if (newPeer) this.stats.unnamed++;
      if (newPeer || this.fromPeer(r, c, comm, 'a remote write')) comm.onRemoteWrite(r, c.imm, c.len || c.immHi || 0);
    }
  }

  private onOp(r: number, c: Completion): void {
    const ops = this.ops;
    const t = c.token;
    if (!ops.live(t)) {
      log.warn(`${this.name}: rail ${r}: a completion for token ${t}, which names no operation in flight`);
      return;
    }
    const kind = ops.kind[t] as OpKind;
    if (kind === OpKind.NOTICE) {
      // The endpoint's own: a refusal (a = its slot) or a closed comm's CLOSE (a = -1).
      const slot = ops.a[t];
      ops.free(t);
      if (slot >= 0) this.refusing[slot] = 0;
      if (c.status !== 0) log.info(`${this.name}: rail ${r}: ${slot >= 0 ? 'a refusal' : 'a close message'} to a peer failed: ${c.error || ''} (${statusName(c.status)})`);
      return;
    }
    if (kind === OpKind.FENCE) {
      // The endpoint's own: a round of fences for the receives of every comm on one GPU.
      const device = ops.a[t];
      ops.free(t);
      this.fences.onDone(device, r, c);
      return;
    }
    const comm = this.comms[ops.comm[t]];
    const a = ops.a[t];
    const b = ops.b[t];
    const cc = ops.c[t];
    const serial = ops.serial[t];
    ops.free(t);
    if (!comm || comm.serial !== serial) {
      // The comm closed: nothing of it reaches anyone; an eager copy's bounce buffer comes back.
      this.stats.staleOps++;
      if (kind === OpKind.EAGER_COPY) this.pool.release(cc);
      return;
    }
    if (c.status !== 0) {
      if (kind === OpKind.EAGER_COPY) this.pool.release(cc);
      comm.onOpError(kind, r, c, a);
      return;
    }
    comm.onOpDone(kind, a, b, cc, r);
  }
}
