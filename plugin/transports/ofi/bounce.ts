// Bounce buffers: the receives an endpoint keeps posted on each rail, for eager messages,
// connect/accept/heartbeat messages and (providers with FI_RX_CQ_DATA) remote writes with
// immediate data. Exact accounting: each rail keeps exactly `window` receives posted between
// completion batches. A completion that consumed one is counted, and exactly one buffer is
// posted back for it at the end of the batch. A buffer whose eager payload still waits for
// its receive is held (not reposted); another one, allocated when none is free, is posted in
// its place. So the window never shrinks (no RNR stalls), and nothing is posted that no
// message will consume but the standing window (bug class: posting a receive per expected
// chunk and again on completion, which left phantom receives behind multi-chunk transfers).
import type { HostBuffer, Rail } from './fabric';

/**
 * Tokens of posted receives are 2^29 + the buffer id; operations' tokens stay below 2^29
 * (ops.ts). Every token is then below 2^30, a small integer to V8, and crosses calls without
 * being boxed: with 2^31 an 8-byte ping-pong over shm allocated 16 bytes per message more.
 */
export const BOUNCE_TOKEN = 0x2000_0000;
export const isBounceToken = (token: number): boolean => token >= BOUNCE_TOKEN;
export const bounceId = (token: number): number => token - BOUNCE_TOKEN;

export const enum BufState {
  FREE = 0,
  POSTED = 1,
  HELD = 2,
}

/** One rail's counters. */
export interface RailAccount {
  /** Receives posted now. */
  posted: number;
  /** Posted when the pool started. */
  initial: number;
  /** Receives a completion consumed (or cancelled). */
  consumed: number;
  /** Receives posted after the start, one per consumed. */
  reposted: number;
  /** Buffers held with an eager payload. */
  held: number;
  /** Buffers this rail owns. */
  buffers: number;
}

export class BouncePool {
  private chunks: HostBuffer[] = [];
  private chunkRail: number[] = []; // the rail that registered each chunk
  private count = 0;
  private railOf = new Uint8Array(256);
  private stateOf = new Uint8Array(256);
  private chunkOf = new Int32Array(256);
  private offsetOf = new Float64Array(256);
  private readonly free: Int32Array[];
  private readonly freeTop: Int32Array;
  readonly accounts: RailAccount[];
  private closed = false;

  constructor(
    private readonly rails: readonly Rail[],
    /** Receives kept posted per rail. */
    readonly window: number,
    /** Bytes of one buffer. */
    readonly bufBytes: number,
  ) {
    this.free = rails.map(() => new Int32Array(window * 2));
    this.freeTop = new Int32Array(rails.length);
    this.accounts = rails.map(() => ({ posted: 0, initial: 0, consumed: 0, reposted: 0, held: 0, buffers: 0 }));
  }

  /** Posts the window on every rail. */
  start(): void {
    for (let r = 0; r < this.rails.length; r++) {
      this.grow(r);
      const a = this.accounts[r];
      while (a.posted < this.window) this.post(r);
      a.initial = a.posted;
    }
  }

  /** The bytes of a buffer's chunk, and where the buffer starts in them. */
  bytes(id: number): Uint8Array {
    return this.chunks[this.chunkOf[id]].bytes;
  }
  offset(id: number): number {
    return this.offsetOf[id];
  }
  chunk(id: number): HostBuffer {
    return this.chunks[this.chunkOf[id]];
  }
  rail(id: number): number {
    return this.railOf[id];
  }
  state(id: number): BufState {
    return this.stateOf[id];
  }

  /** A completion consumed posted buffer id: it is held until released. */
  consume(id: number): void {
    if (id >= this.count || this.stateOf[id] !== BufState.POSTED) throw new Error(`bounce buffer ${id} completed but is not posted`);
    const a = this.accounts[this.railOf[id]];
    this.stateOf[id] = BufState.HELD;
    a.posted--;
    a.consumed++;
    a.held++;
  }

