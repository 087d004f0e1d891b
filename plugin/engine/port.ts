// This protocol thread's side of the native I/O engine (native/engine/): a submission ring to
// every I/O thread and a completion ring back from each, in shared memory. The protocol writes
// submissions straight into a ring during a turn; flush() publishes them at the end of the
// turn and wakes only the I/O threads that sleep. poll() reads every completion that waits and
// hands it to its link. No allocation per message, and no call into native code per message
// but one: a small frame to an idle lane, which this thread writes itself (submitFrame).
import { log } from '../log';
import { CQE, OP_RX, RING, SUB, SUB_F_IMM, SUB_F_NOCQE, SubKind } from './records';
import { monoMs } from '../clock';
import { ADDR_SPLIT } from '../addr';

/** What a link of this thread is told by the engine. */
export interface CqeHandler {
  /**
   * An operation submitted with this link finished: status 0, EOF (-1000) or -errno; value: bytes.
   * libfabric lanes: imm and flags (records.ts CqeFlag); op OP_REMOTE (-2) for a peer's write.
   * io: the I/O thread, or -1 for a frame this protocol thread wrote itself (submitFrame).
   * src: libfabric lanes with FI_SOURCE, the sender of a message or remote write (its AV id);
   * -1 when not known.
   */
  onOp(op: number, status: number, value: number, time: number, io: number, imm: number, flags: number, immHi: number, src: number): void;
  /** A control lane received bytes (status 0; value: its receive counter) or ended (status < 0). */
  onRx(status: number, value: number, time: number, io: number): void;
}

/** The engine's functions this file needs (the binding, or a fake in tests). */
export interface EngineBinding {
  ioStart(threads: number, spinUs: number, lingerMs: number, pollUs: number): number;
  /** For an error code EMFILE or ENFILE: the open-file limit and what to do about it; "" otherwise. */
  fdNote?(code: string): string;
  ioPort(): { sub: ArrayBuffer[]; cq: ArrayBuffer[]; sleeping: Int32Array; port: number };
  ioWake(thread: number): void;
  /**
   * Writes the unpublished submission at index of this thread's ring to I/O thread `thread` on
   * this thread, at once (native/engine/engine_js.cc): -1 nothing written, -2 part written and
   * the record names the rest, else all written and this is the completion's time. Optional:
   * a binding without it never writes on the protocol thread.
   */
  ioWriteNow?(thread: number, index: number): number;
  /**
   * ioWriteNow leaves a submission to the I/O thread when its lane wrote (or posted a send or
   * write) less than us ago; 0: no such rule. Process-wide; optional like ioWriteNow.
   */
  ioSetDirectIdle?(us: number): void;
  ioSetEarlyWake?(on: boolean): void;
}

interface Overflow {
  lane: number;
  link: number;
  op: number;
  kind: SubKind;
  flags: number;
  hi: number;
  lo: number;
  len: number;
  ftype: number;
  fflags: number;
  ftag: number;
  fseq: number;
  fsize: number;
  imm?: number;
  immHi?: number;
  rhi?: number;
  rlo?: number;
}

/** Lanes a ring remembers as written by the protocol thread in one turn (SubRing.directLanes). */
const DIRECT_LANES = 8;
/**
 * libfabric operations of one lane this thread posts itself in one turn (submitOfiNow). A
 * socket lane takes one frame (the I/O thread gathers the rest into one sendmsg); an endpoint
 * posts each operation alone either way, and one lane carries every comm of the device on this
 * thread: a receive's control message and a send's eager message often share a turn.
 */
const OFI_DIRECT_PER_TURN = 2;

class SubRing {
  readonly hdr: Uint32Array;
  readonly u32: Uint32Array;
  readonly i32: Int32Array;
  readonly u16: Uint16Array;
  readonly f64: Float64Array;
  readonly mask: number;
  tail: number;
  head = 0; // last head seen
  dirty = false;
  readonly overflow: Overflow[] = [];
  /**
   * Lanes of this ring whose frame this thread wrote itself in this turn (submitFrame), up to
   * DIRECT_LANES; flush() forgets them. A second frame of one of them in the same turn goes
   * through the ring, where the I/O thread gathers the turn's frames into one sendmsg.
   */
  readonly directLanes = new Int32Array(DIRECT_LANES);
  directCount = 0;

