// A stream link whose two ends live in one JavaScript thread and move bytes by copying: the
// loopback transport (TSNET_TRANSPORT=loopback) and the protocol's unit tests. It keeps the
// native engine's rules: per-lane order, completions in a later microtask, a bounded receive
// ring with flow control, silence after close.
import type { LinkEvents, RxRing, StreamLink } from '../protocol/link';
import type { SchedulePolicy } from '../protocol/policies';
import { monoMs } from '../clock';
import { ADDR_SPLIT } from '../addr';

/** Resolves an address range to bytes (registered regions). */
export interface Memory {
  view(addr: number, len: number): Uint8Array;
}

const EOF = -1000;
const ECONNRESET = -104;

class JsRx implements RxRing {
  readonly bytes: Uint8Array;
  readonly view: DataView;
  readonly mask: number;
  w = 0;
  consumed = 0;
  onRelease: () => void = () => {};

  constructor(capacity: number) {
    this.bytes = new Uint8Array(capacity);
    this.view = new DataView(this.bytes.buffer);
    this.mask = capacity - 1;
  }

  written(): number {
    return this.w;
  }

  release(to: number): void {
    this.consumed = to >>> 0;
    this.onRelease();
  }

  room(): number {
    return this.mask + 1 - ((this.w - this.consumed) >>> 0);
  }

  append(src: Uint8Array): void {
    for (let i = 0; i < src.length; ) {
      const o = (this.w + i) & this.mask;
      const n = Math.min(src.length - i, this.mask + 1 - o);
      this.bytes.set(src.subarray(i, i + n), o);
      i += n;
    }
    this.w = (this.w + src.length) >>> 0;
  }
}

interface Frame {
  header: Uint8Array;
  addr: number;
  len: number;
  op: number;
}

interface Io {
  addr: number; // 0 on a read: drop the bytes
  len: number;
  at: number;
  op: number;
}

class End implements StreamLink {
  readonly rx: JsRx;
  heard: number;
  wrote: number;
  peer!: End;
  private events: LinkEvents | undefined;
  private early: number | undefined;
  private readonly frames: Frame[] = [];
  private readonly writes: Io[][];
  private readonly reads: Io[][];
  private closed = false;
  /** The peer's end: EOF (orderly) or ECONNRESET; reads made after it fail with it. */
  private gone: number | undefined;
  private readonly due: (() => void)[] = [];
  private scheduled = false;

  constructor(
    private readonly memory: Memory,
    readonly lanes: number,
    rxBytes: number,
    readonly policy: SchedulePolicy,
    readonly description: string,
  ) {
    this.rx = new JsRx(rxBytes);
    this.rx.onRelease = () => this.peer.moveFrames();
    this.writes = Array.from({ length: lanes }, () => []);
    this.reads = Array.from({ length: lanes }, () => []);
    this.heard = this.wrote = monoMs();
  }

  attach(events: LinkEvents): void {
    this.events = events;
    if (this.early !== undefined) {
      const s = this.early;
      this.later(() => this.events?.onRx(s));
    }
  }

  frame(type: number, flags: number, tag: number, seq: number, size: number, hi: number, lo: number, len: number, op: number): void {
    if (this.closed) return;
    const addr = hi * ADDR_SPLIT + lo;
    const header = new Uint8Array(24);
    const dv = new DataView(header.buffer);
    dv.setUint8(0, type);
    dv.setUint8(1, flags);
    dv.setInt32(4, tag, true);
    dv.setFloat64(8, seq, true);
    dv.setFloat64(16, size, true);
    this.frames.push({ header, addr, len, op });
    this.wrote = monoMs();
    this.moveFrames();
  }

  write(lane: number, hi: number, lo: number, len: number, op: number): void {
    if (this.closed) return;
    this.writes[lane].push({ addr: hi * ADDR_SPLIT + lo, len, at: 0, op });
    this.wrote = monoMs();
    this.moveData(lane);
  }

  read(lane: number, hi: number, lo: number, len: number, op: number): void {
    if (this.closed) return;
    const gone = this.gone;
    if (gone !== undefined) return this.later(() => this.events?.onOp(op, gone, 0, 0));
    this.reads[lane].push({ addr: hi * ADDR_SPLIT + lo, len, at: 0, op });
    this.peer.moveData(lane);
  }

