// The receive side. irecv writes a control message into the sender's mailbox (one entry per
// sub-receive) and waits: written sub-receives complete when the counted immediate-data
// completions (one per segment) have come; eager messages are resolved in eager-ordinal order
// with the sender's own rule (earliest receive, from the header's base on, with an unused
// entry of that tag) and copied from their bounce buffer (host memory: a copy; GPU memory: a
// local RDMA read). A message that matches no posted receive yet is parked and offered each
// new receive; it never holds back later messages, so a receiver that posts one receive at a
// time cannot deadlock. iflush reads (or writes then reads) through every NIC of the comm.
// With a sender that moves GPU memory by CUDA IPC, a receive that was written completes only
// after a fence (a local read of GPU memory through every NIC of the comm), and then the
// sender is told (an acknowledgement write) that it may reuse the buffers it sent from. The
// endpoint fences the receives of all its comms on a GPU together (fence.ts).
// Completions are queued and reported when the outermost call returns, so a completion
// callback may post the next request.
import { hiOf, loOf } from '../../addr';
import { ResultCode } from '../../abi';
import { copyBytes } from '../../arrays';
import { type NetError, internalError } from '../../errors';
import { log } from '../../log';
import { OfiComm } from './comm';
import { MAX_RAILS } from './config';
import type { OfiEndpoint, OwnedRegion } from './endpoint';
import { type Completion, type RecvComm, type Region, type ReqBuf, ownRegs } from './fabric';
import { FLUSH_HOST_SCRATCH_AT, FLUSH_READ_AT, FLUSH_SRC_AT } from './line';
import { OpKind, SETUP_MESSAGE } from './ops';
import { statusName } from './status';
import { EAGER_HEADER_BYTES } from './policy/eager';
import { FLUSH_LINE, FlushAction, flushAction, flushBytes } from './policy/flush';
import { CtrlRails, homeRail } from './policy/rails';
import {
  ACK_SPAN,
  type Connect,
  CONNECT_GPU_IPC,
  ENTRY_WORDS,
  MAX_RECVS,
  MsgKind,
  SEGS_ACK,
  SEGS_CTRL,
  SEGS_TOO_BIG,
  SLOT_BYTES,
  encodeAccept,
  entryMark,
  immIndex,
  immMsg,
  immSegs,
  immSeq,
  immWrite,
  unwrapAfter,
  unwrapBefore,
} from './wire';

/** Receives in flight at most (and the sender's mailbox slots). */
const RING = 256;
/** Eager messages that can be unresolved at once: 32 x 8 entries of open receives + 32 queued. */
const EAGER_RING = 512;
const STAGING_BYTES = RING * SLOT_BYTES;
const ACCEPT_AT = STAGING_BYTES;
const SLOT_WORDS = SLOT_BYTES / 4;
const DONE_MAX = RING + 1024;

const enum Sub {
  OPEN = 0,
  WRITTEN = 1,
  EAGER = 2,
  DONE = 3,
}

const EMPTY = new Float64Array(0);

