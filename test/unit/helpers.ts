// Shared helpers of the unit suites: settling the event loop, capturing the plugin's log, byte
// patterns, registered memory with guard bytes, and a Sender/Receiver pair over an in-memory
// link (plugin/transports/memory-link.ts) whose calls are recorded.
import { ADDR_SPLIT } from '../../plugin/addr';
import { setClock } from '../../plugin/clock';
import { RING } from '../../plugin/engine/records';
import { type Region, Regions } from '../../plugin/memory';
import { type LinkEvents, type RxRing, SEND_RING_BYTES, type StreamLink, recvRingBytes } from '../../plugin/protocol/link';
import { DEFAULT_POLICIES, type SchedulePolicy } from '../../plugin/protocol/policies';
import { Receiver, newRecvArgs } from '../../plugin/protocol/receiver';
import { Sender } from '../../plugin/protocol/sender';
import { memoryLinkPair } from '../../plugin/transports/memory-link';

import { KiB, allBytes, fill, prng, shuffle } from '../support/data';

export { KiB, MiB, allBytes, fill, firstDiff, prng } from '../support/data';
export { type LogLine, captureLog } from '../support/log-capture';

const turn = () => new Promise<void>((resolve) => setImmediate(resolve));

/** An engine ring (records.h tsn_ring_hdr) of `records` records in a plain ArrayBuffer, for fake engine bindings. */
/**
 * A clock the test moves (plugin/clock.ts), from a start far from 0; put the real one back with
 * setClock(undefined) (afterEach).
 */
export function testClock(t0 = 1_000_000): { now(): number; set(ms: number): void } {
  let t = t0;
  setClock(() => t);
  return { now: () => t, set: (ms) => (t = ms) };
}

export function ringBuffer(records: number, recordBytes: number): ArrayBuffer {
  const buf = new ArrayBuffer(RING.bytes + records * recordBytes);
  const hdr = new Uint32Array(buf, 0, RING.bytes / 4);
  hdr[RING.mask / 4] = records - 1;
  hdr[RING.recordBytes / 4] = recordBytes;
  return buf;
}

/**
 * Awaits macrotask turns (each also drains the microtask queue) until probe() gives the
 * same value on 3 turns in a row. probe defaults to nothing changes at all (a few turns).
 */
export async function settle(probe: () => unknown = () => 0, maxTurns = 10_000): Promise<void> {
  let last = JSON.stringify(probe());
  let same = 0;
  for (let i = 0; i < maxTurns && same < 3; i++) {
    await turn();
    const now = JSON.stringify(probe());
    same = now === last ? same + 1 : 0;
    last = now;
  }
}

/** xs in a seeded random order. */
export function shuffled<T>(xs: readonly T[], seed: number): T[] {
  return shuffle(xs, prng(seed));
}

/** A request's end as the protocol reported it. */
export interface Completion {
  slot: number;
  code: number;
  sizes: number[];
}

export const bySlot = (list: Completion[]) => [...list].sort((a, b) => a.slot - b.slot);

// --- Memory

/** The value of every byte around a buffer (and of a receive buffer before data lands). */
export const GUARD_BYTE = 0xee;
/** Guard bytes on each side of a buffer. */
export const GUARD = 64;

/** A buffer inside a registered region, with guard bytes on both sides. */
export interface Buf {
  region: Region;
  offset: number;
  size: number;
  /** The buffer's bytes. */
  view: Uint8Array;
  /** The region's bytes outside the buffer are all GUARD_BYTE. */
  guarded(): boolean;
}

/** Registered memory as the plugin has it: regions at fake addresses (0x1000_0000 * id) over real ArrayBuffers. */
export class TestMemory {
  readonly regions = new Regions();
  private nextId = 1;

  /** A region of bytes, filled with GUARD_BYTE. */
  region(bytes: number): Region {
    const id = this.nextId++;
    const r = this.regions.add(id, 0, new ArrayBuffer(bytes), 0x1000_0000 * id);
    r.bytes.fill(GUARD_BYTE);
    return r;
  }

  /**
   * A buffer of size bytes in a region of its own, after GUARD + skew guard bytes (an odd
   * skew gives unaligned addresses); filled with pattern seed when given, else GUARD_BYTE.
   */
  buf(size: number, seed?: number, skew = 0): Buf {
    const offset = GUARD + skew;
    const region = this.region(size + offset + GUARD);
    const view = region.bytes.subarray(offset, offset + size);
    if (seed !== undefined) fill(view, seed);
    return {
      region,
      offset,
      size,
      view,
      guarded: () => allBytes(region.bytes.subarray(0, offset), GUARD_BYTE) && allBytes(region.bytes.subarray(offset + size), GUARD_BYTE),
    };
  }
}

// --- A link whose calls are recorded

export interface FrameCall {
  type: number;
  flags: number;
  tag: number;
  seq: number;
  size: number;
  addr: number;
  len: number;
}

export interface IoCall {
  lane: number;
  addr: number;
  len: number;
}

/** A StreamLink that records what the protocol asks of it and passes it on. */
export class SpyLink implements StreamLink {
  readonly frames: FrameCall[] = [];
  readonly writes: IoCall[] = [];
  readonly reads: IoCall[] = [];
  readonly cancels: { base: number; len: number }[] = [];
  readonly closes: boolean[] = [];
  /** Every op token handed to the link. */
  readonly ops: number[] = [];

