// The receive side of a link. MSG frames are parsed in place from the control lane's receive
// ring, in sequence order, and matched to posted receives by the shared rule (matching.ts:
// the earliest posted receive with an unused entry of the message's tag). An eager payload is
// copied from the ring into its buffer once matched (until then it holds its ring space); a
// striped one is read straight into its buffer from the data lanes, stripe by stripe in the
// order the sender wrote them, so a lane waits at a stripe whose message has no receive yet.
// A message larger than its buffer fails the receive (and, through NACK, the send): its bytes
// are dropped, nothing lands past a buffer.
import { ResultCode } from '../abi';
import { objectArray } from '../arrays';
import { type NetError, invalidUsage, remoteError } from '../errors';
import { log } from '../log';
import { hiOf, loOf } from '../addr';
import type { Region } from '../memory';
import { type Complete, Endpoint, STATUS_EOF, laneError } from './endpoint';
import { FLAG_EAGER, type Frame, FrameType, copyOut } from './frames';
import { NO_OP, type StreamLink } from './link';
import { MAX_ENTRIES, Matcher, type RecvEntry, sizeError } from './matching';
import { stripeCount } from './policies';

/** A flush's sizes: it reports none. */
const NO_SIZES: readonly number[] = [];

/** The largest message a peer may announce: the largest isend (core.cc refuses more). */
const MAX_MESSAGE = 0x7fffffff;
/** Messages in flight on one link at most (a message's id takes 16 bits of its token). */
const MAX_MSGS = 0xffff;

/** The buffers of one irecv, filled by the caller and copied by irecv (reused across calls). */
export interface RecvArgs {
  n: number;
  regions: (Region | null)[];
  offsets: number[];
  sizes: number[];
  tags: number[];
}

export function newRecvArgs(): RecvArgs {
  return { n: 0, regions: new Array(MAX_ENTRIES).fill(null), offsets: new Array(MAX_ENTRIES).fill(0), sizes: new Array(MAX_ENTRIES).fill(0), tags: new Array(MAX_ENTRIES).fill(0) };
}

interface RecvOp {
  slot: number;
  gen: number;
  active: boolean; // posted and not yet reported
  n: number;
  left: number; // entries whose message has not fully arrived
  taken: number; // bit i: entry i has its message
  regions: (Region | null)[];
  offsets: number[];
  entries: RecvEntry[]; // size (room) and tag per buffer
  views: RecvEntry[][]; // views[n - 1]: the first n entries, for the matcher
  got: number[]; // sizes to report
  failed: NetError | undefined;
}

interface Msg {
  id: number;
  gen: number;
  seq: number;
  tag: number;
  size: number;
  eager: boolean;
  at: number; // eager: ring position of the payload
  rxUs: number; // tracing: when its frame reached the receive ring, and the I/O thread that put it there
  rxIo: number;
  frameAt: number; // eager: ring position of the frame (held until copied)
  arrived: number; // when its header came (the link's heard: plugin/clock.ts)
  recv: RecvOp | null;
  recvGen: number;
  dest: number; // address of its bytes, 0: dropped
  matched: boolean;
  copied: boolean; // eager: out of the ring
  stripes: number; // stripes not yet landed
  live: boolean;
}

/** Per data lane: stripes expected, in the sender's order (message, offset, length). */
class LaneQueue {
  msgs: (Msg | undefined)[] = new Array(16).fill(undefined);
  offs: number[] = new Array(16).fill(0);
  lens: number[] = new Array(16).fill(0);
  head = 0; // next to submit
  tail = 0;

  push(m: Msg, off: number, len: number): void {
    if (this.tail - this.head === this.msgs.length) this.grow();
    const i = this.tail++ & (this.msgs.length - 1);
    this.msgs[i] = m;
    this.offs[i] = off;
    this.lens[i] = len;
  }