export class OfiRecvComm extends OfiComm implements RecvComm {
  readonly isRecv = true;
  /** The CONNECT that made this comm (connect.ts, connectKey): the endpoint finds it by that when the CONNECT comes again. */
  connectKey = '';
  private readonly mem: OwnedRegion;
  private readonly st32: Uint32Array;
  private readonly stI32: Int32Array;
  private readonly mailboxAddr: number;
  private readonly mbKeyLo = new Uint32Array(MAX_RAILS);
  private readonly mbKeyHi = new Uint32Array(MAX_RAILS);
  private readonly ctrlRails: CtrlRails;
  // Receives, by sequence mod RING.
  private nextSeq = 0;
  private oldestOpen = 0;
  private live = 0;
  private readonly rLive = new Uint8Array(RING);
  private readonly rSlot = new Int32Array(RING);
  private readonly rSeq = new Float64Array(RING);
  private readonly rN = new Uint8Array(RING);
  private readonly rDone = new Uint8Array(RING);
  private readonly rCode = new Uint8Array(RING);
  /** The sender moves GPU memory by CUDA IPC: fence written receives and acknowledge them. */
  private readonly acks: boolean;
  /** CUDA IPC: receives complete and fenced, not yet acknowledged (sendAcks). */
  private readonly ackQ: number[] = [];
  /**
   * CUDA IPC: addresses of GPU buffers whose latest receive was fenced after its writes. Under
   * TSNET_FLUSH=auto their iflush has nothing left to do (the fence was that read).
   */
  private readonly fenced = new Set<number>();
  // Sub-receives, by receive slot x 8 + index.
  private readonly sRegion: (Region | null)[] = new Array(RING * MAX_RECVS).fill(null);
  private readonly sOffset = new Float64Array(RING * MAX_RECVS);
  private readonly sSize = new Float64Array(RING * MAX_RECVS);
  private readonly sTag = new Int32Array(RING * MAX_RECVS);
  private readonly sState = new Uint8Array(RING * MAX_RECVS);
  private readonly sExpect = new Uint8Array(RING * MAX_RECVS);
  private readonly sGot = new Uint8Array(RING * MAX_RECVS);
  private readonly sBytes = new Float64Array(RING * MAX_RECVS);
  // Eager arrivals not yet placed, by ordinal mod EAGER_RING.
  private nextOrd = 0;
  private readonly ePresent = new Uint8Array(EAGER_RING);
  private readonly eOrd = new Float64Array(EAGER_RING);
  private readonly eBuf = new Int32Array(EAGER_RING);
  private readonly eLen = new Int32Array(EAGER_RING);
  private readonly eTag = new Int32Array(EAGER_RING);
  private readonly eBase = new Uint16Array(EAGER_RING);
  private readonly parked = new Int32Array(EAGER_RING);
  private parkedCount = 0;
  // Flushes in flight.
  private fSlot = new Int32Array(32);
  private fLeft = new Int32Array(32);
  private fFree: number[] = [];
  private fCount = 0;
  private flushes = 0;
  // Completions to report when the outermost call returns.
  private depth = 0;
  private flushing = false;
  private readonly dSlot = new Int32Array(DONE_MAX);
  private readonly dCode = new Uint8Array(DONE_MAX);
  private readonly dN = new Uint8Array(DONE_MAX);
  private readonly dSizes = new Float64Array(DONE_MAX * MAX_RECVS);
  private dHead = 0;
  private dTail = 0;
  // Typed arrays: sizes are copied from dSizes (a Float64Array), whose values made plain arrays of
  // small integers change kind, and V8 throw the compiled code away, under NCCL.
  private readonly sizesOf: Float64Array[] = Array.from({ length: MAX_RECVS + 1 }, (_, n) => new Float64Array(n));

  constructor(ep: OfiEndpoint, c: Connect) {
    super(ep, 'recv');
    try {
      this.mem = ep.allocShared(STAGING_BYTES + 512);
    } catch (e) {
      ep.removeComm(this);
      throw e;
    }
    const b = this.mem.bytes!;
    this.st32 = new Uint32Array(b.buffer, b.byteOffset, STAGING_BYTES / 4);
    this.stI32 = new Int32Array(b.buffer, b.byteOffset, STAGING_BYTES / 4);
    try {
      this.setPeers(c.comm, c.rails, c.names); // the provider may refuse the peer's addresses
    } catch (e) {
      ep.freeShared(this.mem);
      ep.removeComm(this);
      throw e;
    }
    this.connectorNonce = c.connectorNonce;
    this.mailboxAddr = c.mailboxAddr;
    for (let l = 0; l < this.rails; l++) {
      const k = c.mailboxKeys[l % c.mailboxKeys.length];
      this.mbKeyLo[l] = k.lo;
      this.mbKeyHi[l] = k.hi;
    }
    this.ctrlRails = new CtrlRails(this.rails, ep.config.rrCtrl, ep.config.smallRail === 'comm' ? homeRail(c.comm, this.rails) : -1);
    this.acks = (c.flags & CONNECT_GPU_IPC) !== 0 && c.pid !== ep.pid;
    this.watchPeer(c.pid, c.start, c.boot);
  }

