// The send side. The receiver writes a control message into this comm's mailbox for every
// irecv (one 64-byte entry per sub-receive: where the buffer is, its keys, size and tag) and
// the immediate data of that write says which slot is ready. Control messages are handed to
// the matcher in receive order; a send that matches an entry is RDMA-written into the
// receiver's buffer in stripes, each with immediate data naming (receiver comm, receive,
// sub-receive, segments). A small send that matches no known entry goes eager: into the
// receiver's bounce buffers with an 8-byte header (eager ordinal, first receive this side did
// not know, tag), from which the receiver finds the same entry this side will match it to
// once the control message comes. A written send completes when its writes complete; an eager
// one when its send completed and its control message matched it. With CUDA IPC
// (TSNET_OFI_GPU_IPC, a peer in another process) a written send from GPU memory completes
// only when the receiver acknowledges its receive as fenced: libfabric's shm reports such a
// write complete before the target's device-to-device copy has read the source, and NCCL
// reuses a send buffer as soon as its send completes (docs/rdma-protocol.md).
import { hiOf, loOf } from '../../addr';
import { ResultCode } from '../../abi';
import { objectArray } from '../../arrays';
import { type NetError, internalError, invalidUsage, systemError } from '../../errors';
import { log } from '../../log';
import { OfiComm } from './comm';
import type { OfiEndpoint, OwnedRegion } from './endpoint';
import { type Completion, type Region, type ReqBuf, type SendComm, ownRegs } from './fabric';
import { SharedSendMatcher, type MatchSink } from './matcher';
import { OpKind, SETUP_MESSAGE } from './ops';
import { statusName } from './status';
import { EAGER_HEADER_BYTES, eagerLimit, mayGoEager } from './policy/eager';
import { homeRail } from './policy/rails';
import { Schedule, StripeScheduler } from './policy/stripes';
import {
  ENTRY_ADDR_HI,
  ENTRY_ADDR_LO,
  ENTRY_KEYS,
  ENTRY_MARK,
  ENTRY_SIZE,
  ENTRY_TAG,
  ENTRY_WORDS,
  MAILBOX_SLOTS,
  CONNECT_GPU_IPC,
  MsgKind,
  SEGS_ACK,
  SEGS_CTRL,
  SEGS_TOO_BIG,
  SLOT_BYTES,
  REFUSAL_WORDS,
  decodeAccept,
  encodeConnect,
  entryMark,
  immIndex,
  immMsg,
  immSegs,
  immSeq,
  immWrite,
  unwrapAfter,
  unwrapBefore,
} from './wire';

/** Sends a comm may have in flight (NCCL: 32 requests x 8 sub-receives). */
const MAX_SENDS = 1024;
const MAILBOX_BYTES = MAILBOX_SLOTS * SLOT_BYTES;
/** Remote writes a send comm keeps before its ACCEPT (holdEarly): every mailbox slot twice over. */
const EARLY_MAX = 2 * MAILBOX_SLOTS;
const CONNECT_AT = MAILBOX_BYTES;
const HEADERS_AT = CONNECT_AT + 512;
const SLOT_WORDS = SLOT_BYTES / 4;

class SendRec {
  slot = 0;
  region: Region | null = null;
  offset = 0;
  size = 0;
  tag = 0;
  /** Went eager (before its control message). */
  eager = false;
  /** Waits for a control message to be written. */
  waiting = false;
  /** Its control message matched it. */
  matched = false;
  /** Operations posted and not completed. */
  left = 0;
  /** CUDA IPC: waits for the receiver's acknowledgement of receive `recv`. */
  ack = false;
  recv = 0;
  code: ResultCode = ResultCode.SUCCESS;
  live = false;
  constructor(readonly index: number) {}
}