  private grow(): void {
    const cap = this.msgs.length;
    const msgs = new Array(cap * 2).fill(undefined);
    const offs = new Array(cap * 2).fill(0);
    const lens = new Array(cap * 2).fill(0);
    for (let k = this.head; k < this.tail; k++) {
      msgs[k & (cap * 2 - 1)] = this.msgs[k & (cap - 1)];
      offs[k & (cap * 2 - 1)] = this.offs[k & (cap - 1)];
      lens[k & (cap * 2 - 1)] = this.lens[k & (cap - 1)];
    }
    this.msgs = msgs;
    this.offs = offs;
    this.lens = lens;
  }
}

export class Receiver extends Endpoint {
  protected readonly kind = 'receive';
  protected readonly peer = 'sender';
  // Receives in flight, from a pool: NCCL posts at most 32 per comm (usually 8) though a comm has
  // 256 request slots, used in turn. One object per slot held 256 of them per comm, 1 KiB each
  // with their arrays: 0.25 MiB of heap per receive comm, most of the plugin's memory in a process
  // with thousands of comms (docs/performance.md, item 38).
  private readonly ops: RecvOp[] = objectArray(); // every receive made, in flight or free
  private readonly freeOps: RecvOp[] = objectArray();
  private readonly matcher: Matcher<RecvOp, Msg>;
  private readonly lanesQ: LaneQueue[];
  private readonly msgs: Msg[] = objectArray();
  private readonly freeMsgs: Msg[] = objectArray();
  // Eager messages whose payload may still be in the ring, in ring order, with their generation
  // (a message whose generation moved on was copied and recycled): [heldHead, heldLen) of two
  // arrays that keep their storage. Emptying them with `length = 0` gave the storage back, and
  // the next push took new storage: about 300 bytes of garbage per eager message.
  private readonly held: Msg[] = objectArray();
  private readonly heldGen: number[] = [];
  private heldHead = 0;
  private heldLen = 0;
  private nextSeq = 0;
  private counter = 0; // stripes expected so far: the lane policy's counter
  private active = 0;
  private endWarned = false; // settle has WARNed once
  private lossWarned = false; // a message cut short by its data lane's end has been WARNed

  constructor(link: StreamLink, complete: Complete, name: string) {
    super(link, complete, name);
    this.matcher = new Matcher((r, i, m) => this.matched(r, i, m));
    this.lanesQ = Array.from({ length: link.lanes }, () => new LaneQueue());
  }

  get pending(): number {
    return this.active;
  }

  /** Receives made so far (the most in flight at once), for tests. */
  get receivesMade(): number {
    return this.ops.length;
  }

  private takeOp(slot: number): RecvOp {
    let r = this.freeOps.pop();
    if (!r) {
      const entries = Array.from({ length: MAX_ENTRIES }, () => ({ size: 0, tag: 0 }));
      r = {
        slot, gen: 0, active: false, n: 0, left: 0, taken: 0,
        regions: new Array(MAX_ENTRIES).fill(null), offsets: new Array(MAX_ENTRIES).fill(0),
        entries, views: entries.map((_e, i) => entries.slice(0, i + 1)), got: new Array(MAX_ENTRIES).fill(0), failed: undefined,
      };
      this.ops.push(r);
    }
    r.slot = slot;
    return r;
  }

  // NCCL has the receive back: its object serves the next. A message still pointing at it is
  // told apart by the generation, which the next irecv moves on.
  private giveBack(r: RecvOp): void {
    for (let i = 0; i < r.n; i++) r.regions[i] = null;
    r.failed = undefined;
    this.freeOps.push(r);
  }

  irecv(slot: number, a: RecvArgs): void {
    if (this.failed) return this.refuse(slot, a.n);
    const r = this.takeOp(slot);
    r.gen = (r.gen + 1) & 0xffffff;
    r.active = true;
    r.n = a.n;
    r.left = a.n;
    r.taken = 0;
    r.failed = undefined;
    for (let i = 0; i < a.n; i++) {
      r.regions[i] = a.regions[i];
      r.offsets[i] = a.offsets[i];
      r.entries[i].size = a.sizes[i];
      r.entries[i].tag = a.tags[i];
      r.got[i] = 0;
    }
    this.active++;
    this.matcher.post(r, r.views[a.n - 1]);
    this.link.rx.release(this.heldAt()); // copies made in matched() freed ring space
    if (this.peerDone) this.settle();
  }