  /** Answers the connector: this comm's id, rails, names and eager capacity. */
  sendAccept(connectorNonce: number): void {
    const out = this.mem.bytes!.subarray(ACCEPT_AT, ACCEPT_AT + 512);
    const len = encodeAccept(
      {
        connectorNonce,
        comm: this.id,
        rails: this.ep.railCount,
        eagerCapacity: this.ep.eagerCapacity,
        pid: this.ep.pid,
        start: this.ep.start,
        boot: this.ep.boot,
        names: this.ep.rails.map((r) => r.name),
      },
      out,
    );
    const token = this.ep.ops.alloc(OpKind.MESSAGE, this.id, this.serial, this.nic[0], SETUP_MESSAGE, 0, 0);
    this.wroteAt = this.ep.now;
    const la = this.mem.base + ACCEPT_AT;
    this.ep.rails[this.nic[0]].send(this.peer[0], hiOf(la), loOf(la), len, this.mem.regs[this.nic[0]].desc, immMsg(MsgKind.ACCEPT, this.peerComm), token);
  }
  /** A lost ACCEPT is not fatal: the connector sends CONNECT again and the listener answers again. */
  override onOpError(kind: OpKind, rail: number, c: Completion, a = 0): void {
    if (kind === OpKind.MESSAGE && a === SETUP_MESSAGE) {
      log.info(`${this.name}: the accept message failed (${c.error || statusName(c.status)}); the connector will ask again`);
      return;
    }
    super.onOpError(kind, rail, c, a);
  }


  get pending(): number {
    return this.live + this.flushes;
  }

  // ---- irecv ------------------------------------------------------------------------------

  irecv(slot: number, bufs: ReqBuf[]): void {
    const n = bufs.length;
    if (this.failed) return this.completeNow(slot, this.failed.code, n);
    if (n < 1 || n > MAX_RECVS) {
      log.warn(`${this.name}: irecv of ${n} buffers; 1 to ${MAX_RECVS}`);
      return this.completeNow(slot, ResultCode.INTERNAL_ERROR, Math.min(n, MAX_RECVS));
    }
    for (let i = 0; i < n; i++)
      if (!bufs[i].region && bufs[i].size > 0) {
        log.warn(`${this.name}: irecv buffer ${i} of ${bufs[i].size} bytes has no registered region`);
        return this.completeNow(slot, ResultCode.INTERNAL_ERROR, n);
      }
    const r = this.nextSeq;
    const w = r % RING;
    if (this.rLive[w]) {
      this.fail(internalError(`${this.name}: more than ${RING} receives in flight`));
      return this.completeNow(slot, ResultCode.INTERNAL_ERROR, n);
    }
    this.depth++;
    this.rLive[w] = 1;
    this.rSlot[w] = slot;
    this.rSeq[w] = r;
    this.rN[w] = n;
    this.rDone[w] = 0;
    this.rCode[w] = ResultCode.SUCCESS;
    const ep = this.ep;
    const line = ep.line;
    const st = this.st32;
    for (let i = 0; i < n; i++) {
      const b = bufs[i];
      const sub = w * MAX_RECVS + i;
      if (this.fenced.size && b.region) this.fenced.delete(b.region.base + b.offset);
      this.sRegion[sub] = b.region;
      this.sOffset[sub] = b.offset;
      this.sSize[sub] = b.size;
      this.sTag[sub] = b.tag;
      this.sState[sub] = Sub.OPEN;
      this.sExpect[sub] = 0;
      this.sGot[sub] = 0;
      this.sBytes[sub] = 0;
      // The entry: where the buffer is (an empty one points at our own line), keys per rail.
      const mem = b.region ?? line;
      const addr = (b.region ? b.region.base + b.offset : line.base + ep.zeroAt) + mem.regs[0].remoteDelta;
      const e = w * SLOT_WORDS + i * ENTRY_WORDS;
      st[e] = addr >>> 0;
      st[e + 1] = (addr - (addr >>> 0)) / 2 ** 32;
      st[e + 2] = b.size > 0xffff_ffff ? 0xffff_ffff : b.size;
      this.stI32[e + 3] = b.tag;
      st[e + 4] = entryMark(r, n, i);
      st[e + 5] = 0;
      for (let l = 0; l < 4; l++) {
        const reg = l < this.rails ? mem.regs[this.nic[l]] : undefined;
        st[e + 6 + 2 * l] = reg ? reg.keyLo : 0;
        st[e + 7 + 2 * l] = reg ? reg.keyHi : 0;
      }
      st[e + 14] = st[e + 15] = 0;
    }
    const l = this.ctrlRails.pick();
    const nic = this.nic[l];
    const token = ep.ops.alloc(OpKind.CTRL, this.id, this.serial, nic, r, 0, 0);
    this.wroteAt = ep.now;
    const la = this.mem.base + w * SLOT_BYTES;
    const ra = this.mailboxAddr + w * SLOT_BYTES;
    ep.rails[nic].write(
      this.peer[l],
      hiOf(la), loOf(la),
      n * 64,
      this.mem.regs[nic].desc,
      hiOf(ra), loOf(ra),
      this.mbKeyLo[l],
      this.mbKeyHi[l],
      immWrite(this.peerComm, r, n - 1, SEGS_CTRL),
      token,
    );
    this.nextSeq = r + 1;
    this.live++;
    // Parked eager messages have seen every earlier receive: offer them this one, in order.
    let keep = 0;
    for (let k = 0; k < this.parkedCount; k++) {
      const s = this.parked[k];
      if (!this.claimIn(s, w)) this.parked[keep++] = s;
    }
    this.parkedCount = keep;
    this.leave();
  }