export class OfiSendComm extends OfiComm implements SendComm, MatchSink<SendRec> {
  readonly isRecv = false;
  /** Set by ACCEPT. */
  connected = false;
  /** When the ACCEPT made it connected (performance.now(), ms; TSNET_STATS). */
  connectedAt: number | undefined;
  connectError: NetError | undefined;
  private readonly mem: OwnedRegion;
  private readonly mb32: Uint32Array;
  private readonly mbI32: Int32Array;
  private readonly matcher = new SharedSendMatcher<SendRec>(this);
  private readonly recs: SendRec[] = objectArray();
  private readonly freeRecs: SendRec[] = objectArray();
  private live = 0;
  private eagerMax = -1;
  private eagerQueued = 0;
  private waiting = 0;
  private eagerOrdinal = 0;
  /** Control messages that arrived, by mailbox slot: n, or 0. */
  private readonly arrived = new Uint8Array(MAILBOX_SLOTS);
  /** Remote writes that came before the ACCEPT from rails it will name (holdEarly). */
  private early: { rail: number; c: Completion; serial: number }[] = [];
  private readonly tags = new Int32Array(8);
  private scheduler: StripeScheduler | undefined;
  private readonly schedule = new Schedule();
  // A typed array: a size read from the mailbox (a Float64Array) is a boxed number, and storing
  // one into a plain array of small integers made V8 throw the compiled code away under NCCL.
  private readonly sizes = new Float64Array(1);
  private readonly hdr: DataView;
  /**
   * CUDA IPC with this peer: GPU memory is written from its IPC registration and the sends
   * wait for acknowledgements; else every operation uses the plain registration.
   */
  private ipc = false;
  /** CUDA IPC: send records waiting for an acknowledgement, by receive sequence mod MAILBOX_SLOTS. */
  private readonly ackWait: number[][] = Array.from({ length: MAILBOX_SLOTS }, () => []);

  constructor(ep: OfiEndpoint) {
    super(ep, 'send');
    try {
      this.mem = ep.allocShared(HEADERS_AT + MAX_SENDS * EAGER_HEADER_BYTES);
    } catch (e) {
      ep.removeComm(this);
      throw e;
    }
    const b = this.mem.bytes!;
    this.mb32 = new Uint32Array(b.buffer, b.byteOffset, MAILBOX_BYTES / 4);
    this.mbI32 = new Int32Array(b.buffer, b.byteOffset, MAILBOX_BYTES / 4);
    this.hdr = new DataView(b.buffer, b.byteOffset + HEADERS_AT, MAX_SENDS * EAGER_HEADER_BYTES);
    this.connectorNonce = ep.random() >>> 0;
  }

  /** When CONNECT was last sent (ep.clock()), and whether its send failed since. */
  connectSentAt = 0;
  connectLost = false;
  /** When CONNECT was first sent: the connect's deadline counts from it (tick). */
  private connectStartedAt = 0;
  private connectTo: { peer: number; listener: number; len: number } | undefined;

  /**
   * Sends CONNECT to the listener named by a handle, from NIC 0. Again with the same bytes
   * while no ACCEPT came (resendConnect): a provider may drop its connection to the peer
   * under a send (libfabric's tcp after the peer deregistered memory under its writes), and
   * the listener answers a repeated CONNECT with the same receive comm.
   */
  sendConnect(listener: number, listenerNonce: number, name: Uint8Array): void {
    const out = this.mem.bytes!.subarray(CONNECT_AT, CONNECT_AT + 512);
    const len = encodeConnect(
      {
        listenerNonce,
        connectorNonce: this.connectorNonce,
        comm: this.id,
        rails: this.ep.railCount,
        eagerMax: this.ep.config.eagerMax,
        flags: this.ep.config.gpuIpc ? CONNECT_GPU_IPC : 0,
        pid: this.ep.pid,
        start: this.ep.start,
        boot: this.ep.boot,
        mailboxAddr: this.mem.base + this.mem.regs[0].remoteDelta,
        mailboxKeys: this.mem.regs.map((r) => ({ lo: r.keyLo, hi: r.keyHi })),
        names: this.ep.rails.map((r) => r.name),
      },
      out,
    );
    this.connectTo = { peer: this.ep.peerId(0, name), listener, len };
    this.connectStartedAt = this.ep.clock();
    this.resendConnect();
  }