  constructor(buf: ArrayBuffer) {
    this.hdr = new Uint32Array(buf, 0, RING.bytes / 4);
    this.u32 = new Uint32Array(buf);
    this.i32 = new Int32Array(buf);
    this.u16 = new Uint16Array(buf);
    this.f64 = new Float64Array(buf);
    this.mask = this.hdr[RING.mask / 4];
    this.tail = Atomics.load(this.hdr, RING.tail / 4);
  }

  room(): number {
    let room = this.mask + 1 - ((this.tail - this.head) >>> 0);
    if (room === 0) {
      this.head = Atomics.load(this.hdr, RING.head / 4);
      room = this.mask + 1 - ((this.tail - this.head) >>> 0);
    }
    return room;
  }

  /**
   * Starts the record at the tail: whose it is, its kind and buffer. Returns its byte offset;
   * the caller fills the rest, then calls advance().
   */
  private begin(lane: number, link: number, op: number, kind: SubKind, inlineLen: number, hi: number, lo: number, len: number): number {
    const b = this.startRecord(lane, link, op, kind, inlineLen);
    this.f64[(b >> 3) + 2] = hi * ADDR_SPLIT + lo;
    this.f64[(b >> 3) + 3] = len;
    return b;
  }

  /** begin() without the buffer: whose record it is and its kind. */
  private startRecord(lane: number, link: number, op: number, kind: SubKind, inlineLen: number): number {
    const b = RING.bytes + (this.tail & this.mask) * SUB.bytes;
    const w = b >> 2;
    this.u32[w] = lane;
    this.u32[w + 1] = link;
    this.u32[w + 2] = op;
    this.u16[(b + SUB.kind) >> 1] = kind;
    this.u16[(b + SUB.inlineLen) >> 1] = inlineLen;
    return b;
  }

  advance(): void {
    this.tail = (this.tail + 1) >>> 0;
    this.dirty = true;
  }

  put(lane: number, link: number, op: number, kind: SubKind, flags: number, hi: number, lo: number, len: number,
    ftype: number, fflags: number, ftag: number, fseq: number, fsize: number): void {
    this.fill(lane, link, op, kind, flags, hi, lo, len, ftype, fflags, ftag, fseq, fsize);
    this.advance();
  }

  /** Writes a record at the tail without publishing it (put() = fill() + advance()). */
  fill(lane: number, link: number, op: number, kind: SubKind, flags: number, hi: number, lo: number, len: number,
    ftype: number, fflags: number, ftag: number, fseq: number, fsize: number): void {
    const b = this.begin(lane, link, op, kind, ftype ? 24 : 0, hi, lo, len);
    const w = b >> 2;
    const d = b >> 3;
    this.u32[w + (SUB.flags >> 2)] = flags;
    if (ftype) {
      // The frame header (plugin/protocol/frames.ts): u8 type, u8 flags, u16 0, i32 tag, f64 seq, f64 size.
      this.u32[w + 16] = ftype | (fflags << 8);
      this.i32[w + 17] = ftag;
      this.f64[d + 9] = fseq;
      this.f64[d + 10] = fsize;
    }
  }

  putOfi(lane: number, link: number, op: number, kind: SubKind, hi: number, lo: number, len: number, mr: number, peer: number,
    rhi: number, rlo: number, keyLo: number, keyHi: number, imm: number, immHi: number): void {
    this.fillOfi(lane, link, op, kind, hi, lo, len, mr, peer, rhi, rlo, keyLo, keyHi, imm, immHi);
    this.advance();
  }