  // ---- written data -----------------------------------------------------------------------

  onRemoteWrite(_rail: number, imm: number, len: number): void {
    if (this.failed) return;
    this.heard();
    const segs = immSegs(imm);
    if (segs === SEGS_CTRL) return this.protocolError(`a control message (immediate 0x${imm.toString(16)}) reached a receive comm`);
    const r = unwrapBefore(this.nextSeq - 1, immSeq(imm), 10);
    const w = r % RING;
    if (r < 0 || !this.rLive[w] || this.rSeq[w] !== r) return this.protocolError(`a write for receive ${r}, which is not in flight`);
    const i = immIndex(imm);
    if (i >= this.rN[w]) return this.protocolError(`a write for sub-receive ${i} of receive ${r}, which has ${this.rN[w]}`);
    const sub = w * MAX_RECVS + i;
    const state = this.sState[sub];
    if (state === Sub.EAGER || state === Sub.DONE)
      return this.protocolError(`a write for sub-receive ${i} of receive ${r}, which ${state === Sub.EAGER ? 'an eager message took' : 'is complete'}`);
    this.depth++;
    if (segs === SEGS_TOO_BIG) {
      this.misfit(w, sub, -1);
      this.subDone(w, sub);
    } else if (this.sExpect[sub] !== 0 && this.sExpect[sub] !== segs) {
      this.protocolError(`sub-receive ${i} of receive ${r}: a write of ${segs} segments after one of ${this.sExpect[sub]}`);
    } else {
      this.sExpect[sub] = segs;
      this.sState[sub] = Sub.WRITTEN;
      this.sBytes[sub] += len;
      if (++this.sGot[sub] === segs) {
        if (this.sBytes[sub] > this.sSize[sub]) this.protocolError(`${this.sBytes[sub]} bytes written into a ${this.sSize[sub]}-byte sub-receive`);
        else this.subDone(w, sub);
      }
    }
    this.leave();
  }

  // ---- eager messages ---------------------------------------------------------------------