  /**
   * While connecting: the listener's silence is judged here, at the watchdog's ticks, like a
   * peer's (judge: Transport.tick's), so that a thread or process held past the deadline takes
   * the ACCEPT that waited before it gives up. Once connected, the comm's own liveness.
   */
  override tick(now: number, timeoutMs: number, judge = true): void {
    if (this.connectTo && !this.connected) {
      if (judge && !this.connectError && !this.failed && !this.closed && now - this.connectStartedAt > timeoutMs)
        this.connectError = systemError(`${this.name}: connect: no answer from the listener within ${timeoutMs} ms`);
      return;
    }
    super.tick(now, timeoutMs, judge);
  }

  resendConnect(): void {
    const to = this.connectTo!;
    this.connectLost = false;
    this.connectSentAt = this.ep.clock();
    const token = this.ep.ops.alloc(OpKind.MESSAGE, this.id, this.serial, 0, SETUP_MESSAGE, 0, 0);
    const la = this.mem.base + CONNECT_AT;
    this.ep.rails[0].send(to.peer, hiOf(la), loOf(la), to.len, this.mem.regs[0].desc, immMsg(MsgKind.CONNECT, to.listener), token);
  }

  override onOpError(kind: OpKind, rail: number, c: Completion, a = 0): void {
    if (kind === OpKind.MESSAGE && a === SETUP_MESSAGE && !this.connected) {
      log.info(`${this.name}: the connect message failed (${c.error || statusName(c.status)}); sending it again`);
      this.connectLost = true;
      return;
    }
    super.onOpError(kind, rail, c, a);
  }

  /** Before the ACCEPT, only the listener's endpoint (NIC 0) may speak to this comm. */
  override sentBy(nic: number, src: number): boolean {
    if (this.connected) return super.sentBy(nic, src);
    return nic === 0 && this.connectTo !== undefined && src === this.connectTo.peer;
  }

  /**
   * A remote write from another of the peer's rails can come before the ACCEPT that names that
   * rail: the receiver writes its first control messages as soon as it has accepted and NCCL
   * posted receives, round robin over the rails, while the ACCEPT travels on rail 0 and the rails
   * keep no order between them. Checked now, it came from no known peer and was dropped, and the
   * sends it announced waited for good (aws-ofi-nccl's reuse_listen_comm over 2 shm rails hung in
   * 3 runs of 5, "a remote write for ... from peer 1, which is not its peer"). So until the
   * ACCEPT the comm keeps such writes (their bytes are in its mailbox already) and checks them
   * once it knows the peer's rails (OfiEndpoint.replayEarly); past EARLY_MAX they are checked at
   * once, as before.
   */
  override holdEarly(rail: number, c: Completion): boolean {
    if (this.connected || this.closed || this.failed) return false;
    if (this.sentBy(rail, c.src ?? -1) || this.early.length >= EARLY_MAX) return false;
    this.early.push({ rail, c: { ...c }, serial: this.ep.avSerial }); // c is the rail's reused record
    return true;
  }

  /** The listener's answer: the receiver's comm id, rails and eager capacity. */
  onAccept(bytes: Uint8Array): void {
    if (this.connected || this.closed) return;
    const a = decodeAccept(bytes);
    if (typeof a !== 'string' && 'refused' in a) {
      // A refusal names the attempt it answers: one for another attempt says nothing of this one.
      if (a.connectorNonce === this.connectorNonce)
        this.connectError = systemError(`${this.name}: connect: refused: ${REFUSAL_WORDS[a.refused] ?? `status ${a.refused}`}`);
      return;
    }
    if (typeof a === 'string' || a.connectorNonce !== this.connectorNonce) {
      this.connectError = systemError(`${this.name}: connect: ${typeof a === 'string' ? a : 'an answer to another connect attempt'}`);
      return;
    }
    try {
      this.setPeers(a.comm, a.rails, a.names);
    } catch (e) {
      this.connectError = systemError(`${this.name}: connect: the answer's addresses: ${e instanceof Error ? e.message : String(e)}`);
      return;
    }
    this.eagerMax = eagerLimit(this.ep.config.eagerMax, a.eagerCapacity);
    // The listener saw our CONNECT_GPU_IPC and pid, and decides the same way.
    this.ipc = this.ep.config.gpuIpc && a.pid !== this.ep.pid;
    this.watchPeer(a.pid, a.start, a.boot);
    const maxMsg = Math.min(...this.ep.rails.map((r) => r.maxMsgSize));
    const home = this.ep.config.smallRail === 'comm' ? homeRail(this.id, this.rails) : -1;
    this.scheduler = new StripeScheduler(this.rails, this.ep.config.minStripe, this.ep.config.smallRrMax, maxMsg, home, Math.max(this.eagerMax, this.ep.config.smallRrMax));
    this.connected = true;
    this.connectedAt = performance.now();
    this.heard();
    log.info(
      `${this.name}: connected to comm ${a.comm}, ${this.rails} rail(s), eager up to ${this.eagerMax} bytes` +
        (this.ep.config.gpuIpc ? (this.ipc ? ', GPU memory by CUDA IPC' : ', no CUDA IPC (the peer is this process)') : '') +
        (this.early.length ? `; ${this.early.length} control write(s) on other rails came before the answer` : ''),
    );
    if (this.early.length) {
      const held = this.early;
      this.early = [];
      this.ep.replayEarly(this, held);
    }
  }