  /** Writes a libfabric record at the tail without publishing it (putOfi() = fillOfi() + advance()). */
  fillOfi(lane: number, link: number, op: number, kind: SubKind, hi: number, lo: number, len: number, mr: number, peer: number,
    rhi: number, rlo: number, keyLo: number, keyHi: number, imm: number, immHi: number): void {
    const b = this.begin(lane, link, op, kind, 0, hi, lo, len);
    const w = b >> 2;
    const u32 = this.u32;
    this.f64[(b >> 3) + 4] = rhi * ADDR_SPLIT + rlo;
    u32[w + (SUB.rkeyLo >> 2)] = keyLo;
    u32[w + (SUB.rkeyHi >> 2)] = keyHi;
    u32[w + (SUB.imm >> 2)] = imm < 0 ? 0 : imm;
    u32[w + (SUB.flags >> 2)] = imm < 0 ? 0 : SUB_F_IMM;
    u32[w + (SUB.aux >> 2)] = peer;
    u32[w + (SUB.mr >> 2)] = mr;
    u32[w + (SUB.inl >> 2)] = imm < 0 ? 0 : immHi;
  }
}

class CqRing {
  readonly hdr: Uint32Array;
  readonly u32: Uint32Array;
  readonly i32: Int32Array;
  readonly f64: Float64Array;
  readonly mask: number;
  head: number;

  constructor(buf: ArrayBuffer) {
    this.hdr = new Uint32Array(buf, 0, RING.bytes / 4);
    this.u32 = new Uint32Array(buf);
    this.i32 = new Int32Array(buf);
    this.f64 = new Float64Array(buf);
    this.mask = this.hdr[RING.mask / 4];
    this.head = Atomics.load(this.hdr, RING.head / 4);
  }
}

export class Port {
  private static shared: Port | undefined;
  readonly threads: number;
  readonly index: number;
  /** The time of the last poll that found completions (plugin/clock.ts), for liveness. */
  now = monoMs();
  /** Completions handled so far (statistics). */
  completions = 0;
  /** Frames this thread wrote itself (submitFrame), and of those the ones that went only in part. */
  writtenHere = 0;
  writtenPart = 0;
  /**
   * Payload bytes up to which submitFrame writes a frame on this thread when its I/O thread has
   * nothing of this thread's waiting (TSNET_DIRECT_SEND_MAX); -1: never.
   */
  writeNowMax = -1;
  // Completions of frames written here, handed to their links by the next poll() or flush():
  // link, op, value (bytes) and time per entry. Their `io` is -1: no I/O thread moved them.
  private localU32 = new Uint32Array(2 * 64);
  private localF64 = new Float64Array(2 * 64);
  private localCount = 0;
  private readonly subs: SubRing[];
  private readonly cqs: CqRing[];
  private readonly sleeping: Int32Array;
  private readonly links: (CqeHandler | undefined)[] = [undefined];
  private readonly gens: number[] = [0];
  private readonly freeLinks: number[] = [];

  /** This thread's port; the first call on thread 0 starts the I/O threads. */
  static get(binding: EngineBinding, opts: { ioThreads: number; spinUs: number; lingerMs: number; pollUs: number; writeNowMax?: number; directIdleUs?: number; earlyWake?: boolean }): Port {
    if (!Port.shared) {
      binding.ioStart(opts.ioThreads, opts.spinUs, opts.lingerMs, opts.pollUs);
      Port.shared = new Port(binding);
      if (typeof binding.ioWriteNow === 'function' && opts.writeNowMax !== undefined) Port.shared.writeNowMax = opts.writeNowMax;
      if (opts.directIdleUs !== undefined) binding.ioSetDirectIdle?.(opts.directIdleUs);
      if (opts.earlyWake !== undefined) binding.ioSetEarlyWake?.(opts.earlyWake);
    }
    return Port.shared;
  }

  constructor(private readonly binding: EngineBinding) {
    const p = binding.ioPort();
    this.index = p.port;
    this.subs = p.sub.map((b) => new SubRing(b));
    this.cqs = p.cq.map((b) => new CqRing(b));
    this.sleeping = p.sleeping;
    this.threads = this.subs.length;
  }

  /** A new link id whose completions go to h. */
  addLink(h: CqeHandler): number {
    let i = this.freeLinks.pop();
    if (i === undefined) {
      i = this.links.length;
      if (i > 0xffff) throw new Error('too many links on one protocol thread (65535)');
      this.links.push(undefined);
      this.gens.push(0);
    }
    this.links[i] = h;
    return ((this.gens[i] << 16) | i) >>> 0;
  }