  /** An eager message arrived in bounce buffer id (len bytes, header included); it is ours until released. */
  onEager(_rail: number, id: number, len: number): void {
    const pool = this.ep.pool;
    if (this.failed || this.closed) return pool.release(id);
    this.heard();
    if (len < EAGER_HEADER_BYTES) {
      pool.release(id);
      return this.protocolError(`an eager message of ${len} bytes, shorter than its header`);
    }
    const b = pool.bytes(id);
    const o = pool.offset(id);
    const ord = unwrapAfter(this.nextOrd, b[o] | (b[o + 1] << 8), 16);
    if (ord - this.nextOrd >= EAGER_RING) {
      pool.release(id);
      return this.protocolError(`eager message ${ord} arrived ${ord - this.nextOrd} ahead of ${this.nextOrd}`);
    }
    const s = ord % EAGER_RING;
    if (this.ePresent[s]) {
      pool.release(id);
      return this.protocolError(`eager message ${ord} arrived while ${this.eOrd[s]} still waits in its place`);
    }
    this.ePresent[s] = 1;
    this.eOrd[s] = ord;
    this.eBuf[s] = id;
    this.eLen[s] = len - EAGER_HEADER_BYTES;
    this.eBase[s] = b[o + 2] | (b[o + 3] << 8);
    this.eTag[s] = b[o + 4] | (b[o + 5] << 8) | (b[o + 6] << 16) | (b[o + 7] << 24);
    this.depth++;
    // Resolve in ordinal order: each message sees what the earlier ones took.
    for (let t = this.nextOrd % EAGER_RING; this.ePresent[t] && this.eOrd[t] === this.nextOrd; t = this.nextOrd % EAGER_RING) {
      this.nextOrd++;
      const base = unwrapBefore(this.nextSeq, this.eBase[t], 16);
      let placed = false;
      for (let r = base > this.oldestOpen ? base : this.oldestOpen; r < this.nextSeq && !placed; r++) {
        const w = r % RING;
        if (this.rLive[w]) placed = this.claimIn(t, w);
      }
      if (!placed) this.parked[this.parkedCount++] = t;
    }
    this.leave();
  }

  // Gives eager message s the first open entry of receive slot w with its tag.
  private claimIn(s: number, w: number): boolean {
    const n = this.rN[w];
    const tag = this.eTag[s];
    for (let i = 0; i < n; i++) {
      const sub = w * MAX_RECVS + i;
      if (this.sState[sub] !== Sub.OPEN || this.sTag[sub] !== tag) continue;
      this.sState[sub] = Sub.EAGER;
      this.place(s, w, sub);
      return true;
    }
    return false;
  }

  // Copies eager message s's payload into its sub-receive (GPU memory: a local RDMA read).
  private place(s: number, w: number, sub: number): void {
    const pool = this.ep.pool;
    const id = this.eBuf[s];
    const len = this.eLen[s];
    this.ePresent[s] = 0;
    if (len > this.sSize[sub]) {
      pool.release(id);
      this.misfit(w, sub, len);
      return this.subDone(w, sub);
    }
    this.sBytes[sub] = len;
    const region = this.sRegion[sub];
    if (len === 0 || !region) {
      pool.release(id);
      return this.subDone(w, sub);
    }
    const from = pool.offset(id) + EAGER_HEADER_BYTES;
    if (region.bytes) {
      copyBytes(region.bytes, this.sOffset[sub], pool.bytes(id), from, len);
      pool.release(id);
      return this.subDone(w, sub);
    }
    const ep = this.ep;
    const nic = pool.rail(id);
    const chunk = pool.chunk(id);
    const token = ep.ops.alloc(OpKind.EAGER_COPY, this.id, this.serial, nic, this.rSeq[w], sub - w * MAX_RECVS, id);
    const la = region.base + this.sOffset[sub];
    const ra = chunk.addr + from + chunk.reg.remoteDelta;
    ep.rails[nic].read(ep.selfPeer[nic], hiOf(la), loOf(la), len, ownRegs(region)[nic].desc, hiOf(ra), loOf(ra), chunk.reg.keyLo, chunk.reg.keyHi, token);
  }

  private misfit(w: number, sub: number, len: number): void {
    this.rCode[w] = ResultCode.INVALID_USAGE;
    this.sBytes[sub] = 0;
    log.warn(
      `${this.name}: ${len < 0 ? 'a send' : `a ${len}-byte eager send`} does not fit the ${this.sSize[sub]}-byte receive (tag ${this.sTag[sub]}) posted for it`,
    );
  }