  get pending(): number {
    return this.live;
  }

  isend(slot: number, buf: ReqBuf): void {
    if (this.failed) {
      this.sizes[0] = 0;
      this.complete(slot, this.failed.code, this.sizes);
      return;
    }
    if (!this.connected || (!buf.region && buf.size > 0)) {
      this.sizes[0] = 0;
      log.warn(`${this.name}: isend ${this.connected ? `of ${buf.size} bytes without a registered region` : 'before the comm is connected'}`);
      this.complete(slot, ResultCode.INTERNAL_ERROR, this.sizes);
      return;
    }
    const rec = this.freeRecs.pop() ?? this.newRec();
    if (!rec) {
      this.sizes[0] = 0;
      this.fail(internalError(`${this.name}: more than ${MAX_SENDS} sends in flight`));
      this.complete(slot, ResultCode.INTERNAL_ERROR, this.sizes);
      return;
    }
    rec.slot = slot;
    rec.region = buf.region;
    rec.offset = buf.offset;
    rec.size = buf.size;
    rec.tag = buf.tag;
    rec.eager = rec.waiting = rec.matched = rec.ack = false;
    rec.left = 0;
    rec.code = ResultCode.SUCCESS;
    rec.live = true;
    this.live++;
    if (this.matcher.arrive(rec, buf.tag)) return;
    if (mayGoEager(buf.size, this.eagerMax, this.eagerQueued, this.waiting, rec.region?.kind === 'cuda', this.ep.gpuEager)) this.sendEager(rec);
    else {
      rec.waiting = true;
      this.waiting++;
    }
  }

  private newRec(): SendRec | undefined {
    if (this.recs.length === MAX_SENDS) return undefined;
    const r = new SendRec(this.recs.length);
    this.recs.push(r);
    return r;
  }

  // Header { u16 ordinal, u16 base, i32 tag } then the payload, in one two-iovec send.
  private sendEager(rec: SendRec): void {
    const ep = this.ep;
    rec.eager = true;
    this.eagerQueued++;
    const at = rec.index * EAGER_HEADER_BYTES;
    this.hdr.setUint16(at, this.eagerOrdinal & 0xffff, true);
    this.hdr.setUint16(at + 2, this.matcher.known & 0xffff, true);
    this.hdr.setInt32(at + 4, rec.tag, true);
    this.eagerOrdinal++;
    const l = this.scheduler!.pickSmall();
    const nic = this.nic[l];
    const src = rec.region ?? ep.line;
    const addr = rec.region ? rec.region.base + rec.offset : ep.line.base + ep.zeroAt;
    // Never the IPC registration: an eager send is not acknowledged.
    const regs = ownRegs(src);
    rec.left = 1;
    this.wroteAt = ep.now;
    const token = ep.ops.alloc(OpKind.EAGER, this.id, this.serial, nic, rec.index, 0, 0);
    const header = this.mem.base + HEADERS_AT + at;
    ep.rails[nic].send2(
      this.peer[l],
      hiOf(header), loOf(header),
      EAGER_HEADER_BYTES,
      this.mem.regs[nic].desc,
      hiOf(addr), loOf(addr),
      rec.size,
      regs[nic].desc,
      immMsg(MsgKind.EAGER, this.peerComm),
      token,
    );
  }

  // ---- control messages -------------------------------------------------------------------