  /** Later completions of the link are dropped; its id may be reused (with another generation). */
  removeLink(id: number): void {
    const i = id & 0xffff;
    if (this.links[i] === undefined || this.gens[i] !== id >>> 16) return;
    this.links[i] = undefined;
    this.gens[i] = (this.gens[i] + 1) & 0xffff;
    this.freeLinks.push(i);
  }

  /** Queues a submission for I/O thread t (published by flush()). ftype > 0 adds a 24-byte frame header inline. */
  submit(t: number, lane: number, link: number, op: number, kind: SubKind, flags: number, hi: number, lo: number, len: number,
    ftype = 0, fflags = 0, ftag = 0, fseq = 0, fsize = 0): void {
    const r = this.subs[t];
    if (r.overflow.length === 0 && r.room() > 0) {
      r.put(lane, link, op, kind, flags, hi, lo, len, ftype, fflags, ftag, fseq, fsize);
      return;
    }
    // The ring is full: keep order behind what waits (rare: 2048 submissions in one turn).
    r.overflow.push({ lane, link, op, kind, flags, hi, lo, len, ftype, fflags, ftag, fseq, fsize });
  }

  /**
   * Queues a frame (a write with a frame header inline) for I/O thread t's lane, as submit()
   * does. One of at most writeNowMax payload bytes this thread writes to the socket itself when
   * nothing it submitted to that I/O thread waits there (the ring empty): a hand-over less, and
   * the bytes leave now rather than after the turn. Its completion, when it asked for one,
   * comes from the next poll() or flush(), like the engine's. Where the lane has queued writes,
   * is busy or closing, or the socket is full, the record is published as usual (or what is left
   * of it, when part went).
   */
  submitFrame(t: number, lane: number, link: number, op: number, flags: number, hi: number, lo: number, len: number,
    ftype: number, fflags: number, ftag: number, fseq: number, fsize: number): void {
    const r = this.subs[t];
    if (!this.mayWriteHere(r, lane, len, 1)) {
      this.submit(t, lane, link, op, SubKind.WRITE, flags, hi, lo, len, ftype, fflags, ftag, fseq, fsize);
      return;
    }
    r.fill(lane, link, op, SubKind.WRITE, flags, hi, lo, len, ftype, fflags, ftag, fseq, fsize);
    const res = this.binding.ioWriteNow!(t, r.tail);
    if (res === -1 || res === -2) {
      if (res === -2) this.writtenPart++;
      r.advance();
      return;
    }
    this.wroteHere(r, lane, flags & SUB_F_NOCQE ? 0 : link, op, (ftype ? 24 : 0) + len, res);
  }

  /**
   * Queues a libfabric submission as submitOfi() does. A send or a write with immediate data
   * of at most writeNowMax bytes (a send's header included) this thread posts itself, as an
   * inject, when nothing it submitted to that I/O thread waits there and the lane posted at most
   * OFI_DIRECT_PER_TURN operations here in this turn; the engine refuses what it cannot inject
   * (GPU memory, more than the provider injects, a post waiting for room: engine_ofi.cc), and
   * that goes through the ring. Its completion comes from the next poll() or flush().
   */
  submitOfiNow(t: number, lane: number, link: number, op: number, kind: SubKind, hi: number, lo: number, len: number, mr: number,
    peer: number, rhi: number, rlo: number, keyLo: number, keyHi: number, imm: number, immHi = 0): void {
    const r = this.subs[t];
    if (!this.mayWriteHere(r, lane, kind === SubKind.OFI_SEND ? len + keyLo : len, OFI_DIRECT_PER_TURN)) {
      this.submitOfi(t, lane, link, op, kind, hi, lo, len, mr, peer, rhi, rlo, keyLo, keyHi, imm, immHi);
      return;
    }
    r.fillOfi(lane, link, op, kind, hi, lo, len, mr, peer, rhi, rlo, keyLo, keyHi, imm, immHi);
    const res = this.binding.ioWriteNow!(t, r.tail);
    if (res < 0) {
      r.advance();
      return;
    }
    this.wroteHere(r, lane, link, op, len, res);
  }