  /** Host memory needs no flush: the bytes are in place once the receive completed. */
  iflush(slot: number): void {
    this.complete(slot, ResultCode.SUCCESS, NO_SIZES, 0);
  }

  /** Periodic: also fails a link whose oldest message has matched nothing for the whole timeout. */
  override tick(now: number, timeoutMs: number, judge = true): void {
    super.tick(now, timeoutMs, judge);
    if (!judge || this.failed || this.matcher.waiting === 0 || this.matcher.posted === 0) return;
    const w = this.matcher.oldestWaiting()!;
    if (now - w.msg.arrived > timeoutMs)
      this.fail(invalidUsage(
        `${this.name}: message ${w.msg.seq} (tag ${w.tag}, ${w.msg.size} bytes) has matched no posted receive for ` +
          `${((now - w.msg.arrived) / 1000).toFixed(1)} s: ${this.matcher.describeOpen()}`,
      ));
  }

  protected override keepFrom(): number {
    return this.heldAt();
  }

  private heldAt(): number {
    const h = this.held;
    const g = this.heldGen;
    while (this.heldHead < this.heldLen && (h[this.heldHead].gen !== g[this.heldHead] || h[this.heldHead].copied)) this.heldHead++;
    if (this.heldHead === this.heldLen) {
      this.heldHead = 0;
      this.heldLen = 0;
      return this.parsed;
    }
    if (this.heldHead > 64 && this.heldHead * 2 > this.heldLen) {
      h.copyWithin(0, this.heldHead, this.heldLen);
      g.copyWithin(0, this.heldHead, this.heldLen);
      this.heldLen -= this.heldHead;
      this.heldHead = 0;
    }
    return h[this.heldHead].frameAt;
  }

  protected onFrame(f: Frame, at: number): void {
    if (f.type !== FrameType.MSG) return this.unexpected(f);
    if (f.seq !== this.nextSeq) return this.fail(remoteError(`${this.name}: protocol error: message ${f.seq} arrived, expected ${this.nextSeq}`));
    // No send is larger (isend refuses more than INT_MAX bytes): a larger size would have this
    // thread list stripes for it in one loop until memory runs out.
    if (f.size > MAX_MESSAGE) return this.fail(remoteError(`${this.name}: protocol error: message ${f.seq} of ${f.size} bytes, more than any send (${MAX_MESSAGE})`));
    if (this.freeMsgs.length === 0 && this.msgs.length >= MAX_MSGS)
      return this.fail(remoteError(`${this.name}: protocol error: more than ${MAX_MSGS} messages in flight on one link (message ${f.seq})`));
    this.nextSeq++;
    const m = this.allocMsg();
    m.seq = f.seq;
    m.tag = f.tag;
    m.size = f.size;
    m.eager = (f.flags & FLAG_EAGER) !== 0;
    m.at = at;
    m.frameAt = (at - 24) >>> 0;
    m.arrived = this.link.heard;
    m.rxUs = this.rxTime;
    m.rxIo = this.rxIo;
    m.stripes = 0;
    if (m.eager) {
      if (this.heldLen === this.held.length) {
        this.held.push(m);
        this.heldGen.push(m.gen);
      } else {
        this.held[this.heldLen] = m;
        this.heldGen[this.heldLen] = m.gen;
      }
      this.heldLen++;
    } else {
      const p = this.link.policy;
      const len = p.stripes.length(f.size, p.minStripe, p.lanes);
      const n = stripeCount(f.size, len);
      let lane = p.laneChoice.first(this.counter, f.tag, p.lanes);
      for (let k = 0, off = 0; k < n; k++, off += len) {
        this.lanesQ[lane].push(m, off, Math.min(len, f.size - off));
        if (++lane === p.lanes) lane = 0;
      }
      this.counter += n;
      m.stripes = n;
    }
    this.stats.messages++;
    this.stats.bytes += f.size;
    this.matcher.arrive(m, f.tag);
  }