  cancel(base: number, len: number): { reads: number; writes: number } {
    const hit = (io: { addr: number; len: number }) => io.addr !== 0 && io.addr < base + len && base < io.addr + io.len;
    let reads = 0;
    let writes = 0;
    for (const q of this.reads) for (const r of q) if (hit(r)) (r.addr = 0), reads++;
    for (const q of this.writes) for (const w of q) if (hit(w)) writes++;
    for (const f of this.frames) if (f.len && hit(f)) writes++;
    return { reads, writes };
  }

  close(graceful: boolean): boolean {
    if (this.closed) return true;
    // As the engine closes a lane: writes of the caller's memory not yet started are dropped
    // (their sends were cancelled), frames without a payload (CLOSE, a striped MSG's header)
    // still go, and a write half done makes it a reset. Frames move whole, so only a data
    // lane's write can be half done.
    const clean = graceful && this.writes.every((q) => q.length === 0 || q[0].at === 0);
    // What can still go goes now (before close returns, so no memory is touched later).
    if (clean) {
      const bare = this.frames.filter((f) => f.len === 0);
      this.frames.length = 0;
      this.frames.push(...bare);
      this.moveFrames();
    }
    this.closed = true;
    this.events = undefined;
    this.frames.length = 0;
    this.writes.forEach((q) => (q.length = 0));
    this.reads.forEach((q) => (q.length = 0));
    this.peer.lost(clean ? EOF : ECONNRESET);
    return clean;
  }

  // The peer went away: its end of every lane is gone. Every read waiting for its bytes, and
  // every later one, ends with status, as the engine's reads meet the socket's end.
  private lost(status: number): void {
    if (this.closed) return;
    this.gone = status;
    this.later(() => this.onRx(status));
    for (const q of this.reads) for (const r of q.splice(0)) this.later(() => this.events?.onOp(r.op, status, 0, 0));
  }

  private onRx(status: number): void {
    this.heard = monoMs();
    if (this.events) this.events.onRx(status);
    else if (this.early === undefined || status !== 0) this.early = status;
  }

  private onOp(op: number): void {
    this.heard = monoMs();
    this.events?.onOp(op, 0, 0, 0);
  }

  moveFrames(): void {
    const to = this.peer;
    if (this.closed || to.closed) return;
    let moved = false;
    while (this.frames.length && to.rx.room() >= 24 + this.frames[0].len) {
      const f = this.frames.shift()!;
      to.rx.append(f.header);
      if (f.len) to.rx.append(this.memory.view(f.addr, f.len));
      if (f.op >= 0) this.later(() => this.onOp(f.op));
      moved = true;
    }
    if (moved) to.later(() => to.onRx(0));
  }

  moveData(lane: number): void {
    const to = this.peer;
    if (this.closed || to.closed) return;
    const ws = this.writes[lane];
    const rs = to.reads[lane];
    while (ws.length && rs.length) {
      const w = ws[0];
      const r = rs[0];
      const n = Math.min(w.len - w.at, r.len - r.at);
      if (n > 0 && r.addr !== 0) this.memory.view(r.addr + r.at, n).set(this.memory.view(w.addr + w.at, n));
      w.at += n;
      r.at += n;
      if (w.at === w.len) {
        ws.shift();
        this.later(() => this.onOp(w.op));
      }
      if (r.at === r.len) {
        rs.shift();
        to.later(() => to.onOp(r.op));
      }
    }
  }

  // Events reach the protocol in a later microtask, as the engine's come in a later turn.
  private later(fn: () => void): void {
    this.due.push(fn);
    if (this.scheduled) return;
    this.scheduled = true;
    queueMicrotask(() => {
      this.scheduled = false;
      for (const f of this.due.splice(0)) if (!this.closed) f();
    });
  }
}

/** Two joined ends: [the connecting (send) side, the accepting (receive) side]. */
export function memoryLinkPair(memory: Memory, policy: SchedulePolicy, rxBytes: { send: number; recv: number }, what: string): [StreamLink, StreamLink] {
  const a = new End(memory, policy.lanes, rxBytes.send, policy, `${what} (send side)`);
  const b = new End(memory, policy.lanes, rxBytes.recv, policy, `${what} (receive side)`);
  a.peer = b;
  b.peer = a;
  return [a, b];
}