  /** A submission went on this thread: remember its lane for the turn, queue its completion (link 0: none). */
  private wroteHere(r: SubRing, lane: number, link: number, op: number, bytes: number, time: number): void {
    this.writtenHere++;
    r.directLanes[r.directCount++] = lane;
    if (link === 0) return;
    let k = this.localCount;
    if (2 * k === this.localU32.length) k = this.growLocal();
    this.localU32[2 * k] = link;
    this.localU32[2 * k + 1] = op;
    this.localF64[2 * k] = bytes;
    this.localF64[2 * k + 1] = time;
    this.localCount = k + 1;
  }

  /**
   * Whether this thread may send `bytes` on the lane itself: within writeNowMax, nothing of this
   * thread waiting for the I/O thread (no record unpublished or untaken, no overflow), and fewer
   * than perTurn of the lane's submissions sent here in this turn, with room to remember one more.
   */
  private mayWriteHere(r: SubRing, lane: number, bytes: number, perTurn: number): boolean {
    if (bytes > this.writeNowMax || r.dirty || r.overflow.length !== 0 || r.directCount === DIRECT_LANES) return false;
    let n = 0;
    for (let i = 0; i < r.directCount; i++) if (r.directLanes[i] === lane) n++;
    return n < perTurn && Atomics.load(r.hdr, RING.head / 4) === r.tail;
  }

  private growLocal(): number {
    const u32 = new Uint32Array(2 * this.localU32.length);
    const f64 = new Float64Array(2 * this.localF64.length);
    u32.set(this.localU32);
    f64.set(this.localF64);
    this.localU32 = u32;
    this.localF64 = f64;
    return this.localCount;
  }

  /** Hands the completions of frames written on this thread to their links; how many. */
  private deliverLocal(): number {
    let count = 0;
    // A handler may write another frame here: the loop takes it too.
    for (let k = 0; k < this.localCount; k++) {
      const link = this.localU32[2 * k];
      const h = this.links[link & 0xffff];
      if (h === undefined || this.gens[link & 0xffff] !== link >>> 16) continue; // a closed link
      try {
        h.onOp(this.localU32[2 * k + 1], 0, this.localF64[2 * k], this.localF64[2 * k + 1], -1, 0, 0, 0, -1);
      } catch (e) {
        log.warn(`a completion handler threw: ${(e as Error)?.stack ?? e}`);
      }
      count++;
    }
    this.localCount = 0;
    this.completions += count;
    return count;
  }

  /** Queues a libfabric receive into [hi * ADDR_SPLIT + lo, +len) with registration mr (submitOfi without the rest). */
  submitOfiRecv(t: number, lane: number, link: number, op: number, hi: number, lo: number, len: number, mr: number): void {
    this.submitOfi(t, lane, link, op, SubKind.OFI_RECV, hi, lo, len, mr, 0, 0, 0, 0, 0, -1);
  }

  /**
   * Queues a libfabric submission for I/O thread t (records.h TSN_SUB_OFI_*): [addr, addr+len)
   * with registration mr, the peer, remote address and key, immediate data (imm >= 0), and for
   * a send a first part [addr0, addr0+len0) with registration mr0 (in the remote address's and
   * keys' fields). Addresses as hi, lo (ADDR_SPLIT).
   */
  submitOfi(t: number, lane: number, link: number, op: number, kind: SubKind, hi: number, lo: number, len: number, mr: number,
    peer: number, rhi: number, rlo: number, keyLo: number, keyHi: number, imm: number, immHi = 0): void {
    const r = this.subs[t];
    if (r.overflow.length === 0 && r.room() > 0) {
      r.putOfi(lane, link, op, kind, hi, lo, len, mr, peer, rhi, rlo, keyLo, keyHi, imm, immHi);
      return;
    }
    r.overflow.push({ lane, link, op, kind, flags: -1, hi, lo, len, ftype: mr, fflags: peer, ftag: keyLo, fseq: 0, fsize: keyHi, imm, immHi, rhi, rlo });
  }