  onRemoteWrite(_rail: number, imm: number, len: number): void {
    if (this.failed) return;
    this.heard();
    if (immSegs(imm) === SEGS_ACK && this.ipc) {
      // len: the high half of the immediate data (a 0-byte write): receives acknowledged with it.
      const r = unwrapBefore(this.matcher.known - 1, immSeq(imm), 10);
      if (r < 0) return this.protocolError(`an acknowledgement of receive ${r}, before the first`);
      this.onAck(r);
      for (let more = len >>> 0, j = 0; more !== 0; more >>>= 1, j++) {
        if (!(more & 1)) continue;
        if (r - 1 - j < 0) return this.protocolError(`an acknowledgement of receive ${r - 1 - j}, before the first`);
        this.onAck(r - 1 - j);
      }
      return;
    }
    if (immSegs(imm) !== SEGS_CTRL) return this.protocolError(`a data write (immediate 0x${imm.toString(16)}) reached a send comm`);
    const known = this.matcher.known;
    const seq = unwrapAfter(known, immSeq(imm), 10);
    const n = immIndex(imm) + 1;
    if (seq - this.matcher.oldest >= MAILBOX_SLOTS) return this.protocolError(`control message ${seq} overruns the mailbox (oldest open receive ${this.matcher.oldest})`);
    // Providers that do not report a remote write's length (tcp) give 0: the entries' marks check it then.
    if (len !== 0 && len !== n * 64) return this.protocolError(`control message ${seq} of ${len} bytes for ${n} entries`);
    const s = seq % MAILBOX_SLOTS;
    if (this.arrived[s]) return this.protocolError(`control message ${seq} arrived twice`);
    this.arrived[s] = n;
    // Hand the control messages to the matcher in receive order.
    for (let r = this.matcher.known; this.arrived[r % MAILBOX_SLOTS] && !this.failed; r = this.matcher.known) {
      const w = (r % MAILBOX_SLOTS) * SLOT_WORDS;
      const cnt = this.arrived[r % MAILBOX_SLOTS];
      this.arrived[r % MAILBOX_SLOTS] = 0;
      for (let i = 0; i < cnt; i++) {
        const e = w + i * ENTRY_WORDS;
        if (this.mb32[e + ENTRY_MARK] !== entryMark(r, cnt, i))
          return this.protocolError(`control message ${r} entry ${i}: mark 0x${this.mb32[e + ENTRY_MARK].toString(16)}, expected 0x${entryMark(r, cnt, i).toString(16)}`);
        this.tags[i] = this.mbI32[e + ENTRY_TAG];
      }
      this.matcher.post(r, cnt, this.tags);
    }
  }

  onFull(_recv: number): void {}

  /** CUDA IPC: receive recv is fenced at the receiver, so the sends written into it have been read. */
  private onAck(recv: number): void {
    const list = this.ackWait[recv % MAILBOX_SLOTS];
    let keep = 0;
    for (let k = 0; k < list.length; k++) {
      const rec = this.recs[list[k]];
      if (rec.live && rec.ack && rec.recv === recv) {
        rec.ack = false;
        if (this.trace) this.trace.step(rec.slot, 'acknowledged', this.ep.cqTime, this.ep.cqIo);
        this.settle(rec);
      } else list[keep++] = list[k];
    }
    list.length = keep;
  }