  private subDone(w: number, sub: number): void {
    this.sState[sub] = Sub.DONE;
    if (++this.rDone[w] < this.rN[w]) return;
    if (this.trace) this.trace.step(this.rSlot[w], 'landed', this.ep.cqTime, this.ep.cqIo);
    if (this.acks && this.fence(w)) return;
    this.finish(w);
  }

  /** The first sub-receive of receive slot w that data writes filled (not eager, not "did not fit"), of GPU memory if gpu; -1: none. */
  private writtenSub(w: number, gpu: boolean): number {
    for (let i = 0; i < this.rN[w]; i++) {
      const sub = w * MAX_RECVS + i;
      if (this.sExpect[sub] > 0 && this.sBytes[sub] > 0 && (!gpu || this.sRegion[sub]?.kind === 'cuda')) return sub;
    }
    return -1;
  }

  // CUDA IPC: libfabric's shm moves a written GPU buffer with a device-to-device cudaMemcpy,
  // which returns (and both sides' completions come) before the copy has run. A later copy
  // out of device memory on that GPU in this process waits for it: the receive waits for the
  // endpoint's next round of fences on the GPU of its first written GPU sub-receive (a local
  // read of one line, fence.ts), then completes and is acknowledged. False: nothing to fence.
  // Every written GPU sub-receive of one receive is on one GPU: NCCL's buffers of a comm are.
  private fence(w: number): boolean {
    const sub = this.writtenSub(w, true);
    if (sub < 0) return false;
    const region = this.sRegion[sub]!;
    const device = ownRegs(region)[0]?.device ?? 0;
    this.ep.fences.wait(this, this.rSeq[w], device < 0 ? 0 : device, this.nics, region, region.base + this.sOffset[sub], this.sBytes[sub]);
    return true;
  }

  get fenceable(): boolean {
    return !this.failed && !this.closed;
  }

  /** The round of fences that receive seq waited for is done (ok), or one of its reads failed. */
  fenceDone(seq: number, ok: boolean, rail: number, c: Completion): void {
    if (!ok) return this.onOpError(OpKind.FENCE, rail, c, seq);
    const w = seq % RING;
    if (!this.rLive[w] || this.rSeq[w] !== seq) return;
    if (this.trace) this.trace.step(this.rSlot[w], 'fenced', this.ep.cqTime, this.ep.cqIo);
    this.depth++;
    this.markFenced(w);
    this.finish(w);
    this.leave();
  }

  // The fence ordered every copy into this receive: its written GPU buffers need no flush.
  private markFenced(w: number): void {
    if (this.ep.config.flush.all) return; // every receive is flushed as asked
    if (this.fenced.size > 4096) this.fenced.clear(); // receives NCCL never flushes (a flush then just reads)
    for (let i = 0; i < this.rN[w]; i++) {
      const sub = w * MAX_RECVS + i;
      const region = this.sRegion[sub];
      if (this.sExpect[sub] > 0 && region?.kind === 'cuda') this.fenced.add(region.base + this.sOffset[sub]);
    }
  }

  /**
   * CUDA IPC: receive r is complete and fenced; the sender is told with a 0-byte write into its
   * mailbox. Inside a completion batch it waits for the batch's end, so that one write can
   * name several receives (sendAcks).
   */
  private acknowledge(r: number): void {
    this.ackQ.push(r);
    if (this.ep.inBatch) this.ep.ackLater(this);
    else this.sendAcks();
  }

  /**
   * Writes the queued acknowledgements: where the rails carry 8 bytes of immediate data, one
   * write names the newest receive and, in the high half, up to ACK_SPAN before it; else one
   * write per receive.
   */
  sendAcks(): void {
    const q = this.ackQ;
    if (!q.length) return;
    if (this.failed || this.closed) {
      q.length = 0;
      return;
    }
    const ep = this.ep;
    q.sort((x, y) => y - x);
    let i = 0;
    while (i < q.length) {
      const r = q[i++];
      const l = this.ctrlRails.pick();
      const nic = this.nic[l];
      let mask = 0;
      if (ep.rails[nic].cqDataBytes >= 8)
        for (; i < q.length && r - q[i] <= ACK_SPAN; i++) mask |= 1 << (r - 1 - q[i]);
      const token = ep.ops.alloc(OpKind.ACK, this.id, this.serial, nic, r, 0, 0);
      this.wroteAt = ep.now;
      const la = ep.line.base + ep.zeroAt;
      ep.rails[nic].write(this.peer[l], hiOf(la), loOf(la), 0, ep.line.regs[nic].desc, hiOf(this.mailboxAddr), loOf(this.mailboxAddr), this.mbKeyLo[l], this.mbKeyHi[l], immWrite(this.peerComm, r, 0, SEGS_ACK), token, mask >>> 0);
    }
    q.length = 0;
  }