  // The matcher gave message m entry i of receive r.
  private matched(r: RecvOp, i: number, m: Msg): void {
    m.recv = r;
    m.recvGen = r.gen;
    m.matched = true;
    r.got[i] = m.size;
    r.taken |= 1 << i;
    const room = r.entries[i].size;
    const tooBig = sizeError(m.size, room, m.tag);
    if (tooBig) {
      this.link.frame(FrameType.NACK, 0, 0, m.seq, room, 0, 0, 0, NO_OP);
      this.failRecv(r, invalidUsage(`${this.name}: ${tooBig}`));
    }
    const region = r.regions[i];
    m.dest = r.failed || !region || m.size === 0 ? 0 : region.base + r.offsets[i];
    if (this.trace && (m.eager || m.stripes === 0)) this.trace.step(r.slot, 'landed', m.rxUs, m.rxIo);
    if (m.eager) {
      if (m.dest) copyOut(this.link.rx, m.at, m.size, region!.bytes!, r.offsets[i]);
      m.copied = true;
      this.landed(m);
    } else if (m.stripes === 0) this.landed(m);
    else for (let k = 0; k < this.lanesQ.length; k++) this.pump(k);
  }

  // Submits the lane's expected stripes whose destination is known, in order.
  private pump(k: number): void {
    const q = this.lanesQ[k];
    const mask = q.msgs.length - 1;
    while (q.head !== q.tail) {
      const i = q.head & mask;
      const m = q.msgs[i]!;
      if (!m.matched) return;
      const d = m.dest === 0 ? 0 : m.dest + q.offs[i];
      this.link.read(k, hiOf(d), loOf(d), q.lens[i], m.id | (m.gen << 16));
      q.msgs[i] = undefined;
      q.head++;
    }
  }

  onOp(token: number, status: number, time: number, io: number): void {
    const m = this.msgs[token & 0xffff];
    if (!m || !m.live || m.gen !== token >>> 16 || this.failed) return;
    if (status === STATUS_EOF) {
      // This stripe's data lane ended before all its bytes came (the send was cancelled by the
      // sender's close, or the sender died): the message is lost and its receive fails. The
      // lane's later stripes end the same way; the other lanes go on.
      // The first such loss of a comm is a WARN, later ones INFO (a close can cut many).
      const r = m.recv;
      if (r && r.active && r.gen === m.recvGen && !r.failed) {
        const err = remoteError(`${this.name}: the sender's data stream ended before message ${m.seq} (tag ${m.tag}, ${m.size} bytes) fully arrived`);
        if (this.lossWarned) log.info(err.message);
        this.failRecv(r, err, !this.lossWarned);
        this.lossWarned = true;
      }
    } else if (status !== 0) return this.fail(laneError(this.name, status));
    else if (this.trace && m.recv) this.trace.step(m.recv.slot, 'landed', time, io);
    if (--m.stripes === 0) this.landed(m);
    if (this.peerDone) this.settle();
  }

  /**
   * The sender will send no more messages (its CLOSE, or its control stream's end). Everything
   * it sent before is still delivered: eager payloads wait in the receive ring and stripes in
   * the data sockets (a close sends FIN after the data) until receives take them, posted before
   * or after this. Only receives that no message is left for fail (settle).
   */
  protected override peerEnded(err: NetError): void {
    if (this.peerDone || this.failed) return;
    this.peerDone = err;
    this.settle();
  }

  /**
   * After the sender's end: a posted receive that still has an entry no message took can never
   * complete. It fails (one WARN per comm, then INFO), and is reported once the messages it did
   * take are consumed (their bytes not yet on their way are dropped). Once nothing is left to
   * deliver (no message waits, no receive is pending) the comm ends: its link closes and later
   * receives fail at once.
   */
  private settle(): void {
    const why = this.peerDone!;
    if (this.failed) return;
    if (this.matcher.posted > 0) {
      const stuck: RecvOp[] = [];
      this.matcher.forEachRecv((r) => stuck.push(r));
      const tags = new Set<number>();
      for (const r of stuck) {
        this.matcher.removeRecv(r);
        // Entries no message took will never be filled: they leave the count of those to come.
        for (let i = 0; i < r.n; i++)
          if (!(r.taken & (1 << i))) {
            tags.add(r.entries[i].tag);
            r.left--;
          }
        this.failRecv(r, why, false);
        if (r.left === 0) this.report(r);
      }
      const line = `${why.message}; no message is left for ${stuck.length} pending receive(s) (tag${tags.size === 1 ? '' : 's'} ${[...tags].sort((a, b) => a - b).join(', ')}); failing them`;
      if (this.endWarned) log.info(line);
      else log.warn(line);
      this.endWarned = true;
    }
    if (this.active === 0 && this.matcher.waiting === 0) this.retire(remoteError(`${why.message}; every message it sent has been delivered`), true);
  }