  /** Publishes every queued submission and wakes the I/O threads that sleep. */
  flush(): void {
    if (this.localCount) this.deliverLocal();
    for (let t = 0; t < this.subs.length; t++) {
      const r = this.subs[t];
      r.directCount = 0; // the turn ends: its lanes may be written here again
      if (r.overflow.length) {
        let k = 0;
        while (k < r.overflow.length && r.room() > 0) {
          const o = r.overflow[k++];
          if (o.flags === -1) r.putOfi(o.lane, o.link, o.op, o.kind, o.hi, o.lo, o.len, o.ftype, o.fflags, o.rhi!, o.rlo!, o.ftag, o.fsize, o.imm!, o.immHi!);
          else r.put(o.lane, o.link, o.op, o.kind, o.flags, o.hi, o.lo, o.len, o.ftype, o.fflags, o.ftag, o.fseq, o.fsize);
        }
        r.overflow.splice(0, k);
      }
      if (!r.dirty) continue;
      r.dirty = false;
      Atomics.store(r.hdr, RING.tail / 4, r.tail);
      // Keep the cached head fresh here, so that room() finds the ring full only when it is:
      // its branch that reads the head first ran after the warm-up (2048 submissions to one
      // I/O thread), and V8 threw away the compiled submit path there (performance.md, item 16).
      r.head = Atomics.load(r.hdr, RING.head / 4);
      if (Atomics.load(this.sleeping, t) === 1) this.binding.ioWake(t);
    }
  }

  /**
   * Publishes every queued submission, waiting for the I/O threads to make room where a ring is
   * full. Close and cancel need it: the engine acts on what it has taken, and a submission left
   * behind would reach the lane after them (or a new lane with the same id).
   */
  drain(): void {
    this.flush();
    if (!this.backlog) return;
    const until = monoMs() + 10_000;
    while (this.backlog) {
      if (monoMs() > until) throw new Error('the I/O threads took no submissions for 10 s');
      this.flush();
    }
  }

  /** True while submissions wait for room in a full ring (the protocol thread turns again at once). */
  get backlog(): boolean {
    return this.subs.some((r) => r.overflow.length > 0);
  }

  /** Hands every waiting completion to its link; returns how many there were. */
  poll(): number {
    let count = this.localCount ? this.deliverLocal() : 0;
    let stamped = false;
    for (let t = 0; t < this.cqs.length; t++) {
      const r = this.cqs[t];
      const tail = Atomics.load(r.hdr, RING.tail / 4);
      let head = r.head;
      if (head === tail) continue;
      if (!stamped) {
        // The time the links' completions are stamped with, read only when some came: a turn
        // per poll made Date.now()'s numbers about 115 bytes of garbage per message over TCP
        // (the clock's reads now allocate nothing inside NCCL, and cost a call).
        stamped = true;
        this.now = monoMs();
      }
      for (; head !== tail; head = (head + 1) >>> 0) {
        const b = RING.bytes + (head & r.mask) * CQE.bytes;
        const w = b >> 2;
        const d = b >> 3;
        const link = r.u32[w];
        const h = this.links[link & 0xffff];
        if (h === undefined || this.gens[link & 0xffff] !== link >>> 16) continue; // a closed link
        const op = r.i32[w + 1]; // records.ts OP_RX, OP_REMOTE
        try {
          if (op === OP_RX) h.onRx(r.i32[w + 2], r.f64[d + 2], r.f64[d + 4], t);
          else h.onOp(op, r.i32[w + 2], r.f64[d + 2], r.f64[d + 4], t, r.u32[w + 3], r.u32[w + 6], r.u32[w + 7], r.i32[w + 10]);
        } catch (e) {
          log.warn(`a completion handler threw: ${(e as Error)?.stack ?? e}`);
        }
        count++;
      }
      r.head = tail;
      Atomics.store(r.hdr, RING.head / 4, tail);
    }
    this.completions += count;
    return count;
  }
}