  private finish(w: number): void {
    if (this.acks && this.writtenSub(w, false) >= 0) this.acknowledge(this.rSeq[w]);
    this.rLive[w] = 0;
    this.live--;
    while (this.oldestOpen < this.nextSeq && !this.rLive[this.oldestOpen % RING]) this.oldestOpen++;
    const n = this.rN[w];
    const d = this.push(this.rSlot[w], this.rCode[w], n);
    for (let i = 0; i < n; i++) this.dSizes[d * MAX_RECVS + i] = this.sBytes[w * MAX_RECVS + i];
  }

  // ---- flush ------------------------------------------------------------------------------

  iflush(slot: number, bufs: ReqBuf[]): void {
    if (this.failed) return this.completeNow(slot, this.failed.code, -1);
    let b: ReqBuf | undefined;
    for (const x of bufs)
      if (x.size > 0 && x.region) {
        b = x;
        break;
      }
    const action = b ? flushAction(this.ep.config.flush, b.region!.kind, b.size) : FlushAction.NONE;
    if (action === FlushAction.NONE) return this.completeNow(slot, ResultCode.SUCCESS, -1);
    // Under auto, a receive the CUDA IPC fence already read back needs no second read (markFenced).
    if (this.fenced.delete(b!.region!.base + b!.offset)) return this.completeNow(slot, ResultCode.SUCCESS, -1);
    const f = this.fFree.pop() ?? this.newFlush();
    this.fSlot[f] = slot;
    this.fLeft[f] = this.nics;
    this.flushes++;
    const ep = this.ep;
    const line = ep.line;
    const region = b!.region!;
    for (let nic = 0; nic < this.nics; nic++) {
      if (action === FlushAction.READ) {
        const token = ep.ops.alloc(OpKind.FLUSH_READ, this.id, this.serial, nic, f, 0, 0);
        const reg = ownRegs(region)[nic];
        const la = line.base + FLUSH_READ_AT + FLUSH_LINE * nic;
        const ra = region.base + b!.offset + reg.remoteDelta;
        ep.rails[nic].read(ep.selfPeer[nic], hiOf(la), loOf(la), flushBytes(b!.size), line.regs[nic].desc, hiOf(ra), loOf(ra), reg.keyLo, reg.keyHi, token);
      } else {
        const { target, at } = this.scratch(nic);
        const reg = ownRegs(target)[nic];
        const token = ep.ops.alloc(OpKind.FLUSH_WRITE, this.id, this.serial, nic, f, nic, 0);
        const la = line.base + FLUSH_SRC_AT + FLUSH_LINE * nic;
        const ra = at + reg.remoteDelta;
        ep.rails[nic].write(ep.selfPeer[nic], hiOf(la), loOf(la), FLUSH_LINE, line.regs[nic].desc, hiOf(ra), loOf(ra), reg.keyLo, reg.keyHi, -1, token);
      }
    }
  }

  // The line a write-then-read flush writes and reads back on nic: device memory when the plugin gave one.
  private scratch(nic: number): { target: Region; at: number } {
    const dev = this.ep.flushScratch;
    if (dev) return { target: dev, at: dev.base + FLUSH_LINE * nic };
    return { target: this.ep.line, at: this.ep.line.base + FLUSH_HOST_SCRATCH_AT + FLUSH_LINE * nic };
  }

  private newFlush(): number {
    if (this.fCount === this.fSlot.length) {
      const s = new Int32Array(this.fCount * 2);
      s.set(this.fSlot);
      const l = new Int32Array(this.fCount * 2);
      l.set(this.fLeft);
      this.fSlot = s;
      this.fLeft = l;
    }
    return this.fCount++;
  }