  /** send takes entry `index` of receive `recv`: write it there, or (eager) it is delivered. */
  onMatch(rec: SendRec, recv: number, index: number): void {
    if (this.failed) return;
    const e = (recv % MAILBOX_SLOTS) * SLOT_WORDS + index * ENTRY_WORDS;
    const room = this.mb32[e + ENTRY_SIZE];
    if (rec.eager) {
      this.eagerQueued--;
      rec.matched = true;
      if (rec.size > room) this.misfit(rec, room);
      this.settle(rec);
      return;
    }
    if (rec.waiting) {
      rec.waiting = false;
      this.waiting--;
    }
    const ep = this.ep;
    const raddr = this.mb32[e + ENTRY_ADDR_LO] + this.mb32[e + ENTRY_ADDR_HI] * 2 ** 32;
    const src = rec.region ?? ep.line;
    const base = rec.region ? rec.region.base + rec.offset : ep.line.base + ep.zeroAt;
    // CUDA IPC only for bytes to move (a 0-byte or "did not fit" write goes from the plain registration).
    const ipc = this.ipc && src.localRegs !== undefined && rec.size > 0 && rec.size <= room;
    const regs = ipc ? src.regs : ownRegs(src);
    const sch = this.schedule;
    let segs = 0;
    if (rec.size > room) {
      // Tell the receiver (0 bytes, "did not fit") so that its sub-receive ends too.
      this.misfit(rec, room);
      sch.n = 1;
      sch.rail[0] = 0;
      sch.offset[0] = 0;
      sch.len[0] = 0;
      segs = SEGS_TOO_BIG;
    } else if (!this.scheduler!.plan(rec.size, sch)) {
      rec.code = ResultCode.INVALID_USAGE;
      this.fail(invalidUsage(`${this.name}: a ${rec.size}-byte send needs more than 14 segments (provider max_msg_size ${Math.min(...ep.rails.map((r) => r.maxMsgSize))})`));
      return;
    } else segs = sch.n;
    rec.left = sch.n;
    if (ipc) {
      // The receiver acknowledges receive recv once it is complete and fenced.
      rec.ack = true;
      rec.recv = recv;
      this.ackWait[recv % MAILBOX_SLOTS].push(rec.index);
    }
    this.wroteAt = ep.now;
    for (let i = 0; i < sch.n; i++) {
      const l = sch.rail[i];
      const nic = this.nic[l];
      const token = ep.ops.alloc(OpKind.WRITE, this.id, this.serial, nic, rec.index, 0, 0);
      const la = base + sch.offset[i];
      const ra = raddr + sch.offset[i];
      ep.rails[nic].write(
        this.peer[l],
        hiOf(la), loOf(la),
        sch.len[i],
        regs[nic].desc,
        hiOf(ra), loOf(ra),
        this.mb32[e + ENTRY_KEYS + 2 * l],
        this.mb32[e + ENTRY_KEYS + 2 * l + 1],
        immWrite(this.peerComm, recv, index, segs),
        token,
        // The segment's length in the immediate data's high half, for providers that report no
        // length of a remote write (tcp) but carry 8 bytes of immediate data.
        ep.rails[nic].cqDataBytes >= 8 ? sch.len[i] : 0,
      );
    }
  }

  private misfit(rec: SendRec, room: number): void {
    rec.code = ResultCode.INVALID_USAGE;
    log.warn(`${this.name}: isend of ${rec.size} bytes (tag ${rec.tag}) does not fit the ${room}-byte receive posted for it`);
  }

  // ---- completions ------------------------------------------------------------------------

  onOpDone(kind: OpKind, a: number, _b: number, _c: number, _rail: number): void {
    if (kind !== OpKind.EAGER && kind !== OpKind.WRITE) return;
    const rec = this.recs[a];
    if (!rec.live || this.failed) return;
    if (--rec.left === 0 && this.trace) this.trace.step(rec.slot, kind === OpKind.EAGER ? 'sent' : 'written', this.ep.cqTime, this.ep.cqIo);
    this.settle(rec);
  }

  private settle(rec: SendRec): void {
    if (rec.left > 0 || (rec.eager && !rec.matched) || rec.ack) return;
    rec.live = false;
    rec.region = null;
    this.live--;
    this.freeRecs.push(rec);
    this.sizes[0] = rec.code === ResultCode.SUCCESS ? rec.size : 0;
    this.complete(rec.slot, rec.code, this.sizes);
  }

  protected failPending(err: NetError): void {
    for (const rec of this.recs) {
      if (!rec.live) continue;
      rec.live = false;
      this.sizes[0] = 0;
      this.complete(rec.slot, err.code, this.sizes);
    }
    this.dropPending();
  }

  protected dropPending(): void {
    for (const rec of this.recs) {
      rec.live = false;
      rec.region = null;
    }
    for (const l of this.ackWait) l.length = 0;
    this.live = 0;
    this.matcher.clear();
    this.eagerQueued = this.waiting = 0;
  }

  protected release(): void {
    this.ep.retire(this.mem);
  }
}