  /** The buffer's contents are no longer needed. */
  release(id: number): void {
    if (this.stateOf[id] !== BufState.HELD) throw new Error(`bounce buffer ${id} released but not held`);
    const r = this.railOf[id];
    this.accounts[r].held--;
    this.stateOf[id] = BufState.FREE;
    this.free[r][this.freeTop[r]++] = id;
  }

  /** Posts one buffer for every one consumed on rail r since the last refill. */
  refill(r: number): void {
    if (this.closed) return;
    const a = this.accounts[r];
    while (a.posted < this.window) {
      this.post(r);
      a.reposted++;
    }
  }

  /** The endpoint is going away: no more posts (cancelled receives come back as errors). */
  close(): void {
    this.closed = true;
  }

  /**
   * The endpoints are closed (no receive of the pool is posted any more): every chunk's
   * registration goes, and with it, once the views are collected too, its memory.
   */
  freeChunks(): void {
    this.closed = true;
    this.chunks.splice(0).forEach((c, i) => this.rails[this.chunkRail[i]].free(c));
    this.chunkRail = [];
  }

  /** Why the accounting is wrong, or undefined. */
  check(): string | undefined {
    for (let r = 0; r < this.rails.length; r++) {
      const a = this.accounts[r];
      let posted = 0;
      let held = 0;
      let free = 0;
      let buffers = 0;
      for (let id = 0; id < this.count; id++) {
        if (this.railOf[id] !== r) continue;
        buffers++;
        if (this.stateOf[id] === BufState.POSTED) posted++;
        else if (this.stateOf[id] === BufState.HELD) held++;
        else free++;
      }
      if (!this.closed && a.posted !== this.window) return `rail ${r}: ${a.posted} receives posted, the window is ${this.window}`;
      if (a.initial + a.reposted - a.consumed !== a.posted)
        return `rail ${r}: ${a.initial} posted at start + ${a.reposted} reposted - ${a.consumed} consumed != ${a.posted} posted`;
      if (posted !== a.posted || held !== a.held || free !== this.freeTop[r] || buffers !== a.buffers)
        return `rail ${r}: buffers say ${posted} posted, ${held} held, ${free} free of ${buffers}; counters say ${a.posted}, ${a.held}, ${this.freeTop[r]} of ${a.buffers}`;
    }
    return undefined;
  }

  private post(r: number): void {
    if (this.freeTop[r] === 0) this.grow(r);
    const id = this.free[r][--this.freeTop[r]];
    this.stateOf[id] = BufState.POSTED;
    this.accounts[r].posted++;
    const c = this.chunks[this.chunkOf[id]];
    this.rails[r].postRecv(c, this.offsetOf[id], this.bufBytes, BOUNCE_TOKEN + id);
  }

  // Another window's worth of buffers for rail r, in one registered chunk.
  private grow(r: number): void {
    const n = this.window;
    const chunk = this.rails[r].alloc(n * this.bufBytes);
    const c = this.chunks.push(chunk) - 1;
    this.chunkRail.push(r);
    while (this.count + n > this.railOf.length) this.resize();
    if (this.free[r].length < this.accounts[r].buffers + n) {
      const f = new Int32Array((this.accounts[r].buffers + n) * 2);
      f.set(this.free[r].subarray(0, this.freeTop[r]));
      this.free[r] = f;
    }
    for (let i = n - 1; i >= 0; i--) {
      const id = this.count + i;
      this.railOf[id] = r;
      this.stateOf[id] = BufState.FREE;
      this.chunkOf[id] = c;
      this.offsetOf[id] = i * this.bufBytes;
      this.free[r][this.freeTop[r]++] = id;
    }
    this.count += n;
    this.accounts[r].buffers += n;
  }

  private resize(): void {
    const n = this.railOf.length * 2;
    const rail = new Uint8Array(n);
    rail.set(this.railOf);
    const state = new Uint8Array(n);
    state.set(this.stateOf);
    const chunk = new Int32Array(n);
    chunk.set(this.chunkOf);
    const off = new Float64Array(n);
    off.set(this.offsetOf);
    this.railOf = rail;
    this.stateOf = state;
    this.chunkOf = chunk;
    this.offsetOf = off;
  }
}