  // ---- completions ------------------------------------------------------------------------

  onOpDone(kind: OpKind, a: number, b: number, c: number, _rail: number): void {
    if (kind === OpKind.EAGER_COPY) this.ep.pool.release(c);
    if (this.failed) return;
    this.depth++;
    if (kind === OpKind.EAGER_COPY) {
      const w = a % RING;
      if (this.rLive[w] && this.rSeq[w] === a) this.subDone(w, w * MAX_RECVS + b);
    } else if (kind === OpKind.FLUSH_WRITE) {
      // The write is done: now read that line back through the same NIC.
      const ep = this.ep;
      const { target, at } = this.scratch(b);
      const reg = ownRegs(target)[b];
      const token = ep.ops.alloc(OpKind.FLUSH_READ, this.id, this.serial, b, a, 0, 0);
      const la = ep.line.base + FLUSH_READ_AT + FLUSH_LINE * b;
      const ra = at + reg.remoteDelta;
      ep.rails[b].read(ep.selfPeer[b], hiOf(la), loOf(la), FLUSH_LINE, ep.line.regs[b].desc, hiOf(ra), loOf(ra), reg.keyLo, reg.keyHi, token);
    } else if (kind === OpKind.FLUSH_READ) {
      if (--this.fLeft[a] === 0) {
        this.flushes--;
        this.fFree.push(a);
        this.push(this.fSlot[a], ResultCode.SUCCESS, 0);
      }
    }
    this.leave();
  }

  // A completion to report (n sizes follow at the returned index), then leave() reports it.
  private push(slot: number, code: number, n: number): number {
    const d = this.dTail % DONE_MAX;
    if (this.dTail - this.dHead === DONE_MAX) throw internalError(`${this.name}: more than ${DONE_MAX} completions queued`);
    this.dSlot[d] = slot;
    this.dCode[d] = code;
    this.dN[d] = n;
    this.dTail++;
    return d;
  }

  private completeNow(slot: number, code: number, n: number): void {
    this.depth++;
    this.push(slot, code, n < 0 ? 0 : n);
    if (n > 0) this.dSizes.fill(0, ((this.dTail - 1) % DONE_MAX) * MAX_RECVS, ((this.dTail - 1) % DONE_MAX) * MAX_RECVS + n);
    this.leave();
  }

  private leave(): void {
    if (--this.depth > 0 || this.flushing) return;
    this.flushing = true;
    while (this.dHead < this.dTail) {
      const d = this.dHead++ % DONE_MAX;
      const n = this.dN[d];
      const sizes = n ? this.sizesOf[n] : EMPTY;
      for (let i = 0; i < n; i++) sizes[i] = this.dSizes[d * MAX_RECVS + i];
      this.complete(this.dSlot[d], this.dCode[d], sizes);
    }
    this.flushing = false;
  }

  protected failPending(err: NetError): void {
    this.depth++;
    for (let w = 0; w < RING; w++) {
      if (!this.rLive[w]) continue;
      const n = this.rN[w];
      const d = this.push(this.rSlot[w], err.code, n);
      for (let i = 0; i < n; i++) this.dSizes[d * MAX_RECVS + i] = this.sBytes[w * MAX_RECVS + i];
    }
    for (let f = 0; f < this.fCount; f++) if (this.fLeft[f] > 0) this.push(this.fSlot[f], err.code, 0);
    this.forget();
    this.leave();
  }

  protected dropPending(): void {
    this.forget();
    this.dHead = this.dTail;
  }

  private forget(): void {
    this.fenced.clear();
    this.rLive.fill(0);
    this.sRegion.fill(null);
    this.live = 0;
    this.fLeft.fill(0);
    this.flushes = 0;
    for (let s = 0; s < EAGER_RING; s++)
      if (this.ePresent[s]) {
        this.ePresent[s] = 0;
        this.ep.pool.release(this.eBuf[s]);
      }
    this.parkedCount = 0;
  }

  protected release(): void {
    this.ep.retire(this.mem);
  }
}