  /** journal: where close() says so ("close <name>"), in order with other events of a test. */
  constructor(
    readonly inner: StreamLink,
    private readonly journal?: string[],
    private readonly name = 'link',
  ) {}

  get lanes(): number {
    return this.inner.lanes;
  }
  get rx(): RxRing {
    return this.inner.rx;
  }
  get policy(): SchedulePolicy {
    return this.inner.policy;
  }
  get description(): string {
    return this.inner.description;
  }
  get heard(): number {
    return this.inner.heard;
  }
  get wrote(): number {
    return this.inner.wrote;
  }
  attach(events: LinkEvents): void {
    this.inner.attach(events);
  }
  frame(type: number, flags: number, tag: number, seq: number, size: number, hi: number, lo: number, len: number, op: number): void {
    this.frames.push({ type, flags, tag, seq, size, addr: hi * ADDR_SPLIT + lo, len });
    this.ops.push(op);
    this.inner.frame(type, flags, tag, seq, size, hi, lo, len, op);
  }
  write(lane: number, hi: number, lo: number, len: number, op: number): void {
    this.writes.push({ lane, addr: hi * ADDR_SPLIT + lo, len });
    this.ops.push(op);
    this.inner.write(lane, hi, lo, len, op);
  }
  read(lane: number, hi: number, lo: number, len: number, op: number): void {
    this.reads.push({ lane, addr: hi * ADDR_SPLIT + lo, len });
    this.ops.push(op);
    this.inner.read(lane, hi, lo, len, op);
  }
  cancel(base: number, len: number): { reads: number; writes: number } {
    this.cancels.push({ base, len });
    return this.inner.cancel(base, len);
  }
  close(graceful: boolean): boolean {
    this.closes.push(graceful);
    this.journal?.push(`close ${this.name}`);
    return this.inner.close(graceful);
  }
}

// --- A Sender and a Receiver over one in-memory link

/** The schedule of the tests unless they say otherwise: 64 KiB eager, 128 KiB stripes, 4 lanes. */
export function policyOf(over: Partial<SchedulePolicy> = {}): SchedulePolicy {
  return { eagerMax: 64 * KiB, minStripe: 128 * KiB, lanes: 4, ...DEFAULT_POLICIES, ...over };
}

/** One buffer of a receive: where (null: no region) and its tag; size defaults to the buffer's. */
export interface Entry {
  buf: Buf | null;
  tag: number;
  size?: number;
}

export interface Pair {
  mem: TestMemory;
  policy: SchedulePolicy;
  sender: Sender;
  receiver: Receiver;
  sendLink: SpyLink;
  recvLink: SpyLink;
  sent: Completion[];
  received: Completion[];
  /** Link closes and completions in the order they happened: "close send", "sent 3", "received 0". */
  journal: string[];
  /** isend of a whole buffer (or size bytes of it; null: no region, size 0 unless given). */
  send(slot: number, buf: Buf | null, tag: number, size?: number): void;
  /** irecv of the given buffers. */
  recv(slot: number, ...entries: Entry[]): void;
  /** Settles until neither side reports anything new. */
  settle(): Promise<void>;
}

/** A started Sender and Receiver over memoryLinkPair, rings sized as the transports size them. */
export function pair(over: Partial<SchedulePolicy> = {}): Pair {
  const policy = policyOf(over);
  const mem = new TestMemory();
  const [a, b] = memoryLinkPair(mem.regions, policy, { send: SEND_RING_BYTES, recv: recvRingBytes(policy.eagerMax) }, 'test link');
  const journal: string[] = [];
  const sendLink = new SpyLink(a, journal, 'send');
  const recvLink = new SpyLink(b, journal, 'recv');
  const sent: Completion[] = [];
  const received: Completion[] = [];
  const sender = new Sender(sendLink, (slot, code, sizes, n) => {
    sent.push({ slot, code, sizes: Array.from(sizes).slice(0, n) });
    journal.push(`sent ${slot}`);
  }, 'test-send');
  const receiver = new Receiver(recvLink, (slot, code, sizes, n) => {
    received.push({ slot, code, sizes: Array.from(sizes).slice(0, n) });
    journal.push(`received ${slot}`);
  }, 'test-recv');
  sender.start();
  receiver.start();
  const args = newRecvArgs();
  return {
    mem,
    policy,
    sender,
    receiver,
    sendLink,
    recvLink,
    sent,
    received,
    journal,
    send: (slot, buf, tag, size) => sender.isend(slot, buf ? buf.region : null, buf ? buf.offset : 0, size ?? buf?.size ?? 0, tag),
    recv: (slot, ...entries) => {
      args.n = entries.length;
      entries.forEach((e, i) => {
        args.regions[i] = e.buf ? e.buf.region : null;
        args.offsets[i] = e.buf ? e.buf.offset : 0;
        args.sizes[i] = e.size ?? e.buf?.size ?? 0;
        args.tags[i] = e.tag;
      });
      receiver.irecv(slot, args);
    },
    settle: () => settle(() => [sent.length, received.length]),
  };
}