  // Every byte of m is in place (or dropped).
  private landed(m: Msg): void {
    const r = m.recv!;
    const mine = r.active && r.gen === m.recvGen;
    this.freeMsg(m);
    if (!mine || --r.left > 0) return;
    this.report(r);
  }

  // Every message of r has landed (or was dropped): NCCL gets it back.
  private report(r: RecvOp): void {
    r.active = false;
    this.active--;
    this.complete(r.slot, r.failed ? r.failed.code : ResultCode.SUCCESS, r.got, r.n);
    this.giveBack(r);
  }

  // The receive ends in error once every message it took is consumed; bytes of its messages not
  // yet on their way into its buffers are dropped.
  private failRecv(r: RecvOp, err: NetError, warn = true): void {
    if (r.failed) return;
    r.failed = err;
    if (warn) log.warn(err.message);
    for (const m of this.msgs) if (m.live && m.recv === r && m.recvGen === r.gen) m.dest = 0;
  }

  protected failPending(err: NetError): void {
    this.cancelPending(err);
  }

  protected cancelPending(err: NetError): number {
    let n = 0;
    for (const r of this.ops) {
      if (!r.active) continue;
      r.active = false;
      n++;
      this.complete(r.slot, r.failed ? r.failed.code : err.code, r.got, r.n);
      this.giveBack(r);
    }
    this.active = 0;
    this.matcher.clear();
    for (const m of this.msgs) m.live = false;
    return n;
  }

  cancelRegion(region: Region): number {
    let n = 0;
    for (const r of this.ops) {
      if (!r.active || !r.regions.slice(0, r.n).includes(region)) continue;
      // Reads already handed to the transport drop the rest of their bytes before NCCL has the
      // receive back: those into the region, and those into the receive's other buffers.
      if (n++ === 0) this.link.cancel(region.base, region.size);
      for (let i = 0; i < r.n; i++) {
        const other = r.regions[i];
        if (other && other !== region && r.entries[i].size > 0) this.link.cancel(other.base + r.offsets[i], r.entries[i].size);
      }
      this.matcher.removeRecv(r);
      for (const m of this.msgs) if (m.live && m.recv === r && m.recvGen === r.gen) m.dest = 0;
      r.active = false;
      this.active--;
      this.complete(r.slot, ResultCode.INVALID_USAGE, r.got, r.n);
      this.giveBack(r);
    }
    // A WARN: each fails with ncclInvalidUsage, which NCCL reports without a word.
    if (n) log.warn(`${this.name}: the memory of ${n} receive(s) in flight was deregistered; failing them`);
    return n;
  }

  private allocMsg(): Msg {
    let m = this.freeMsgs.pop();
    if (!m) {
      // Ids stay below MAX_MSGS (onFrame fails the link first) and generations below 2^14: a
      // token (id | gen << 16) stays below 2^30, never one of the engine's markers (CQE_RX,
      // OP_REMOTE) and a small integer to V8.
      m = { id: this.msgs.length, gen: 0, seq: 0, tag: 0, size: 0, eager: false, at: 0, rxUs: 0, rxIo: 0, frameAt: 0, arrived: 0, recv: null, recvGen: 0, dest: 0, matched: false, copied: false, stripes: 0, live: false };
      this.msgs.push(m);
    }
    m.gen = (m.gen + 1) & 0x3fff;
    m.live = true;
    m.matched = false;
    m.copied = false;
    m.recv = null;
    m.dest = 0;
    return m;
  }

  private freeMsg(m: Msg): void {
    m.live = false;
    m.recv = null;
    this.freeMsgs.push(m);
  }
}
