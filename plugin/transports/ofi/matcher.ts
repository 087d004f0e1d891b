// Matching on the sender, against the receive entries it learns of from control messages.
// The rule (shared with TCP's receiver-side matcher): a send goes to the earliest posted
// receive, in posting order, that has an unused entry with its tag; equal tags keep their
// order; sends with different tags may match out of order. A send that matches no known
// receive waits, in send order, for the next control messages.
//
// SendMatcher is the seam where the shared Matcher of plugin/protocol/matching.ts plugs in:
// the comm only calls post/arrive/clear and is told of matches through MatchSink.

export interface MatchSink<S> {
  /** send takes entry `index` of receive `recv`. */
  onMatch(send: S, recv: number, index: number): void;
  /** Every entry of receive `recv` is taken: its control message is no longer needed. */
  onFull(recv: number): void;
}

export interface SendMatcher<S> {
  /** Receives posted so far: the sequence number the next post must carry. */
  readonly known: number;
  /** Sends that wait for a receive. */
  readonly queued: number;
  /** The earliest receive that may still have an unused entry (its control message is still needed). */
  readonly oldest: number;
  /** Receive `recv` (== known) with n entries tagged tags[0..n): matches waiting sends, in send order. */
  post(recv: number, n: number, tags: ArrayLike<number>): void;
  /** A new send; true when it matched at once (onMatch has been called). */
  arrive(send: S, tag: number): boolean;
  /** Forgets every receive and send. */
  clear(): void;
}

/** Receives that can have unused entries at once: the control mailbox's slots. */
const WINDOW = 256;

export class FifoSendMatcher<S> implements SendMatcher<S> {
  known = 0;
  private head = 0; // oldest receive that may have an unused entry
  private readonly n = new Uint8Array(WINDOW);
  private readonly used = new Uint8Array(WINDOW); // bit i: entry i taken
  private readonly tags = new Int32Array(WINDOW * 8);
  private sends: (S | undefined)[] = new Array(64).fill(undefined);
  private sendTags = new Int32Array(64);
  private count = 0;
  // Matches found by post, reported after the queue is consistent again.
  private readonly mSend: (S | undefined)[] = new Array(8).fill(undefined);
  private readonly mIndex = new Int32Array(8);

  constructor(private readonly sink: MatchSink<S>) {}

  get queued(): number {
    return this.count;
  }

  get oldest(): number {
    return this.head;
  }

  post(recv: number, n: number, tags: ArrayLike<number>): void {
    if (recv !== this.known) throw new Error(`matcher: receive ${recv} posted, expected ${this.known}`);
    if (recv - this.head >= WINDOW) throw new Error(`matcher: more than ${WINDOW} receives with unused entries`);
    const w = recv % WINDOW;
    this.n[w] = n;
    for (let i = 0; i < n; i++) this.tags[w * 8 + i] = tags[i];
    let used = 0;
    let matched = 0;
    // Waiting sends take entries in send order; the rest of the queue closes up behind them.
    let keep = 0;
    for (let k = 0; k < this.count; k++) {
      const s = this.sends[k];
      const tag = this.sendTags[k];
      let index = -1;
      if (matched < n)
        for (let i = 0; i < n; i++)
          if (!(used & (1 << i)) && tags[i] === tag) {
            index = i;
            break;
          }
      if (index >= 0) {
        used |= 1 << index;
        this.mSend[matched] = s;
        this.mIndex[matched++] = index;
      } else {
        this.sends[keep] = s;
        this.sendTags[keep++] = tag;
      }
    }
    for (let k = keep; k < this.count; k++) this.sends[k] = undefined;
    this.count = keep;
    this.used[w] = used;
    this.known = recv + 1;
    for (let m = 0; m < matched; m++) {
      const s = this.mSend[m] as S;
      this.mSend[m] = undefined;
      this.sink.onMatch(s, recv, this.mIndex[m]);
    }
    if (matched === n) this.full(recv);
  }

  arrive(send: S, tag: number): boolean {
    for (let r = this.head; r < this.known; r++) {
      const w = r % WINDOW;
      const n = this.n[w];
      const used = this.used[w];
      if (used === (1 << n) - 1) continue;
      for (let i = 0; i < n; i++) {
        if (used & (1 << i) || this.tags[w * 8 + i] !== tag) continue;
        this.used[w] = used | (1 << i);
        this.sink.onMatch(send, r, i);
        if (this.used[w] === (1 << n) - 1) this.full(r);
        return true;
      }
    }
    if (this.count === this.sends.length) this.grow();
    this.sends[this.count] = send;
    this.sendTags[this.count++] = tag;
    return false;
  }

  clear(): void {
    this.sends.fill(undefined);
    this.count = 0;
    this.head = this.known;
  }

  private full(recv: number): void {
    this.sink.onFull(recv);
    while (this.head < this.known) {
      const w = this.head % WINDOW;
      if (this.used[w] !== (1 << this.n[w]) - 1) break;
      this.head++;
    }
  }

  private grow(): void {
    const sends = new Array(this.sends.length * 2).fill(undefined);
    for (let i = 0; i < this.count; i++) sends[i] = this.sends[i];
    const tags = new Int32Array(this.sends.length * 2);
    tags.set(this.sendTags);
    this.sends = sends;
    this.sendTags = tags;
  }
}
